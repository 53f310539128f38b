"""Unit tests of iattention.data.cache."""

import os

import numpy as np

from helpers import write_corpus
from iattention.data import DataConfig, load_data


def _cfg(paths, cache, tokenizer="byte"):
    return DataConfig(dataset="text", train=paths["train"], valid=paths["valid"], test=paths["test"],
                      tokenizer=tokenizer, cache_dir=str(cache))


def _cache_files(cache):
    return sorted(f for f in os.listdir(os.path.join(cache, "tokens")) if f.endswith(".tok"))


def test_token_cache_hits_and_invalidates(tmp_path):
    paths = write_corpus(tmp_path)
    cfg = _cfg(paths, tmp_path / "c")
    first = load_data(cfg)
    files = _cache_files(tmp_path / "c")
    assert len(files) == 3 and all(f.endswith(".uint16.tok") for f in files)
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


def test_a_truncated_token_cache_is_rebuilt_not_read_as_a_shorter_split(tmp_path, capsys):
    paths = write_corpus(tmp_path)
    cfg = _cfg(paths, tmp_path / "c")
    whole = load_data(cfg).splits["test"].copy()
    tokens = os.path.join(tmp_path / "c", "tokens")
    from iattention.data.cache import cache_key
    from iattention.data.sources import read_split

    name = f"{cache_key(read_split(cfg, 'test'), 'byte')}.uint16.tok"
    assert os.path.getsize(os.path.join(tokens, name)) > 2 * len(whole)  # a header, then the ids
    with open(os.path.join(tokens, name), "r+b") as f:  # cut the test split's cache to half
        f.truncate(len(whole))
    again = load_data(cfg).splits["test"]
    assert np.array_equal(again, whole)
    assert "does not hold the" in capsys.readouterr().err
