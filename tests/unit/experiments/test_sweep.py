"""Unit tests of iattention.experiments.sweep (moved from tests/test_not_ours.py)."""

import os

import pytest

from helpers import tiny_overrides, write_corpus


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


def test_a_crashed_sweep_child_is_not_relayed_as_the_message():
    """Before: the message was the child's last stderr line, the last line of a traceback; and a child's own
    one-line error came out nested ("iattn: error: run ... failed (exit 2): iattn: error: ...")."""
    from iattention.experiments.sweep import _child_failure

    crash = "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: boom\n"
    message = _child_failure("standard-h2-s0", 1, crash)
    assert "boom" not in message and "crashed" in message
    mine = _child_failure("standard-h2-s0", 2, "iattn: error: train.seed must be < 2^63; e.g. train.seed=0\n")
    assert mine == "run standard-h2-s0 failed: train.seed must be < 2^63; e.g. train.seed=0"
