"""Statistics (`experiments/stats.py`) against textbook formulas and scipy's own tests, written here
independently: Welch and paired intervals, TOST equivalence, Holm's adjustment, and the verdict words."""

import math

import numpy as np
import pytest
from scipy import stats
from scipy import stats as sps

from iattention.experiments.stats import (
    ALPHA,
    Difference,
    compare,
    holm,
    mean_std,
    paired_difference,
    verdict,
    welch_difference,
)


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


NAN = float("nan")
A = [10.0, 12.0, 11.0, 14.0]
B = [13.0, 12.5, 16.0, 15.0, 14.5]


def test_alpha_is_five_percent():
    assert ALPHA == 0.05


def test_mean_std_is_the_sample_mean_and_sample_sd():
    m, s = mean_std([1, 2, 3, 4])
    assert m == 2.5 and s == pytest.approx(math.sqrt(5 / 3))  # sum of squares 5, n - 1 = 3
    assert isinstance(m, float) and isinstance(s, float)
    m1, s1 = mean_std([7])
    assert m1 == 7.0 and math.isnan(s1)
    assert mean_std([2, 4]) == (3.0, pytest.approx(math.sqrt(2)))


def test_welch_matches_scipy():
    d = welch_difference(A, B)
    ref = sps.ttest_ind(B, A, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert d.mean == pytest.approx(np.mean(B) - np.mean(A))
    assert (d.low, d.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d.df == pytest.approx(ref.df) and d.se == pytest.approx(d.mean / ref.statistic)
    assert (d.n_a, d.n_b, d.kind, d.undefined) == (4, 5, "welch", "")
    assert d.p == pytest.approx(ref.pvalue)
    ci90 = ref.confidence_interval(0.90)
    assert d.interval(0.90) == (pytest.approx(ci90.low), pytest.approx(ci90.high))
    d99 = welch_difference(A, B, level=0.99)
    ci99 = ref.confidence_interval(0.99)
    assert (d99.low, d99.high) == (pytest.approx(ci99.low), pytest.approx(ci99.high))
    assert isinstance(d.low, float) and isinstance(d.df, float)


def test_welch_undefined_cases():
    one = welch_difference([1.0], [2.0, 3.0])
    assert one.mean == pytest.approx(1.5) and (one.n_a, one.n_b) == (1, 2)
    assert math.isnan(one.low) and math.isnan(one.high) and one.undefined == "fewer than 2 seeds in an arm"
    other = welch_difference([1.0, 3.0], [2.0])
    assert other.undefined == "fewer than 2 seeds in an arm" and other.mean == pytest.approx(0.0)
    flat = welch_difference([1.0, 1.0], [2.0, 2.0, 2.0])
    assert flat.mean == 1.0 and flat.undefined == "no spread in either arm" and (flat.n_a, flat.n_b) == (2, 3)
    assert math.isnan(flat.high) and not flat.has_ci and flat.kind == "welch"
    # two samples in each arm are enough
    assert welch_difference([1.0, 2.0], [3.0, 5.0]).has_ci


def test_paired_matches_scipy():
    a = {0: 200.0, 1: 190.0, 2: 210.0, 3: 205.0, 9: 1.0}
    b = {0: 197.0, 1: 189.0, 2: 206.5, 3: 204.0, 8: 5.0}
    d = paired_difference(a, b)
    x, y = [a[s] for s in range(4)], [b[s] for s in range(4)]
    ref = sps.ttest_rel(y, x)
    ci = ref.confidence_interval(0.95)
    assert (d.kind, d.n_a, d.n_b, d.undefined) == ("paired", 4, 4, "")
    assert d.mean == pytest.approx(np.mean(np.subtract(y, x)))
    assert (d.low, d.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d.df == 3 and d.se == pytest.approx(d.mean / ref.statistic)
    assert d.p == pytest.approx(ref.pvalue)
    d80 = paired_difference(a, b, level=0.8)
    ci80 = ref.confidence_interval(0.8)
    assert (d80.low, d80.high) == (pytest.approx(ci80.low), pytest.approx(ci80.high))


def test_paired_undefined_cases():
    one = paired_difference({0: 1.0, 1: 5.0}, {0: 3.0, 2: 0.0})
    assert one.mean == 2.0 and (one.n_a, one.n_b) == (1, 1) and one.kind == "paired"
    assert one.undefined == "fewer than 2 shared seeds" and math.isnan(one.low) and math.isnan(one.high)
    none = paired_difference({0: 1.0}, {1: 2.0})
    assert math.isnan(none.mean) and (none.n_a, none.n_b) == (0, 0) and none.kind == "paired"
    same = paired_difference({0: 1.0, 1: 5.0}, {0: 3.0, 1: 7.0})
    assert same.mean == 2.0 and same.undefined == "every seed's difference is the same"
    assert (same.n_a, same.n_b, same.kind) == (2, 2, "paired") and math.isnan(same.high)
    assert paired_difference({0: 1.0, 1: 5.0}, {0: 3.0, 1: 8.0}).has_ci


def test_compare_pairs_from_two_shared_seeds_else_welch():
    a, b = {0: 1.0, 1: 2.0, 2: 4.0}, {0: 1.5, 1: 2.9, 3: 9.0}
    d = compare(a, b)
    assert d.kind == "paired" and d.n_a == 2
    assert d.mean == pytest.approx(((1.5 - 1.0) + (2.9 - 2.0)) / 2)
    lone = compare({0: 1.0, 1: 2.0, 2: 4.0}, {0: 1.5, 5: 2.9, 6: 9.0})  # one shared seed: Welch over all
    ref = sps.ttest_ind([1.5, 2.9, 9.0], [1.0, 2.0, 4.0], equal_var=False).confidence_interval(0.9)
    assert lone.kind == "welch" and (lone.n_a, lone.n_b) == (3, 3)
    assert compare({0: 1.0, 1: 2.0, 2: 4.0}, {0: 1.5, 5: 2.9, 6: 9.0}, level=0.9).low == pytest.approx(ref.low)
    assert compare(a, b, level=0.9).high == pytest.approx(
        sps.ttest_rel([1.5, 2.9], [1.0, 2.0]).confidence_interval(0.9).high)


def test_has_ci_and_excludes_zero():
    def diff(low, high):
        return Difference(0.5 * (low + high), low, high, 3, 3)

    assert diff(0.1, 2.0).excludes_zero() and diff(-2.0, -0.1).excludes_zero()
    assert not diff(-1.0, 1.0).excludes_zero()
    assert not diff(0.0, 1.0).excludes_zero() and not diff(-1.0, 0.0).excludes_zero()  # touching 0: not excluded
    assert diff(-1.0, 1.0).has_ci and not Difference(1.0, NAN, NAN, 1, 1).has_ci
    assert not Difference(1.0, NAN, NAN, 1, 1).excludes_zero()
    assert not Difference(1.0, -math.inf, 2.0, 1, 1).has_ci
    d = Difference(1.0, NAN, NAN, 1, 1)
    assert math.isnan(d.p) and math.isnan(d.tost_p(1.0))
    assert all(math.isnan(x) for x in d.interval(0.9))
    assert (d.kind, d.undefined) == ("welch", "") and math.isnan(d.se) and math.isnan(d.df)


def test_tost_matches_two_one_sided_scipy_tests():
    rng = np.random.default_rng(3)
    x = rng.normal(0.3, 1.0, 8)
    a = {s: 100.0 for s in range(8)}
    b = {s: 100.0 + x[s] for s in range(8)}
    d = paired_difference(a, b)
    for margin in (0.2, 0.8, 1.5, 3.0):
        lower = sps.ttest_1samp(x, -margin, alternative="greater").pvalue  # H0: mean <= -margin
        upper = sps.ttest_1samp(x, margin, alternative="less").pvalue  # H0: mean >= +margin
        assert d.tost_p(margin) == pytest.approx(max(lower, upper), rel=1e-6), margin
    assert math.isnan(d.tost_p(0.0)) and math.isnan(d.tost_p(-1.0)) and math.isnan(d.tost_p(NAN))
    # a negative mean: the other one-sided test binds
    neg = paired_difference(b, a)
    assert neg.tost_p(0.8) == pytest.approx(max(sps.ttest_1samp(-x, -0.8, alternative="greater").pvalue,
                                                sps.ttest_1samp(-x, 0.8, alternative="less").pvalue), rel=1e-6)
    assert neg.p == pytest.approx(sps.ttest_1samp(-x, 0.0).pvalue)


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    got = holm([NAN, 0.01, 0.02])
    assert math.isnan(got[0]) and got[1:] == pytest.approx([0.02, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert holm([0.3, 0.1]) == pytest.approx([0.3, 0.2])
    assert holm([]) == [] and math.isnan(holm([NAN])[0])
    assert holm([0.04]) == [0.04]


def _d(mean, low, high, undefined=""):
    return Difference(mean, low, high, 3, 3, undefined, se=abs(mean) / 3 + 0.1, df=4.0)


LOWER = _d(-5.0, -8.0, -2.0)  # excludes 0, below
HIGHER = _d(5.0, 2.0, 8.0)
NONE = _d(0.5, -1.0, 2.0)
NO_CI = _d(1.0, NAN, NAN, "fewer than 2 seeds in an arm")


def test_verdict_words_for_the_perplexity_difference():
    assert verdict(NO_CI, LOWER) == "interval undefined (fewer than 2 seeds in an arm): no verdict"
    assert verdict(LOWER, LOWER) == "canonical lower perplexity; faster to best"
    assert verdict(HIGHER, HIGHER, name="identity_q") == "identity_q higher perplexity; slower to best"
    assert verdict(NONE, NONE) == "no perplexity difference detected; no difference in epoch of best"
    # Holm-adjusted p decides instead of the interval
    assert verdict(NONE, NONE, p_adj=0.01).startswith("canonical higher perplexity;")
    assert verdict(LOWER, NONE, p_adj=0.05).startswith("neither a difference nor equivalence survives Holm "
                                                      "(unadjusted: lower (95% interval excludes 0))")
    assert verdict(LOWER, NONE, p_adj=0.049).startswith("canonical lower perplexity;")
    # equivalence
    assert verdict(NONE, NONE, tost_adj=0.01, margin=3.0).startswith("level (within ±3.00);")
    assert verdict(NONE, NONE, tost_adj=0.05, margin=3.0).startswith(
        "no perplexity difference detected, equivalence not shown;")
    assert verdict(LOWER, NONE, tost_adj=0.01, margin=12.5).startswith(
        "canonical lower perplexity (but within ±12.50);")
    assert verdict(LOWER, NONE, tost_adj=0.2, margin=12.5).startswith("canonical lower perplexity;")


def test_verdict_unadjusted_equivalence_is_named_when_holm_removes_it():
    tight = Difference(0.1, -0.2, 0.4, 5, 5, se=0.1, df=10.0)
    assert tight.tost_p(1.0) < ALPHA and tight.tost_p(0.15) > ALPHA
    assert verdict(tight, tight, p_adj=0.5, margin=1.0).startswith(
        "neither a difference nor equivalence survives Holm (unadjusted: within ±1.00 (90% interval));")
    assert verdict(tight, tight, p_adj=0.5, margin=0.15).startswith("no perplexity difference detected;")
    assert verdict(tight, tight, margin=1.0).startswith("no perplexity difference detected;")  # no Holm: no list
    both = Difference(-2.0, -3.0, -1.0, 5, 5, se=0.4, df=10.0)
    assert verdict(both, both, p_adj=0.2, margin=5.0).startswith(
        "neither a difference nor equivalence survives Holm (unadjusted: lower (95% interval excludes 0), "
        "within ±5.00 (90% interval));")


def test_verdict_words_for_the_epoch_of_best():
    assert verdict(NONE, None) == "no perplexity difference detected; epoch interval undefined (no data)"
    assert verdict(NONE, NO_CI) == ("no perplexity difference detected; epoch interval undefined "
                                    "(fewer than 2 seeds in an arm)")
    assert verdict(NONE, LOWER, censored=1) == ("no perplexity difference detected; epoch of best censored in "
                                                "1 run (lower bound): no epoch verdict")
    assert verdict(NONE, None, censored=3).endswith("censored in 3 runs (lower bound): no epoch verdict")
    assert verdict(NONE, HIGHER).endswith("; slower to best")


def test_one_value_or_no_shared_seed_gives_nan_without_numpy_warnings():
    """Undefined spreads are returned as nan on purpose, not computed (numpy would warn: 'Degrees of
    freedom <= 0', 'Mean of empty slice')."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(mean_std([3.0])[1])
        assert math.isnan(paired_difference({0: 1.0}, {1: 2.0}).mean)
    same = paired_difference({0: 1.0, 1: 5.0}, {0: 3.0, 1: 7.0})
    assert math.isnan(same.low) and not same.has_ci


def test_defaults_are_95_percent_and_holm_caps_at_one():
    a, b = {0: 1.0, 1: 2.0, 2: 4.0}, {0: 1.5, 1: 2.9, 2: 4.2}
    ci = sps.ttest_rel([1.5, 2.9, 4.2], [1.0, 2.0, 4.0]).confidence_interval(0.95)
    assert (compare(a, b).low, compare(a, b).high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # 1.2 and 0.7, capped, running maximum


def test_verdict_plural_and_epoch_direction_near_zero():
    assert verdict(NONE, None, censored=2).endswith("censored in 2 runs (lower bound): no epoch verdict")
    later = Difference(0.5, 0.2, 0.8, 3, 3, se=0.1, df=4.0)  # half an epoch later, interval above 0
    assert verdict(NONE, later).endswith("; slower to best")
    sooner = Difference(-0.5, -0.8, -0.2, 3, 3, se=0.1, df=4.0)
    assert verdict(NONE, sooner).endswith("; faster to best")
