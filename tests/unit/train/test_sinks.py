"""Unit tests of iattention.train.sinks: what TensorBoard and W&B get."""

from __future__ import annotations

import sys
import types

from iattention.train.sinks import Sinks

START = dict(kind="start", step=0, epoch=0, lr=1e-4, train_loss=None, val_loss=5.5, val_ppl=244.7,
             val_word_ppl=None, tokens_per_s=0.0)
EPOCH = dict(kind="epoch", step=22, epoch=1, lr=1e-3, train_loss=3.0, val_loss=2.9, val_ppl=18.2,
             val_word_ppl=40.0, tokens_per_s=2000.0)


def test_the_step_0_evaluation_is_step_0_of_the_validation_curve_in_tensorboard_and_wandb(tmp_path, monkeypatch):
    """The start record goes to the same tags as every epoch's (epoch/val_loss at step 0), not to a one-point
    start/ chart, and with no tokens/s (no step ran); the epoch record's numbers all go."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    calls = []
    fake = types.ModuleType("wandb")  # a stand-in for the wandb package: the test is of our calls to it
    fake.init = lambda **kw: types.SimpleNamespace(log=lambda values, step: calls.append((step, values)),
                                                   finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    sinks = Sinks(tmp_path, tensorboard=True, wandb_project="p", config={}, run_name="r")
    sinks.record(START)
    sinks.record(EPOCH)
    sinks.close()
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    tags = events.Tags()["scalars"]
    assert not [t for t in tags if t.startswith("start/")], tags
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("epoch/val_loss")] == [(0, 5.5), (22, 2.9)]
    assert [e.step for e in events.Scalars("epoch/val_ppl")] == [0, 22]
    assert [e.step for e in events.Scalars("epoch/tokens_per_s")] == [22]
    assert calls[0] == (0, {"epoch/val_loss": 5.5, "epoch/val_ppl": 244.7, "epoch/lr": 1e-4})
    assert calls[1][0] == 22 and calls[1][1]["epoch/tokens_per_s"] == 2000.0
