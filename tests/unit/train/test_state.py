"""Unit tests of iattention.train.state."""

from __future__ import annotations

from iattention.train.state import TrainState


def test_state_counts_steps_and_stops_after_patience_epochs():
    s = TrainState()
    s.count_step(2.0, tokens=10, seconds=0.5)
    s.count_step(float("nan"), tokens=10, seconds=0.5)  # a skipped batch: counted, its loss left out
    assert (s.step, s.batch, s.tokens_seen, s.train_time, s.train_loss()) == (2, 2, 20, 1.0, 2.0)
    improved = [s.end_epoch(v, patience=2) for v in (3.0, 2.5, 2.6, 2.4, 2.7)]
    assert improved == [True, True, False, True, False] and not s.stopped_early
    assert (s.epoch, s.batch, s.best_epoch, s.best_val_loss, s.train_loss()) == (5, 0, 4, 2.4, None)
    assert s.end_epoch(2.8, patience=2) is False and s.stopped_early and s.bad_epochs == 2
    assert TrainState(best_val_loss=1.0).end_epoch(5.0, patience=0) is False  # patience 0: never stops
