"""Balancedness (`symmetry/balance.py`): how far each head's factors are from balanced, with biases as
augmented rows."""

import pytest
import torch

from helpers import make_model
from iattention.symmetry import balancedness, random_gauge


def test_balancedness_is_invariant_under_orthogonal_gauge_and_changes_otherwise():
    model = make_model(bias=False)
    b0 = balancedness(model)
    random_gauge(model, seed=0, spread=1.0)  # orthogonal R: conserved quantity transforms by R^T . R
    b1 = balancedness(model)
    assert torch.allclose(b0["qk"], b1["qk"], atol=1e-10)
    random_gauge(model, seed=0, spread=3.0)
    assert not torch.allclose(b1["qk"], balancedness(model)["qk"], atol=1e-3)


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
