"""Unit tests of iattention.model.activations."""

import pytest
import torch

from helpers import make_model
from iattention.attention.registry import variant_names
from iattention.errors import UserError
from iattention.interop.convert import convert
from iattention.model.activations import canonical_view, run_with_cache


@pytest.mark.parametrize("attention", variant_names())
def test_cached_patterns_reproduce_each_layers_attention_output(attention):
    model = make_model(attention=attention, n_head=1 if attention == "identity_ko" else 3)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    logits, cache = run_with_cache(model, idx)
    assert torch.equal(logits, model(idx)[0])
    for layer, block in enumerate(model.transformer.h):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert pattern.shape == (2, model.config.n_head, 12, 12)
        assert torch.allclose(pattern.sum(-1), torch.ones(2, model.config.n_head, 12, dtype=pattern.dtype))
        assert pattern.triu(1).abs().max() == 0  # causal
        attn = block.attn
        _, _, v = attn.qkv(block.ln_1(cache[f"blocks.{layer}.hook_resid_pre"]))
        v = v.reshape(2, 12, attn.n_head, attn.d_head).transpose(1, 2)
        y = (pattern @ v).transpose(1, 2).reshape(2, 12, -1)
        assert torch.allclose(attn.project_out(y), cache[f"blocks.{layer}.hook_attn_out"], atol=1e-12)
        resid_mid = cache[f"blocks.{layer}.hook_resid_pre"] + cache[f"blocks.{layer}.hook_attn_out"]
        assert torch.allclose(resid_mid + block.mlp(block.ln_2(resid_mid)), cache[f"blocks.{layer}.hook_resid_post"])


def test_a_sliding_window_layer_s_pattern_is_what_it_attends_with():
    """A Mistral layer with a window of 4: its cached pattern is zero on every key the window hides and
    reproduces the layer's output (it was the plain causal pattern: every earlier key got weight)."""
    model = make_model(family="mistral", sliding_window=4, n_kv_head=3)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    _, cache = run_with_cache(model, idx)
    for layer, block in enumerate(model.transformer.h):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert pattern.tril(-4).abs().max() == 0 and pattern.triu(1).abs().max() == 0  # keys i - 3 .. i only
        attn = block.attn
        _, _, v = attn.qkv(block.ln_1(cache[f"blocks.{layer}.hook_resid_pre"]))
        v = v.reshape(2, 12, attn.n_head, attn.d_head).transpose(1, 2)
        y = (pattern @ v).transpose(1, 2).reshape(2, 12, -1)
        assert torch.allclose(attn.project_out(y), cache[f"blocks.{layer}.hook_attn_out"], atol=1e-12)


def _canonical(n_head, bias=True):
    """A canonical model converted from a standard one with pivoted blocks (fixed rows and columns that are
    not the aligned ones), and the standard model it expands back to."""
    std = make_model(n_head=n_head, bias=bias)
    canon, _ = convert(std, "canonical", block="pivoted", dtype="float64")
    back, _ = convert(canon, "standard", dtype="float64")
    return canon, back


@pytest.mark.parametrize("n_head", [3, 1])
def test_the_canonical_view_s_products_are_the_expanded_standard_model_s(n_head):
    canon, back = _canonical(n_head)
    view = canonical_view(canon)
    for layer, (block, std_block) in enumerate(zip(canon.transformer.h, back.transformer.h)):
        hw = std_block.attn.to_heads()
        v = {k.rsplit(".", 1)[-1]: t for k, t in view.items() if k.startswith(f"blocks.{layer}.attn.canonical.")}
        assert (v["W_QK"] - hw.W_Q @ hw.W_K.transpose(1, 2)).abs().max() < 1e-12
        assert torch.equal(v["W_K_learned"], block.attn.W_K_free) and torch.equal(v["W_Q"], block.attn.W_Q)
        assert torch.equal(v["W_O_learned"], block.attn.W_O_free.transpose(1, 2))
        assert torch.equal(v["W_V"], block.attn.W_V)
        assert v["W_O_learned"].shape == (n_head, 48 // n_head, 48 - 48 // n_head)


@pytest.mark.parametrize("n_head", [3, 1])
def test_the_canonical_view_s_bilinear_form_gives_the_layer_s_attention_pattern(n_head):
    canon, _ = _canonical(n_head, bias=False)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    _, cache = run_with_cache(canon, idx, canonical=True)
    r = 48 // n_head
    for layer, block in enumerate(canon.transformer.h):
        x = block.ln_1(cache[f"blocks.{layer}.hook_resid_pre"])
        scores = torch.einsum("bid,hde,bje->bhij", x, cache[f"blocks.{layer}.attn.canonical.W_QK"], x) / r**0.5
        mask = torch.ones(12, 12, dtype=torch.bool).tril()
        pattern = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        assert (pattern - cache[f"blocks.{layer}.attn.hook_pattern"]).abs().max() < 1e-12


def test_the_fixed_blocks_are_the_identity_and_one_head_s_W_is_W_Q():
    canon, _ = _canonical(3)
    view = canonical_view(canon)
    for name in ("W_K_fixed", "W_O_fixed"):
        eye = torch.eye(16, dtype=torch.float64).expand(3, 16, 16)
        assert torch.equal(view[f"blocks.0.attn.canonical.{name}"], eye)
    one = make_model(attention="canonical", n_head=1)
    attn = one.transformer.h[1].attn
    attn.set_blocks({"pass": torch.randperm(48, generator=torch.Generator().manual_seed(0))[None],
                     "out": torch.arange(48)[None]})
    view = canonical_view(one)
    rows = view["blocks.1.attn.canonical.k_rows"][0]
    assert not torch.equal(rows, torch.arange(48))  # a real permutation
    W_K = attn.to_heads().W_K[0]  # (d, d): the permutation with ones at (rows[j], j)
    assert torch.equal(W_K, torch.zeros_like(W_K).index_put_((rows, torch.arange(48)), torch.tensor(1.0).double()))
    W, W_Q = view["blocks.1.attn.canonical.W"], view["blocks.1.attn.canonical.W_Q"][0]
    assert torch.equal(W[:, rows], W_Q)  # x_i W x_j^T: W_Q with column j at column rows[j]
    aligned = make_model(attention="canonical", n_head=1)
    view = canonical_view(aligned)
    assert torch.equal(view["blocks.0.attn.canonical.W"], aligned.transformer.h[0].attn.W_Q[0])  # W = W_Q


def test_a_standard_model_has_no_canonical_view_and_says_so():
    with pytest.raises(UserError, match="standard-attention model has no canonical view.*convert --to canonical"):
        run_with_cache(make_model(), torch.zeros(1, 3, dtype=torch.long), canonical=True)


LLAMA_SHAPES = [dict(), dict(n_kv_head=1, rot=4, rope_layout="interleaved", qkv_bias=True, o_bias=True),
                dict(n_head=2, n_kv_head=2, d_head=24)]


@pytest.mark.parametrize("canonical", [False, True])
@pytest.mark.parametrize("kw", LLAMA_SHAPES, ids=["gqa", "mqa-partial-interleaved-bias", "mha-wide"])
def test_a_llama_s_cached_patterns_reproduce_each_layers_attention_output(kw, canonical):
    """The Llama family: RoPE'd scores, each query head reading its group's key and value head."""
    from helpers import make_llama
    from iattention.symmetry.transforms import canonicalize

    model = make_llama(**kw)
    model = canonicalize(model, block="pivoted") if canonical else model
    idx = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    logits, cache = run_with_cache(model, idx)
    assert torch.equal(logits, model(idx)[0])
    c = model.config
    for layer, block in enumerate(model.transformer.h):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert pattern.shape == (2, c.n_head, 12, 12) and pattern.triu(1).abs().max() == 0
        attn = block.attn
        _, _, v = attn.qkv(block.ln_1(cache[f"blocks.{layer}.hook_resid_pre"]))
        v = v.reshape(2, 12, c.n_kv_head, c.d_head).transpose(1, 2).repeat_interleave(c.n_head // c.n_kv_head, 1)
        y = (pattern @ v).transpose(1, 2).reshape(2, 12, -1)
        assert (attn.project_out(y) - cache[f"blocks.{layer}.hook_attn_out"]).abs().max() < 1e-12
        resid_mid = cache[f"blocks.{layer}.hook_resid_pre"] + cache[f"blocks.{layer}.hook_attn_out"]
        assert torch.allclose(resid_mid + block.mlp(block.ln_2(resid_mid)),
                              cache[f"blocks.{layer}.hook_resid_post"])
    assert torch.equal(model.lm_head(cache["ln_final.hook_normalized"]), logits)


@pytest.mark.parametrize("canonical", [False, True])
@pytest.mark.parametrize("family", ["qwen3", "olmo2", "smollm3"])
def test_patterns_through_a_query_key_norm_norms_after_the_sublayers_and_layers_without_rope(family, canonical):
    """Qwen3's per-head and OLMo 2's whole-projection query/key norms, OLMo 2's norms after the sublayers, SmolLM3's
    layers without RoPE: each cached pattern is what its layer attends with (it left the norm out, and rotated the
    layers without RoPE; TransformerLens' patterns of a Qwen3 export differed from ours by 0.58)."""
    from helpers import make_llama
    from iattention.symmetry.transforms import canonicalize

    model = make_llama(family=family, n_layer=2, **({"nope_every": 2} if family == "smollm3" else {}))
    model = canonicalize(model, block="pivoted") if canonical else model
    idx = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    _, cache = run_with_cache(model, idx)
    c = model.config
    for layer, block in enumerate(model.transformer.h):
        attn, x = block.attn, cache[f"blocks.{layer}.hook_resid_pre"]
        x = x if c.norm_place == "post" else block.ln_1(x)  # the attention's input
        _, _, v = attn.qkv(x)
        v = v.reshape(2, 12, c.n_kv_head, c.d_head).transpose(1, 2).repeat_interleave(c.n_head // c.n_kv_head, 1)
        y = (cache[f"blocks.{layer}.attn.hook_pattern"] @ v).transpose(1, 2).reshape(2, 12, -1)
        assert (attn.project_out(y) - cache[f"blocks.{layer}.hook_attn_out"]).abs().max() < 1e-12


@pytest.mark.parametrize("kw", LLAMA_SHAPES, ids=["gqa", "mqa-partial-interleaved-bias", "mha-wide"])
def test_a_llama_canonical_model_s_view_is_its_expanded_model_s_products(kw):
    """One family: a canonical Llama-family model has a canonical view too (before, it was refused as
    "Llama-family ... no canonical view"): W_QK is each query head's W_Q with its group's W_K, the pass rows are
    the identity, each rotary pair's pivot row is (1, 0)."""
    from helpers import make_llama
    from iattention.attention.rope import pair_dims
    from iattention.symmetry.transforms import canonicalize, expand

    canon = canonicalize(make_llama(**kw), block="pivoted")
    view, c = canonical_view(canon), canon.config
    G, r, rot = c.n_kv_head, c.d_head, c.rot
    first, second = pair_dims(rot, c.rope_layout)
    for layer, std in enumerate(expand(canon).attention_layers):
        hw = std.to_heads()
        v = {k.rsplit(".", 1)[-1]: t for k, t in view.items() if k.startswith(f"blocks.{layer}.attn.canonical.")}
        assert (v["W_QK"] - hw.W_Q @ hw.per_query_head("W_K").transpose(1, 2)).abs().max() < 1e-12
        assert v["rot_rows"].shape == (G, rot // 2) and v["o_cols"].shape == (G, r)
        assert torch.equal(v["W_O_fixed"], torch.eye(r, dtype=torch.float64).expand(G, r, r))
        if r > rot:
            assert torch.equal(v["W_K_fixed"], torch.eye(r - rot, dtype=torch.float64).expand(G, r - rot, r - rot))
        for j in range(G):
            pivots = hw.W_K[j, v["rot_rows"][j]]  # (rot/2, r): each pair's pivot row of the expanded key map
            k = torch.arange(rot // 2)
            assert (pivots[k, first] - 1).abs().max() < 1e-12 and pivots[k, second].abs().max() < 1e-12
