"""Choosing a block of rows: column-pivoted QR (`transforms.select_blocks` uses it), and blocks' conditioning."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch

BLOCKS = ("aligned", "pivoted")


def pivoted_rows(W: torch.Tensor) -> list[int]:
    """The r best-conditioned rows of a d x r matrix, by column-pivoted QR of W^T (Businger-Golub).

    scipy is used because torch has no pivoted QR.
    """
    r = W.shape[1]
    _, _, piv = scipy.linalg.qr(W.detach().double().cpu().numpy().T, mode="economic", pivoting=True)
    return sorted(int(i) for i in piv[:r])


def condition_numbers(W: torch.Tensor, rows: torch.Tensor) -> np.ndarray:
    """2-norm condition number of each head's chosen block W[h][rows[h]] (W: H x d x r)."""
    blocks = torch.stack([W[h].detach().double()[rows[h]] for h in range(W.shape[0])])
    return torch.linalg.cond(blocks).cpu().numpy()
