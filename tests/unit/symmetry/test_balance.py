"""Unit tests of iattention.symmetry.balance (moved from tests/test_symmetry.py)."""

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
