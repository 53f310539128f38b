"""Token cache: each tokenized split is a flat numpy memmap keyed by (text hash, tokenizer)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np

from iattention.errors import UserError
from iattention.utils.atomic import write_text, write_with


def cache_root(cfg) -> Path:
    root = Path(cfg.cache_dir or os.environ.get("IATTN_CACHE_DIR") or Path.home() / ".cache" / "iattention")
    root = root.expanduser()
    for p in (root, *root.parents):
        if p.exists():
            if not p.is_dir():
                raise UserError(f"token cache folder {root}: {p} is a file, not a folder; point data.cache_dir (or "
                                "IATTN_CACHE_DIR) at a folder")
            break
    return root


def cache_key(text: str, tokenizer_fingerprint: str) -> str:
    h = hashlib.sha256(tokenizer_fingerprint.encode())
    h.update(b"\0")
    h.update(text.encode("utf-8"))
    return h.hexdigest()[:24]


def cached_tokens(cfg, text: str, tokenizer) -> np.ndarray:
    """Token ids of `text` as a read-only memmap (uint16 when the vocabulary fits). Each cache file has a
    `.len` file beside it with its token count, written after it: a file whose size does not match (cut
    short, or from before the count was kept) is rebuilt, never read as a shorter split; so is one holding
    an id the tokenizer does not have (overwritten)."""
    dtype = np.uint16 if tokenizer.vocab_size <= 65536 else np.uint32
    path = cache_root(cfg) / "tokens" / f"{cache_key(text, tokenizer.fingerprint)}.{np.dtype(dtype).name}.bin"
    count = path.with_name(path.name + ".len")
    if path.is_file() and not _intact(path, count, np.dtype(dtype).itemsize):
        if count.is_file():
            recorded = count.read_bytes()[:40].decode(errors="replace").strip()
            print(f"iattn: token cache {path} does not hold the {recorded} tokens it recorded; "
                  "rebuilding it", file=sys.stderr)
        path.unlink()
    read_back = path.is_file()
    if not read_back:
        ids = tokenizer.encode(text).astype(dtype)
        write_with(path, lambda tmp: _write_array(tmp, ids))
        write_text(count, f"{len(ids)}\n")
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    ids = np.memmap(path, dtype=dtype, mode="r")
    if read_back and int(ids.max()) >= tokenizer.vocab_size:  # overwritten: never feed it to the model
        print(f"iattn: token cache {path} holds ids beyond the tokenizer's {tokenizer.vocab_size}; rebuilding it",
              file=sys.stderr)
        del ids
        path.unlink()
        return cached_tokens(cfg, text, tokenizer)
    return ids


def _write_array(path: Path, ids: np.ndarray) -> None:
    """Like ids.tofile(path), but through Python's file write: numpy's fwrite reports a full disk as an
    OSError without errno ("N requested and M written"); this one carries ENOSPC."""
    with open(path, "wb") as f:
        f.write(memoryview(np.ascontiguousarray(ids)).cast("B"))


def _intact(path: Path, count: Path, itemsize: int) -> bool:
    try:
        return count.is_file() and path.stat().st_size == int(count.read_text().strip()) * itemsize
    except (ValueError, UnicodeDecodeError, OSError):
        return False
