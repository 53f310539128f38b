"""Unit tests of iattention.symmetry.transforms on the Llama family: the RoPE / grouped-query gauge, its canonical
form, the counts (the GPT-2 cases are test_transforms.py)."""

from __future__ import annotations

import pytest
import torch

from helpers import make_llama
from iattention.attention.rope import pair_dims
from iattention.symmetry import transforms as sg
from iattention.symmetry.counts import removed_split

# (name, config overrides): MHA, GQA, MQA, partial RoPE in both layouts, no RoPE, head width != d / H, biases
SHAPES = [
    ("mha", dict(n_kv_head=4)),
    ("gqa", dict()),
    ("mqa", dict(n_kv_head=1, qkv_bias=True, o_bias=True)),
    ("partial-half", dict(rot=4, qkv_bias=True)),
    ("partial-interleaved", dict(rot=6, rope_layout="interleaved")),
    ("interleaved", dict(rope_layout="interleaved", n_kv_head=1)),
    ("d_head-12", dict(d_head=12, rot=8)),
    ("no-rope", dict(rot=0, qkv_bias=True, o_bias=True)),  # rot=0: no rotary dims (was "all" before one family)
]
IDS = [name for name, _ in SHAPES]


def _x():
    return torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(5))


def _layer_outputs(model):
    """Each attention layer's output on the same random normalised input (no residual stream in between), so
    a change far below the logits' float32 RMSNorm rounding is still seen."""
    x = torch.randn(2, 20, model.config.n_embd, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    rope = model.transformer.rotary_emb(torch.arange(20), torch.float64)
    with torch.no_grad():
        return torch.stack([attn(x, rope=rope) for attn in model.attention_layers])


def _diff(a, b) -> float:
    with torch.no_grad():
        logits = (a(_x())[0] - b(_x())[0]).abs().max().item()
        return max(logits, (_layer_outputs(a) - _layer_outputs(b)).abs().max().item())


def _moved(model, A_q, A_k, S_v, S_o):
    """A copy with W_Q[h] A_q[h], W_K[j] A_k[j]^{-T}, W_V[j] S_v[j], W_O[h] -> S_o[h]^{-1} W_O[h] (biases alike):
    any gauge, commuting or not, per query head or per group."""
    out = sg.expand(model)
    for attn in out.attention_layers:
        hw = attn.to_heads().to(torch.float64)
        A_k_inv_T = torch.linalg.inv(A_k).mT
        hw.W_Q, hw.W_K, hw.W_V, hw.W_O = hw.W_Q @ A_q, hw.W_K @ A_k_inv_T, hw.W_V @ S_v, torch.linalg.solve(S_o, hw.W_O)
        if hw.b_Q is not None:
            hw.b_Q = (hw.b_Q.unsqueeze(1) @ A_q).squeeze(1)
            hw.b_K = (hw.b_K.unsqueeze(1) @ A_k_inv_T).squeeze(1)
            hw.b_V = (hw.b_V.unsqueeze(1) @ S_v).squeeze(1)
        attn.load_heads(hw)
    return out


@pytest.mark.parametrize("kw", [kw for _, kw in SHAPES], ids=IDS)
def test_a_random_commuting_gauge_keeps_the_function(kw):
    model = make_llama(**kw)
    moved = sg.random_gauge(sg.expand(model), seed=3)
    assert _diff(moved, model) <= 1e-12
    changed = max((a - b).abs().max().item() for a, b in zip(moved.state_dict().values(), model.state_dict().values()))
    assert changed > 0.1, "the gauge did not move the weights: the test would pass vacuously"


def _controls(cfg):
    """Gauges that do not commute with RoPE, or do not respect the groups: each must change the function."""
    G, r, rot = cfg.n_kv_head, cfg.d_head, cfg.rot
    gen = torch.Generator().manual_seed(4)
    base = sg.random_commuting(G, r, rot, cfg.rope_layout, gen)
    first, second = pair_dims(rot, cfg.rope_layout)
    out = {}
    shear = base.clone()
    shear[:, first[0], second[0]] += 0.7  # a 2 x 2 map inside pair 0 that is not a complex scalar
    out["shear inside a pair"] = shear
    swap = torch.eye(r, dtype=torch.float64).repeat(G, 1, 1)
    p = list(range(r))
    a, b, c, e = (int(t) for t in (first[0], first[1], second[0], second[1]))
    p[a], p[b], p[c], p[e] = b, a, e, c
    out["swap of two pairs"] = swap[:, :, p]  # orthogonal, but moves pair 0's frequency onto pair 1
    if r > rot:
        mix = base.clone()
        mix[:, first[0], rot] += 0.7  # a rotary dim feeding a pass dim
        out["rotary-pass mix"] = mix
    return out


@pytest.mark.parametrize("kw", [kw for name, kw in SHAPES if name in ("gqa", "partial-half", "partial-interleaved")],
                         ids=["gqa", "partial-half", "partial-interleaved"])
def test_gauges_that_do_not_commute_with_rope_change_the_function(kw):
    model = make_llama(**kw)
    cfg = model.config
    g = cfg.group
    eye = torch.eye(cfg.d_head, dtype=torch.float64).repeat(cfg.n_kv_head, 1, 1)
    for what, A in _controls(cfg).items():
        moved = _moved(model, A.repeat_interleave(g, 0), A, eye, eye.repeat_interleave(g, 0))
        assert _diff(moved, model) > 1e-3, f"{what} kept the function"
    # the commuting base itself keeps it, so the controls fail for their non-commuting part only
    A = sg.random_commuting(cfg.n_kv_head, cfg.d_head, cfg.rot, cfg.rope_layout, torch.Generator().manual_seed(4))
    assert _diff(_moved(model, A.repeat_interleave(g, 0), A, eye, eye.repeat_interleave(g, 0)), model) <= 1e-12


def test_one_group_must_share_its_gauges():
    """Two query heads of one group given different (each commuting) A, or different S, change the function."""
    model = make_llama()
    cfg = model.config
    gen = torch.Generator().manual_seed(6)
    A_q = sg.random_commuting(cfg.n_head, cfg.d_head, cfg.rot, cfg.rope_layout, gen)  # one per query head
    eye = torch.eye(cfg.d_head, dtype=torch.float64)
    per_head = _moved(model, A_q, A_q[:: cfg.group], eye.repeat(cfg.n_kv_head, 1, 1), eye.repeat(cfg.n_head, 1, 1))
    assert _diff(per_head, model) > 1e-3
    S_o = sg._random_invertible(cfg.n_head, cfg.d_head, gen, 2.0)
    per_head_vo = _moved(model, eye.repeat(cfg.n_head, 1, 1), eye.repeat(cfg.n_kv_head, 1, 1), S_o[:: cfg.group], S_o)
    assert _diff(per_head_vo, model) > 1e-3
    shared = _moved(model, A_q[:: cfg.group].repeat_interleave(cfg.group, 0), A_q[:: cfg.group],
                    S_o[:: cfg.group], S_o[:: cfg.group].repeat_interleave(cfg.group, 0))
    assert _diff(shared, model) <= 1e-12


@pytest.mark.parametrize("kw", [kw for _, kw in SHAPES], ids=IDS)
@pytest.mark.parametrize("block", ["pivoted", "aligned"])
def test_canonicalize_and_expand_are_exact(kw, block):
    model = make_llama(**kw)
    canon = sg.canonicalize(model, block=block)
    assert canon.config.attention == "canonical"
    assert _diff(canon, model) <= 1e-11
    back = sg.expand(canon)
    assert back.config.attention == "standard" and _diff(back, model) <= 1e-11


@pytest.mark.parametrize("kw", [kw for _, kw in SHAPES], ids=IDS)
def test_the_fixed_entries_are_one_zero_and_identity(kw):
    """After canonicalizing, each rotary pair's pivot row is (1, 0), each pass block and output block is I, at the
    blocks pivoting chose for the source."""
    model = make_llama(**kw)
    cfg = model.config
    canon = sg.canonicalize(model, block="pivoted")
    hw = canon.attention_layers[0].to_heads()
    blocks = sg.select_blocks(model.attention_layers[0].to_heads(), cfg.rot, cfg.rope_layout, "pivoted")
    first, second = pair_dims(cfg.rot, cfg.rope_layout)
    G, d, r = hw.W_K.shape
    for j in range(G):
        for k in range(cfg.rot // 2):
            row = blocks["rot"][j, k]
            assert hw.W_K[j, row, first[k]].item() == 1.0 and hw.W_K[j, row, second[k]].item() == 0.0
        if r > cfg.rot:
            assert torch.equal(hw.W_K[j, blocks["pass"][j], cfg.rot:], torch.eye(r - cfg.rot, dtype=torch.float64))
        W_O_T = hw.W_O.mT.reshape(G, cfg.group * d, r)
        assert torch.equal(W_O_T[j, blocks["out"][j]], torch.eye(r, dtype=torch.float64))


@pytest.mark.parametrize("kw", [kw for _, kw in SHAPES], ids=IDS)
def test_the_canonical_form_is_unique_under_a_gauge(kw):
    """A randomly gauged copy canonicalizes to the same weights (same blocks: aligned ones do not depend on the
    weights; the rotary pivots of 'pivoted' do not depend on the gauge either)."""
    model = make_llama(**kw)
    moved = sg.random_gauge(sg.expand(model), seed=8)
    a, b = sg.canonicalize(model, block="aligned"), sg.canonicalize(moved, block="aligned")
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(x, y, rtol=0, atol=1e-9), name
    assert max((x - y).abs().max().item() for x, y in zip(model.state_dict().values(), moved.state_dict().values())
               if x.is_floating_point()) > 0.1


def test_the_rotary_pivot_does_not_depend_on_the_gauge():
    model = make_llama()
    moved = sg.random_gauge(sg.expand(model), seed=2)
    cfg = model.config
    for a, b in zip(model.attention_layers, moved.attention_layers):
        pa = sg.select_blocks(a.to_heads(), cfg.rot, cfg.rope_layout, "pivoted")["rot"]
        pb = sg.select_blocks(b.to_heads(), cfg.rot, cfg.rope_layout, "pivoted")["rot"]
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("kw", [kw for _, kw in SHAPES], ids=IDS)
def test_removed_parameters_follow_the_formula(kw):
    model = make_llama(**kw)
    cfg = model.config
    G, r, rot = cfg.n_kv_head, cfg.d_head, cfg.rot
    expected = cfg.n_layer * G * (rot + (r - rot) ** 2 + r * r)  # written out, not taken from the code
    canon = sg.canonicalize(model)
    assert model.num_params() - canon.num_params() == expected
    assert sum(removed_split(cfg).values()) == expected
    assert type(canon.attention_layers[0]).removed_params(cfg) == expected


def test_pivoting_beats_aligned_blocks_on_a_badly_scaled_model():
    """A key row and an output column scaled down make the aligned blocks ill-conditioned; pivoted ones stay tame."""
    model = sg.expand(make_llama(rot=4))
    with torch.no_grad():
        for attn in model.attention_layers:
            attn.k_proj.weight[:, [0, 4]] *= 1e-4  # input rows of group 0's aligned rotary pivot and pass block
            attn.o_proj.weight[0] *= 1e-4  # one column of group 0's aligned output block
    cfg = model.config
    hw = model.attention_layers[0].to_heads().to(torch.float64)
    piv = sg.conditioning(hw, cfg.rot, cfg.rope_layout, sg.select_blocks(hw, cfg.rot, cfg.rope_layout, "pivoted"))
    ali = sg.conditioning(hw, cfg.rot, cfg.rope_layout, sg.select_blocks(hw, cfg.rot, cfg.rope_layout, "aligned"))
    assert piv["output"].max() < 100 < ali["output"][0]
    assert piv["pass"].max() < 100 < ali["pass"][0]
    assert piv["rotary"].min() >= 1 / cfg.n_embd**0.5 > ali["rotary"][0]
