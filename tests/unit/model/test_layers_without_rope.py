"""Rotary as per-layer data (GPTConfig.nope_every: SmolLM3's layers without RoPE), for a family whose record says
its class has such layers: each such layer rotates nothing, its query/key gauge is the whole GL(r), and every tool
that reads a layer's rotary width reads that layer's (the gauge, canonicalize/expand, the counts, the caches)."""

import copy
import dataclasses

import pytest
import torch

from iattention.config.families import FAMILIES
from iattention.config.model import GPTConfig
from iattention.errors import UserError
from iattention.model.gpt import GPT, exact_norms
from iattention.symmetry.counts import param_count, removed_split, standard_param_count
from iattention.symmetry.transforms import canonicalize, expand, random_gauge


@pytest.fixture
def nope_family(monkeypatch):
    """A record like the Llama family's whose class has layers without RoPE (no such family is needed here)."""
    monkeypatch.setitem(FAMILIES, "nope_test", dataclasses.replace(FAMILIES["llama"], name="nope_test", nope=True))
    return "nope_test"


def _model(family, **kw):
    cfg = GPTConfig(family=family, n_layer=4, n_head=4, n_kv_head=kw.pop("n_kv_head", 2), n_embd=32, vocab_size=50,
                    block_size=24, nope_every=2, **kw)
    torch.manual_seed(0)
    model = GPT(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


X = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(1))


def _logits(model):
    with exact_norms(model):
        return model(X)[0]


def test_every_n_th_layer_rotates_nothing_and_the_rest_all_of_a_head(nope_family):
    model = _model(nope_family)
    assert [b.attn.rot for b in model.transformer.h] == [8, 0, 8, 0]
    rotary = GPT(model.config.replace(nope_every=0)).double().eval()
    rotary.load_state_dict(model.state_dict())
    assert (_logits(rotary) - _logits(model)).abs().max() > 1e-3  # the layers without RoPE do differ


def test_the_whole_gl_r_gauge_of_a_layer_without_rope_keeps_the_function_and_canonical_fixes_it(nope_family):
    model = _model(nope_family, qkv_bias=True, o_bias=True)
    ref = _logits(model)
    moved = random_gauge(copy.deepcopy(model), seed=1)
    layer = 1  # no RoPE there: a generic A (not commuting with any rotation) was applied
    k_moved, k_was = (m.transformer.h[layer].attn.k_proj.weight for m in (moved, model))
    assert (k_moved - k_was).abs().max() > 0.1
    assert (_logits(moved) - ref).abs().max() < 1e-9
    canon = canonicalize(moved, block="pivoted")
    assert (_logits(canon) - ref).abs().max() < 1e-9 and (_logits(expand(canon)) - ref).abs().max() < 1e-9
    learned = sum(p.numel() for p in canon.parameters())
    assert param_count(canon.config) == learned  # the counts read each layer's own rotary width
    split = removed_split(canon.config)
    r, G = 8, 2
    assert split["query_key"] == 2 * G * r + 2 * G * r * r  # two rotary layers (rot numbers), two with GL(r)
    assert standard_param_count(canon.config) - learned == split["query_key"] + split["value_output"]


def test_the_k_only_cache_skips_rope_on_those_layers(nope_family):
    model = _model(nope_family, n_kv_head=4)  # multi-head, G r = d: the K-only cache applies
    prompt = X[:1, :5]
    full = model.generate(prompt, 12, temperature=0.0, cache_kind="full")
    assert torch.equal(model.generate(prompt, 12, temperature=0.0, cache_kind="k-only"), full)
    assert torch.equal(model.generate(prompt, 12, temperature=0.0, use_cache=False), full)


def test_a_family_whose_class_has_no_such_layers_refuses_them_in_one_line():
    with pytest.raises(UserError, match="model.nope_every=4 .*transformers' llama rotates every layer"):
        GPTConfig(family="llama", n_head=4, n_embd=32, nope_every=4)
