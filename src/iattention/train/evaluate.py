"""Perplexity over a whole split: every token after the first predicted once (non-overlapping windows)."""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from iattention.data.dataset import eval_windows
from iattention.train.distributed import DistContext
from iattention.utils.faults import fault_point


@torch.no_grad()
def split_nll(model, tokens: np.ndarray, block_size: int, batch_size: int, ctx: DistContext,
              autocast=nullcontext) -> tuple[float, int]:
    """(sum of NLL in nats, number of predicted tokens), summed over ranks."""
    was_training = model.training
    model.eval()
    windows = eval_windows(len(tokens), block_size)[ctx.rank::ctx.world]
    total = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    by_len: dict[int, list[int]] = {}
    for start, length in windows:
        by_len.setdefault(length, []).append(start)
    for length, starts in by_len.items():
        for i in range(0, len(starts), batch_size):
            rows = np.stack([np.asarray(tokens[s: s + length + 1], dtype=np.int64) for s in starts[i: i + batch_size]])
            t = torch.from_numpy(rows).to(ctx.device)
            with autocast():
                logits, _ = model(t[:, :-1])
            nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), t[:, 1:].reshape(-1), reduction="sum")
            total[0] += nll.double()
            total[1] += t[:, 1:].numel()
            fault_point("eval")
    ctx.sum_(total)
    model.train(was_training)
    return total[0].item(), int(total[1].item())


def perplexity(nll_sum: float, count: int) -> float:
    return math.exp(nll_sum / max(count, 1))
