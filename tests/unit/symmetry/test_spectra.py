"""Head spectra (`symmetry/spectra.py`): the singular values of each head's d x d QK and OV products, and
the effective rank."""

import copy

import pytest
import torch

from helpers import make_model
from iattention.attention.heads import HeadWeights
from iattention.symmetry import canonicalize, random_gauge
from iattention.symmetry.spectra import effective_rank, head_spectra


def test_head_spectra_are_gauge_invariant_and_the_svd_of_the_products():
    model = make_model(n_head=3)
    hw = model.transformer.h[0].attn.to_heads()
    s = head_spectra(hw)
    direct = torch.linalg.svdvals(hw.W_Q.double() @ hw.W_K.double().transpose(1, 2))[:, : model.config.d_head]
    assert torch.allclose(s["qk"], direct, rtol=1e-9)
    direct_ov = torch.linalg.svdvals(hw.W_V.double() @ hw.W_O.double())[:, : model.config.d_head]
    assert torch.allclose(s["ov"], direct_ov, rtol=1e-9)
    moved = copy.deepcopy(model)
    random_gauge(moved, seed=3)
    canon = canonicalize(copy.deepcopy(model), block="pivoted")
    for other in (moved, canon):
        t = head_spectra(other.transformer.h[0].attn.to_heads())
        assert torch.allclose(t["qk"], s["qk"], rtol=1e-8) and torch.allclose(t["ov"], s["ov"], rtol=1e-8)
    assert not torch.allclose(s["qk"], head_spectra(model.transformer.h[1].attn.to_heads())["qk"])


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


def test_a_grouped_layer_s_spectra_are_per_query_head_with_its_group_s_key_and_value_head():
    """Query head h of a GQA layer reads key/value head h // g: its W_Q[h] W_K[h // g]^T (the score form at
    relative position 0) and W_V[h // g] W_O[h]; unchanged by the RoPE-compatible gauge and by canonicalize."""
    from helpers import make_llama
    from iattention.symmetry.transforms import canonicalize, random_gauge

    model = make_llama(n_head=4, n_kv_head=2, rot=4)
    hw = model.attention_layers[0].to_heads()
    s = head_spectra(hw)
    r = model.config.d_head
    assert s["qk"].shape == s["ov"].shape == (4, r)
    for h in range(4):
        j = h // 2
        assert torch.allclose(s["qk"][h], torch.linalg.svdvals(hw.W_Q[h] @ hw.W_K[j].T)[:r], rtol=1e-9)
        assert torch.allclose(s["ov"][h], torch.linalg.svdvals(hw.W_V[j] @ hw.W_O[h])[:r], rtol=1e-9)
    for other in (random_gauge(copy.deepcopy(model), seed=1), canonicalize(copy.deepcopy(model), block="pivoted")):
        t = head_spectra(other.attention_layers[0].to_heads())
        assert torch.allclose(t["qk"], s["qk"], rtol=1e-8) and torch.allclose(t["ov"], s["ov"], rtol=1e-8)
