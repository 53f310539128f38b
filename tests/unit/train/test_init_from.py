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


def test_a_gqa_source_s_head_count_fix_names_its_kv_heads_too():
    """A run of 2 heads (n_kv_head following n_head) from a source of 4 heads over 2 KV heads: the line named
    n_head only, and with that set the next try was refused for n_kv_head (its 4 followed the new n_head): every
    key to set comes at once (found by a hostile-input walkthrough)."""
    kw = dict(family="llama", n_layer=2, n_embd=32, vocab_size=67, block_size=64)
    source = GPTConfig(**kw, n_head=4, n_kv_head=2)
    with pytest.raises(UserError) as err:
        _check_fits("SRC", GPTConfig(**kw, n_head=2), source, None, None)
    assert "set model.n_head=4 model.n_kv_head=2" in str(err.value)
    _check_fits("SRC", GPTConfig(**kw, n_head=4, n_kv_head=2), source, None, None)


@pytest.mark.parametrize("family, kw", [("gpt2", dict(n_head=2)), ("gpt_neox", dict(n_head=2, rot=4))])
@pytest.mark.parametrize("src_form, run_form", [("standard", "minimal"), ("minimal", "standard"),
                                                ("canonical", "minimal"), ("minimal", "canonical")])
def test_init_from_into_or_out_of_minimal_biases_keeps_the_function(tmp_path, family, kw, src_form, run_form):
    """A canonical model with minimal biases (model.minimal_bias) holds other tensors than one without (no b_V;
    b_K only on the rotary dims): init_from between the two loaded a state dict of the wrong keys (a raw
    RuntimeError); it moves the weights through expand / canonicalize(minimal=...) as it does between halves."""
    import torch

    from iattention import GPT
    from iattention.checkpoint.state import save_checkpoint
    from iattention.interop.convert import logits_in_float64, probe_batch
    from iattention.train.init_from import load_initial_weights

    forms = {"standard": dict(attention="standard"), "canonical": dict(attention="canonical"),
             "minimal": dict(attention="canonical", minimal_bias=True)}
    shape = dict(family=family, n_layer=2, n_embd=16, vocab_size=37, vocab_pad_multiple=1, block_size=8, **kw)
    torch.manual_seed(0)
    src = GPT(GPTConfig(**shape, **forms[src_form])).double()
    with torch.no_grad():
        for name, p in src.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("b_") or name.endswith("bias"):
                p.normal_(0, 0.3)  # biases that matter
    save_checkpoint(tmp_path / "src.safetensors", src, {"config": {"model": src.config.to_dict()}})
    run = GPT(GPTConfig(**shape, **forms[run_form])).double()
    load_initial_weights(run, str(tmp_path / "src.safetensors"), None)
    x = probe_batch(src)
    ref = logits_in_float64(src, x)
    assert ((logits_in_float64(run, x) - ref).abs().max() / ref.abs().max()).item() <= 1e-12
