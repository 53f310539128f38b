"""End-to-end tests: data."""

import os

import numpy as np
import pytest

from helpers import shared_data_dir
from iattention.data import DataConfig, load_data, load_tokenizer


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
