"""Failpoints for crash-safety tests: IATTN_FAULT="point:N" SIGKILLs the process at the N-th hit of
`point` (after tearing the given temp file in half, to simulate a write cut short). Unset: no effect.

Points: ckpt_write (a checkpoint's temp file is written, not yet renamed), eval (inside an evaluation),
step (right after an optimizer step).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

_hits: dict[str, int] = {}


def fault_point(name: str, torn: Path | None = None) -> None:
    spec = os.environ.get("IATTN_FAULT")
    if not spec:
        return
    point, _, count = spec.partition(":")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(count or 1):
        if torn is not None and torn.exists():
            os.truncate(torn, torn.stat().st_size // 2)
        os.kill(os.getpid(), signal.SIGKILL)
