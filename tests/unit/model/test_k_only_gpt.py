"""The K-only cache for every family (GPT-2 and a multi-head Llama, every attention variant): the same per-step
logits and tokens as the full cache, half its bytes; at one canonical head without rotary dims the keys are the
layer input, permuted. `iattn generate --cache`."""

from __future__ import annotations

import pytest
import torch

from helpers import make_model
from iattention.attention.cache import KOnlyCache, KVCache
from iattention.attention.registry import variant_names

# the families as make_model keys: GPT-2, and a Llama whose heads fill the width (n_kv_head = n_head, H r = d), where
# the keys determine the layer input and every variant applies
FAMILIES = {"gpt2": {}, "llama": dict(family="llama")}
CASES = [(f, a, h, bias) for f in FAMILIES for a in variant_names() for h in (1, 3) for bias in (True, False)]


def _steps(model, x, cache):
    """Prompt of 5, then 1, 3 and the rest, through the cache: the logits of every position."""
    with torch.no_grad():
        return torch.cat([model(x[:, a:b], cache=cache)[0] for a, b in ((0, 5), (5, 6), (6, 9), (9, x.shape[1]))], 1)


def _randomize_biases(model):
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("b_" in name or "bias" in name):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def _permuted_canonical_one_head(family, dtype=torch.float64):
    """One canonical head (no rotary dims) whose key map is a random (not the identity) permutation of the input."""
    kw = FAMILIES[family] | (dict(rot=0, bias=True) if family != "gpt2" else {})
    can = _randomize_biases(make_model(dtype=dtype, n_head=1, attention="canonical", **kw))
    gen = torch.Generator().manual_seed(3)
    for layer in can.attention_layers:
        layer.set_blocks({"pass": torch.randperm(48, generator=gen)[None], "out": torch.arange(48)[None]})
        assert not torch.equal(layer.k_perm[0], torch.arange(48)) and not layer._k_identity
    return can


@pytest.mark.parametrize("family,attention,heads,bias", CASES)
def test_k_only_cache_gives_the_full_forward(family, attention, heads, bias):
    model = _randomize_biases(make_model(n_head=heads, attention=attention, bias=bias, **FAMILIES[family]))
    x = torch.randint(0, 97, (2, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(x)[0]
    cache = model.make_cache("k-only")
    assert isinstance(cache, KOnlyCache)
    assert (_steps(model, x, cache) - full).abs().max().item() <= 1e-10
    kv = model.make_cache("full")
    assert (_steps(model, x, kv) - full).abs().max().item() <= 1e-10
    assert 2 * cache.nbytes() == kv.nbytes() == 2 * 2 * 14 * 48 * 8 * model.config.n_layer  # B T d float64 L


@pytest.mark.parametrize("family", FAMILIES)
def test_one_canonical_head_keys_are_the_permuted_input(family):
    can = _permuted_canonical_one_head(family)
    x = torch.randint(0, 97, (1, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = can(x)[0]
    assert (_steps(can, x, can.make_cache("k-only")) - full).abs().max().item() <= 1e-10
    layer = can.attention_layers[0]
    h = torch.randn(1, 3, 48, dtype=torch.float64)
    k = layer.qkv(h)[1]
    assert torch.equal(k, h[..., layer.k_perm[0]] + layer.b_K.reshape(-1))  # the cache holds x itself, permuted
    W_KV, _ = layer.k_only_value_map()
    assert torch.equal(W_KV, layer.W_V[:, layer.k_perm[0], :])  # an index copy, no solve


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attention", ["standard", "canonical"])
def test_k_only_generation_equals_the_full_cache_in_float32(attention, family):
    model = make_model(dtype=torch.float32, n_head=3, attention=attention, n_embd=48, **FAMILIES[family])
    prompt = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(2))
    full = model.generate(prompt, 30, temperature=0)  # past block_size 16: the window restarts too
    k_only = model.generate(prompt, 30, temperature=0, cache_kind="k-only")
    assert torch.equal(k_only, full)
    assert len(set(full[0, 4:].tolist())) > 1


@pytest.mark.parametrize("family", FAMILIES)
def test_the_value_map_is_needed(family):
    """Control: dropping the key-bias correction of the offset changes the logits, so the test above is not
    vacuous."""
    model = _randomize_biases(make_model(n_head=3, bias=True, **FAMILIES[family]))
    x = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(x)[0]
    for attn in model.attention_layers:
        attn.k_only_value_map = lambda a=attn: (type(a).k_only_value_map(a)[0], a.to_heads().b_V)
    assert (_steps(model, x, model.make_cache("k-only")) - full).abs().max().item() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_full_cache_bytes_are_keys_and_values(family):
    model = make_model(n_head=3, **FAMILIES[family])
    kv, ko = KVCache(2), model.make_cache("k-only")
    with torch.no_grad():
        model(torch.zeros(1, 7, dtype=torch.long), cache=kv)
        model(torch.zeros(1, 7, dtype=torch.long), cache=ko)
    assert kv.nbytes() == 2 * ko.nbytes() == 2 * 2 * 7 * 48 * 8
