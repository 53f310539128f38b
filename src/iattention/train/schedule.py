"""GPT-style learning rate: linear warmup, then cosine (or linear) decay to a floor."""

from __future__ import annotations

import math

from iattention.config.run import SCHEDULES, LoopConfig
from iattention.errors import UserError


def budget_steps(t: LoopConfig, steps_per_epoch: int, block_size: int) -> int:
    """The optimizer steps a run makes, the total its schedule decays over: `train.max_steps`, else the most
    whole steps of batch_size x block_size tokens within `train.max_tokens`, else `train.epochs` epochs."""
    if t.max_steps:
        return t.max_steps
    if t.max_tokens:
        per_step = t.batch_size * block_size
        if t.max_tokens < per_step:
            raise UserError(f"train.max_tokens={t.max_tokens} is less than one step ({t.batch_size} x {block_size} = "
                            f"{per_step} tokens); raise it, or lower train.batch_size")
        return t.max_tokens // per_step
    return steps_per_epoch * t.epochs


def lr_at(step: int, total_steps: int, lr: float, warmup_steps: int, min_lr_ratio: float,
          schedule: str = "cosine") -> float:
    """lr(step) for 0-based `step`: (step+1)/warmup * lr during warmup, then a decay to min_lr_ratio * lr
    at `total_steps`: cosine (GPT-style, nanoGPT) or linear (Hugging Face Trainer's default).
    min_lr_ratio=1 makes the rate flat after warmup (nanoGPT's defaults at a run far shorter than
    its lr_decay_iters)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    min_lr = lr * min_lr_ratio
    if total_steps <= warmup_steps:
        return lr
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return lr - progress * (lr - min_lr)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
