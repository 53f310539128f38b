"""train.init_from's comparison of the run's model with the source's (train/init_from.py `_check_fits`)."""

from __future__ import annotations

import pytest

from iattention.config.model import GPTConfig
from iattention.errors import UserError
from iattention.train.init_from import _check_fits


def test_a_source_with_a_sliding_window_asks_the_run_for_it():
    """A Mistral loaded with its window (16) now computes a windowed function; a run without the window would
    silently train another one from its weights, so the difference is named with the key to set."""
    kw = dict(family="mistral", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, vocab_size=67, block_size=128)
    source = GPTConfig(**kw, sliding_window=16)
    with pytest.raises(UserError) as err:
        _check_fits("SRC", GPTConfig(**kw), source, None, None)
    assert "model.sliding_window (source 16, run 0)" in str(err.value)
    assert "set model.sliding_window=16" in str(err.value)
    _check_fits("SRC", GPTConfig(**kw, sliding_window=16), source, None, None)


def test_a_window_at_least_as_long_as_the_run_s_blocks_is_no_difference():
    """A Mistral's window of 4096 in a run of 128-token blocks never binds: the run need not set it (it was
    refused until model.sliding_window=4096 was set); a run at blocks longer than the window still is."""
    kw = dict(family="mistral", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, vocab_size=67)
    source = GPTConfig(**kw, block_size=8192, sliding_window=4096)
    _check_fits("SRC", GPTConfig(**kw, block_size=128), source, None, None)
    with pytest.raises(UserError, match="model.sliding_window \\(source 4096, run 0\\)"):
        _check_fits("SRC", GPTConfig(**kw, block_size=8192), source, None, None)
