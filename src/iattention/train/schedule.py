"""GPT-style learning rate: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math


def lr_at(step: int, total_steps: int, lr: float, warmup_steps: int, min_lr_ratio: float) -> float:
    """lr(step) for 0-based `step`: (step+1)/warmup * lr during warmup, then cosine to min_lr_ratio * lr."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    min_lr = lr * min_lr_ratio
    if total_steps <= warmup_steps:
        return lr
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
