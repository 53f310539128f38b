"""Unit tests of iattention.data.dataset."""

import re

import numpy as np
import pytest

from fixtures import UNICODE, bpe_tokenizer, byte_tokenizer
from helpers import write_corpus
from iattention.data import DataConfig, epoch_order, eval_windows, load_data
from iattention.data.dataset import count_words, n_train_windows, scored_text, train_batch
from iattention.errors import UserError
from iattention.train.evaluate import per_unit


def _cfg(paths, cache, tokenizer="byte"):
    return DataConfig(dataset="text", train=paths["train"], valid=paths["valid"], test=paths["test"],
                      tokenizer=tokenizer, cache_dir=str(cache))


def test_split_caps_cut_train_and_validation_only(tmp_path):
    paths = write_corpus(tmp_path)
    whole = load_data(_cfg(paths, tmp_path / "c"))
    cfg = _cfg(paths, tmp_path / "c")
    cfg.train_tokens, cfg.valid_tokens = 100, 50
    cut = load_data(cfg)
    assert np.array_equal(cut.splits["train"], whole.splits["train"][:100])
    assert np.array_equal(cut.splits["valid"], whole.splits["valid"][:50])
    assert np.array_equal(cut.splits["test"], whole.splits["test"])  # the test split is never cut
    cfg.valid_tokens = -1
    with pytest.raises(UserError, match="data.valid_tokens must be >= 0"):
        load_data(cfg)


def test_windows_cover_every_token_once():
    for n, T in [(100, 7), (64, 8), (9, 8), (2, 8)]:
        w = eval_windows(n, T)
        covered = [s + 1 + i for s, L in w for i in range(L)]
        assert covered == list(range(1, n))
    a, b = epoch_order(10, 0, 0), epoch_order(10, 0, 1)
    assert sorted(a) == list(range(10)) and not np.array_equal(a, b)
    assert np.array_equal(a, epoch_order(10, 0, 0))


def test_missing_split_offline_is_a_clear_error(tmp_path):
    (tmp_path / "wikitext-2-raw-v1").mkdir()
    cfg = DataConfig(dataset="wikitext-2-raw-v1", data_dir=str(tmp_path), tokenizer="byte")
    with pytest.raises(UserError, match=r"wikitext-2-raw-v1 train split not found.*wiki\.train\.raw"):
        load_data(cfg)


def test_words_are_counted_as_lm_eval_counts_them():
    # lm-eval's wikitext task: len(re.split(r"\s+", doc)); leading/trailing whitespace adds an empty word
    assert count_words("ab cd") == 2
    assert count_words(" ab  cd\n") == 4  # '', 'ab', 'cd', ''
    assert count_words("\u3000ab") == 2  # unicode whitespace too (a str pattern)


def test_scored_text_is_the_tokens_after_the_first_by_hand():
    tok = byte_tokenizer()
    ids = tok.encode("ab cd\n")
    text = scored_text(tok, ids)  # predicted: "b cd\n" -> 'b', 'cd', ''
    assert (text.tokens, text.words, text.bytes) == (5, 3, 5)
    assert scored_text(tok, ids[:1]) == scored_text(tok, ids[:0]) == type(text)(0, 0, 0)
    assert per_unit(1.0, type(text)(0, 0, 0)) is None


def test_scored_text_of_a_whole_text_is_it_less_its_first_token(tmp_path):
    """Oracle independent of decode_bytes: the bpe tokenizer's own character offsets of the first token
    (which must hold whole characters for offsets to say where it ends: an ASCII start)."""
    tok, source = bpe_tokenizer(tmp_path), " The" + UNICODE
    enc = tok._impl.encode(source)
    rest = source[enc.offsets[0][1]:]
    text = scored_text(tok, tok.encode(source))
    assert (text.tokens, text.words, text.bytes) == (len(enc.ids) - 1, len(re.split(r"\s+", rest)),
                                                      len(rest.encode()))


@pytest.mark.parametrize("block", [1, 4, 7])
@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("extra", [0, 1])
def test_training_windows_are_every_whole_window_of_block_plus_one_tokens(block, k, extra):
    """A training window is block + 1 tokens (inputs and the targets one further), windows step by block:
    the count is the largest n whose last window ends inside the split. At k * block tokens the last
    block is one token short of a window; at k * block + 1 it is whole."""
    tokens = np.arange(k * block + extra)
    n = n_train_windows(tokens, block)
    assert n * block + 1 <= len(tokens) < (n + 1) * block + 1
    if n == 0:
        return
    x, y = train_batch(tokens, np.arange(n), block)
    assert x.shape == y.shape == (n, block)
    for i in range(n):  # window i: inputs tokens[i*block : (i+1)*block], targets one token further
        assert x[i].tolist() == list(range(i * block, (i + 1) * block))
        assert y[i].tolist() == list(range(i * block + 1, (i + 1) * block + 1))


def test_a_split_of_one_window_or_less_has_none_or_one():
    assert n_train_windows(np.arange(0), 4) == 0
    assert n_train_windows(np.arange(1), 4) == 0
    assert n_train_windows(np.arange(4), 4) == 0  # 4 inputs need a fifth token as the last target
    assert n_train_windows(np.arange(5), 4) == 1
