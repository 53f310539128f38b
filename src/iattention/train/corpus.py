"""A run's data: the splits of `data.*` (data/), the model config resolved to their vocabulary, what
validation and test score (tokens, words, bytes), the token fingerprints a resume checks, and the
number of steps an epoch has. Every problem is found here, before any training."""

from __future__ import annotations

import dataclasses

import numpy as np

from iattention.config import RunConfig, resolve_vocab
from iattention.data.dataset import (
    ScoredText,
    check_eval_split,
    fingerprint,
    load_data,
    n_train_windows,
    scored_text,
)
from iattention.data.tokenizers import Tokenizer
from iattention.errors import UserError


@dataclasses.dataclass
class RunData:
    splits: dict[str, np.ndarray]
    tokenizer: Tokenizer
    scored: dict[str, ScoredText]  # valid and test: what an evaluation predicts (every token after the first)
    fingerprints: dict[str, str]  # train and valid: the token streams this run trains and selects on
    n_windows: int  # training windows of block_size + 1 tokens
    steps_per_epoch: int


def load_run_data(cfg: RunConfig, world: int) -> tuple[RunConfig, RunData]:
    """The data of `cfg` for `world` processes, and a copy of `cfg` with the model's vocabulary resolved."""
    t = cfg.train
    if t.batch_size % (t.grad_accum * world):
        raise UserError(f"train.batch_size={t.batch_size} must be divisible by grad_accum x processes "
                        f"({t.grad_accum} x {world})")
    data = load_data(cfg.data)
    fingerprints = {s: fingerprint(data.splits[s]) for s in ("train", "valid")}  # the data, before eval_tokens
    splits = dict(data.splits)
    if t.eval_tokens:  # training's validation passes score this prefix (docs/training.md)
        splits["valid"] = splits["valid"][:t.eval_tokens]
    # What validation and test predict (every token after the first), in words and bytes: constants
    # of the (possibly cut) splits, for the per-word and per-byte metrics.
    scored = {s: scored_text(data.tokenizer, splits[s]) for s in ("valid", "test")}
    cfg = dataclasses.replace(cfg, model=resolve_vocab(cfg.model, cfg.data.tokenizer, data.vocab_size))
    cfg.model.validate()
    T = cfg.model.block_size
    valid_cap = "train.eval_tokens" if t.eval_tokens else "data.valid_tokens"
    for split, cap in (("valid", valid_cap), ("test", None)):
        check_eval_split(splits[split], split, T, f"give a longer {split} file"
                         + (f", raise {cap} (0: the whole split)" if cap else "") + " or lower model.block_size")
    n_windows = n_train_windows(data.splits["train"], T)
    steps_per_epoch = n_windows // t.batch_size
    if steps_per_epoch == 0:
        raise UserError(f"train split has {len(data.splits['train'])} tokens: fewer than one batch of "
                        f"{t.batch_size} x {T + 1}; lower train.batch_size or model.block_size, or use more data")
    return cfg, RunData(splits, data.tokenizer, scored, fingerprints, n_windows, steps_per_epoch)
