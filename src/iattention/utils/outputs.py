"""Output folders of the commands that write figures and tables into a folder the user names (`iattn inspect`,
`iattn lab --out`): running one again rewrites what it wrote there before, and never a file someone else put
there. What iattention wrote in a folder is listed, a name a line, in its WRITTEN file (no library keeps such a
list for a plain folder of outputs; a run folder has its own rules, checkpoint/run_folder.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from iattention.errors import UserError
from iattention.utils.atomic import write_text

WRITTEN = ".iattn-written"


def _ours(folder: Path) -> set[str]:
    try:
        return set((folder / WRITTEN).read_text(encoding="utf-8").split("\n")) - {""}
    except (OSError, UnicodeDecodeError):
        return set()


def claim_outputs(folder: str | Path, names: Iterable[str], written_before: Callable[[Path], bool],
                  flag: str = "--out") -> None:
    """Before anything is written: refuse, in one line, a name in `folder` that is there but not one iattention
    wrote, then list every name as ours (a listed name with no file yet is harmless; a file written but not yet
    listed, by a kill between the two, would be refused next time). A folder written before outputs were listed
    (docs/lab, an older `iattn inspect`) has no list: there a name counts as ours where `written_before(path)`
    recognises the command's own output by its content."""
    folder, names = Path(folder), list(names)
    listed = _ours(folder)
    for name in names:
        path = folder / name
        if os.path.lexists(path) and name not in listed and not (
                not (folder / WRITTEN).exists() and path.is_file() and not path.is_symlink() and written_before(path)):
            raise UserError(f"{path} is there and not a file iattention wrote (its list, {WRITTEN}, does not name "
                            f"it); choose another {flag}, or move the file (nothing is overwritten)")
    if not set(names) <= listed:
        folder.mkdir(parents=True, exist_ok=True)
        write_text(folder / WRITTEN, "".join(f"{n}\n" for n in sorted(listed | set(names))))


def starts_with(path: Path, prefix: bytes) -> bool:
    """Does the file begin with `prefix` (what a command's own output begins with)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(prefix)) == prefix
    except OSError:
        return False
