"""Gauge moves on weights (`symmetry/transforms.py`): canonicalize, expand, fold_biases; exact in float64,
and a singular block named by layer, head and block with the fix."""

import copy

import pytest
import torch

from helpers import make_model, max_rel, tells
from iattention.attention.heads import HeadWeights
from iattention.attention.registry import ATTENTION_REGISTRY, variant_names
from iattention.errors import SingularBlockError
from iattention.symmetry import (
    canonicalize,
    condition_numbers,
    expand,
    fold_biases,
    fully_reduced_count,
    param_count,
    random_gauge,
)

SHAPES = [dict(n_head=3, n_embd=48), dict(n_head=1, n_embd=32), dict(n_head=4, n_embd=40, bias=False)]


def _x():
    return torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("shape", SHAPES)
def test_random_gauge_keeps_function_float64(shape):
    model = make_model(**shape)
    before = model(_x())[0]
    w_before = model.attention_layers[0].to_heads().W_Q.clone()
    random_gauge(model, seed=3)
    assert not torch.allclose(model.attention_layers[0].to_heads().W_Q, w_before)  # weights did move
    assert (model(_x())[0] - before).abs().max().item() <= 1e-10


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", ["aligned", "pivoted"])
@pytest.mark.parametrize("halves", ["both", "qk", "vo"])
def test_canonicalize_expand_round_trip_float64(shape, block, halves):
    model = make_model(**shape)
    random_gauge(model, seed=1)
    ref = model(_x())[0]
    canon = canonicalize(model, block=block, halves=halves)
    assert canon.config.attention == "canonical"
    assert (canon(_x())[0] - ref).abs().max().item() <= 1e-10
    back = expand(canon)
    assert back.config.attention == "standard"
    assert (back(_x())[0] - ref).abs().max().item() <= 1e-10
    assert canon.num_params() < model.num_params()


@pytest.mark.parametrize("block", ["aligned", "pivoted"])
def test_round_trip_float32(block):
    model = make_model(dtype=torch.float32)
    random_gauge(model, seed=2)
    ref = model(_x())[0]
    canon = canonicalize(model, block=block)
    assert canon.transformer.wte.weight.dtype == torch.float32
    assert max_rel(canon(_x())[0], ref) <= 1e-4
    assert max_rel(expand(canon)(_x())[0], ref) <= 1e-4


@pytest.mark.parametrize("attention", variant_names())
def test_every_variant_expands_exactly(attention):
    model = make_model(attention=attention)
    with torch.no_grad():  # biases too, so a wrong bias in to_heads would show
        for name, p in model.named_parameters():
            if ".attn." in name and (p.dim() == 1 or name.rsplit(".", 1)[-1].startswith("b_")):
                p.normal_(0.0, 0.3)
    ref = model(_x())[0]
    std = expand(model)
    assert (std(_x())[0] - ref).abs().max().item() <= 1e-12
    assert (canonicalize(std)(_x())[0] - ref).abs().max().item() <= 1e-10
    if ATTENTION_REGISTRY[attention].full_class:
        assert (canonicalize(model, block="pivoted")(_x())[0] - ref).abs().max().item() <= 1e-10


def test_perturbed_canonical_model_differs():
    """The round-trip test can fail: a wrong block choice changes the function."""
    model = make_model()
    canon = canonicalize(model)
    attn = canon.attention_layers[0]
    attn.set_blocks({"pass": torch.roll(attn.k_perm[:, :16], 1, dims=0), "out": attn.o_perm[:, :16]})  # swap heads
    assert (canon(_x())[0] - model(_x())[0]).abs().max().item() > 1e-3


def test_singular_block_is_reported_and_pivoted_handles_it():
    model = make_model()
    with torch.no_grad():
        attn = model.attention_layers[1]
        W = attn.c_attn.weight  # rows [d, 2d) are W_K^T; head 0's aligned block = input coords 0..15
        W[48:64, 0:16] = 0.0
    with pytest.raises(SingularBlockError, match=r"layer 1 head 0: the key block .* pivoted") as e:
        canonicalize(model, block="aligned")
    assert "nan" not in str(e.value)  # an exactly singular block is "not invertible", not "condition number nan"
    canon = canonicalize(model, block="pivoted")
    assert (canon(_x())[0] - model(_x())[0]).abs().max().item() <= 1e-10
    hw = model.attention_layers[1].to_heads()
    k_rows = canon.attention_layers[1].k_perm[:, :16]
    assert condition_numbers(hw.W_K, k_rows)[0] < 1e6


@pytest.mark.parametrize("heads", [1, 3])
def test_identity_ko_expands_exactly_and_refuses_general_heads(heads):
    from iattention.errors import UserError

    model = make_model(attention="identity_ko", n_head=heads)
    with torch.no_grad():
        for a in model.attention_layers:
            a.b_K.normal_()
    std = expand(model)
    assert std.config.attention == "standard"
    assert (std(_x())[0] - model(_x())[0]).abs().max().item() <= 1e-12
    canon = canonicalize(model, block="pivoted")  # symmetry tools take it as it is (via to_heads)
    assert (canon(_x())[0] - model(_x())[0]).abs().max().item() <= 1e-10
    # back into identity_ko only when W_K and W_O really are the identity
    back = copy.deepcopy(model)
    with torch.no_grad():
        for p in back.attention_layers[0].parameters():
            p.zero_()
    for src, dst in zip(std.attention_layers, back.attention_layers):
        dst.load_heads(src.to_heads())
    assert (back(_x())[0] - model(_x())[0]).abs().max().item() <= 1e-12
    with pytest.raises(UserError, match="identity_ko"):
        back.attention_layers[0].load_heads(make_model(n_head=heads).attention_layers[0].to_heads())


@pytest.mark.parametrize("heads", [1, 3])
def test_minimal_canonicalize_folds_b_v_drops_b_k_and_keeps_the_function(heads):
    """b_K and b_V are redundant: the fully reduced canonical model computes the same logits with 2 d
    fewer parameters per layer, and its count is what `fully_reduced_count` says."""

    model = make_model(n_head=heads)
    with torch.no_grad():
        for attn in model.attention_layers:
            attn.c_attn.bias.normal_(0.0, 0.5)  # sizeable b_Q, b_K, b_V, so a dropped one would show
    canon = canonicalize(model, block="pivoted")
    minimal = canonicalize(model, block="pivoted", minimal=True)
    assert minimal.config.minimal_bias and minimal.attention_layers[0].b_K is None
    assert (minimal(_x())[0] - model(_x())[0]).abs().max().item() <= 1e-10
    assert canon.num_params() - minimal.num_params() == 2 * model.config.n_embd * model.config.n_layer
    assert minimal.num_params() == param_count(minimal.config) == fully_reduced_count(canon.config)
    # b_V is sizeable, so it is the fold into b_O (not a zero b_V) that keeps the function
    hw = canon.attention_layers[0].to_heads()
    assert hw.b_V.abs().max() > 0.1
    assert (expand(minimal)(_x())[0] - model(_x())[0]).abs().max().item() <= 1e-10


def test_random_gauge_is_a_function_of_its_seed():
    """The same seed gives the same gauge whatever the global RNG's state (the transforms draw from the
    seeded generator only), another seed another one."""

    def gauged(seed, global_seed):
        torch.manual_seed(123)
        model = make_model(attention="standard")
        torch.manual_seed(global_seed)
        return random_gauge(model, seed=seed).transformer.h[0].attn.c_attn.weight

    a, b, c = gauged(3, 1), gauged(3, 2), gauged(4, 1)
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_random_invertible_has_singular_values_across_its_spread():
    """`_random_invertible(H, r, gen, spread)`: U diag(s) V with s spread over [1/spread, spread]."""
    from iattention.symmetry.transforms import _random_invertible

    s = torch.linalg.svdvals(_random_invertible(4, 16, torch.Generator().manual_seed(0), 3.0))
    assert s.min() >= 1 / 3 - 1e-12 and s.max() <= 3 + 1e-12
    assert s.min() < 0.5 and s.max() > 2  # both ends reached, not one side of 1


def test_random_invertible_draws_each_head_its_own_rotations():
    """Each head gets its own U and V: with one U shared by all heads, M_h M_h^T = U diag(s_h^2) U^T would
    commute between heads."""
    from iattention.symmetry.transforms import _random_invertible

    M = _random_invertible(2, 6, torch.Generator().manual_seed(0), 3.0)
    A, B = M[0] @ M[0].T, M[1] @ M[1].T
    assert torch.linalg.matrix_norm(A @ B - B @ A) > 1e-3 * torch.linalg.matrix_norm(A) * torch.linalg.matrix_norm(B)


def test_random_invertible_draws_each_head_its_own_right_rotation_and_spectrum():
    """The other two factors per head too: with one V shared by all heads, M_h^T M_h = V^T diag(s_h^2) V would
    commute between heads; with one s shared, every head would have the same singular values."""
    from iattention.symmetry.transforms import _random_invertible

    M = _random_invertible(2, 6, torch.Generator().manual_seed(0), 3.0)
    A, B = M[0].T @ M[0], M[1].T @ M[1]
    assert torch.linalg.matrix_norm(A @ B - B @ A) > 1e-3 * torch.linalg.matrix_norm(A) * torch.linalg.matrix_norm(B)
    s = torch.linalg.svdvals(M)
    assert (s[0] - s[1]).abs().max() > 1e-3


def test_a_block_at_exactly_the_singular_threshold_is_refused():
    from iattention.symmetry.transforms import SINGULAR_COND, _check_block

    W = torch.zeros(1, 3, 2, dtype=torch.float64)
    W[0, 0, 0], W[0, 1, 1] = SINGULAR_COND, 1.0  # the block of rows [0, 1]: singular values 1e12 and 1
    rows = torch.tensor([[0, 1]])
    assert condition_numbers(W, rows)[0] == SINGULAR_COND
    with pytest.raises(SingularBlockError) as e:
        _check_block(2, "key", W[:, :2], rows, "pivoted", 1)  # the block itself: rows [0, 1] of head 0
    tells(e, "layer 2 head 0", "key block [0, 1]", "condition number 1e+12", "no canonical form")
    W[0, 0, 0] = SINGULAR_COND / 2
    _check_block(2, "key", W[:, :2], rows, "pivoted", 1)


def test_fold_biases_by_hand():
    g = torch.Generator().manual_seed(1)
    H, d, r = 2, 4, 2
    hw = HeadWeights(*(torch.randn(H, d, r, generator=g, dtype=torch.float64) for _ in range(3)),
                     W_O=torch.randn(H, r, d, generator=g, dtype=torch.float64),
                     b_Q=torch.randn(H, r, generator=g, dtype=torch.float64),
                     b_K=torch.randn(H, r, generator=g, dtype=torch.float64),
                     b_V=torch.randn(H, r, generator=g, dtype=torch.float64),
                     b_O=torch.randn(d, generator=g, dtype=torch.float64))
    out = fold_biases(hw, 0)
    want = hw.b_O + sum(hw.b_V[h] @ hw.W_O[h] for h in range(H))
    assert torch.allclose(out.b_O, want) and torch.equal(out.b_Q, hw.b_Q)
    assert not out.b_K.any() and not out.b_V.any()
    assert all(torch.equal(getattr(out, n), getattr(hw, n)) for n in ("W_Q", "W_K", "W_V", "W_O"))
    plain = HeadWeights(hw.W_Q, hw.W_K, hw.W_V, hw.W_O)
    assert fold_biases(plain, 0) is plain
    rotary = fold_biases(hw, 1)  # b_K stays on the rotary dim (the first of each head), goes on the pass dim
    assert torch.equal(rotary.b_K[:, 0], hw.b_K[:, 0]) and not rotary.b_K[:, 1].any()
    assert torch.equal(rotary.b_O, out.b_O)


def test_canonical_blocks_are_exactly_the_identity_and_expand_restores_the_products():
    model = make_model()
    model.eval()
    canon = canonicalize(model)
    assert canon.config.attention == "canonical" and not canon.training
    assert canon.transformer.wte.weight.dtype == torch.float64
    H, r = 3, 16
    for src, dst in zip(model.attention_layers, canon.attention_layers):
        hw, cw = src.to_heads(), dst.to_heads()
        for h in range(H):
            rows = list(range(h * r, (h + 1) * r))
            assert torch.equal(cw.W_K[h][rows], torch.eye(r, dtype=torch.float64))
            assert torch.equal(cw.W_O[h][:, rows], torch.eye(r, dtype=torch.float64))
            assert torch.allclose(cw.W_Q[h] @ cw.W_K[h].T, hw.W_Q[h] @ hw.W_K[h].T, atol=1e-10)
            assert torch.allclose(cw.W_V[h] @ cw.W_O[h], hw.W_V[h] @ hw.W_O[h], atol=1e-10)
            assert torch.allclose(cw.b_Q[h] @ cw.W_K[h].T, hw.b_Q[h] @ hw.W_K[h].T, atol=1e-10)
            assert torch.allclose(cw.b_V[h] @ cw.W_O[h], hw.b_V[h] @ hw.W_O[h], atol=1e-10)
    back = expand(canon)
    assert back.config.attention == "standard" and not back.training
    assert back.config.canonical_halves == "both" and not back.config.minimal_bias
    minimal = canonicalize(model, minimal=True)
    assert minimal.config.minimal_bias and minimal.config.init == "gpt2"
    assert not canonicalize(make_model(bias=False), minimal=True).config.minimal_bias


def test_a_singular_block_names_its_layer_head_and_block_and_the_way_out():
    model = make_model()
    with torch.no_grad():
        W = model.attention_layers[0].c_proj.weight  # head 1's output block (rows 16..31 of W_O^T): zero
        W[16:32, 16:32] = 0.0
    with pytest.raises(SingularBlockError) as err:
        canonicalize(model, halves="vo")
    message = str(err.value)
    assert all(m in message for m in ("layer 0 head 1", "output block", "[16, 17", "singular", "--block pivoted"))
    rank1 = make_model()
    with torch.no_grad():
        W = rank1.attention_layers[0].c_attn.weight
        W[48:64] = torch.outer(torch.ones(16, dtype=W.dtype), W[48])  # head 0's W_K has rank 1
    with pytest.raises(SingularBlockError) as err:
        canonicalize(rank1, block="pivoted")
    assert "head 0" in str(err.value) and "no canonical form" in str(err.value)  # no block choice helps
    assert "--block" not in str(err.value)
    near = make_model()
    with torch.no_grad():
        near.attention_layers[0].c_attn.weight[48:64, 0:16] *= 1e-13  # tiny but invertible: a finite number
        near.attention_layers[0].c_attn.weight[48, 0:16] = 1.0
    with pytest.raises(SingularBlockError, match=r"head 0: the key block .* \(condition number \d"):
        canonicalize(near)
