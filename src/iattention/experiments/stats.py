"""Summary statistics and the canonical - standard comparison (Welch t interval)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


def mean_std(xs) -> tuple[float, float]:
    xs = np.asarray(xs, dtype=float)
    return float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else float("nan")


@dataclass
class Difference:
    mean: float  # mean(b) - mean(a)
    low: float  # 95% confidence interval (Welch); nan with fewer than 2 samples per arm
    high: float
    n_a: int
    n_b: int

    @property
    def has_ci(self) -> bool:
        return math.isfinite(self.low)

    def excludes_zero(self) -> bool:
        return self.has_ci and (self.low > 0 or self.high < 0)


def welch_difference(a, b, level: float = 0.95) -> Difference:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(b.mean() - a.mean())
    if len(a) < 2 or len(b) < 2:
        return Difference(diff, float("nan"), float("nan"), len(a), len(b))
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(diff, diff, diff, len(a), len(b))
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    t = stats.t.ppf(0.5 + level / 2, df)
    return Difference(diff, diff - t * se, diff + t * se, len(a), len(b))


def verdict(ppl: Difference, epoch: Difference) -> str:
    if not ppl.has_ci:
        return "fewer than 2 seeds in an arm: no interval, no verdict"
    parts = []
    if ppl.excludes_zero():
        parts.append("canonical lower perplexity" if ppl.mean < 0 else "canonical higher perplexity")
    else:
        parts.append("no perplexity difference detected")
    if epoch.excludes_zero():
        parts.append("faster to best" if epoch.mean < 0 else "slower to best")
    else:
        parts.append("no difference in epoch of best")
    return "; ".join(parts)
