"""Progress of an evaluation (windows scored of windows): a tqdm bar with an ETA on a terminal, and one
line when it ends elsewhere (a log file, a SLURM job, a pipe), so no evaluation is silent. Off (`show=False`:
`--quiet`, another DDP process) it only counts."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class EvalProgress:
    def __init__(self, desc: str, total: int, show: bool = True, file=None):
        self.desc, self.total, self.done, self.file = desc, total, 0, file or sys.stderr
        self._t0 = time.time()
        self.show = show
        tty = bool(getattr(self.file, "isatty", lambda: False)())
        self.bar = (tqdm(total=total, desc=desc, unit="win", file=self.file, leave=False, dynamic_ncols=True)
                    if show and tty else None)
        self.line = show and not tty

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)

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
