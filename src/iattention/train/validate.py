"""The evaluation passes of a training run: mean loss and perplexity of a split (`evaluate.split_nll`,
every token after the first predicted once, summed over processes), and the per-word and per-byte
metrics of a mean loss (`evaluate.per_unit`, lm-evaluation-harness's definitions) over the text it scored."""

from __future__ import annotations

import numpy as np
import torch

from iattention.data.dataset import ScoredText
from iattention.train.evaluate import per_unit, perplexity, split_nll
from iattention.train.runtime import Runtime

NO_UNITS = dict(word_ppl=None, byte_ppl=None, bits_per_byte=None)


class Validator:
    def __init__(self, splits: dict[str, np.ndarray], scored: dict[str, ScoredText], block_size: int,
                 batch_size: int, runtime: Runtime, show: bool = True):
        self.splits, self.scored, self.block_size, self.batch_size = splits, scored, block_size, batch_size
        self.runtime, self.show = runtime, show  # show: each pass's progress (utils/progress.py)

    def loss(self, model: torch.nn.Module, split: str, what: str = "") -> tuple[float, float]:
        """(mean loss in nats, perplexity) of `model` over `split`; `what` names the pass in its progress."""
        nll, count = split_nll(model, self.splits[split], self.block_size, self.batch_size, self.runtime.ctx,
                               self.runtime.eval_precision,
                               progress=f"eval {split}{what and f' ({what})'}" if self.show else None)
        return nll / max(count, 1), perplexity(nll, count)

    def per_unit(self, split: str, loss: float) -> dict:
        """Word/byte metrics of a mean loss over `split`'s scored tokens (None each where it has no words)."""
        text = self.scored[split]
        return per_unit(loss * text.tokens, text) or dict(NO_UNITS)

    def units(self, best_val_loss: float, test_loss: float | None) -> dict:
        """The summary's tokenizer-free metrics of the best validation and of test (None each where test was
        not run), and what they count."""
        out = {}
        for split, prefix, loss in (("valid", "best_val", best_val_loss), ("test", "test", test_loss)):
            text, short = self.scored[split], "val" if split == "valid" else split
            m = self.per_unit(split, loss) if loss is not None else dict(NO_UNITS)
            out.update({f"{prefix}_word_ppl": m["word_ppl"], f"{prefix}_byte_ppl": m["byte_ppl"],
                        f"{prefix}_bits_per_byte": m["bits_per_byte"], f"{short}_tokens_scored": text.tokens,
                        f"{short}_words": text.words, f"{short}_bytes": text.bytes})
        return out
