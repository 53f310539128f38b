"""Output folders of the commands that write figures and tables into a folder the user names (`iattn inspect`,
`iattn lab --out`): running one again rewrites what it wrote there before, and never a file someone else put
there. What iattention wrote in a folder is listed, a name a line, in its WRITTEN file (no library keeps such a
list for a plain folder of outputs; a run folder has its own rules, checkpoint/run_folder.py)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from iattention.errors import UserError
from iattention.utils.atomic import write_text

WRITTEN = ".iattn-written"


def _ours(folder: Path) -> set[str]:
    try:
        return set((folder / WRITTEN).read_text(encoding="utf-8").split("\n")) - {""}
    except (OSError, UnicodeDecodeError):
        return set()


def check_outputs(folder: str | Path, names: Iterable[str], flag: str = "--out") -> None:
    """Refuse, in one line and before anything is written, a name in `folder` that is there but not one
    iattention wrote (a user's file, or one written before outputs were listed)."""
    folder = Path(folder)
    ours = _ours(folder)
    for name in names:
        if os.path.lexists(folder / name) and name not in ours:
            raise UserError(f"{folder / name} is there and not a file iattention wrote (its list, {WRITTEN}, does "
                            f"not name it); choose another {flag}, or move the file (nothing is overwritten)")


def record_output(path: str | Path) -> Path:
    """Add a file just written to its folder's list; returns it."""
    path = Path(path)
    ours = _ours(path.parent)
    if path.name not in ours:
        write_text(path.parent / WRITTEN, "".join(f"{n}\n" for n in sorted(ours | {path.name})))
    return path
