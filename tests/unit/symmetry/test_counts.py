"""Parameter counts (`symmetry/counts.py`): each variant's count, redundancy and bias redundancy against the
models built, and the iso-parameter MLP width."""

import pytest

from iattention import GPT, GPTConfig
from iattention.attention.registry import variant_names
from iattention.symmetry import (
    bias_redundancy,
    fully_reduced_count,
    iso_param_mlp_hidden,
    param_count,
    redundancy,
    standard_param_count,
)

VARIANTS = variant_names()


@pytest.mark.slow
@pytest.mark.parametrize("d,heads,layers,bias", [(48, 3, 2, True), (64, 1, 3, False), (96, 4, 1, True),
                                                 (50, 5, 2, False), (768, 12, 12, True)])
@pytest.mark.parametrize("attention", VARIANTS)
def test_param_count_closed_form(d, heads, layers, bias, attention):
    cfg = GPTConfig(n_layer=layers, n_head=heads, n_embd=d, vocab_size=101, block_size=32, bias=bias,
                    attention=attention)
    model = GPT(cfg)
    assert model.num_params() == param_count(cfg)
    # the oracle is the built models, not a formula: what the variant removes is the difference in stored
    # parameters against a built standard model of the same shape
    standard = GPT(cfg.replace(attention="standard"))
    assert redundancy(cfg) == standard.num_params() - model.num_params()
    if attention == "canonical":
        assert redundancy(cfg) == 2 * (d // heads) ** 2 * heads * layers
        # compact storage: the learned tensors hold no masked dead entries
        std = GPT(cfg.replace(attention="standard"))
        assert sum(p.numel() for p in std.parameters()) - sum(p.numel() for p in model.parameters()) \
            == redundancy(cfg)


def test_gpt2_small_counts():
    expected = {1: 110_284_032, 4: 120_900_864, 8: 122_670_336, 12: 123_260_160}
    for heads, n in expected.items():
        cfg = GPTConfig(n_head=heads, attention="canonical")
        assert param_count(cfg) == n
        assert param_count(cfg.replace(attention="standard")) == 124_439_808
        # the paper's "110M at every head count": W_K = W_O = I_d as whole maps
        assert param_count(cfg.replace(attention="identity_ko")) == 110_284_032


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("attention", variant_names())
def test_iso_param_mlp_width_spends_the_saved_parameters_on_the_mlp(attention, heads):
    from iattention.symmetry import iso_param_mlp_hidden, param_count

    std = GPTConfig(n_layer=2, n_head=heads, n_embd=32, vocab_size=64, block_size=16)
    reduced = std.replace(attention=attention)
    wide = reduced.replace(mlp_hidden=iso_param_mlp_hidden(reduced))
    assert (wide.mlp_hidden > 4 * std.n_embd) == (param_count(reduced) < param_count(std))
    model = GPT(wide)
    assert model.transformer.h[0].mlp.c_fc.weight.shape == (wide.mlp_hidden, 32)
    assert model.num_params() == param_count(wide)  # closed form and the model agree at any width
    per_unit = std.n_layer * (2 * std.n_embd + 1)  # one hidden unit: a row of c_fc, its bias, a column of c_proj
    assert abs(param_count(wide) - param_count(std)) <= per_unit / 2


def _learned(model):
    return sum(p.numel() for p in model.parameters())  # tied embeddings: wte counted once


@pytest.mark.parametrize("kw", [dict(family="gpt_neox", rot=2), dict(family="llama", qkv_bias=True, o_bias=True),
                                dict(family="llama", n_kv_head=1, d_head=6, rot=4, qkv_bias=True, o_bias=True)],
                         ids=["neox-partial-rotary", "llama-biases", "llama-mqa-partial"])
def test_the_fully_reduced_count_of_a_rotary_model_is_a_model(kw):
    """What `iattn params` calls fully reduced is built by model.minimal_bias in every family: canonical without
    b_V and without b_K's pass dims (its rotary ones stay)."""
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=12, vocab_size=37, block_size=11, attention="canonical", **kw)
    minimal = cfg.replace(minimal_bias=True)
    assert _learned(GPT(minimal)) == param_count(minimal) == fully_reduced_count(cfg) < param_count(cfg)
    assert param_count(cfg) - fully_reduced_count(cfg) == 2 * cfg.n_kv_head * (2 * cfg.d_head - cfg.rot)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mlp_hidden", [0, 40])
def test_standard_count_is_the_built_models(bias, mlp_hidden):
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=37, vocab_pad_multiple=1, block_size=11,
                    bias=bias, mlp_hidden=mlp_hidden)
    assert standard_param_count(cfg) == _learned(GPT(cfg))
    assert param_count(cfg) == standard_param_count(cfg) and redundancy(cfg) == 0


@pytest.mark.parametrize("attention", variant_names())
def test_variant_counts_are_the_built_models(attention):
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=37, vocab_pad_multiple=1, block_size=11,
                    attention=attention)
    built = _learned(GPT(cfg))
    assert param_count(cfg) == built
    assert redundancy(cfg) == standard_param_count(cfg) - built
    minimal = cfg.replace(minimal_bias=True) if attention == "canonical" else cfg
    if attention == "canonical":
        # b_K dropped and b_V folded: d per layer each, when the model has biases
        assert bias_redundancy(cfg) == 2 * 2 * 16
        assert fully_reduced_count(cfg) == param_count(cfg) - 64
        assert param_count(minimal) == _learned(GPT(minimal))
    assert fully_reduced_count(cfg) == param_count(cfg) - bias_redundancy(cfg)
    assert bias_redundancy(cfg.replace(bias=False)) == 0


@pytest.mark.parametrize("heads", [1, 2])
def test_iso_param_width_by_hand(heads):
    cfg = GPTConfig(n_layer=3, n_head=heads, n_embd=16, vocab_size=37, vocab_pad_multiple=1, block_size=11,
                    attention="canonical")
    std = standard_param_count(cfg.replace(attention="standard"))
    width = iso_param_mlp_hidden(cfg)
    # the nearest width: no other width brings the canonical count closer to standard's
    gaps = {w: abs(param_count(cfg.replace(mlp_hidden=w)) - std) for w in range(width - 3, width + 4)}
    assert min(gaps, key=gaps.get) == width and width > 64
    assert iso_param_mlp_hidden(cfg.replace(attention="standard")) == 64
    assert iso_param_mlp_hidden(cfg.replace(mlp_hidden=100)) == width  # from GPT-2's 4 d, whatever is set
