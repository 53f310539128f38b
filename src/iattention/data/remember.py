"""The data folder remembered for the user, as Hugging Face keeps HF_HOME: `iattn data remember DIR` (run
by `make demo` / `make setup`) writes it to `$XDG_CONFIG_HOME/iattention/config.json` (default
`~/.config/iattention/config.json`), and every command that needs data and was told no folder reads it.

Where a command looks for data, first to last: `--data-dir` (or `data.data_dir=`), `$IATTN_DATA_DIR`,
the folder an existing run recorded (commands on a run), this remembered folder, then a download with
Hugging Face `datasets` (pip install "iattention[data]")."""

from __future__ import annotations

import json
import os
from pathlib import Path

from iattention.errors import UserError
from iattention.utils.atomic import write_text
from iattention.utils.files import expand_user, home_folder

KEY = "data_dir"


def config_file() -> Path | None:
    """Where the remembered folder is kept; None for a user with neither $XDG_CONFIG_HOME nor a home folder."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    if base and Path(base).is_absolute():
        return Path(base) / "iattention" / "config.json"
    home = home_folder()
    return home / ".config" / "iattention" / "config.json" if home else None


def _writable_config_file() -> Path:
    path = config_file()
    if path is None:
        raise UserError("this user has no home folder (HOME is unset and the uid has no passwd entry), so there is "
                        "nowhere to remember a data folder; set XDG_CONFIG_HOME (or HOME) to a writable folder, or "
                        "pass --data-dir / set IATTN_DATA_DIR instead")
    return path


def _read() -> dict:
    path = config_file()
    if path is None or not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError):
        raise UserError(f"{path} is not readable JSON; delete it or run `iattn data remember DIR` again") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} must hold a JSON object; delete it or run `iattn data remember DIR` again")
    return obj


def remembered_data_dir() -> str | None:
    """The remembered data folder, or None if none is remembered."""
    value = _read().get(KEY)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise UserError(f"{config_file()}: {KEY} must be a path string; run `iattn data remember DIR` again")
    return value


def remember_data_dir(folder: str | Path) -> Path:
    """Remember `folder` (made absolute) as the user's data folder; returns the config file written."""
    folder = expand_user(folder)
    if not folder.is_dir():
        raise UserError(f"data folder {folder} does not exist; give the folder that holds wikitext-2-v1/")
    path = _writable_config_file()
    obj = _read()
    obj[KEY] = str(folder.resolve())
    write_text(path, json.dumps(obj, indent=2) + "\n")
    return path


def forget_data_dir() -> bool:
    """Drop the remembered folder; True if one was remembered."""
    obj = _read()
    if KEY not in obj:
        return False
    del obj[KEY]
    write_text(_writable_config_file(), json.dumps(obj, indent=2) + "\n")
    return True
