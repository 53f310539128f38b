"""Summary statistics and arm-vs-reference comparisons (Welch t interval)."""

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
    low: float  # 95% confidence interval (Welch); nan when undefined (see `undefined`)
    high: float
    n_a: int
    n_b: int
    undefined: str = ""  # why there is no interval: too few seeds, or no spread in either arm

    @property
    def has_ci(self) -> bool:
        return math.isfinite(self.low)

    def excludes_zero(self) -> bool:
        return self.has_ci and (self.low > 0 or self.high < 0)


def welch_difference(a, b, level: float = 0.95) -> Difference:
    """mean(b) - mean(a) with Welch's interval. With fewer than 2 samples in an arm, or no spread at
    all (every value equal within each arm), the t interval is undefined, and so it is returned."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(b.mean() - a.mean())
    nan = float("nan")
    if len(a) < 2 or len(b) < 2:
        return Difference(diff, nan, nan, len(a), len(b), "fewer than 2 seeds in an arm")
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(diff, nan, nan, len(a), len(b), "no spread in either arm")
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    t = stats.t.ppf(0.5 + level / 2, df)
    return Difference(diff, diff - t * se, diff + t * se, len(a), len(b))


def verdict(ppl: Difference, epoch: Difference | None, name: str = "canonical", censored: int = 0) -> str:
    """Plain words for one comparison. `epoch` None or `censored` > 0: no verdict on the epoch of best
    (a run whose best is its last epoch only bounds its epoch of best from below)."""
    if not ppl.has_ci:
        return f"interval undefined ({ppl.undefined}): no verdict"
    parts = []
    if ppl.excludes_zero():
        parts.append(f"{name} lower perplexity" if ppl.mean < 0 else f"{name} higher perplexity")
    else:
        parts.append("no perplexity difference detected")
    if censored:
        parts.append(f"epoch of best censored in {censored} run{'s' if censored > 1 else ''} (lower bound): "
                     "no epoch verdict")
    elif epoch is None or not epoch.has_ci:
        parts.append(f"epoch interval undefined ({epoch.undefined if epoch else 'no data'})")
    elif epoch.excludes_zero():
        parts.append("faster to best" if epoch.mean < 0 else "slower to best")
    else:
        parts.append("no difference in epoch of best")
    return "; ".join(parts)
