"""Unit tests of iattention.lab.variance."""

from iattention.lab import VarianceSetting, run_multi_head, run_single_head


def test_single_head_variance_matches_prediction():
    r = run_single_head(VarianceSetting(samples=20000))
    se = 0.01  # Monte-Carlo standard error of a variance near 0.45 with 20k samples is ~0.003
    assert abs(r.stats.var_all - r.predicted_var) < 3 * se
    assert r.stats.var_all > 0.3  # c swings between v_a and v_b


def test_multi_head_reduces_variance_and_identical_heads_do_not():
    r = run_multi_head(VarianceSetting(samples=20000))
    assert r.reduction_pos >= 10
    assert r.reduction_all > 3
    assert abs(r.identical_ratio - 1.0) < 1e-12
    broken = run_multi_head(VarianceSetting(samples=20000, eps=0.1))  # noisy keys: heads stop copying
    assert broken.reduction_pos < 10
