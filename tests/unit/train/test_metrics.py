"""Unit tests of iattention.train.metrics."""

from __future__ import annotations

import json
import math

from iattention.checkpoint.run_folder import METRICS, STEPS, RunFolder
from iattention.config import LoopConfig
from iattention.train.metrics import Metrics, Throughput


def test_metrics_write_both_logs_on_the_main_process_only(tmp_path):
    t = LoopConfig(tensorboard=False)
    for main in (True, False):
        folder = tmp_path / ("main" if main else "other")
        folder.mkdir()
        m = Metrics(RunFolder(folder), is_main=main)
        m.open(t, {})
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
