"""A report's numbers (`experiments/comparisons.py`): every arm against the reference at each head count, paired
by seed; Holm over the declared family only; a row on the pre-declared seeds beside a row that includes
added ones, adjusted as it would have been; reached pairs and the reference's bar."""

import pytest

from iattention.experiments.comparisons import comparisons, reach_targets, reached_pairs
from iattention.experiments.results import Run, group
from iattention.experiments.stats import compare, holm

CFG = {"train": {"batch_size": 4}, "model": {"block_size": 8}}


def _run(arm, heads, seed, best):
    evals = [{"step": 0, "val_ppl": 100.0}, {"step": 10, "val_ppl": best}]
    return Run(None, {"config": CFG, "n_head": heads, "seed": seed, "best_val_ppl": best, "best_epoch": 1,
                      "epochs_run": 2}, evals, arm)


BEST = {("ref", 2): [20.0, 21.0, 19.5, 20.5], ("a", 2): [19.0, 20.5, 19.0, 19.8], ("b", 2): [22.0, 23.5, 21.0, 22.0],
        ("ref", 4): [18.0, 18.5, 17.5, 18.2], ("a", 4): [18.1, 18.3, 17.9, 18.0]}
RUNS = [_run(arm, h, s, v) for (arm, h), vs in BEST.items() for s, v in enumerate(vs)]


def _rows(**kw):
    groups = group(RUNS)
    return comparisons(groups, set(groups), ["ref", "a", "b"], "ref", 2.0, kw.pop("added", {}), **kw)


def test_each_arm_is_compared_with_the_reference_at_each_head_count_paired_by_seed():
    rows = _rows()
    assert [(r["arm"], r["heads"]) for r in rows] == [("a", 2), ("a", 4), ("b", 2)]  # b has no 4-head runs
    row = rows[0]
    want = compare(dict(enumerate(BEST[("ref", 2)])), dict(enumerate(BEST[("a", 2)])))
    assert row["ppl"].mean == pytest.approx(want.mean) and row["p"] == pytest.approx(want.p)
    assert row["ref_mean"] == pytest.approx(sum(BEST[("ref", 2)]) / 4)
    assert row["margin"] == pytest.approx(0.02 * row["ref_mean"])
    assert row["reached_pairs"] == (4, 4)  # each of a's runs at or under its seed's reference best
    assert rows[2]["reached_pairs"] == (0, 4)


def test_holm_adjusts_over_the_family_only():
    rows = _rows(family=["a"])
    family = [r for r in rows if r["arm"] == "a"]
    for key in ("p", "tost"):
        assert [r[f"{key}_holm"] for r in family] == pytest.approx(holm([r[key] for r in family]))
    outside = next(r for r in rows if r["arm"] == "b")
    assert not outside["in_family"] and outside["p_holm"] == outside["p"]  # exploratory: unadjusted
    every = _rows()
    assert [r["p_holm"] for r in every] == pytest.approx(holm([r["p"] for r in every]))


def test_added_seeds_give_a_row_on_the_declared_seeds_adjusted_in_its_place():
    rows = _rows(added={"a": {"2": [3]}})
    a2 = [r for r in rows if (r["arm"], r["heads"]) == ("a", 2)]
    assert [r["subset"] for r in a2] == ["all", "declared"]
    declared = a2[1]
    want = compare(dict(enumerate(BEST[("ref", 2)][:3])), dict(enumerate(BEST[("a", 2)][:3])))
    assert declared["ppl"].mean == pytest.approx(want.mean) and declared["n_b"] == 3
    main = [r for r in rows if r["subset"] == "all"]
    ps = [r["p"] for r in main]
    ps[0] = declared["p"]
    assert declared["p_holm"] == pytest.approx(holm(ps)[0])


def test_the_bar_is_the_reference_s_mean_best_and_pairs_are_matched_by_seed():
    groups = group(RUNS)
    assert reach_targets(groups, "ref") == {2: pytest.approx(20.25), 4: pytest.approx(18.05)}
    ref = [_run("ref", 2, s, v) for s, v in ((0, 10.0), (1, 20.0))]
    arm = [_run("a", 2, s, v) for s, v in ((1, 15.0), (2, 1.0))]  # seed 2: no reference run to pair with
    assert reached_pairs(ref, arm) == (1, 1)
