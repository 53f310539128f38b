"""Unit tests of iattention.experiments.sweep."""

import os

import pytest


def test_a_crashed_sweep_child_is_not_relayed_as_the_message():
    """Before: the message was the child's last stderr line, the last line of a traceback; and a child's own
    one-line error came out nested ("iattn: error: run ... failed (exit 2): iattn: error: ...")."""
    from iattention.experiments.sweep import _child_failure

    crash = "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: boom\n"
    message = _child_failure("standard-h2-s0", 1, crash)
    assert "boom" not in message and "crashed" in message
    mine = _child_failure("standard-h2-s0", 2, "iattn: error: train.seed must be < 2^63; e.g. train.seed=0\n")
    assert mine == "run standard-h2-s0 failed: train.seed must be < 2^63; e.g. train.seed=0"


def _finish(folder, val_ppl=5.0):
    """What a finished run leaves: one epoch's record, then summary.json (written last)."""
    from iattention.checkpoint.run_folder import METRICS

    folder.write_records(METRICS, [{"kind": "epoch", "step": 4, "epoch": 1, "val_ppl": val_ppl}])
    folder.write_summary({"config": folder.read_config(), "attention": "standard", "n_head": 2, "seed": 0,
                          "best_val_ppl": val_ppl, "best_epoch": 1, "epochs_run": 1})


def _started(out, spec):
    """A run folder as a run leaves it when killed after its first evaluation: config.yaml, a log, a
    checkpoint's place; no summary, no lock holder."""
    from iattention.checkpoint.run_folder import METRICS, RunFolder

    folder = RunFolder(out / spec.name)
    folder.path.mkdir(parents=True)
    folder.write_config({"model": {"n_head": spec.n_head}, "train": {"seed": spec.seed}})
    folder.write_records(METRICS, [{"kind": "epoch", "step": 4, "epoch": 1, "val_ppl": 9.0}])
    (folder / "last.safetensors").write_bytes(b"")
    return folder


@pytest.fixture
def one_run(tmp_path):
    """A one-run grid, its out folder, and a launcher that records each command and, as a training child
    would, finishes the run in the folder it was given."""
    from iattention.checkpoint.run_folder import RunFolder
    from iattention.experiments import sweep as sweep_mod
    from iattention.experiments.arms import resolve_arms

    spec = sweep_mod.grid(resolve_arms(["standard"], None), [2], [0])[0]
    launched = []

    def launch(cmd, quiet, name):
        launched.append(cmd)
        _finish(RunFolder(cmd[cmd.index("--out") + 1]), val_ppl=7.0)
        return 0, ""

    return dict(spec=spec, out=tmp_path / "sweep", launch=launch, launched=launched, run_one=sweep_mod.run_one)


def test_a_sweep_skips_a_finished_run_and_reports_its_summary(one_run):
    r = one_run
    folder = _started(r["out"], r["spec"])
    _finish(folder)
    summary = r["run_one"](r["spec"], "tiny", r["out"], [], threads=1, quiet=True, launch=r["launch"])
    assert summary["_status"] == "skipped (finished)" and summary["best_val_ppl"] == 5.0
    assert r["launched"] == []


def test_a_sweep_resumes_a_run_that_was_killed_before_its_summary(one_run):
    r = one_run
    folder = _started(r["out"], r["spec"])
    summary = r["run_one"](r["spec"], "tiny", r["out"], [], threads=1, quiet=True, launch=r["launch"])
    assert len(r["launched"]) == 1
    cmd = r["launched"][0]
    assert "--resume" in cmd and cmd[cmd.index("--out") + 1] == str(folder.path)
    assert summary["_status"].startswith("ran") and summary["best_val_ppl"] == 7.0


def test_a_sweep_skips_a_run_another_process_is_training(one_run):
    from iattention.utils.lock import RunLock

    r = one_run
    folder = _started(r["out"], r["spec"])
    lock = RunLock(folder.path).acquire()  # the training process's lock, held here
    try:
        summary = r["run_one"](r["spec"], "tiny", r["out"], [], threads=1, quiet=True, launch=r["launch"])
    finally:
        lock.release()
    assert summary["_status"] == f"skipped (running, pid {os.getpid()})"
    assert r["launched"] == []
    assert not folder.has_summary()
