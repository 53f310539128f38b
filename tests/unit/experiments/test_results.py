"""Reading finished runs (`experiments/results.py`): each run folder under the given folders, its arm, the
same run merged once, two different runs under one name or two studies refused naming what differs; the
tokens a run took to reach a perplexity, interpolated in log perplexity; runs grouped by heads then arm."""

import json
import math

import pytest

from iattention.checkpoint.run_folder import METRICS, RunFolder
from iattention.config import load_config
from iattention.errors import UserError
from iattention.experiments.results import Run, find_runs, group


def _run(folder, attention="standard", heads=2, seed=0, arm=None, ppls=(9.0, 7.0), extra=()):
    cfg = json.loads(json.dumps(load_config("tiny", None, [f"model.attention={attention}", f"model.n_head={heads}",
                                                           f"train.seed={seed}", *extra]).to_dict()))
    f = RunFolder(folder)
    f.path.mkdir(parents=True)
    f.write_config(cfg)
    f.write_records(METRICS, [{"kind": "epoch", "step": 5 * (i + 1), "epoch": i + 1, "val_ppl": p}
                              for i, p in enumerate(ppls)])
    best = min(range(len(ppls)), key=lambda i: ppls[i])
    f.write_summary({"config": cfg, "attention": attention, "n_head": heads, "seed": seed,
                     "best_val_ppl": ppls[best], "best_epoch": best + 1, "epochs_run": len(ppls)})
    if arm:
        f.write_arm({"arm": arm, "overrides": [f"model.attention={attention}"]})
    return f.path


def test_every_finished_run_under_the_folders_is_found_with_its_arm(tmp_path):
    _run(tmp_path / "a" / "standard-h2-s0")
    _run(tmp_path / "a" / "deep" / "canonical-h2-s0", attention="canonical", arm="canon")
    (tmp_path / "a" / "unfinished").mkdir()
    runs = find_runs([tmp_path / "a"])
    assert sorted((r.arm, r.arm_keys) for r in runs) == [("canon", ("model.attention",)),
                                                         ("standard", ("model.attention",))]


def test_the_same_run_in_two_folders_counts_once_and_two_different_runs_under_one_name_are_refused(tmp_path):
    _run(tmp_path / "a" / "r")
    _run(tmp_path / "b" / "r")
    assert len(find_runs([tmp_path / "a", tmp_path / "b"])) == 1
    _run(tmp_path / "c" / "r", extra=["optim.lr=0.01"], arm="standard")
    with pytest.raises(UserError) as err:
        find_runs([tmp_path / "a", tmp_path / "c"])
    assert "different study configs" in str(err.value)  # the lr is no arm's key: another study


def test_two_runs_of_one_arm_heads_and_seed_that_differ_name_both_folders(tmp_path):
    _run(tmp_path / "a" / "r", arm="x")
    _run(tmp_path / "b" / "r", attention="canonical", arm="x")  # arm x sets the attention: same study
    with pytest.raises(UserError) as err:
        find_runs([tmp_path / "a", tmp_path / "b"])
    assert str(tmp_path / "a" / "r") in str(err.value) and str(tmp_path / "b" / "r") in str(err.value)


def test_no_finished_run_or_no_folder_says_which(tmp_path):
    with pytest.raises(UserError, match="no finished runs"):
        find_runs([tmp_path])
    with pytest.raises(UserError, match=str(tmp_path / "nope")):
        find_runs([tmp_path / "nope"])


def test_tokens_to_reach_interpolates_in_log_perplexity():
    cfg = {"train": {"batch_size": 4}, "model": {"block_size": 8}}  # 32 tokens a step
    evals = [{"step": 0, "val_ppl": 400.0}, {"step": 10, "val_ppl": 100.0}, {"step": 20, "val_ppl": 25.0}]
    run = Run(None, {"config": cfg, "n_head": 1, "best_epoch": 2, "epochs_run": 2}, evals, "a")
    assert run.tokens_to_reach(50.0) == pytest.approx(32 * 15)  # 50 is halfway from 100 to 25 in log
    assert run.tokens_to_reach(100.0) == 32 * 10 and run.tokens_to_reach(1000.0) == 0.0
    assert run.tokens_to_reach(10.0) is None
    assert math.isclose(run.tokens_to_reach(200.0), 32 * 5)
    assert run.censored  # best at the last epoch run: a lower bound


def test_groups_are_ordered_by_heads_then_by_the_arms_first_appearance():
    def run(arm, heads):
        return Run(None, {"n_head": heads}, [], arm)

    runs = [run("b", 4), run("a", 2), run("b", 2), run("a", 4), run("b", 2)]
    grouped = group(runs)
    assert list(grouped) == [("b", 2), ("a", 2), ("b", 4), ("a", 4)]
    assert len(grouped[("b", 2)]) == 2


def test_a_llama_study_is_one_config_across_head_counts_unless_its_head_width_is_set():
    """A Llama run's d_head and rot as its n_head made them (n_embd / n_head) vary with the heads a sweep varies,
    and its n_kv_head is left out of the saved config where it equals n_head: runs at 2 and 4 heads with 2
    key/value heads are one study; a d_head, rot or key/value head count set otherwise stays a difference."""
    from iattention.config import load_config
    from iattention.experiments.results import _study_config

    def cfg(*ov):
        return load_config("llama-cpu", None, list(ov)).to_dict()

    assert _study_config(cfg("model.n_head=2")) == _study_config(cfg("model.n_head=4"))
    assert _study_config(cfg("model.n_head=2", "model.d_head=32")) != _study_config(cfg("model.n_head=4"))
    assert _study_config(cfg("model.n_head=4", "model.rot=32")) != _study_config(cfg("model.n_head=4"))
    assert _study_config(cfg("model.n_head=4", "model.n_kv_head=1")) != _study_config(cfg("model.n_head=4"))
    assert _study_config(cfg("model.n_head=4", "model.n_kv_head=4")) != _study_config(cfg("model.n_head=4"))


def test_how_a_run_compiled_is_not_part_of_its_study():
    """Runs compiled whole, by blocks, in another mode or not at all compute the same thing: one study."""
    from iattention.config import load_config
    from iattention.experiments.results import _study_config

    def cfg(*ov):
        return load_config("tiny", None, list(ov)).to_dict()

    eager = _study_config(cfg())
    assert eager == _study_config(cfg("train.compile=true", "train.compile_scope=blocks",
                                      "train.compile_mode=max-autotune"))
    assert eager != _study_config(cfg("optim.lr=1e-3"))
