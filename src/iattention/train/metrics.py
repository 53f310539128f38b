"""A run's numbers as it trains: the records of metrics.jsonl (one per evaluation) and steps.jsonl (one per
optimizer step), each appended as a whole line in one write as it is made (`tail -f` follows them, across a
--resume too: the file is cut in place to the checkpoint, never replaced; a killed run keeps them), synced
to disk before each checkpoint, written through the run folder; the progress bar (tqdm);
TensorBoard and W&B (`sinks.py`); the training throughput in tokens/s. Only the main process writes."""

from __future__ import annotations

import sys

from tqdm import tqdm

from iattention.checkpoint.run_folder import METRICS, STEPS, RecordLog, RunFolder
from iattention.config import LoopConfig
from iattention.train.checkpointer import Start
from iattention.train.sinks import Sinks
from iattention.utils.progress import LineProgress, is_terminal


class Throughput:
    """Tokens per second of training steps (their time only, not the evaluations between them)."""

    def __init__(self) -> None:
        self.tokens, self.seconds = 0, 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds

    @property
    def per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


class Metrics:
    def __init__(self, folder: RunFolder, is_main: bool = True):
        self.folder, self.is_main = folder, is_main
        self.records: list[dict] = []  # metrics.jsonl
        self.steps: list[dict] = []  # steps.jsonl
        self.sinks: Sinks | None = None
        self.bar: tqdm | None = None
        self.lines: LineProgress | None = None  # the bar's stand-in where output is not a terminal
        self.step_log: RecordLog | None = None
        self.metric_log: RecordLog | None = None

    def open(self, t: LoopConfig, config: dict, start: Start) -> None:
        """TensorBoard and W&B as `train.*` asks, and the logs as the run starts (`start`: a fresh run's empty
        ones, or a resumed run's up to its checkpoint) open to append (nothing on other processes)."""
        self.records, self.steps = list(start.records), list(start.steps)
        self.sinks = Sinks(self.folder.path, t.tensorboard, t.wandb, config, self.folder.name, main=self.is_main)
        if self.is_main:
            self.metric_log = self.folder.append_records(METRICS, start.log_step)
            if start.relabel is not None:
                self.metric_log.replace_last(start.relabel)
            self.step_log = self.folder.append_records(STEPS, start.log_step)

    def start_bar(self, total: int, initial: int, quiet: bool, file=None) -> None:
        """tqdm's bar of steps on a terminal; elsewhere (a job log, a pipe) progress lines (utils/progress.py)."""
        file = file or sys.stderr
        show = self.is_main and not quiet
        self.bar = tqdm(total=total, initial=initial, disable=None if show else True, dynamic_ncols=True,
                        desc=self.folder.name, file=file)
        self.lines = (LineProgress(f"{self.folder.name}: train", total, "steps", file, initial)
                      if show and not is_terminal(file) else None)

    def step(self, step: int, loss: float, lr: float, grad_norm: float | None, tokens_per_s: float) -> None:
        self.steps.append(dict(step=step, loss=loss, lr=lr, grad_norm=grad_norm))
        if self.step_log is not None:
            self.step_log.append(self.steps[-1])
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:.0f}", refresh=False)
        if self.lines is not None:
            self.lines.update(step, f", loss {loss:.3f}, lr {lr:.2e}, {tokens_per_s:.0f} tok/s")
        self.sinks.step(step, loss, lr, grad_norm)

    def record(self, rec: dict) -> dict:
        """One evaluation record (kind start, step or epoch)."""
        self.records.append(rec)
        if self.metric_log is not None:
            self.metric_log.append(rec)
        self.sinks.record(rec)
        return rec

    def epochs(self) -> list[int]:
        return [r["epoch"] for r in self.records if r["kind"] == "epoch"]

    def write(self, line: str) -> None:
        """A line above the progress bar, on the main process."""
        if self.is_main:
            self.bar.write(line)

    def save(self) -> None:
        """Both logs' appended lines on disk: what a checkpoint saved next may point to."""
        for log in (self.metric_log, self.step_log):
            if log is not None:
                log.sync()

    def close_bar(self) -> None:
        self.bar.close()

    def close_log(self) -> None:
        for log in (self.metric_log, self.step_log):
            if log is not None:
                log.close()

    def close(self) -> None:
        self.close_log()
        self.sinks.close()
