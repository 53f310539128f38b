"""The "W_Q = I" reduction (Karbevski & Mijoski, arXiv 2510.23912), a control arm.

Queries are the input split into heads (head h reads coordinates [h r, (h+1) r)), with no query
projection and no query bias; keys and values come from one fused GEMM `c_kv`.
"""

from __future__ import annotations

import torch
from torch import nn

from iattention.attention.base import CausalSelfAttention, column_blocks, row_blocks, unsplit_heads
from iattention.attention.heads import (
    HeadWeights,
    eye_heads_in,
    fused_to_heads,
    heads_to_fused,
    heads_to_out,
    out_to_heads,
)
from iattention.errors import UserError


class IdentityQAttention(CausalSelfAttention):
    variant = "identity_q"

    def __init__(self, config):
        super().__init__(config)
        d = config.n_embd
        self.c_kv = nn.Linear(d, 2 * d, bias=config.qkv_bias)
        self.c_proj = nn.Linear(d, d, bias=config.o_bias)
        self.c_proj.residual_scale = True

    @classmethod
    def unsupported(cls, config) -> str | None:
        return unsplit_heads(config, "queries are the input split into heads")

    @classmethod
    def removed_params(cls, config) -> int:
        """W_Q (d^2) and b_Q (d) per layer."""
        return config.n_layer * (config.n_embd**2 + (config.n_embd if config.qkv_bias else 0))

    @classmethod
    def redundant_biases(cls, config) -> tuple[str, ...]:
        return cls.learned_redundant_biases(config)

    @classmethod
    def projection_flops(cls, config) -> int:
        """K, V and O GEMMs: 6 d^2."""
        return 6 * config.n_embd**2

    def qkv(self, x):
        k, v = self.c_kv(x).split(self.n_embd, dim=2)
        return x, k, v

    def project_out(self, y):
        return self.c_proj(y)

    def head_blocks(self) -> dict[str, list[tuple]]:
        r, H = self.d_head, self.n_head
        return {"c_kv.weight": row_blocks((H, H), r), "c_proj.weight": column_blocks(r, H)}

    def to_heads(self) -> HeadWeights:
        kv = fused_to_heads(self.c_kv, "KV", (self.n_head, self.n_head), self.d_head)
        eye = eye_heads_in(self.n_embd, self.n_head, kv["W_K"])
        b_Q = None if kv["b_K"] is None else torch.zeros_like(kv["b_K"])
        return HeadWeights(W_Q=eye, b_Q=b_Q, **kv, **out_to_heads(self.c_proj, self.n_head))

    def load_heads(self, hw: HeadWeights) -> None:
        if not torch.equal(hw.W_Q, eye_heads_in(self.n_embd, self.n_head, hw.W_Q)) or (
                hw.b_Q is not None and hw.b_Q.any()):
            raise UserError("identity_q attention can only hold heads whose W_Q is the identity and b_Q = 0")
        heads_to_fused(self.c_kv, hw, "KV")
        heads_to_out(self.c_proj, hw)
