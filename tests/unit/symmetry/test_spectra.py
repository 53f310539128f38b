"""Unit tests of iattention.symmetry.spectra (moved from tests/test_inspect.py)."""

import copy

import torch

from helpers import make_model
from iattention.symmetry import canonicalize, random_gauge
from iattention.symmetry.spectra import head_spectra


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
