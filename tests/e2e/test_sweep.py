"""End-to-end tests: sweep."""

import json
import os

import pytest
import yaml

from helpers import tiny_overrides, write_corpus
from iattention.cli import main
from iattention.config import override, parse_override
from iattention.errors import UserError


@pytest.mark.slow
def test_sweep_refuses_a_finished_run_of_another_config(tmp_path):
    """A finished run is skipped only if it is the run asked for; else one line names the differing key."""
    from helpers import tiny_overrides, write_corpus
    from iattention.experiments.arms import resolve_arms
    from iattention.experiments.sweep import grid, run_sweep

    paths = write_corpus(tmp_path)
    base = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1, "train.tensorboard": "false"})
    specs = grid(resolve_arms(["standard"]), [1], [0])
    first = run_sweep("tiny", specs, tmp_path / "sw", base, log=lambda *_: None)
    again = run_sweep("tiny", specs, tmp_path / "sw", base + ["train.threads=1"], log=lambda *_: None)
    assert again[0]["_status"] == "skipped (finished)" and again[0]["best_val_ppl"] == first[0]["best_val_ppl"]
    with pytest.raises(UserError, match=r"another config \(optim.lr: 0.003 there vs 0.05 here\)"):
        run_sweep("tiny", specs, tmp_path / "sw", base + ["optim.lr=0.05"], log=lambda *_: None)
    with pytest.raises(UserError, match="model.block_size: 32 there vs 64 here"):
        run_sweep("cpu-quick", specs, tmp_path / "sw", base, log=lambda *_: None)
    assert json.loads((tmp_path / "sw" / "standard-h1-s0" / "arm.json").read_text())["arm"] == "standard"


@pytest.mark.slow
def test_sweep_compares_the_resolved_vocabulary_not_the_override_as_typed(tmp_path):
    """A run trained with model.vocab_size=512 is not the run a sweep with the automatic vocabulary (256
    for the byte tokenizer) asks for, and the refusal leaves the run's arm.json as it was."""
    from helpers import tiny_overrides, write_corpus
    from iattention.experiments.arms import resolve_arms
    from iattention.experiments.sweep import grid, run_sweep

    base = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache", **{"train.epochs": 1})
    specs = grid(resolve_arms(["standard"]), [1], [0])
    run_sweep("tiny", specs, tmp_path / "sw", base + ["model.vocab_size=512"], log=lambda *_: None)
    arm_json = (tmp_path / "sw" / "standard-h1-s0" / "arm.json").read_bytes()
    with pytest.raises(UserError, match="model.vocab_size: 512 there vs 256 here"):
        run_sweep("tiny", specs, tmp_path / "sw", base, log=lambda *_: None)
    assert (tmp_path / "sw" / "standard-h1-s0" / "arm.json").read_bytes() == arm_json
    again = run_sweep("tiny", specs, tmp_path / "sw", base + ["model.vocab_size=512"], log=lambda *_: None)
    assert again[0]["_status"] == "skipped (finished)"


@pytest.mark.slow
def test_sweep_through_submitit_local_executor_trains_skips_and_logs(tmp_path, capsys):
    """--launcher submitit: each run is a submitit job (its local executor here, no sbatch), logs under
    <out>/submitit/; the results are the runs' own; a rerun skips the finished runs and submits nothing."""
    pytest.importorskip("submitit")
    from helpers import tiny_overrides, write_corpus
    from iattention.cli import main

    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache", **{"train.epochs": 1})
    out = tmp_path / "sw"
    args = ["sweep", "--preset", "tiny", "--arms", "standard,canonical", "--heads", "2", "--seeds", "0",
            "--out", str(out), "--launcher", "submitit", "--slurm-time", "10", *ov]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "launcher: submitit (local executor)" in text and text.count("submitted") == 2
    for name in ("standard-h2-s0", "canonical-h2-s0"):
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["epochs_run"] == 1 and summary["attention"] == name.split("-")[0]
    logs = list((out / "submitit").rglob("*_log.err"))
    assert len(logs) == 2
    assert main(args) == 0
    again = capsys.readouterr().out
    assert "submitted" not in again and again.count("skipped (finished)") == 2
    assert len(list((out / "submitit").rglob("*_log.err"))) == 2  # nothing submitted again
    # cluster flags without the launcher are a one-line mistake
    assert main(["sweep", "--preset", "tiny", "--out", str(tmp_path / "x"), "--gpus-per-run", "1", *ov]) == 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("notours")
    paths = write_corpus(root)
    return dict(root=root, ov=tiny_overrides(paths, root / "cache", **{"train.epochs": 1}))


@pytest.mark.slow
def test_a_sweep_skips_a_run_another_sweep_took_between_look_and_start(corpus, tmp_path, monkeypatch):
    """Before: two `sweep --jobs 2` on one folder both exited 2 ("in use"): a run looked free, then the other
    sweep's child took its lock before this one's did. The lost race is simulated: the look says free, the
    lock is held (by this test process)."""
    from iattention.experiments import sweep as sweep_mod
    from iattention.experiments.arms import resolve_arms
    from iattention.utils.lock import RunLock

    spec = sweep_mod.grid(resolve_arms(["standard"], None), [2], [0])[0]
    out = tmp_path / "sweep"
    lock = RunLock(out / spec.name).acquire()
    looks = []
    real_holder = sweep_mod.holder

    def first_look_free(path):
        looks.append(path)
        return None if len(looks) == 1 else real_holder(path)

    monkeypatch.setattr(sweep_mod, "holder", first_look_free)
    try:
        summary = sweep_mod.run_one(spec, "tiny", out, corpus["ov"], threads=1, quiet=True)
    finally:
        lock.release()
    assert summary["_status"] == f"skipped (running, pid {os.getpid()})"


# ------------------------------------------------------------------ values that cross a process boundary
HOSTILE_VALUES = ["/d/D #2", "/d/a: b", "!tag", "[x", "{y", "trailing ", " leading", "naïve—ü", "a\nb", "it's \"q\"",
                  "\\back", "#", "", "-", "~", "null", "yes", "1e3", "0x10", "\udcff"]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_an_override_made_from_a_value_reads_back_as_that_value(value):
    """Every override the tool builds for a child process (a sweep's `iattn train`) is read back by the child
    as exactly the value given: never as a YAML comment, mapping, tag, list, another type or a stripped string."""
    key, text = override("data.data_dir", value).split("=", 1)
    assert key == "data.data_dir"
    assert parse_override(f"{key}={text}") == {"data": {"data_dir": value}}


@pytest.mark.slow
def test_a_sweep_trains_on_the_data_folder_named_not_a_prefix_of_it(tmp_path):
    """`--data-dir "D #2: [x] {y} ü "` reached the sweep's children as a YAML override, where ' #' began a
    comment: they trained on D. Each child must record (and read) the folder exactly as given."""
    hostile = tmp_path / "D #2: [x] {y} ü "
    for folder, seed in ((hostile, 0), (tmp_path / "D", 1)):  # D: a decoy holding other text
        (folder / "wikitext-2-v1").mkdir(parents=True)
        paths = write_corpus(folder, seed=seed)
        for split, p in paths.items():
            os.replace(p, folder / "wikitext-2-v1" / f"wiki.{split}.tokens")
    out = tmp_path / "sw"
    rc = main(["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "2", "--seeds", "0", "--out", str(out),
               "--data-dir", str(hostile), "train.epochs=1", "train.threads=1", f"data.cache_dir={tmp_path / 'cache'}"])
    assert rc == 0
    config = yaml.safe_load((out / "standard-h2-s0" / "config.yaml").read_text())
    assert config["data"]["data_dir"] == str(hostile)
