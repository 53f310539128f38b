"""Unit tests of iattention.lab.average."""

from iattention.lab import run_average


def test_average_formula_and_bound():
    r = run_average()
    assert r.max_abs_alpha_error < 1e-12
    assert all(e <= b + 1e-15 for e, b in zip(r.error, r.bound))
    assert all(abs(e - x) < 1e-12 for e, x in zip(r.error, r.error_exact))
    assert r.error[0] > 1.0 and r.error[-1] < 1e-4  # beta = 0: plain mean of all values, far from m
