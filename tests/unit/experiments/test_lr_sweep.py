"""Learning-rate sweeps inside a study (`experiments/lr_sweep.py`): arms that differ only in `optim.lr` form a
family per head count, each rate summarised over the seeds run at every rate, named after the arm at the
study's rate; the table marks the best rate."""

import pytest

from iattention.experiments.lr_sweep import lr_families, lr_table
from iattention.experiments.results import Run


def _run(arm, keys, lr, seed, best, heads=2, init="gpt2"):
    cfg = {"optim": {"lr": lr}, "model": {"init": init, "attention": "canonical"}, "train": {"seed": seed}}
    return Run(None, {"config": cfg, "n_head": heads, "seed": seed, "best_val_ppl": best}, [], arm, keys)


BASE = ("model.attention",)
LR = ("model.attention", "optim.lr")
RUNS = [
    _run("canonical", BASE, 1e-3, 0, 20.0), _run("canonical", BASE, 1e-3, 1, 22.0),
    _run("canonical-lr2x", LR, 2e-3, 0, 18.0), _run("canonical-lr2x", LR, 2e-3, 1, 19.0),
    _run("canonical-lr2x", LR, 2e-3, 2, 5.0),  # a seed the study rate lacks: left out of the comparison
    _run("canonical-matched", BASE + ("model.init",), 1e-3, 0, 40.0, init="matched"),  # another family: one rate
]


def test_arms_that_differ_only_in_lr_are_one_family_over_their_common_seeds():
    families = lr_families(RUNS, study_lr=1e-3)
    assert len(families) == 1
    f = families[0]
    assert (f.name, f.n_head, f.seeds) == ("canonical", 2, [0, 1])
    assert sorted(f.by_lr) == [1e-3, 2e-3]
    assert {r.arm for r in f.by_lr[1e-3]} == {"canonical"}  # the matched init is another family
    assert f.best_val_ppl(2e-3)[0] == pytest.approx(18.5)  # seed 2's 5.0 not counted
    assert f.best_lr == 2e-3


def test_each_head_count_is_its_own_family_and_one_rate_is_none():
    more = RUNS + [_run("canonical", BASE, 1e-3, 0, 30.0, heads=4)]
    assert [(f.name, f.n_head) for f in lr_families(more, 1e-3)] == [("canonical", 2)]  # 4 heads: one rate


def test_the_table_has_a_column_per_multiplier_and_marks_the_best():
    lines = lr_table(lr_families(RUNS, 1e-3), 1e-3)
    assert "lr 1× (0.001)" in lines[0] and "lr 2× (0.002)" in lines[0]
    row = [c.strip() for c in lines[2].strip("|").split("|")]
    assert row[:3] == ["canonical", "2", "0, 1"]
    assert row[3].startswith("21.00") and row[4].startswith("**18.50") and row[-1] == "2×"
