"""Atomic file writes: write to a temp file in the same folder, fsync, then rename over the target."""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

from iattention.errors import UserError
from iattention.utils.files import as_os_error, os_error_message


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


# Temp names say whose they are: `.NAME.iattn-PID.xxxxxxxx.tmp` (`.conv` for a converted model's folder).
# Only a name of this form whose writer is gone is ever removed: a user's `.notes.tmp` is never ours.
TEMP_MARK = "iattn-"
_TEMP_RE = re.compile(r"^\..*\." + TEMP_MARK + r"(\d+)\.[A-Za-z0-9_]+\.(tmp|conv)$")
_MAX_STEM = 120  # bytes of the target's name kept in a temp name: a 255-byte name still fits (NAME_MAX 255)


def _stem(name: str) -> str:
    """The target's name, cut to _MAX_STEM bytes (whole characters) so its temp name is a legal file name."""
    raw = name.encode("utf-8", "surrogateescape")
    return raw[:_MAX_STEM].decode("utf-8", "ignore") if len(raw) > _MAX_STEM else name


def temp_prefix(path: Path) -> str:
    """Temp names carry a mark and the writer's pid (`.NAME.iattn-PID.xxxx.tmp`), so a later writer can tell
    its own kind's leftovers of a killed process (`remove_stale`) from another live writer's file, and from
    files that are not ours at all."""
    return f".{_stem(path.name)}.{TEMP_MARK}{os.getpid()}."


def temp_writer(name: str) -> int | None:
    """The pid in one of our temp names; None for any other name (a user's file)."""
    m = _TEMP_RE.match(name)
    return int(m.group(1)) if m else None


def _remove(stale: Path) -> None:
    if stale.is_dir() and not stale.is_symlink():
        shutil.rmtree(stale, ignore_errors=True)
    else:
        stale.unlink(missing_ok=True)


def remove_stale(path: Path, suffix: str = ".tmp") -> None:
    """Remove temps of `path` left by processes that are gone (SIGKILL leaves no chance to clean up)."""
    for stale in path.parent.glob(f".{glob.escape(_stem(path.name))}.{TEMP_MARK}*{suffix}"):
        pid = temp_writer(stale.name)
        if pid is not None and not _alive(pid):
            _remove(stale)


def remove_stale_in(folder: Path) -> None:
    """Every temp of ours in `folder` whose writer is gone; nothing else (not a user's `.x.tmp`)."""
    for stale in Path(folder).glob(".*"):
        pid = temp_writer(stale.name)
        if pid is not None and not _alive(pid):
            _remove(stale)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else set back at once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: str | os.PathLike, folder: bool = False) -> None:
    """mkstemp / mkdtemp create 0600 / 0700; what we write gets the mode any other file gets:
    0666 (folders 0777) less the umask."""
    os.chmod(path, (0o777 if folder else 0o666) & ~current_umask())


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
        apply_umask(tmp)
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


def publish_folder(tmp: Path, out: Path) -> None:
    """Rename the finished temp folder `tmp` to `out`, which must not exist. When `out` appeared since the
    caller checked (another process published there first), a UserError says it already exists: `out` is
    left as it is, and `tmp` for the caller to remove. (A rename onto a folder fails only when that folder
    is non-empty, onto a file with ENOTDIR: neither is the user's path being wrong.)"""
    try:
        if os.path.lexists(out):
            raise FileExistsError(errno.EEXIST, "exists", str(out))
        os.rename(tmp, out)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR) and os.path.lexists(out):
            raise UserError(f"output {out} already exists (written meanwhile by another process); choose a new "
                            "--out (nothing is overwritten)") from None
        raise


@contextmanager
def staged_folder(out: str | Path):
    """Yield a temp sibling folder of `out` (`.NAME.iattn-PID.xxxx.conv`) to write a model into; when the block
    ends it gets the umask's modes and is renamed to `out` in one step, and on any error (a full disk, a kill's
    leftovers found by the next run) it is removed: no half-written folder ever carries the name `out`."""
    out = Path(out)
    if os.path.lexists(out):  # a dangling symlink too: it is not ours to replace
        raise UserError(f"output {out} already exists; choose a new --out (nothing is overwritten)")
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        remove_stale(out, suffix=".conv")  # the temp folder of a convert that was killed
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out), suffix=".conv", dir=parent))
        apply_umask(tmp, folder=True)  # mkdtemp makes 0700; the model folder gets a folder's usual mode
    except (PermissionError, FileExistsError, NotADirectoryError):
        raise UserError(f"cannot write into {parent}; choose a writable --out") from None
    try:
        yield tmp
        for written in tmp.iterdir():  # transformers writes model.safetensors 0600: every file gets the umask's mode
            apply_umask(written, folder=written.is_dir())
        publish_folder(tmp, out)
    except (OSError, SafetensorError) as e:  # safetensors reports a full disk as SafetensorError
        shutil.rmtree(tmp, ignore_errors=True)
        e = as_os_error(e, out)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"disk full while writing {out}; free space and rerun (nothing was written)") from None
        if os_error_message(e, out):
            raise UserError(f"cannot write {os_error_message(e, out)}") from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
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
