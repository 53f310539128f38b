"""Unit tests of iattention.lab.subspace."""

from iattention.lab import run_subspace


def test_subspace_exact_when_orthogonal_and_broken_when_tilted():
    r = run_subspace(trials=50)
    assert r.orthogonal_error < 1e-12
    i = len(r.angles) // 2  # 45 degrees
    assert r.tilted_error[i] > 0.1
    assert all(abs(m - p) < 1e-12 for m, p in zip(r.tilted_error, r.tilted_predicted))
