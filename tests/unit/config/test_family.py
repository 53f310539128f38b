"""A Llama-family model config (`GPTConfig(family="llama" | "qwen2" | "mistral")`, config/model.py): the family's
structural defaults, head width and rotary dims default from the shape, every setting checked where it is made
(the refusal names the key and what it takes), and a saved config read back as itself with an unknown key named;
an old Llama config (`arch: llama`, d_ff, rms_eps) read under today's names."""

import pytest

from iattention.config import GPTConfig
from iattention.errors import UserError


def test_head_width_and_rotary_dims_default_from_the_shape():
    c = GPTConfig(family="llama", n_embd=64, n_head=4, n_kv_head=2)
    assert (c.d_head, c.rot, c.group) == (16, 16, 2)
    assert (c.pos, c.norm, c.mlp, c.bias, c.tie_embeddings, c.projection) == (
        "rope", "rmsnorm", "swiglu", False, False, "separate")
    c = GPTConfig(family="llama", n_embd=64, n_head=4, n_kv_head=1, d_head=8, rot=4)
    assert (c.d_head, c.rot, c.group) == (8, 4, 4)
    assert GPTConfig(family="llama", n_embd=64, n_head=4, rot=0).rot == 0  # rot=0: no rotary dims (was: all)


@pytest.mark.parametrize("changes, must", [
    (dict(n_kv_head=3), ["n_head=4", "n_kv_head=3"]),
    (dict(d_head=128), ["d_head=128", "n_embd=64"]),
    (dict(rot=3), ["model.rot", "even", "3"]),
    (dict(rot=18), ["model.rot", "d_head=16"]),
    (dict(rope_layout="spiral"), ["model.rope_layout", "'spiral'", "half", "interleaved"]),
    (dict(rope_type="yarn"), ["model.rope_type", "'yarn'", "llama3"]),
    # identity_q now serves every family, where it can: not with fewer KV heads than query heads
    (dict(attention="identity_q"), ["identity_q", "2 KV heads for 4 query heads", "standard or canonical"]),
    (dict(family="gemma"), ["model.family", "'gemma'", "qwen2"]),
    (dict(dropout=1.0), ["dropout", "[0, 1)"]),
    (dict(n_layer=0), ["model.n_layer", "positive integer"]),
    (dict(vocab_size=True), ["model.vocab_size", "True"]),
    (dict(rope_theta=-5.0), ["model.rope_theta", "> 0", "-5.0"]),
    (dict(norm_eps=-1e-6), ["model.norm_eps", "> 0"]),  # 0 is "unset" now: the family's 1e-6
    (dict(rope_type="llama3"), ["rope_type=llama3", "factor", "original_max_position_embeddings"]),
    (dict(rope_type="llama3", rope_scaling=dict(factor=8.0)), ["missing or not a number: low_freq_factor"]),
    (dict(rope_scaling=dict(factor=8.0)), ["model.rope_scaling", "only with model.rope_type=llama3"]),
    (dict(sliding_window=-3), ["model.sliding_window", ">= 0"]),
    (dict(sliding_window=16), ["model.sliding_window=16", "needs model.family mistral or phi3 or qwen2"]),
    (dict(family="mistral", sliding_window=16, attn_kernel="triton"),
     ["model.attn_kernel=triton has no sliding-window mask", "model.sliding_window=16", "auto, sdpa or math"]),
    (dict(family="mistral", sliding_window=16, full_attention_layers=1), ["model.full_attention_layers=1", "qwen2"]),
    (dict(family="qwen2", full_attention_layers=1), ["model.full_attention_layers=1", "model.sliding_window"]),
    (dict(max_positions=64), ["model.max_positions=64", "model.block_size=128"]),
])
def test_a_bad_setting_names_the_key_and_what_it_takes(changes, must):
    with pytest.raises(UserError) as err:
        GPTConfig(**{**dict(family="llama", n_embd=64, n_head=4, n_kv_head=2, block_size=128), **changes})
    for m in must:
        assert m in str(err.value)


def test_a_saved_config_reads_back_as_itself_and_an_unknown_key_is_named():
    c = GPTConfig(family="qwen2", n_embd=48, n_head=6, n_kv_head=3, rot=4, rope_layout="interleaved", qkv_bias=True)
    d = c.to_dict()
    assert d["family"] == "qwen2" and "arch" not in d and GPTConfig.from_dict(d) == c
    assert c.replace(n_layer=5).n_layer == 5 and c.n_layer == 12
    with pytest.raises(UserError) as err:
        GPTConfig.from_dict({**d, "n_experts": 8})
    assert "n_experts" in str(err.value) and "n_kv_head" in str(err.value)  # the key and the allowed ones


def test_an_old_llama_config_reads_under_today_s_names():
    # as LlamaConfig.to_dict wrote it: arch, d_ff, rms_eps, and rot stored resolved (there 0 meant all dims)
    old = dict(arch="llama", family="mistral", n_layer=2, n_head=4, n_kv_head=2, n_embd=64, d_head=16, rot=0,
               d_ff=96, rms_eps=1e-5, vocab_size=100, block_size=32, tie_embeddings=True)
    c = GPTConfig.from_dict(old)
    assert (c.family, c.mlp_hidden, c.norm_eps, c.rot, c.tie_embeddings) == ("mistral", 96, 1e-5, 16, True)
    assert GPTConfig.from_dict({**old, "rot": 8}).rot == 8
    assert GPTConfig.from_dict({k: v for k, v in old.items() if k != "family"}).family == "llama"
    with pytest.raises(UserError, match=r"model.d_ff and model.mlp_hidden are both set"):
        GPTConfig.from_dict({**old, "mlp_hidden": 96})


def test_a_window_is_per_layer_and_kept_by_a_saved_config():
    """Mistral's window on every layer, Qwen2's from full_attention_layers on; a window shorter than the block is
    a setting now (it was refused: the model attended over its whole block), and a config without one is written
    as before (no new key)."""
    m = GPTConfig(family="mistral", n_embd=64, n_head=4, n_kv_head=2, n_layer=3, block_size=128, sliding_window=16)
    q = GPTConfig(family="qwen2", n_embd=64, n_head=4, n_kv_head=2, n_layer=3, block_size=128, sliding_window=16,
                  full_attention_layers=2)
    assert [m.window_of(i) for i in range(3)] == [16, 16, 16] and [q.window_of(i) for i in range(3)] == [0, 0, 16]
    assert GPTConfig.from_dict(q.to_dict()) == q
    assert "full_attention_layers" not in m.to_dict() and "sliding_window" not in m.replace(sliding_window=0).to_dict()
