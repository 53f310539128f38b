"""Progress of an evaluation (windows scored of windows): a tqdm bar with an ETA on a terminal; elsewhere (a log
file, a SLURM job, a pipe), where a bar's redraws would be one endless line, whole lines (`LineProgress`): one
each time another tenth is done, at most one per LINE_INTERVAL_S seconds, and one when it ends, so no
evaluation is silent and a job log shows a long one advancing. Off (`show=False`: `--quiet`, another DDP
process) it only counts."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

LINE_INTERVAL_S = 30.0  # the least time between two progress lines where output is not a terminal
LINE_EVERY = 0.1  # a progress line each time this fraction more of the total is done (at that rate at most)


def is_terminal(file) -> bool:
    return bool(getattr(file, "isatty", lambda: False)())


class LineProgress:
    """Progress as whole lines, for output that is not a terminal: `desc: done/total unit (p%)...` each time
    another LINE_EVERY of the total is done, never sooner than LINE_INTERVAL_S seconds after the last line
    (a short pass prints none: its caller's final line says it all)."""

    def __init__(self, desc: str, total: int, unit: str, file, initial: int = 0):
        self.desc, self.total, self.unit, self.file = desc, total, unit, file
        self._t0 = self._last = time.time()
        self._next = self._mark_after(initial)

    def _mark_after(self, done: int) -> float:
        """The next tenth (LINE_EVERY) of the total past `done`, counted in whole parts: no float drift."""
        parts = round(1 / LINE_EVERY)
        return (done * parts // max(self.total, 1) + 1) * self.total / parts

    def update(self, done: int, extra: str = "") -> None:
        now = time.time()
        if done >= self._next and done < self.total and now - self._last >= LINE_INTERVAL_S:
            print(f"{self.desc}: {done:,}/{self.total:,} {self.unit} ({100 * done / self.total:.0f}%){extra}, "
                  f"{now - self._t0:.0f} s", file=self.file, flush=True)
            self._last, self._next = now, self._mark_after(done)


class EvalProgress:
    def __init__(self, desc: str, total: int, show: bool = True, file=None):
        self.desc, self.total, self.done, self.file = desc, total, 0, file or sys.stderr
        self._t0 = time.time()
        self.show = show
        tty = is_terminal(self.file)
        self.bar = (tqdm(total=total, desc=desc, unit="win", file=self.file, leave=False, dynamic_ncols=True)
                    if show and tty else None)
        self.line = show and not tty
        self.lines = LineProgress(desc, total, "windows", self.file) if self.line else None

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        if self.lines is not None:
            self.lines.update(self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.line:
            self.line = False
            seconds = time.time() - self._t0
            print(f"{self.desc}: {self.done:,}/{self.total:,} windows in {seconds:.1f} s", file=self.file,
                  flush=True)

    def __enter__(self) -> EvalProgress:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        elif self.bar is not None:  # interrupted: the bar goes, no "done" line claims a finished pass
            self.bar.close()
            self.bar, self.line = None, False
