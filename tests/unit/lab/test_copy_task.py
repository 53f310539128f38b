"""Unit tests of iattention.lab.copy_task."""

import math

from iattention.lab import run_copy


def test_copy_matches_closed_form():
    r = run_copy(ns=(2, 64), deltas=[0.0, 2.0, 8.0])
    assert r.max_abs_alpha_error < 1e-12 and r.bound_holds
    assert math.isclose(r.alpha_measured[64][0], 1 / 64, rel_tol=1e-12)  # no margin: no copying
    assert r.alpha_measured[2][-1] > 0.999
