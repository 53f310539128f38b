"""The loop's counters (what last.safetensors carries besides weights and optimizer), with the two updates
the loop makes to them: a step counted, and an epoch closed (best validation so far, early stopping)."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class TrainState:
    step: int = 0
    epoch: int = 0  # epochs completed
    batch: int = 0  # next batch index within the current epoch
    best_val_loss: float = math.inf
    best_epoch: int = 0  # 1-based epoch of the best validation loss
    bad_epochs: int = 0
    run_loss_sum: float = 0.0  # running train loss of the current epoch
    run_loss_count: int = 0
    train_time: float = 0.0  # seconds inside training steps
    wall_time: float = 0.0  # seconds, summed over resumed sessions
    tokens_seen: int = 0
    skipped: int = 0
    stopped_early: bool = False

    def count_step(self, loss: float, tokens: int, seconds: float) -> None:
        """One optimizer step done (or a non-finite batch skipped: counted, its loss left out of the mean)."""
        self.train_time += seconds
        self.tokens_seen += tokens
        self.step += 1
        self.batch += 1
        if math.isfinite(loss):
            self.run_loss_sum += loss
            self.run_loss_count += 1

    def train_loss(self) -> float | None:
        """The mean training loss of the current epoch so far (None before any step)."""
        return self.run_loss_sum / self.run_loss_count if self.run_loss_count else None

    def end_epoch(self, val_loss: float, patience: int) -> bool:
        """Close the epoch with its validation loss; True when it is the best so far. `patience` epochs in a
        row without improvement stop the run early (0: never)."""
        self.epoch += 1
        self.batch = 0
        self.run_loss_sum, self.run_loss_count = 0.0, 0
        if val_loss < self.best_val_loss:
            self.best_val_loss, self.best_epoch, self.bad_epochs = val_loss, self.epoch, 0
            return True
        self.bad_epochs += 1
        if patience and self.bad_epochs >= patience:
            self.stopped_early = True
        return False

    def reopen_epoch(self, batch: int, loss_sum: float, loss_count: int) -> None:
        """Undo the close of an epoch that a budget ended after `batch` of its batches, so the run goes on with
        it: its running loss back, and the patience it used (a best there stays the best so far)."""
        if self.best_epoch != self.epoch:
            self.bad_epochs = max(0, self.bad_epochs - 1)
        self.epoch -= 1
        self.batch, self.run_loss_sum, self.run_loss_count = batch, loss_sum, loss_count
        self.stopped_early = False
