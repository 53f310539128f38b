"""Per-head weights in math form, the common currency of the symmetry tools.

For head h with head dim r (row-vector convention, x is 1 x d):
    q = x W_Q[h] + b_Q[h],  k = x W_K[h] + b_K[h],  v = x W_V[h] + b_V[h]   (W_*[h]: d x r)
    out = sum_h softmax(q k^T / sqrt(r)) v W_O[h] + b_O                     (W_O[h]: r x d)
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class HeadWeights:
    W_Q: torch.Tensor  # (H, d, r)
    W_K: torch.Tensor  # (H, d, r)
    W_V: torch.Tensor  # (H, d, r)
    W_O: torch.Tensor  # (H, r, d)
    b_Q: torch.Tensor | None = None  # (H, r)
    b_K: torch.Tensor | None = None
    b_V: torch.Tensor | None = None
    b_O: torch.Tensor | None = None  # (d,)

    def to(self, dtype: torch.dtype) -> HeadWeights:
        return HeadWeights(**{f.name: None if (t := getattr(self, f.name)) is None else t.to(dtype)
                              for f in fields(self)})

    @property
    def n_head(self) -> int:
        return self.W_Q.shape[0]


def split_heads_in(W: torch.Tensor, n_head: int) -> torch.Tensor:
    """nn.Linear weight (H*r, d) -> per-head input maps (H, d, r)."""
    out_dim, d = W.shape
    return W.reshape(n_head, out_dim // n_head, d).transpose(1, 2)


def merge_heads_in(W: torch.Tensor) -> torch.Tensor:
    """(H, d, r) -> nn.Linear weight (H*r, d)."""
    H, d, r = W.shape
    return W.transpose(1, 2).reshape(H * r, d)


def split_heads_out(W: torch.Tensor, n_head: int) -> torch.Tensor:
    """nn.Linear weight (d, H*r) of the output projection -> (H, r, d)."""
    d, in_dim = W.shape
    return W.t().reshape(n_head, in_dim // n_head, d)


def merge_heads_out(W: torch.Tensor) -> torch.Tensor:
    """(H, r, d) -> nn.Linear weight (d, H*r)."""
    H, r, d = W.shape
    return W.reshape(H * r, d).t()
