"""Gauge-invariant per-head quantities: the singular values of each head's score matrix W_Q W_K^T and
of its output circuit W_V W_O (both d x d, rank <= r). These are what I-Attention claims to
parameterize with fewer numbers, so they are the same for a standard model and its exact canonical
form, and unchanged by any gauge move. Takes math-form weights (HeadWeights), never a model class."""

from __future__ import annotations

import torch

from iattention.attention.heads import HeadWeights


@torch.no_grad()
def head_spectra(hw: HeadWeights) -> dict[str, torch.Tensor]:
    """{'qk': (H, r), 'ov': (H, r)} singular values, largest first, computed in float64 from the r x r
    cores (W_Q W_K^T = Q_q R_q R_k^T Q_k^T has the singular values of R_q R_k^T), so no d x d SVD. With G < H
    key/value heads: per query head h, with its group's W_K[h // g] and
    W_V[h // g] (under RoPE, W_Q W_K^T is the score form at relative position 0; the RoPE-compatible gauge
    leaves it unchanged)."""
    W_K, W_V = hw.per_query_head("W_K"), hw.per_query_head("W_V")  # each query head's key/value head

    def spectrum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # singular values of a @ b^T, (H, d, r) each
        ra = torch.linalg.qr(a.double()).R
        rb = torch.linalg.qr(b.double()).R
        return torch.linalg.svdvals(ra @ rb.transpose(1, 2))

    return {"qk": spectrum(hw.W_Q, W_K), "ov": spectrum(W_V, hw.W_O.transpose(1, 2))}


def effective_rank(sv: torch.Tensor) -> torch.Tensor:
    """Participation ratio (sum s)^2 / sum s^2 over the last axis: 1 for one direction, r for a flat spectrum."""
    return sv.sum(-1) ** 2 / (sv**2).sum(-1).clamp_min(1e-300)
