"""Data: token cache, tokenizers, window semantics."""

import os

import numpy as np
import pytest

from helpers import shared_data_dir, write_corpus
from iattention.data import DataConfig, epoch_order, eval_windows, load_data, load_tokenizer
from iattention.data.cache import cache_root
from iattention.errors import UserError


def _cfg(paths, cache, tokenizer="byte"):
    return DataConfig(dataset="text", train=paths["train"], valid=paths["valid"], test=paths["test"],
                      tokenizer=tokenizer, cache_dir=str(cache))


def _cache_files(cache):
    return sorted(f for f in os.listdir(os.path.join(cache, "tokens")) if f.endswith(".bin"))


def test_token_cache_hits_and_invalidates(tmp_path):
    paths = write_corpus(tmp_path)
    cfg = _cfg(paths, tmp_path / "c")
    first = load_data(cfg)
    files = _cache_files(tmp_path / "c")
    assert len(files) == 3 and all(f.endswith(".uint16.bin") for f in files)
    again = load_data(cfg)
    assert _cache_files(tmp_path / "c") == files  # hit: nothing new written
    assert isinstance(again.splits["train"], np.memmap)
    assert np.array_equal(first.splits["train"], again.splits["train"])
    with open(paths["train"], "a") as f:  # a changed file gets a new entry
        f.write("new words\n")
    changed = load_data(cfg)
    assert len(_cache_files(tmp_path / "c")) == 4
    assert len(changed.splits["train"]) == len(first.splits["train"]) + len("new words\n")
    load_data(_cfg(paths, tmp_path / "c", tokenizer="bpe:300"))  # another tokenizer: 3 more entries
    assert len(_cache_files(tmp_path / "c")) == 7


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


def test_bpe_is_deterministic_and_cached(tmp_path):
    paths = write_corpus(tmp_path)
    a = load_tokenizer(_cfg(paths, tmp_path / "a", "bpe:300"), open(paths["train"]).read())
    b = load_tokenizer(_cfg(paths, tmp_path / "b", "bpe:300"), open(paths["train"]).read())
    text = open(paths["valid"]).read()
    assert 256 < a.vocab_size <= 300  # the tiny corpus may run out of merges
    assert list(a.encode(text)) == list(b.encode(text))
    assert a.decode(a.encode(text)) == text
    assert len(os.listdir(cache_root(_cfg(paths, tmp_path / "a")) / "tokenizers")) == 1


def test_windows_cover_every_token_once():
    for n, T in [(100, 7), (64, 8), (9, 8), (2, 8)]:
        w = eval_windows(n, T)
        covered = [s + 1 + i for s, L in w for i in range(L)]
        assert covered == list(range(1, n))
    a, b = epoch_order(10, 0, 0), epoch_order(10, 0, 1)
    assert sorted(a) == list(range(10)) and not np.array_equal(a, b)
    assert np.array_equal(a, epoch_order(10, 0, 0))


@pytest.mark.skipif(shared_data_dir() is None, reason="../shared/data not present")
def test_gpt2_tokenizer_round_trips_wikitext2_test(tmp_path):
    root = shared_data_dir()
    cfg = DataConfig(dataset="wikitext-2-v1", data_dir=root, tokenizer="gpt2", cache_dir=str(tmp_path))
    tok = load_tokenizer(cfg)
    assert tok.vocab_size == 50257
    assert list(tok.encode("Hello world")) == [15496, 995]
    for name in ("wikitext-2-v1/wiki.test.tokens", "wikitext-2-raw-v1/wiki.test.raw"):
        text = open(os.path.join(root, name), encoding="utf-8").read()
        assert tok.decode(tok.encode(text)) == text
    data = load_data(cfg, splits=("test",))
    assert data.splits["test"].dtype == np.uint16


def test_missing_split_offline_is_a_clear_error(tmp_path):
    (tmp_path / "wikitext-2-raw-v1").mkdir()
    cfg = DataConfig(dataset="wikitext-2-raw-v1", data_dir=str(tmp_path), tokenizer="byte")
    with pytest.raises(UserError, match=r"wikitext-2-raw-v1 train split not found.*wiki\.train\.raw"):
        load_data(cfg)


def test_a_truncated_token_cache_is_rebuilt_not_read_as_a_shorter_split(tmp_path, capsys):
    paths = write_corpus(tmp_path)
    cfg = _cfg(paths, tmp_path / "c")
    whole = load_data(cfg).splits["test"].copy()
    tokens = os.path.join(tmp_path / "c", "tokens")
    from iattention.data.cache import cache_key
    from iattention.data.sources import read_split

    name = f"{cache_key(read_split(cfg, 'test'), 'byte')}.uint16.bin"
    assert os.path.getsize(os.path.join(tokens, name)) == 2 * len(whole)
    with open(os.path.join(tokens, name), "r+b") as f:  # cut the test split's cache to half
        f.truncate(len(whole))
    again = load_data(cfg).splits["test"]
    assert np.array_equal(again, whole)
    assert "does not hold the" in capsys.readouterr().err
