"""Lab: predictions hold within Monte-Carlo error, and fail when their conditions are broken."""

import json
import math
import subprocess
import sys

from iattention.lab import VarianceSetting, run_average, run_copy, run_multi_head, run_single_head, run_subspace


def test_copy_matches_closed_form():
    r = run_copy(ns=(2, 64), deltas=[0.0, 2.0, 8.0])
    assert r.max_abs_alpha_error < 1e-12 and r.bound_holds
    assert math.isclose(r.alpha_measured[64][0], 1 / 64, rel_tol=1e-12)  # no margin: no copying
    assert r.alpha_measured[2][-1] > 0.999


def test_subspace_exact_when_orthogonal_and_broken_when_tilted():
    r = run_subspace(trials=50)
    assert r.orthogonal_error < 1e-12
    i = len(r.angles) // 2  # 45 degrees
    assert r.tilted_error[i] > 0.1
    assert all(abs(m - p) < 1e-12 for m, p in zip(r.tilted_error, r.tilted_predicted))


def test_average_formula_and_bound():
    r = run_average()
    assert r.max_abs_alpha_error < 1e-12
    assert all(e <= b + 1e-15 for e, b in zip(r.error, r.bound))
    assert all(abs(e - x) < 1e-12 for e, x in zip(r.error, r.error_exact))
    assert r.error[0] > 1.0 and r.error[-1] < 1e-4  # beta = 0: plain mean of all values, far from m


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


def test_cli_lab_all_json(tmp_path):
    res = subprocess.run([sys.executable, "-m", "iattention", "lab", "all", "--json", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert set(data) == {"copy", "subspace", "average", "single-head", "multi-head"}
    for name in data:
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
        assert json.loads((tmp_path / f"{name}.json").read_text())["experiment"] == name
