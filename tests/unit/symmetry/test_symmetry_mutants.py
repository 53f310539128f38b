"""Survivors of `make mutation` in symmetry/ turned into checks (tests/mutation/SCORES.md): counts against
built models, spectra against a d x d SVD, balancedness, blocks and the canonical form by hand."""

import numpy as np
import pytest
import torch

from helpers import make_model
from iattention.attention.heads import HeadWeights
from iattention.attention.registry import variant_names
from iattention.config import GPTConfig
from iattention.errors import SingularBlockError
from iattention.model.gpt import GPT
from iattention.symmetry import (
    BLOCKS,
    balancedness,
    bias_redundancy,
    canonicalize,
    condition_numbers,
    expand,
    fold_biases,
    fully_reduced_count,
    iso_param_mlp_hidden,
    param_count,
    redundancy,
    select_blocks,
    standard_param_count,
)
from iattention.symmetry.blocks import pivoted_rows
from iattention.symmetry.spectra import effective_rank, head_spectra


def _learned(model):
    return sum(p.numel() for p in model.parameters())  # tied embeddings: wte counted once


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


def test_spectra_are_the_singular_values_of_the_d_by_d_products():
    g = torch.Generator().manual_seed(0)
    H, d, r = 2, 6, 3
    hw = HeadWeights(*(torch.randn(H, d, r, generator=g, dtype=torch.float64) for _ in range(3)),
                     W_O=torch.randn(H, r, d, generator=g, dtype=torch.float64))
    sp = head_spectra(hw)
    for h in range(H):
        qk = torch.linalg.svdvals((hw.W_Q[h] @ hw.W_K[h].T).double())[:r]
        ov = torch.linalg.svdvals((hw.W_V[h] @ hw.W_O[h]).double())[:r]
        assert torch.allclose(sp["qk"][h], qk, rtol=1e-10) and torch.allclose(sp["ov"][h], ov, rtol=1e-10)
    assert sp["qk"].dtype == torch.float64 and sp["qk"].shape == (H, r)


def test_effective_rank_by_hand():
    assert effective_rank(torch.tensor([1.0, 0.0, 0.0])).item() == pytest.approx(1.0)
    assert effective_rank(torch.tensor([2.0, 2.0, 2.0, 2.0])).item() == pytest.approx(4.0)
    assert effective_rank(torch.tensor([3.0, 1.0])).item() == pytest.approx(16 / 10)
    assert effective_rank(torch.tensor([0.3, 0.1], dtype=torch.float64)).item() == pytest.approx(1.6)  # scale-free
    assert effective_rank(torch.zeros(3, dtype=torch.float64)).item() == 0.0  # no division by zero
    assert effective_rank(torch.tensor([[1.0, 1.0], [1.0, 0.0]])).tolist() == pytest.approx([2.0, 1.0])


def test_balancedness_by_hand():
    model = make_model()
    with torch.no_grad():  # non-zero biases, so the augmented rows count
        for name, p in model.named_parameters():
            if ".attn." in name and p.dim() == 1:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    got = balancedness(model)
    for layer, attn in enumerate(model.attention_layers):
        hw = attn.to_heads().to(torch.float64)
        for h in range(model.config.n_head):
            Q = torch.cat([hw.W_Q[h], hw.b_Q[h][None]], 0)
            K = torch.cat([hw.W_K[h], hw.b_K[h][None]], 0)
            V = torch.cat([hw.W_V[h], hw.b_V[h][None]], 0)
            qk = ((Q.T @ Q - K.T @ K) ** 2).sum().sqrt()
            vo = ((V.T @ V - hw.W_O[h] @ hw.W_O[h].T) ** 2).sum().sqrt()
            assert got["qk"][layer, h].item() == pytest.approx(qk.item(), rel=1e-10)
            assert got["vo"][layer, h].item() == pytest.approx(vo.item(), rel=1e-10)
    nb = balancedness(make_model(bias=False))
    assert nb["qk"].shape == (2, 3) and nb["qk"].dtype == torch.float64


def test_blocks():
    assert BLOCKS == ("aligned", "pivoted")
    W_K, W_O = torch.randn(2, 8, 4, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    k, o = select_blocks(W_K, W_O, "aligned")
    assert k.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and torch.equal(k, o)
    k[0, 0] = 99
    assert o[0, 0] == 0  # two tensors, not one
    with pytest.raises(ValueError, match="unknown block 'best'; choose one of aligned, pivoted"):
        select_blocks(W_K, W_O, "best")
    # pivoted: rows 5..8 of a 10 x 4 matrix are the identity times 10, the rest tiny: those rows are chosen
    W = torch.full((10, 4), 1e-3, dtype=torch.float64)
    W[5:9] = 10 * torch.eye(4, dtype=torch.float64)
    assert pivoted_rows(W) == [5, 6, 7, 8]
    k, o = select_blocks(W[None].expand(2, 10, 4), W.T[None].expand(2, 4, 10), "pivoted")
    assert k.tolist() == o.tolist() == [[5, 6, 7, 8]] * 2
    conds = condition_numbers(W[None], torch.tensor([[5, 6, 7, 8]]))
    assert conds == pytest.approx([np.linalg.cond(W[5:9].numpy())]) and conds[0] == pytest.approx(1.0)


def test_fold_biases_by_hand():
    g = torch.Generator().manual_seed(1)
    H, d, r = 2, 4, 2
    hw = HeadWeights(*(torch.randn(H, d, r, generator=g, dtype=torch.float64) for _ in range(3)),
                     W_O=torch.randn(H, r, d, generator=g, dtype=torch.float64),
                     b_Q=torch.randn(H, r, generator=g, dtype=torch.float64),
                     b_K=torch.randn(H, r, generator=g, dtype=torch.float64),
                     b_V=torch.randn(H, r, generator=g, dtype=torch.float64),
                     b_O=torch.randn(d, generator=g, dtype=torch.float64))
    out = fold_biases(hw)
    want = hw.b_O + sum(hw.b_V[h] @ hw.W_O[h] for h in range(H))
    assert torch.allclose(out.b_O, want) and torch.equal(out.b_Q, hw.b_Q)
    assert not out.b_K.any() and not out.b_V.any()
    assert all(torch.equal(getattr(out, n), getattr(hw, n)) for n in ("W_Q", "W_K", "W_V", "W_O"))
    plain = HeadWeights(hw.W_Q, hw.W_K, hw.W_V, hw.W_O)
    assert fold_biases(plain) is plain


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


def test_singular_output_block_message():
    model = make_model()
    with torch.no_grad():
        W = model.attention_layers[0].c_proj.weight  # (d, d): columns of head 1's W_O^T rows... zero its block
        W[16:32, 16:32] = 0.0
    with pytest.raises(SingularBlockError, match=r"^layer 0 head 1: the output block \[16, 17, 18, 19, 20, 21, "
                                                 r"22, 23\]\.\.\. is singular \(not invertible at all\); use "
                                                 r"block='pivoted' \(--block pivoted\)"):
        canonicalize(model, halves="vo")
    rank1 = make_model()
    with torch.no_grad():
        W = rank1.attention_layers[0].c_attn.weight
        W[48:64] = torch.outer(torch.ones(16, dtype=W.dtype), W[48])  # head 0's W_K has rank 1
    with pytest.raises(SingularBlockError, match="; this head has rank < r and has no canonical form$"):
        canonicalize(rank1, block="pivoted")
    near = make_model()
    with torch.no_grad():
        near.attention_layers[0].c_attn.weight[48:64, 0:16] *= 1e-13  # tiny but invertible: a finite number
        near.attention_layers[0].c_attn.weight[48, 0:16] = 1.0
    with pytest.raises(SingularBlockError, match=r"head 0: the key block .* \(condition number \d"):
        canonicalize(near)
