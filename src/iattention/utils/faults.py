"""Failpoints for crash-safety tests: IATTN_FAULT="point:N" SIGKILLs the process at the N-th hit of
`point` (after tearing the given temp file in half, to simulate a write cut short). Unset: no effect.

Points: ckpt_write (a checkpoint's temp file is written, not yet renamed), eval (inside an evaluation),
step (right after an optimizer step), convert_write (a streaming conversion wrote a tensor into its temp folder).
disk_full is no kill: its N-th hit (after a conversion's tensor write) raises ENOSPC, as a full disk would.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

from iattention.errors import UserError

POINTS = ("ckpt_write", "eval", "step", "convert_write", "disk_full")
_hits: dict[str, int] = {}


def fault_spec() -> tuple[str, int] | None:
    """IATTN_FAULT as (point, N); None when unset. Anything else is one line (checked by the CLI at start,
    so a typo does not surface only at the first checkpoint)."""
    spec = os.environ.get("IATTN_FAULT")
    if not spec:
        return None
    point, _, count = spec.partition(":")
    count = count.strip() or "1"
    if point not in POINTS or not count.isdigit() or int(count) < 1:
        raise UserError(f"IATTN_FAULT={spec!r} is not POINT:N (POINT one of {', '.join(POINTS)}, N an integer >= 1); "
                        "fix it or unset IATTN_FAULT (it is for crash-safety tests)")
    return point, int(count)


def fault_point(name: str, torn: Path | None = None) -> None:
    spec = fault_spec()
    if spec is None or spec[0] != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == spec[1]:
        if name == "disk_full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(torn))
        if torn is not None and torn.exists():
            os.truncate(torn, torn.stat().st_size // 2)
        os.kill(os.getpid(), signal.SIGKILL)
