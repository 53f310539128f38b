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
import stat
from pathlib import Path

from iattention.errors import UserError
from iattention.utils.files import os_error_message

LOCK_NAME = ".lock"


class RunLock:
    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None
        self.created_folder = False  # this process made the folder (so only it may remove it again)

    def _make_folder(self) -> None:
        folder = self.path.parent
        try:
            folder.mkdir(parents=True)
            self.created_folder = True
        except FileExistsError:
            if not folder.is_dir():
                if folder.is_symlink():
                    raise UserError(f"{folder} is a symbolic link that leads to no folder (a missing target or a "
                                    "loop); fix the link or choose another --out") from None
                raise UserError(f"cannot create folder {folder}: a file of that name exists; choose another "
                                "--out") from None
        except PermissionError:
            raise UserError(f"folder {folder} is not writable; choose a writable output folder") from None
        except OSError as e:
            raise UserError(f"cannot take the lock {os_error_message(e, folder) or f'{folder}: {e}'}") from None

    def _give_up(self, fd: int | None = None, unlink: bool = False) -> None:
        """Undo what this process made on a failed acquire: never a lock file another process may hold."""
        if fd is not None:
            if unlink:  # still flocked by us: nobody else holds this file
                self.path.unlink(missing_ok=True)
            os.close(fd)
        if self.created_folder:
            try:
                self.path.parent.rmdir()
            except OSError:
                pass
            self.created_folder = False

    def acquire(self) -> RunLock:
        self._make_folder()
        try:
            # O_NOFOLLOW: a symlink named .lock is refused, never followed (it would truncate its target);
            # O_NONBLOCK: a FIFO named .lock cannot block the open.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
        except OSError as e:
            self._give_up()
            if self.path.is_symlink():
                raise UserError(f"lock file {self.path} is a symbolic link (to {os.readlink(self.path)}); it is never "
                                "followed: remove the link and rerun") from None
            if isinstance(e, IsADirectoryError):
                raise UserError(f"lock file {self.path} is a folder; remove it (rmdir) and rerun") from None
            if isinstance(e, PermissionError):
                raise UserError(f"folder {self.path.parent} is not writable; choose a writable output folder") \
                    from None
            raise UserError(f"cannot take the lock {os_error_message(e, self.path) or f'{self.path}: {e}'}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            self._give_up(fd)
            raise UserError(f"lock file {self.path} is not a regular file (a pipe or device); remove it and rerun")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            self._give_up(fd)  # the holder's lock file stays: it is not ours
            raise UserError(f"run folder {self.path.parent} is in use by another process (pid {pid}); wait for it "
                            "to finish or stop it, or choose another --out") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as e:  # a full disk: the lock is not taken
            self._give_up(fd, unlink=self.created_folder)
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
    """The pid holding the folder's lock, or None if nobody holds it (checked without taking it; a lock that
    is a symlink or not a regular file is never opened: the trainer refuses it)."""
    path = Path(folder) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
