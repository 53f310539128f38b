"""Unit tests of a Llama-family iattention.model.gpt.GPT: cached decoding, full and K-only (transformers parity is in
tests/unit/interop/test_hf_llama.py)."""

from __future__ import annotations

import pytest
import torch

from helpers import make_llama
from iattention.attention.cache import KOnlyCache, KVCache
from iattention.errors import UserError
from iattention.symmetry.transforms import canonicalize

# MHA shapes where the key map is square (n_kv_head x d_head = n_embd): full and partial RoPE, biases, canonical
# shapes whose keys fill the width (n_kv_head x d_head = n_embd), so a K-only cache is exact: MHA, one head, and
# grouped queries with wide heads (there, a query head must take its own group's values: h // group, not h % G)
MHA = [dict(n_kv_head=4), dict(n_kv_head=4, rot=4, qkv_bias=True, o_bias=True),
       dict(n_kv_head=4, rope_layout="interleaved", rot=6), dict(n_head=1, n_kv_head=1),
       dict(n_head=4, n_kv_head=2, d_head=16, qkv_bias=True), dict(n_head=6, n_kv_head=2, d_head=16)]


def _model(kw, canonical=False, dtype=torch.float64):
    model = make_llama(dtype=dtype, **kw)
    return canonicalize(model, block="pivoted") if canonical else model


def _steps(model, x, cache):
    """Prompt of 5, then 1, 3 and the rest: the logits of every position, through the cache."""
    with torch.no_grad():
        return torch.cat([model(x[:, a:b], cache=cache)[0] for a, b in ((0, 5), (5, 6), (6, 9), (9, x.shape[1]))], 1)


@pytest.mark.parametrize("kw", MHA)
@pytest.mark.parametrize("canonical", [False, True])
def test_k_only_cache_gives_the_full_forward(kw, canonical):
    model = _model(kw, canonical)
    x = torch.randint(0, 61, (2, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(x)[0]
    cache = model.make_cache("k-only")
    assert isinstance(cache, KOnlyCache)
    assert (_steps(model, x, cache) - full).abs().max().item() <= 1e-12
    kv = KVCache(model.config.n_layer)
    assert (_steps(model, x, kv) - full).abs().max().item() <= 1e-12
    assert cache.length == kv.length == 14 and 2 * cache.nbytes() == kv.nbytes()


def test_k_only_cache_in_float32():
    model = _model(MHA[1], dtype=torch.float32)
    x = torch.randint(0, 61, (2, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(x)[0]
    got = _steps(model, x, model.make_cache("k-only"))
    assert ((got - full).abs().max() / full.abs().max()).item() <= 1e-4


@pytest.mark.parametrize("canonical", [False, True])
def test_k_only_generation_equals_the_full_cache(canonical):
    model = _model(MHA[1], canonical)
    prompt = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(3))
    full = model.generate(prompt, 15, temperature=0)
    k_only = model.generate(prompt, 15, temperature=0, cache_kind="k-only")
    no_cache = model.generate(prompt, 15, temperature=0, use_cache=False)
    assert torch.equal(k_only, full) and torch.equal(full, no_cache)
    assert len(set(full[0, 5:].tolist())) > 1  # not one token repeated: the comparison sees the attention


def test_the_k_only_value_map_is_needed():
    """Dropping the value map's key bias term breaks the K-only path (so the checks above can fail)."""
    model = _model(MHA[1])
    x = torch.randint(0, 61, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(x)[0]
    for attn in model.attention_layers:
        attn.k_only_value_map = lambda a=attn: (type(a).k_only_value_map(a)[0], None)
    assert (_steps(model, x, model.make_cache("k-only")) - full).abs().max().item() > 1e-3


@pytest.mark.parametrize("kw", [dict(), dict(n_kv_head=1)])
def test_k_only_cache_is_refused_for_grouped_queries(kw):
    model = make_llama(**kw)
    with pytest.raises(UserError, match=r"n_kv_head x d_head = n_embd.* \d+ x 8 = \d+ < 32") as e:
        model.make_cache("k-only")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="unknown cache"):
        model.make_cache("x-only")


def test_k_only_cache_on_keys_wider_than_the_width_says_so():
    """2 heads of 24 (48 key dims > n_embd 32) was refused as "48 < 32", blaming grouped-query attention."""
    with pytest.raises(UserError, match=r"2 x 24 = 48 > 32 key dims per token \(the key map is not square") as e:
        make_llama(n_head=2, n_kv_head=2, d_head=24).make_cache("k-only")
    assert "grouped-query" not in str(e.value)


def test_an_unknown_cache_kind_is_refused():
    from helpers import make_model

    for model in (make_model(), _model(MHA[0])):  # GPT-2 has a K-only cache too (tests/unit/model/test_k_only_gpt.py)
        with pytest.raises(UserError, match="unknown cache 'kv'"):
            model.generate(torch.zeros(1, 2, dtype=torch.long), 2, cache_kind="kv")
