"""`iattn params --arch llama`: shape-only presets of published models, their totals (arithmetic and a
meta-device model), the query/key vs value/output split, and the cache bytes per token; GPT-2 small (the default
GPTConfig) alongside them, counted by the same code."""

from __future__ import annotations

import pytest
import torch

from iattention.config.model import GPTConfig
from iattention.config.shapes import SHAPES, published_count, shape_names, shape_preset
from iattention.model.gpt import GPT
from iattention.symmetry.counts import kv_cache_values_per_token, removed_split, standard_param_count

PUBLISHED = {"llama-3-8b": 8_030_261_248, "smollm2-135m": 134_515_008, "qwen2.5-0.5b": 494_032_768,
             "gpt2-small": 124_439_808}


def _shape(name) -> GPTConfig:
    """A published shape of either family: GPT-2 small is GPTConfig's default, the others are shape presets."""
    return GPTConfig() if name == "gpt2-small" else shape_preset(name)


def test_the_published_totals_from_arithmetic_alone():
    # Each matrix written out: embed, (q, k, v, o [+ q/k/v bias]), gate/up/down, two norms per layer, final norm,
    # head (untied only).
    llama = 128256 * 4096 + 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096) + 4096 \
        + 128256 * 4096
    smol = 49152 * 576 + 30 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536 + 2 * 576) + 576
    qwen = 151936 * 896 + 24 * (896 * 896 * 2 + 896 * 128 * 2 + (896 + 2 * 128) + 3 * 896 * 4864 + 2 * 896) + 896
    # GPT-2: embed, learned positions, (two LayerNorms, c_attn, c_proj, c_fc, c_proj, all with biases), final
    # LayerNorm, tied head
    gpt2 = 50257 * 768 + 1024 * 768 + 12 * (2 * 2 * 768 + 768 * 2304 + 2304 + 768 * 768 + 768 + 768 * 3072 + 3072
                                           + 3072 * 768 + 768) + 2 * 768
    assert (llama, smol, qwen, gpt2) == tuple(PUBLISHED.values())
    for name, total in PUBLISHED.items():
        assert name not in SHAPES or published_count(name) == total
        assert standard_param_count(_shape(name)) == total, name


def _meta(name, attention="standard"):
    with torch.device("meta"):
        return GPT(_shape(name).replace(attention=attention))


# their canonical builds take 3-26 s even on "meta" (the blocks' index bookkeeping)
BIG = ("llama-3-8b", "smollm2-1.7b", "phi-3-mini-4k", "qwen3-0.6b")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n
                                  for n in (*shape_names(), "gpt2-small")])
def test_a_meta_device_model_has_the_closed_form_count_and_split(name):
    cfg = _shape(name)
    std = _meta(name)
    assert std.num_params() == standard_param_count(cfg)
    if name in PUBLISHED:
        assert std.num_params() == PUBLISHED[name]
    can = _meta(name, "canonical")
    split = removed_split(cfg)
    assert std.num_params() - can.num_params() == split["query_key"] + split["value_output"]
    # The split read off the learned tensors: what the key side (the key map, and a query/key norm's key gain) and
    # the output map lost.
    L, G, H, d, r = cfg.n_layer, cfg.n_kv_head, cfg.n_head, cfg.n_embd, cfg.d_head
    key_std = L * G * d * r + sum(p.numel() for n, p in std.named_parameters() if ".k_norm." in n)
    key = sum(p.numel() for n, p in can.named_parameters() if ".W_K" in n or ".k_norm." in n)
    out = sum(p.numel() for n, p in can.named_parameters() if ".W_O_" in n)
    assert key_std - key == split["query_key"]
    assert L * H * r * d - out == split["value_output"]
    # Cache per token: keys and values of every layer's key width (G r); K-only only where that width is d.
    G_, _, r_ = std.transformer.h[0].attn.to_heads().W_K.shape
    width = G_ * r_
    assert kv_cache_values_per_token(cfg) == 2 * L * width
    assert kv_cache_values_per_token(cfg, "k-only") == (L * width if width == d else None)
