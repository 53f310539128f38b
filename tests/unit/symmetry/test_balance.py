"""Balancedness (`symmetry/balance.py`): how far each head's (KV group's) factors are from balanced, with biases as
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


@pytest.mark.parametrize("rot, layout", [(4, "half"), (8, "half"), (8, "interleaved")],
                         ids=["partial-rope", "full-rope", "interleaved"])
def test_what_gradient_descent_conserves_per_kv_group_with_rope(rot, layout):
    """A Llama-family model (4 query heads on 2 KV heads, RoPE on `rot` of 8 dims): one (L, G) number per KV
    group, and after 20 small SGD steps without weight decay both barely move (O(lr^2) per step), while the full
    matrix sum_h Q_h^T Q_h - K^T K, which RoPE keeps the gauge from moving, changes over 100x more: what is
    conserved is its pass block and each rotary pair's mean diagonal. (It was a RuntimeError on any GQA model.)"""
    from helpers import make_llama
    from iattention.symmetry.balance import _augment

    def unprojected(model):
        out = []
        for attn in model.attention_layers:
            hw = attn.to_heads().to(torch.float64)
            Q, K = _augment(hw.W_Q, hw.b_Q), _augment(hw.W_K, hw.b_K)
            QQ = (Q.mT @ Q).reshape(hw.n_kv_head, hw.group, 8, 8).sum(1)
            out.append(torch.linalg.matrix_norm(QQ - K.mT @ K))
        return torch.stack(out)

    model = make_llama(rot=rot, rope_layout=layout).train()
    x = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(1))
    before, raw_before = balancedness(model), unprojected(model)
    assert before["qk"].shape == before["vo"].shape == (2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(20):
        opt.zero_grad()
        model(x[:, :-1], x[:, 1:])[1].backward()
        opt.step()
    after, raw = balancedness(model), (unprojected(model) - raw_before).abs().max().item()
    for key in ("qk", "vo"):
        moved = (after[key] - before[key]).abs().max().item()
        assert moved < 1e-2 * raw and moved < 1e-5, (key, moved, raw)
