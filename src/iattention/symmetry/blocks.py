"""Choosing each head's r x r block: aligned coordinates or column-pivoted QR."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch

from iattention.attention.canonical import aligned_blocks

BLOCKS = ("aligned", "pivoted")


def pivoted_rows(W: torch.Tensor) -> list[int]:
    """The r best-conditioned rows of a d x r matrix, by column-pivoted QR of W^T (Businger-Golub).

    scipy is used because torch has no pivoted QR.
    """
    r = W.shape[1]
    _, _, piv = scipy.linalg.qr(W.detach().double().cpu().numpy().T, mode="economic", pivoting=True)
    return sorted(int(i) for i in piv[:r])


def select_blocks(W_K: torch.Tensor, W_O: torch.Tensor, block: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, r) key rows and (H, r) output columns to fix to the identity, per head."""
    H, d, r = W_K.shape
    if block == "aligned":
        b = aligned_blocks(H, r)
        return b, b.clone()
    if block == "pivoted":
        k = torch.tensor([pivoted_rows(W_K[h]) for h in range(H)])
        o = torch.tensor([pivoted_rows(W_O[h].t()) for h in range(H)])
        return k, o
    raise ValueError(f"unknown block {block!r}; choose one of {', '.join(BLOCKS)}")


def condition_numbers(W: torch.Tensor, rows: torch.Tensor) -> np.ndarray:
    """2-norm condition number of each head's chosen block W[h][rows[h]] (W: H x d x r)."""
    blocks = torch.stack([W[h].detach().double()[rows[h]] for h in range(W.shape[0])])
    return torch.linalg.cond(blocks).cpu().numpy()
