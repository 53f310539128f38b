"""Atomic file writes: write to a temp file in the same folder, fsync, then rename over the target."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from iattention.errors import UserError


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temp path next to `path`; on success it replaces `path` atomically, else it is removed."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except FileExistsError:
        raise UserError(f"cannot create folder {path.parent}: a file of that name exists; choose another path") \
            from None
    except PermissionError:
        raise UserError(f"folder {path.parent} is not writable; choose a writable output folder") from None
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if e.errno == 28:  # ENOSPC
            raise UserError(f"disk full while writing {path}; free space and rerun (the old file is intact)") \
                from None
        raise
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_bytes(path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_with(path, writer: Callable[[Path], None]) -> None:
    """Atomically produce `path` with a function that writes to the temp path it is given."""
    with atomic_path(path) as tmp:
        writer(tmp)
