"""Reading files we did not necessarily write, and naming what went wrong with a file in one line.

Every reader of a user's or a run's file goes through `read_text` (a folder, a FIFO, a non-UTF-8 byte
or a missing file is a one-line `UserError`), YAML through `load_yaml` (PyYAML's safe loader, but a key
given twice is refused instead of "last wins"), and an `OSError` met while writing is turned into one
line by `os_error_message` (disk full, read-only, a file where a folder should be, ...)."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

import yaml

from iattention.errors import UserError


def check_regular(path: Path, what: str, fix: str) -> None:
    """Refuse a path that is missing, a folder, or not a regular file (a FIFO would block forever)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist; {fix}") from None
    except NotADirectoryError:
        raise UserError(f"{what} {path}: a part of that path is a file, not a folder; {fix}") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{what} {path} is a folder, not a file; {fix}")
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} {path} is not a regular file (a pipe or device); {fix}")


def check_out_folder(path: str | Path, data_dir: str | Path | None = None, flag: str = "--out") -> None:
    """Refuse an output folder we must never write into: the file system root, the home folder, the data
    folder; and a path whose symlinks lead nowhere (a loop, a missing target)."""
    path = Path(path)
    try:
        os.stat(path)
    except FileNotFoundError:
        if path.is_symlink():
            raise UserError(f"{flag} {path} is a symbolic link to {os.readlink(path)}, which does not exist; "
                            f"fix the link or choose another {flag}") from None
    except OSError as e:
        message = os_error_message(e, path)
        if message is None:
            raise
        raise UserError(f"{flag} {message}") from None
    where = path.resolve()
    precious = {Path("/"): "the file system root"}
    if home_folder() is not None:
        precious[home_folder().resolve()] = "your home folder"
    if data_dir:
        precious[Path(data_dir).resolve()] = "the data folder"
    if where in precious:
        raise UserError(f"{flag} {path} is {precious[where]}; give a folder of its own for the results "
                        f"(e.g. {flag} runs/NAME)")


def home_folder() -> Path | None:
    """The user's home folder, or None where there is none (HOME unset and no passwd entry for the uid, as
    `docker run --user 4242` gives): what lives there (the token cache, the remembered data folder) is
    optional, so callers go on without it."""
    try:
        return Path.home()
    except (RuntimeError, KeyError):
        return None


def expand_user(path: str | Path) -> Path:
    """`path` with a leading ~ expanded; a user without a home folder gets one line, not a RuntimeError."""
    path = Path(path)
    if not str(path).startswith("~"):
        return path
    try:
        return path.expanduser()
    except (RuntimeError, KeyError):
        raise UserError(f"{path} starts with ~, but this user has no home folder (HOME is unset and the uid has "
                        "no passwd entry); write the path in full, or set HOME") from None


def read_bytes(path: str | Path, what: str, fix: str) -> bytes:
    path = Path(path)
    check_regular(path, what, fix)
    try:
        return path.read_bytes()
    except PermissionError:
        raise UserError(f"{what} {path} is not readable (permission denied); {fix}") from None


def read_text(path: str | Path, what: str, fix: str) -> str:
    """The UTF-8 text of a regular file; anything else is one line naming the file, `what` it should be
    and the `fix`."""
    data = read_bytes(path, what, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {e.start}); {fix}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping key given twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: merged keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                break
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str):
    """yaml.safe_load, except that a repeated key is an error (yaml.YAMLError)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: str | Path, what: str, fix: str):
    """A YAML file's content; unreadable, non-UTF-8 or invalid YAML (a repeated key too) is one line."""
    text = read_text(path, what, fix)
    try:
        return load_yaml(text)
    except yaml.YAMLError as e:
        raise UserError(f"{what} {path} is not valid YAML ({_yaml_problem(e)}); {fix}") from None


def _yaml_problem(e: yaml.YAMLError) -> str:
    """'key 'epochs' appears twice in one mapping at line 3, column 3': PyYAML's problem and place, one line."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


# errno -> (what happened, the fix); the path is put in front.
_OS_ERRORS = {
    errno.ENOSPC: ("disk full", "free space and rerun (files already written are intact)"),
    errno.EDQUOT: ("disk quota exceeded", "free space and rerun (files already written are intact)"),
    errno.EROFS: ("on a read-only file system", "choose a writable path"),
    errno.EACCES: ("permission denied", "choose a path you can write, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "choose another path, or fix its permissions"),
    errno.ENOTDIR: ("a part of that path is a file, not a folder", "choose another path"),
    errno.EISDIR: ("is a folder where a file is needed", "give a file path, or remove the folder"),
    errno.ENAMETOOLONG: ("file name too long", "choose a shorter path"),
    errno.ENOTEMPTY: ("is a non-empty folder where a file is needed", "choose another path"),
    errno.ELOOP: ("too many levels of symbolic links (a symlink loop)", "fix the links or choose another path"),
    errno.EFBIG: ("file too large (the file system's or `ulimit -f`'s file-size limit)",
                  "write to a file system that takes larger files, or raise the limit"),
}


def os_error_message(e: OSError, where: str | Path | None = None) -> str | None:
    """One line for an OSError a user's machine or path causes (None for others, which are bugs).
    where: the path to name (default: the one the error carries)."""
    if e.errno not in _OS_ERRORS:
        return None
    problem, fix = _OS_ERRORS[e.errno]
    where = where or (e.filename2 if e.errno == errno.EISDIR and e.filename2 else e.filename)
    return f"{where}: {problem}; {fix}" if where else f"{problem}; {fix}"


def as_os_error(e: Exception, where: str | Path | None = None) -> OSError:
    """An OSError for an error a library raised for a failed write without being one: safetensors (Rust)
    raises `SafetensorError('... I/O error: No space left on device (os error 28)')`. The errno is read
    from Rust's "(os error N)"; without one the error is returned as an OSError without errno (a bug)."""
    if isinstance(e, OSError):
        return e
    m = re.search(r"\(os error (\d+)\)", str(e))
    if m is None:
        return OSError(str(e))
    code = int(m[1])
    return OSError(code, os.strerror(code), str(where) if where else None)
