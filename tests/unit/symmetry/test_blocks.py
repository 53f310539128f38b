"""Block choice (`symmetry/blocks.py`, `transforms.select_blocks`): which rows of a head's key and output matrices
the canonical form fixes (aligned: the head's own; pivoted: the best-conditioned), and their condition numbers."""

import numpy as np
import pytest
import torch

from iattention.attention.heads import HeadWeights
from iattention.symmetry import (
    BLOCKS,
    condition_numbers,
    select_blocks,
)
from iattention.symmetry.blocks import pivoted_rows


def _heads(W_K, W_O) -> HeadWeights:
    """Math-form heads with these key and output maps (one query head per key head; W_Q, W_V random)."""
    return HeadWeights(W_Q=torch.randn(W_K.shape, dtype=torch.float64), W_K=W_K,
                       W_V=torch.randn(W_K.shape, dtype=torch.float64), W_O=W_O)


def test_aligned_blocks_are_each_head_s_rows_and_pivoted_ones_the_best_conditioned():
    assert BLOCKS == ("aligned", "pivoted")
    W_K, W_O = torch.randn(2, 8, 4, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    blocks = select_blocks(_heads(W_K, W_O), 0, "half", "aligned")
    k, o = blocks["pass"], blocks["out"]
    assert k.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and torch.equal(k, o) and blocks["rot"].shape == (2, 0)
    k[0, 0] = 99
    assert o[0, 0] == 0  # two tensors, not one
    with pytest.raises(ValueError) as err:
        select_blocks(_heads(W_K, W_O), 0, "half", "best")
    assert all(m in str(err.value) for m in ("'best'", "aligned", "pivoted"))  # the value and the choices
    # pivoted: rows 5..8 of a 10 x 4 matrix are the identity times 10, the rest tiny: those rows are chosen
    W = torch.full((10, 4), 1e-3, dtype=torch.float64)
    W[5:9] = 10 * torch.eye(4, dtype=torch.float64)
    assert pivoted_rows(W) == [5, 6, 7, 8]
    blocks = select_blocks(_heads(W[None].expand(2, 10, 4), W.T[None].expand(2, 4, 10)), 0, "half", "pivoted")
    k, o = blocks["pass"], blocks["out"]
    assert k.tolist() == o.tolist() == [[5, 6, 7, 8]] * 2
    conds = condition_numbers(W[None], torch.tensor([[5, 6, 7, 8]]))
    assert conds == pytest.approx([np.linalg.cond(W[5:9].numpy())]) and conds[0] == pytest.approx(1.0)
