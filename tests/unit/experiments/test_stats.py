"""Unit tests of iattention.experiments.stats (moved from tests/test_experiments.py)."""

import numpy as np
import pytest
from scipy import stats

from iattention.experiments.stats import welch_difference


def test_welch_interval_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(10, 1, 4), rng.normal(11, 3, 5)
    d = welch_difference(a, b)
    ref = stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    assert d.mean == pytest.approx(b.mean() - a.mean())
    assert (d.low, d.high) == (pytest.approx(ref.low), pytest.approx(ref.high))
    assert not welch_difference([1.0], [2.0, 3.0]).has_ci  # one seed: no interval


def test_zero_spread_gives_no_interval_and_no_verdict():
    from iattention.experiments.stats import verdict

    d = welch_difference([10, 10, 10], [16, 16, 16])
    assert not d.has_ci and d.undefined == "no spread in either arm"
    assert verdict(d, d).startswith("interval undefined (no spread in either arm)")
    one_sided = welch_difference([10, 10, 10], [15, 16, 17])  # spread in one arm: Welch is defined
    ref = stats.ttest_ind([15, 16, 17], [10, 10, 10], equal_var=False).confidence_interval(0.95)
    assert (one_sided.low, one_sided.high) == (pytest.approx(ref.low), pytest.approx(ref.high))


def test_paired_interval_tost_and_holm_match_their_definitions():
    from iattention.experiments.stats import holm, paired_difference

    rng = np.random.default_rng(1)
    a = rng.normal(200, 5, 5)
    b = a + rng.normal(-2, 0.5, 5)  # strongly correlated with a, as arms sharing seeds are
    d = paired_difference(dict(enumerate(a)), dict(enumerate(b)))
    ref = stats.ttest_rel(b, a)
    assert d.kind == "paired" and d.mean == pytest.approx((b - a).mean())
    assert (d.low, d.high) == (pytest.approx(ref.confidence_interval(0.95).low),
                               pytest.approx(ref.confidence_interval(0.95).high))
    assert d.p == pytest.approx(ref.pvalue)
    # TOST at alpha 0.05 rejects exactly when the 90% interval lies inside (-margin, margin)
    lo90, hi90 = d.interval(0.90)
    for margin in (abs(lo90) * 0.99, max(abs(lo90), abs(hi90)) * 1.01):
        assert (d.tost_p(margin) < 0.05) == (-margin < lo90 and hi90 < margin)
    # only shared seeds pair; Welch over the same data is far wider
    assert paired_difference({0: 1.0, 1: 2.0, 5: 9.0}, {0: 1.5, 1: 2.7, 7: 0.0}).n_a == 2
    assert welch_difference(a, b).high - welch_difference(a, b).low > 5 * (d.high - d.low)
    # Holm: sorted p times (m - rank), running maximum, capped at 1; nan is outside the family
    assert holm([0.01, 0.04, 0.03, float("nan"), 0.5]) == pytest.approx([0.04, 0.09, 0.09, float("nan"), 0.5],
                                                                          nan_ok=True)
