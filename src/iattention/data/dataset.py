"""Token splits and the epoch / evaluation window semantics.

Training: the train split is cut into non-overlapping windows of block_size + 1 tokens
(inputs and shifted targets share block_size tokens), visited in a fresh random order every
epoch (numpy Generator seeded with seed + epoch); the last incomplete batch is dropped.
Evaluation: every token of a split after the first is predicted exactly once, in
non-overlapping windows of up to block_size predictions; perplexity = exp(total NLL / count).
The text those predictions score (`scored_text`) is what words and bytes are counted in, for the
tokenizer-free metrics (per word, per byte) that compare models across tokenizers.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np
import torch

from iattention.data.cache import cached_tokens
from iattention.data.config import SPLITS, DataConfig
from iattention.data.sources import read_split
from iattention.data.tokenizers import Tokenizer, load_tokenizer
from iattention.errors import UserError


@dataclass
class TokenData:
    tokenizer: Tokenizer
    splits: dict[str, np.ndarray]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def load_data(cfg: DataConfig, splits=SPLITS, tokenizer: Tokenizer | None = None) -> TokenData:
    """The token ids of `splits`. `tokenizer`: one the caller has (a run's own tokenizer.json), so only the
    splits asked for are read; else the data config's, built (a `bpe:N` one from the train split)."""
    texts = {s: read_split(cfg, s) for s in splits}
    if tokenizer is not None:
        tok = tokenizer
    else:
        train_text = texts.get("train") if "train" in texts else None
        if cfg.tokenizer.startswith("bpe:") and train_text is None:
            train_text = read_split(cfg, "train")
        tok = load_tokenizer(cfg, train_text)
    tokens = {s: cached_tokens(cfg, t, tok) for s, t in texts.items()}
    for split, cap in (("train", cfg.train_tokens), ("valid", cfg.valid_tokens)):
        if cap < 0:
            raise UserError(f"data.{split}_tokens must be >= 0 (0 = whole split), got {cap}")
        if split in tokens and cap:
            tokens[split] = tokens[split][:cap]
    return TokenData(tok, tokens)


def tokenizer_of(cfg: DataConfig) -> Tokenizer:
    """The tokenizer a data config names (a `bpe:N` one is rebuilt from, or cached by, its train split)."""
    return load_tokenizer(cfg, read_split(cfg, "train") if cfg.tokenizer.startswith("bpe:") else None)


def check_eval_split(tokens: np.ndarray, split: str, block_size: int, fix: str) -> None:
    """An evaluation split needs one whole window (block_size predictions, so block_size + 1 tokens): a
    shorter one scores a handful of tokens (one token: none at all) and its perplexity means nothing."""
    if len(tokens) < block_size + 1:
        raise UserError(f"the {split} split has {len(tokens)} token(s), fewer than one window of {block_size} "
                        f"predictions plus one token ({block_size + 1}); {fix}")


def fingerprint(tokens: np.ndarray) -> str:
    """sha256 of a token stream (as int64, whatever dtype the cache holds it in)."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype=np.int64).tobytes()).hexdigest()


def n_train_windows(tokens: np.ndarray, block_size: int) -> int:
    return max(0, (len(tokens) - 1) // block_size)


def epoch_order(n_windows: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n_windows)


def train_batch(tokens: np.ndarray, window_ids: np.ndarray, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = window_ids * block_size
    rows = np.stack([np.asarray(tokens[s: s + block_size + 1], dtype=np.int64) for s in starts])
    t = torch.from_numpy(rows)
    return t[:, :-1], t[:, 1:]


def eval_windows(n_tokens: int, block_size: int) -> list[tuple[int, int]]:
    """(start, length) of non-overlapping windows: inputs tokens[s:s+L], targets tokens[s+1:s+L+1]."""
    return [(s, min(block_size, n_tokens - 1 - s)) for s in range(0, n_tokens - 1, block_size)]


def count_words(text: str) -> int:
    """Words as lm-evaluation-harness counts them for its wikitext task: `len(re.split(r"\\s+", text))`,
    so text that starts (ends) with whitespace counts one empty word before (after) it."""
    return len(re.split(r"\s+", text))


@dataclass(frozen=True)
class ScoredText:
    """The text an evaluation of a token stream predicts: every token after the first (the first is
    context only), i.e. the bytes of tokens[1:]. `tokens` is their number (split_nll's count)."""
    tokens: int
    words: int
    bytes: int


def scored_text(tokenizer: Tokenizer, tokens: np.ndarray, text: str | None = None) -> ScoredText:
    """Tokens, words and UTF-8 bytes of the scored span tokens[1:], decoded exactly: a character that the
    cut after the first token splits keeps its bytes (and reads as U+FFFD, a non-space, for the words).
    Where tokens[0] is the BOS the tokenizer puts before a document, the scored span is the whole text.
    No words or bytes (0: no per-word or per-byte figures) where they cannot be had exactly: a tokenizer
    whose pieces do not spell bytes, or (given the `text` the tokens encode) a text it did not keep as is
    (a normalizer, an unknown token)."""
    if len(tokens) < 2:
        return ScoredText(0, 0, 0)
    bos = tokenizer.bos is not None and int(tokens[0]) == tokenizer.bos
    raw = tokenizer.decode_bytes(tokens, at_start=True) if bos else tokenizer.decode_bytes(tokens[1:])
    whole = text.encode("utf-8") if text is not None else None
    if not tokenizer.exact_bytes or whole is not None and not (raw == whole if bos else whole.endswith(raw)):
        return ScoredText(len(tokens) - 1, 0, 0)
    return ScoredText(len(tokens) - 1, count_words(raw.decode("utf-8", errors="replace")), len(raw))
