"""Summary statistics and arm-vs-reference comparisons.

Arms of a study share seeds (a seed fixes the data order and, for most arms, the starting function),
so two arms are compared **paired by seed** where they share at least two seeds: the mean of the
per-seed differences with a t interval on n - 1 degrees of freedom. Welch's interval (unequal
variances, independent samples) is kept for arms that share no seeds and, for one release, beside the
paired one so readers see what changed. A verdict of "level" is an equivalence claim: two one-sided
tests (TOST) against a margin declared before the runs. Holm's step-down correction adjusts the p values
of a family of comparisons (a report's verdicts). scipy's t distribution gives every quantile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

ALPHA = 0.05
NAN = float("nan")


def mean_std(xs) -> tuple[float, float]:
    xs = np.asarray(xs, dtype=float)
    return float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else NAN


@dataclass
class Difference:
    mean: float  # mean(b) - mean(a) (paired: the mean of the per-seed differences b_s - a_s)
    low: float  # 95% confidence interval; nan when undefined (see `undefined`)
    high: float
    n_a: int
    n_b: int
    undefined: str = ""  # why there is no interval: too few seeds, or no spread
    kind: str = "welch"  # "welch" (independent samples) or "paired" (by seed)
    se: float = NAN  # standard error of `mean`
    df: float = NAN  # degrees of freedom of its t distribution

    @property
    def has_ci(self) -> bool:
        return math.isfinite(self.low)

    def excludes_zero(self) -> bool:
        return self.has_ci and (self.low > 0 or self.high < 0)

    @property
    def p(self) -> float:
        """Two-sided p value of "no difference"; nan without an interval."""
        if not self.has_ci:
            return NAN
        return float(2 * stats.t.sf(abs(self.mean) / self.se, self.df))

    def tost_p(self, margin: float) -> float:
        """p value of the two one-sided tests of |difference| < margin (equivalence); nan without an
        interval. Below alpha exactly when the (1 - 2 alpha) interval lies inside (-margin, +margin)."""
        if not self.has_ci or not margin > 0:
            return NAN
        p_low = stats.t.sf((self.mean + margin) / self.se, self.df)  # H0: difference <= -margin
        p_high = stats.t.cdf((self.mean - margin) / self.se, self.df)  # H0: difference >= +margin
        return float(max(p_low, p_high))

    def interval(self, level: float) -> tuple[float, float]:
        if not self.has_ci:
            return NAN, NAN
        t = stats.t.ppf(0.5 + level / 2, self.df)
        return self.mean - t * self.se, self.mean + t * self.se


def _with_interval(diff: float, se: float, df: float, n_a: int, n_b: int, kind: str, level: float) -> Difference:
    t = stats.t.ppf(0.5 + level / 2, df)
    return Difference(diff, float(diff - t * se), float(diff + t * se), n_a, n_b, kind=kind, se=se, df=df)


def welch_difference(a, b, level: float = 0.95) -> Difference:
    """mean(b) - mean(a) with Welch's interval. With fewer than 2 samples in an arm, or no spread at
    all (every value equal within each arm), the t interval is undefined, and so it is returned."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(b.mean() - a.mean())
    if len(a) < 2 or len(b) < 2:
        return Difference(diff, NAN, NAN, len(a), len(b), "fewer than 2 seeds in an arm")
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(diff, NAN, NAN, len(a), len(b), "no spread in either arm")
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return _with_interval(diff, se, float(df), len(a), len(b), "welch", level)


def paired_difference(a: dict, b: dict, level: float = 0.95) -> Difference:
    """Mean of b[s] - a[s] over the seeds s both have, with the paired t interval (n - 1 df)."""
    seeds = sorted(set(a) & set(b))
    d = np.array([b[s] - a[s] for s in seeds], dtype=float)
    n = len(d)
    if n < 2:
        return Difference(float(d.mean()) if n else NAN, NAN, NAN, n, n, "fewer than 2 shared seeds", "paired")
    se = float(d.std(ddof=1) / math.sqrt(n))
    if se == 0:
        return Difference(float(d.mean()), NAN, NAN, n, n, "every seed's difference is the same", "paired")
    return _with_interval(float(d.mean()), se, n - 1, n, n, "paired", level)


def compare(a: dict, b: dict, level: float = 0.95) -> Difference:
    """Paired by seed where the arms share at least two seeds, else Welch over all of each arm's seeds."""
    if len(set(a) & set(b)) >= 2:
        return paired_difference(a, b, level)
    return welch_difference(list(a.values()), list(b.values()), level)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p values (family-wise error), in the input order; nan stays nan and
    does not count towards the family's size."""
    idx = [i for i, p in enumerate(pvalues) if math.isfinite(p)]
    m = len(idx)
    out = [NAN] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def verdict(ppl: Difference, epoch: Difference | None, name: str = "canonical", censored: int = 0,
            p_adj: float | None = None, tost_adj: float | None = None, margin: float | None = None) -> str:
    """Plain words for one comparison. `p_adj` / `tost_adj`: Holm-adjusted p values of the difference
    and the equivalence test (default: the interval alone decides the difference, no equivalence
    claim). `epoch` None or `censored` > 0: no verdict on the epoch of best (a run whose best is its
    last epoch only bounds its epoch of best from below)."""
    if not ppl.has_ci:
        return f"interval undefined ({ppl.undefined}): no verdict"
    parts = []
    differs = ppl.excludes_zero() if p_adj is None else p_adj < ALPHA
    level = tost_adj is not None and tost_adj < ALPHA
    word = "lower" if ppl.mean < 0 else "higher"
    if differs:
        parts.append(f"{name} {word} perplexity" + (f" (but within ±{margin:.2f})" if level else ""))
    elif level:
        parts.append(f"level (within ±{margin:.2f})")
    else:
        unadjusted = [f"{word} (95% interval excludes 0)"] if ppl.excludes_zero() else []
        if margin and ppl.tost_p(margin) < ALPHA:
            unadjusted.append(f"within ±{margin:.2f} (90% interval)")
        if unadjusted and p_adj is not None:
            parts.append(f"neither a difference nor equivalence survives Holm (unadjusted: {', '.join(unadjusted)})")
        else:
            parts.append("no perplexity difference detected" +
                         (", equivalence not shown" if tost_adj is not None else ""))
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
