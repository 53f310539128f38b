"""Where text comes from: a local folder with the official WikiText-2 files, plain text files,
or (for users online) Hugging Face `datasets`."""

from __future__ import annotations

import os
from pathlib import Path

from iattention.data.config import DATASETS, SPLITS, WIKITEXT_RELEASES, DataConfig
from iattention.data.remember import remembered_data_dir
from iattention.errors import UserError
from iattention.utils.files import expand_user, read_bytes


def data_dir(cfg: DataConfig) -> Path | None:
    """The data folder to read, first to last: data.data_dir (--data-dir), $IATTN_DATA_DIR, the folder the user
    remembered (`iattn data remember DIR`, see data/remember.py); None: download."""

    d = cfg.data_dir or os.environ.get("IATTN_DATA_DIR", "") or remembered_data_dir()
    return expand_user(d) if d else None


def resolved_data_dir(cfg: DataConfig) -> str:
    """The data folder a run reads (its data_dir, else $IATTN_DATA_DIR) as an absolute path, "" for none:
    what a run records in its config.yaml, so later commands on the run find its data."""
    d = data_dir(cfg)
    return str(d.resolve()) if d else ""


def data_dir_told(flag: str | None) -> str | None:
    """A data folder the user gave now (--data-dir, else $IATTN_DATA_DIR), absolute; None if neither.
    Commands on an existing run use it instead of the folder the run recorded."""
    d = flag or os.environ.get("IATTN_DATA_DIR")
    return str(expand_user(d).resolve()) if d else None


def _local_wikitext(cfg: DataConfig, split: str) -> Path | None:
    root = data_dir(cfg)
    if root is None:
        return None
    if root.exists() and not root.is_dir():
        raise UserError(f"data folder {root} is a file, not a folder; point --data-dir / IATTN_DATA_DIR at the "
                        f"folder holding {cfg.dataset}/")
    if not root.is_dir():
        raise UserError(f"data folder {root} does not exist; point --data-dir / IATTN_DATA_DIR at the folder "
                        f"holding {cfg.dataset}/")
    name = WIKITEXT_RELEASES[cfg.dataset].format(split=split)
    for candidate in (root / cfg.dataset / name, root / name):
        if candidate.is_file():
            return candidate
    return None


def _read_text_file(path: Path, what: str) -> str:
    data = read_bytes(path, f"{what} file", "give a text file (check the path)")  # a FIFO is refused, not waited on
    if not data.strip():
        raise UserError(f"{what} file {path} is empty; give a text file with content")
    if b"\x00" in data:
        raise UserError(f"{what} file {path} looks binary (contains NUL bytes); give a UTF-8 text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} file {path} is not UTF-8 text ({e.reason} at byte {e.start}); "
                        "convert it to UTF-8") from None


def read_text_file(path: str | Path, what: str = "text") -> str:
    """A UTF-8 text file's content; an empty, binary, non-UTF-8 or missing file is one line."""
    return _read_text_file(expand_user(path), what)


def _hf_wikitext(cfg: DataConfig, split: str) -> str:
    hf_split = {"valid": "validation"}.get(split, split)
    try:
        import datasets  # optional: pip install iattention[data]

        rows = datasets.load_dataset("wikitext", cfg.dataset, split=hf_split)["text"]
        return "".join(rows)
    except Exception as e:  # offline, not installed, hub error: all end in the same advice
        name = WIKITEXT_RELEASES[cfg.dataset].format(split=split)
        where = data_dir(cfg)
        place = f"{where}/{cfg.dataset}/{name}" if where else f"DIR/{cfg.dataset}/{name}"
        raise UserError(f"{cfg.dataset} {split} split not found locally and not downloadable "
                        f"({type(e).__name__}); put the official file at {place} and pass --data-dir DIR (or set "
                        "IATTN_DATA_DIR=DIR, or once: iattn data remember DIR), or pip install "
                        "\"iattention[data]\" to download it") from None


def read_split(cfg: DataConfig, split: str) -> str:
    """The raw text of one split."""
    if split not in SPLITS:
        raise ValueError(split)
    if cfg.dataset not in DATASETS:
        raise UserError(f"unknown dataset {cfg.dataset!r}; choose one of {', '.join(DATASETS)}")
    if cfg.dataset == "text":
        path = getattr(cfg, split)
        if not path:
            raise UserError(f"dataset=text needs data.{split}=PATH to a UTF-8 text file")
        return _read_text_file(expand_user(path), split)
    local = _local_wikitext(cfg, split)
    if local is not None:
        return _read_text_file(local, split)
    return _hf_wikitext(cfg, split)
