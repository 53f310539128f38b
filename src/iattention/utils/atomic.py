"""Atomic file writes: write to a temp file in the same folder, fsync, then rename over the target."""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from iattention.errors import UserError
from iattention.utils.files import os_error_message


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def temp_prefix(path: Path) -> str:
    """Temp names carry the writer's pid (`.NAME.PID.xxxx.tmp`), so a later writer of the same target can
    tell the leftovers of a killed process (`remove_stale`) from another live writer's file."""
    return f".{path.name}.{os.getpid()}."


def remove_stale(path: Path, suffix: str = ".tmp") -> None:
    """Remove temps of `path` left by processes that are gone (SIGKILL leaves no chance to clean up)."""
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*{suffix}"):
        pid = stale.name[len(path.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temp path next to `path`; on success it replaces `path` atomically, else it is removed."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    except FileExistsError:
        raise UserError(f"cannot create folder {path.parent}: a file of that name exists; choose another path") \
            from None
    except PermissionError:
        raise UserError(f"folder {path.parent} is not writable; choose a writable output folder") from None
    except OSError as e:
        raise UserError(f"cannot write {os_error_message(e, path) or f'{path}: {e}'}") from None
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if e.errno == errno.ENOSPC:
            raise UserError(f"disk full while writing {path}; free space and rerun (the old file is intact)") \
                from None
        if os_error_message(e, path):
            raise UserError(f"cannot write {os_error_message(e, path)}") from None
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
