"""Unit tests of iattention.train.metrics."""

from __future__ import annotations

import json
import math
import os

from iattention.checkpoint.run_folder import METRICS, STEPS, RunFolder
from iattention.config import LoopConfig
from iattention.train.checkpointer import Start
from iattention.train.metrics import Metrics, Throughput
from iattention.train.state import TrainState


def test_metrics_write_both_logs_on_the_main_process_only(tmp_path):
    t = LoopConfig(tensorboard=False)
    for main in (True, False):
        folder = tmp_path / ("main" if main else "other")
        folder.mkdir()
        m = Metrics(RunFolder(folder), is_main=main)
        m.open(t, {}, Start(TrainState(), [], [], resumed=False))
        m.start_bar(total=2, initial=0, quiet=True)
        m.step(1, 2.5, 1e-3, 0.7, tokens_per_s=100.0)
        m.step(2, float("nan"), 2e-3, None, tokens_per_s=100.0)
        rec = m.record(dict(kind="epoch", step=2, epoch=1, val_ppl=12.0))
        assert m.records == [rec]
        m.save()
        m.close_bar()
        m.close()
        assert (folder / METRICS).exists() is main and (folder / STEPS).exists() is main
    folder = tmp_path / "main"
    steps = RunFolder(folder).read_records(STEPS)
    assert [s["step"] for s in steps] == [1, 2] and steps[0]["grad_norm"] == 0.7 and math.isnan(steps[1]["loss"])
    assert [json.loads(line) for line in (folder / METRICS).read_text().splitlines()] == [rec]
    speed = Throughput()
    speed.add(1000, 0.25)
    speed.add(500, 0.25)
    assert speed.per_s == 3000.0 and Throughput().per_s == 0.0


def test_a_resumed_run_appends_to_the_logs_a_reader_has_open_cut_in_place_at_its_checkpoint(tmp_path):
    """--resume keeps the files a `tail -f` follows (the same inode, not a new file in its place): what a
    crash left past the checkpoint's step, a torn last line too, is cut in place, and the resumed run's records
    follow, each step once."""
    folder = RunFolder(tmp_path)
    first = Metrics(folder)
    first.open(LoopConfig(tensorboard=False), {}, Start(TrainState(), [], [], resumed=False))
    first.start_bar(total=5, initial=0, quiet=True)
    first.record(dict(kind="start", step=0, epoch=0, val_ppl=30.0))
    for step in (1, 2, 3):
        first.step(step, 3.0 - step / 10, 1e-3, 0.5, tokens_per_s=1.0)
    first.record(dict(kind="step", step=3, epoch=0, val_ppl=20.0))
    first.close_bar()
    first.close()
    with open(tmp_path / STEPS, "a") as f:
        f.write('{"step": 4, "lo')  # a write a kill cut short (another writer's: ours are whole lines)
    inodes = {name: os.stat(tmp_path / name).st_ino for name in (STEPS, METRICS)}
    resumed = Start(TrainState(step=2), folder.read_records(METRICS, 2), folder.read_records(STEPS, 2))
    again = Metrics(folder)
    again.open(LoopConfig(tensorboard=False), {}, resumed)
    again.start_bar(total=5, initial=2, quiet=True)
    for step in (3, 4):
        again.step(step, 1.0, 1e-3, 0.5, tokens_per_s=1.0)
    again.record(dict(kind="epoch", step=4, epoch=1, val_ppl=10.0))
    again.close_bar()
    again.close()
    assert {name: os.stat(tmp_path / name).st_ino for name in (STEPS, METRICS)} == inodes
    assert [r["step"] for r in folder.read_records(STEPS, finished=True)] == [1, 2, 3, 4]
    assert [(r["kind"], r["step"]) for r in folder.read_records(METRICS, finished=True)] == [("start", 0), ("epoch", 4)]


def test_training_not_on_a_terminal_prints_progress_lines_not_a_bar(tmp_path, monkeypatch):
    """The steps' progress where output is a file or pipe (a StringIO): whole lines naming the step of the total,
    its loss and speed, one per tenth of the run when the least interval allows; none with --quiet."""
    import io

    from iattention.utils import progress

    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 0.0)
    for quiet in (False, True):
        out = io.StringIO()
        m = Metrics(RunFolder(tmp_path))
        m.open(LoopConfig(tensorboard=False), {}, Start(TrainState(), [], [], resumed=False))
        m.start_bar(total=20, initial=0, quiet=quiet, file=out)
        for step in range(1, 21):
            m.step(step, 2.0, 1e-3, 0.5, tokens_per_s=1000.0)
        m.close_bar()
        m.close()
        lines = out.getvalue().splitlines()
        assert "\r" not in out.getvalue()
        if quiet:
            assert lines == []
        else:
            assert [x.split(" steps")[0] for x in lines] == [f"{tmp_path.name}: train: {s}/20" for s in range(2, 20, 2)]
            assert lines[0].endswith("s") and "loss 2.000, lr 1.00e-03, 1000 tok/s" in lines[0]
