"""Shared causal self-attention core: project, split heads, SDPA, merge, project out."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from iattention.attention.cache import KVCache
from iattention.attention.heads import HeadWeights
from iattention.config import GPTConfig


class CausalSelfAttention(nn.Module):
    """Subclasses define how q, k, v are made from x and how heads are mapped back to d."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.d_head = config.d_head
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def project_out(self, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def to_heads(self) -> HeadWeights:
        """The layer's weights in math form (see heads.py)."""
        raise NotImplementedError

    def load_heads(self, hw: HeadWeights) -> None:
        """Set the layer's weights from math form (inverse of to_heads)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        """x (B, T, d). With a cache, x holds only the new positions; keys and values of the earlier
        ones come from the cache (slot `layer`), and the new ones are appended to it."""
        B, T, C = x.shape
        q, k, v = self.qkv(x)
        shape = (B, T, self.n_head, self.d_head)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        past = 0
        if cache is not None:
            past = 0 if cache.keys[layer] is None else cache.keys[layer].shape[2]
            k, v = cache.update(layer, k, v)
        mask = None
        if past and T > 1:  # new position i sees every cached position and new ones up to itself
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=past == 0
        )
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.project_out(y))
