"""Perplexity over a split, two protocols.

- `split_nll` (default, used in training): non-overlapping windows; every token after the first is
  predicted exactly once, with 0 to block_size - 1 tokens of context.
- `strided_nll`: the sliding-window protocol of the Hugging Face perplexity guide (GPT-2 on
  WikiText-2): windows of block_size tokens starting every `stride` tokens; each window scores only
  the tokens no earlier window scored, so with stride < block_size every token has at least
  block_size - stride tokens of context. Each window's first token is context only, so with
  stride = block_size the first token of every window goes unscored.

`per_unit` turns a total NLL into lm-evaluation-harness's tokenizer-free metrics (word perplexity, byte
perplexity, bits per byte) over the words and bytes of the scored text (data.dataset.scored_text).
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from iattention.data.dataset import ScoredText, eval_windows
from iattention.train.distributed import DistContext
from iattention.utils.faults import fault_point
from iattention.utils.progress import EvalProgress


@torch.no_grad()
def split_nll(model, tokens: np.ndarray, block_size: int, batch_size: int, ctx: DistContext,
              autocast=nullcontext, progress: str | None = None) -> tuple[float, int]:
    """(sum of NLL in nats, number of predicted tokens), summed over ranks. `progress`: a description, shown
    with this rank's windows scored of its windows on the main rank (utils/progress.py); None: silent."""
    was_training = model.training
    model.eval()
    windows = eval_windows(len(tokens), block_size)[ctx.rank::ctx.world]
    total = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    by_len: dict[int, list[int]] = {}
    for start, length in windows:
        by_len.setdefault(length, []).append(start)
    with EvalProgress(progress or "", len(windows), show=progress is not None and ctx.is_main) as bar:
        for length, starts in by_len.items():
            for i in range(0, len(starts), batch_size):
                rows = np.stack([np.asarray(tokens[s: s + length + 1], dtype=np.int64)
                                 for s in starts[i: i + batch_size]])
                t = torch.from_numpy(rows).to(ctx.device)
                with autocast():
                    logits, _ = model(t[:, :-1])
                nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), t[:, 1:].reshape(-1),
                                      reduction="sum")
                total[0] += nll.double()
                total[1] += t[:, 1:].numel()
                bar.update(len(rows))
                fault_point("eval")
    ctx.sum_(total)
    model.train(was_training)
    return total[0].item(), int(total[1].item())


def exp_loss(loss: float) -> float:
    """exp(loss), inf where that overflows a float (loss > ~709 nats: a diverged run, not an error here)."""
    return math.exp(loss) if loss < 709.0 else math.inf


def perplexity(nll_sum: float, count: int) -> float:
    """Perplexity of a summed NLL over `count` tokens: exp_loss of the mean."""
    return exp_loss(nll_sum / max(count, 1))


def per_unit(nll_sum: float, text: ScoredText, scored: int | None = None) -> dict | None:
    """word_ppl = exp(NLL / words), byte_ppl = exp(NLL / bytes), bits_per_byte = NLL / bytes / ln 2 (NLL:
    the total in nats over `text`), as lm-eval defines them. None when the NLL is not over every token of
    `text` (`scored`, the number of tokens the NLL sums over, differs from text.tokens) or it is empty."""
    if text.words == 0 or text.bytes == 0 or scored is not None and scored != text.tokens:
        return None
    return dict(word_ppl=exp_loss(nll_sum / text.words), byte_ppl=exp_loss(nll_sum / text.bytes),
                bits_per_byte=nll_sum / text.bytes / math.log(2))


@torch.no_grad()
def strided_nll(model, tokens: np.ndarray, block_size: int, stride: int, batch_size: int,
                device: torch.device | str = "cpu", progress: str | None = None) -> tuple[float, int]:
    """(sum of NLL in nats, number of scored tokens) under the sliding-window protocol above. `progress`: a
    description, shown with windows scored of windows (utils/progress.py); None: silent."""
    was_training = model.training
    model.eval()
    n = len(tokens)
    windows, prev_end = [], 0  # (begin, end, first scored position)
    for begin in range(0, n, stride):
        end = min(begin + block_size, n)
        first = max(prev_end, begin + 1)
        if first < end:
            windows.append((begin, end, first))
        prev_end = end
        if end == n:
            break
    total, count = 0.0, 0
    by_len: dict[int, list[tuple[int, int, int]]] = {}
    for w in windows:
        by_len.setdefault(w[1] - w[0], []).append(w)
    with EvalProgress(progress or "", len(windows), show=progress is not None) as bar:
        for length, ws in by_len.items():
            for i in range(0, len(ws), batch_size):
                chunk = ws[i: i + batch_size]
                t = torch.from_numpy(np.stack([np.asarray(tokens[b:e], dtype=np.int64) for b, e, _ in chunk]))
                t = t.to(device)
                logits, _ = model(t[:, :-1])
                nll = F.cross_entropy(logits.float().transpose(1, 2), t[:, 1:], reduction="none")  # (B, length - 1)
                pos = torch.arange(1, length, device=device)  # position (within the window) of each target
                scored = pos[None, :] >= torch.tensor([f - b for b, _, f in chunk], device=device)[:, None]
                total += float(nll[scored].double().sum())
                count += int(scored.sum())
                bar.update(len(chunk))
    model.train(was_training)
    return total, count
