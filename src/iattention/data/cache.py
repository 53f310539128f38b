"""Token cache: each tokenized split is a flat numpy memmap keyed by (text hash, tokenizer)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np

from iattention.errors import UserError
from iattention.utils.atomic import write_with
from iattention.utils.files import expand_user, home_folder


def cache_root(cfg) -> Path | None:
    """data.cache_dir, else $IATTN_CACHE_DIR, else ~/.cache/iattention; None for a user without a home folder
    (the cache is optional: tokens and tokenizers are then built each time, not kept)."""
    named = cfg.cache_dir or os.environ.get("IATTN_CACHE_DIR")
    home = home_folder()
    if not named and home is None:
        return None
    root = expand_user(named) if named else home / ".cache" / "iattention"
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


# A cache entry is one file: a header, then the ids. The header holds a mark, the entry's own key, the token
# count and a hash of the ids, so the file is published whole by one rename (a reader never sees ids
# without their count, and never judges a live writer's file damaged), and a file that holds another
# key's tokens (a link to another split's entry, a copy) or other bytes is told from the right one.
_MAGIC = b"IATTNTOK1\n"
_HEADER = 128  # bytes: _MAGIC, then "key count sha256\n" in ASCII, padded with spaces


def cached_tokens(cfg, text: str, tokenizer) -> np.ndarray:
    """Token ids of `text` as a read-only memmap (uint16 when the vocabulary fits). An entry whose header
    does not name this key, count and content (another split's file linked in, cut short, overwritten, an
    entry of an older format) is rebuilt with a one-line notice, never read; it is replaced by an atomic
    rename, never deleted first, so a concurrent reader or writer of the same entry is never disturbed."""
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 65536 else np.uint32)
    key = cache_key(text, tokenizer.fingerprint)
    root = cache_root(cfg)
    if root is None:  # no home folder and no cache folder named: nowhere to keep it
        return tokenizer.encode(text).astype(dtype)
    path = root / "tokens" / f"{key}.{dtype.name}.tok"
    if path.is_file():
        ids, problem = _read_entry(path, key, dtype)
        if problem is None:
            return ids
        print(f"iattn: token cache {path} {problem}; rebuilding it", file=sys.stderr)
    ids = tokenizer.encode(text).astype(dtype)
    write_with(path, lambda tmp: _write_entry(tmp, key, ids))
    return _read_entry(path, key, dtype)[0] if len(ids) else ids


def _header(key: str, ids: np.ndarray) -> bytes:
    digest = hashlib.sha256(memoryview(np.ascontiguousarray(ids)).cast("B")).hexdigest()
    return (_MAGIC + f"{key} {len(ids)} {digest}\n".encode()).ljust(_HEADER, b" ")


def _write_entry(path: Path, key: str, ids: np.ndarray) -> None:
    """The header and the ids through Python's file write: numpy's fwrite reports a full disk as an OSError
    without errno ("N requested and M written"); this one carries ENOSPC."""
    with open(path, "wb") as f:
        f.write(_header(key, ids))
        f.write(memoryview(np.ascontiguousarray(ids)).cast("B"))


def _read_entry(path: Path, key: str, dtype: np.dtype) -> tuple[np.ndarray | None, str | None]:
    """(ids, None) for an intact entry of `key`, else (None, what is wrong with it)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER)
        size = path.stat().st_size
    except OSError as e:
        return None, f"is unreadable ({e.strerror})"
    fields = head[len(_MAGIC):].split() if head.startswith(_MAGIC) and len(head) == _HEADER else []
    if len(fields) != 3 or not fields[1].isdigit():
        return None, "is not a token cache entry of this version"
    if fields[0].decode(errors="replace") != key:
        return None, f"holds the tokens of another text (key {fields[0].decode(errors='replace')[:24]})"
    count = int(fields[1])
    if size != _HEADER + count * dtype.itemsize:
        return None, f"does not hold the {count} tokens it records"
    ids = np.memmap(path, dtype=dtype, mode="r", offset=_HEADER, shape=(count,)) if count else np.zeros(0, dtype)
    if _header(key, ids) != head:
        return None, "holds other tokens than it records (its content hash differs)"
    return ids, None
