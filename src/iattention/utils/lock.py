"""One process per run folder: an exclusive `fcntl.flock` on `<run>/.lock`, which holds the holder's pid.

flock (stdlib; no maintained library adds anything we need here) is released by the kernel when its
process dies, however it dies, so a lock left by a killed run is simply taken over by the next one;
the pid written into the file only names the holder in the error. flock works across processes on
one machine and on local disks; on network file systems its reach depends on the server (NFSv4
honours it), so two machines sharing a disk should prefer splitting a sweep by --seeds.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from iattention.errors import UserError
from iattention.utils.files import os_error_message

LOCK_NAME = ".lock"


class RunLock:
    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileExistsError:
            raise UserError(f"cannot create folder {self.path.parent}: a file of that name exists; choose another "
                            "--out") from None
        except PermissionError:
            raise UserError(f"folder {self.path.parent} is not writable; choose a writable output folder") from None
        except IsADirectoryError:
            raise UserError(f"lock file {self.path} is a folder; remove it (rmdir) and rerun") from None
        except OSError as e:
            raise UserError(f"cannot take the lock {os_error_message(e, self.path) or f'{self.path}: {e}'}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UserError(f"run folder {self.path.parent} is in use by another process (pid {pid}); wait for it "
                            "to finish or stop it, or choose another --out") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as e:  # a full disk: the lock is not taken
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise UserError(f"cannot take the lock {os_error_message(e, self.path) or f'{self.path}: {e}'}") from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def holder(folder: str | Path) -> str | None:
    """The pid holding the folder's lock, or None if nobody holds it (checked without taking it)."""
    path = Path(folder) / LOCK_NAME
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
