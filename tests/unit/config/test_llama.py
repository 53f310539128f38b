"""The Llama-family model config (`config/llama.py`): head width and rotary dims default from the shape, every
setting checked where it is made (the refusal names the key and what it takes), and a saved config read
back as itself with an unknown key named."""

import pytest

from iattention.config.llama import ARCH, LlamaConfig
from iattention.errors import UserError


def test_head_width_and_rotary_dims_default_from_the_shape():
    c = LlamaConfig(n_embd=64, n_head=4, n_kv_head=2)
    assert (c.d_head, c.rot, c.group) == (16, 16, 2)
    c = LlamaConfig(n_embd=64, n_head=4, n_kv_head=1, d_head=8, rot=4)
    assert (c.d_head, c.rot, c.group) == (8, 4, 4)


@pytest.mark.parametrize("changes, must", [
    (dict(n_kv_head=3), ["n_head=4", "n_kv_head=3"]),
    (dict(d_head=128), ["d_head=128", "n_embd=64"]),
    (dict(rot=3), ["model.rot", "even", "3"]),
    (dict(rot=18), ["model.rot", "d_head=16"]),
    (dict(rope_layout="spiral"), ["model.rope_layout", "'spiral'", "half", "interleaved"]),
    (dict(rope_type="yarn"), ["model.rope_type", "'yarn'", "llama3"]),
    (dict(attention="identity_q"), ["'identity_q'", "standard", "canonical"]),
    (dict(family="gemma"), ["model.family", "'gemma'", "qwen2"]),
    (dict(dropout=1.0), ["dropout", "[0, 1)"]),
    (dict(n_layer=0), ["model.n_layer", "positive integer"]),
    (dict(vocab_size=True), ["model.vocab_size", "True"]),
    (dict(rope_theta=-5.0), ["model.rope_theta", "> 0", "-5.0"]),
    (dict(rms_eps=0.0), ["model.rms_eps", "> 0"]),
    (dict(rope_type="llama3"), ["rope_type=llama3", "factor", "original_max_position_embeddings"]),
    (dict(rope_type="llama3", rope_scaling=dict(factor=8.0)), ["missing or not a number: low_freq_factor"]),
    (dict(rope_scaling=dict(factor=8.0)), ["model.rope_scaling", "only with model.rope_type=llama3"]),
    (dict(sliding_window=-3), ["model.sliding_window", ">= 0"]),
    (dict(sliding_window=16), ["model.sliding_window=16", "model.block_size=128", "set model.block_size=16"]),
    (dict(max_positions=64), ["model.max_positions=64", "model.block_size=128"]),
])
def test_a_bad_setting_names_the_key_and_what_it_takes(changes, must):
    with pytest.raises(UserError) as err:
        LlamaConfig(**{**dict(n_embd=64, n_head=4, n_kv_head=2), **changes})
    for m in must:
        assert m in str(err.value)


def test_a_saved_config_reads_back_as_itself_and_an_unknown_key_is_named():
    c = LlamaConfig(n_embd=48, n_head=6, n_kv_head=3, rot=4, rope_layout="interleaved", qkv_bias=True)
    d = c.to_dict()
    assert d["arch"] == ARCH and LlamaConfig.from_dict(d) == c
    assert c.replace(n_layer=5).n_layer == 5 and c.n_layer == 2
    with pytest.raises(UserError) as err:
        LlamaConfig.from_dict({**d, "n_experts": 8})
    assert "n_experts" in str(err.value) and "n_kv_head" in str(err.value)  # the key and the allowed ones
