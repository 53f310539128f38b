"""`iattn params --arch llama`: shape-only presets of published models, their totals (arithmetic and a
meta-device model), the query/key vs value/output split, and the cache bytes per token."""

from __future__ import annotations

import pytest
import torch

from iattention.config.llama_shapes import llama_shape, published_count, shape_names
from iattention.model.llama import Llama
from iattention.symmetry.counts import kv_cache_values_per_token, llama_removed_split, llama_standard_param_count

PUBLISHED = {"llama-3-8b": 8_030_261_248, "smollm2-135m": 134_515_008, "qwen2.5-0.5b": 494_032_768}


def test_the_published_totals_from_arithmetic_alone():
    # Each matrix written out: embed, (q, k, v, o [+ q/k/v bias]), gate/up/down, two norms per layer, final norm,
    # head (untied only).
    llama = 128256 * 4096 + 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096) + 4096 \
        + 128256 * 4096
    smol = 49152 * 576 + 30 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536 + 2 * 576) + 576
    qwen = 151936 * 896 + 24 * (896 * 896 * 2 + 896 * 128 * 2 + (896 + 2 * 128) + 3 * 896 * 4864 + 2 * 896) + 896
    assert (llama, smol, qwen) == tuple(PUBLISHED.values())
    for name, total in PUBLISHED.items():
        assert published_count(name) == total
        assert llama_standard_param_count(llama_shape(name)) == total, name


def _meta(name, attention="standard"):
    with torch.device("meta"):
        return Llama(llama_shape(name).replace(attention=attention))


BIG = ("llama-3-8b", "smollm2-1.7b")  # their canonical builds take 3-8 s even on "meta" (the blocks' index bookkeeping)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in shape_names()])
def test_a_meta_device_model_has_the_closed_form_count_and_split(name):
    cfg = llama_shape(name)
    std = _meta(name)
    assert std.num_params() == llama_standard_param_count(cfg)
    if published_count(name) is not None:
        assert std.num_params() == published_count(name)
    can = _meta(name, "canonical")
    split = llama_removed_split(cfg)
    assert std.num_params() - can.num_params() == split["query_key"] + split["value_output"]
    # The split read off the learned tensors: what the key map and the output map lost.
    L, G, H, d, r = cfg.n_layer, cfg.n_kv_head, cfg.n_head, cfg.n_embd, cfg.d_head
    key = sum(p.numel() for n, p in can.named_parameters() if ".W_K_" in n)
    out = sum(p.numel() for n, p in can.named_parameters() if ".W_O_" in n)
    assert L * G * d * r - key == split["query_key"]
    assert L * H * r * d - out == split["value_output"]
    # Cache per token: keys and values of every layer's k_proj width; K-only only where that width is d.
    width = std.model.layers[0].self_attn.k_proj.weight.shape[0]
    assert kv_cache_values_per_token(cfg) == 2 * L * width
    assert kv_cache_values_per_token(cfg, "k-only") == (L * width if width == d else None)
