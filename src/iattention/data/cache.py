"""Token cache: each tokenized split is a flat numpy memmap keyed by (text hash, tokenizer)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from iattention.utils.atomic import write_with


def cache_root(cfg) -> Path:
    root = cfg.cache_dir or os.environ.get("IATTN_CACHE_DIR") or Path.home() / ".cache" / "iattention"
    return Path(root).expanduser()


def cache_key(text: str, tokenizer_fingerprint: str) -> str:
    h = hashlib.sha256(tokenizer_fingerprint.encode())
    h.update(b"\0")
    h.update(text.encode("utf-8"))
    return h.hexdigest()[:24]


def cached_tokens(cfg, text: str, tokenizer) -> np.ndarray:
    """Token ids of `text` as a read-only memmap (uint16 when the vocabulary fits)."""
    dtype = np.uint16 if tokenizer.vocab_size <= 65536 else np.uint32
    path = cache_root(cfg) / "tokens" / f"{cache_key(text, tokenizer.fingerprint)}.{np.dtype(dtype).name}.bin"
    if not path.is_file():
        ids = tokenizer.encode(text).astype(dtype)
        write_with(path, lambda tmp: ids.tofile(tmp))
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")
