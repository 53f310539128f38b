"""The "W_Q = I" reduction (Karbevski & Mijoski, arXiv 2510.23912), a control arm.

Queries are the input split into heads (head h reads coordinates [h r, (h+1) r)), with no query
projection and no query bias; keys and values come from one fused GEMM `c_kv`.
"""

from __future__ import annotations

import torch
from torch import nn

from iattention.attention.base import CausalSelfAttention
from iattention.attention.heads import (
    HeadWeights,
    merge_heads_in,
    merge_heads_out,
    split_heads_in,
    split_heads_out,
)
from iattention.errors import UserError


class IdentityQAttention(CausalSelfAttention):
    variant = "identity_q"

    def __init__(self, config):
        super().__init__(config)
        d = config.n_embd
        self.c_kv = nn.Linear(d, 2 * d, bias=config.bias)
        self.c_proj = nn.Linear(d, d, bias=config.bias)
        self.c_proj.residual_scale = True

    def qkv(self, x):
        k, v = self.c_kv(x).split(self.n_embd, dim=2)
        return x, k, v

    def project_out(self, y):
        return self.c_proj(y)

    def _identity_q(self, like: torch.Tensor) -> torch.Tensor:
        eye = torch.eye(self.n_embd, dtype=like.dtype, device=like.device)
        return split_heads_in(eye, self.n_head)

    def to_heads(self) -> HeadWeights:
        H, r = self.n_head, self.d_head
        Wk, Wv = self.c_kv.weight.split(self.n_embd, dim=0)
        hw = HeadWeights(W_Q=self._identity_q(Wk), W_K=split_heads_in(Wk, H), W_V=split_heads_in(Wv, H),
                         W_O=split_heads_out(self.c_proj.weight, H))
        if self.c_kv.bias is not None:
            bk, bv = self.c_kv.bias.split(self.n_embd)
            hw.b_Q, hw.b_K, hw.b_V, hw.b_O = torch.zeros_like(bk).reshape(H, r), bk.reshape(H, r), \
                bv.reshape(H, r), self.c_proj.bias
        return hw

    @torch.no_grad()
    def load_heads(self, hw: HeadWeights) -> None:
        if not torch.equal(hw.W_Q, self._identity_q(hw.W_Q)) or (hw.b_Q is not None and hw.b_Q.any()):
            raise UserError("identity_q attention can only hold heads whose W_Q is the identity and b_Q = 0")
        self.c_kv.weight.copy_(torch.cat([merge_heads_in(hw.W_K), merge_heads_in(hw.W_V)], dim=0))
        self.c_proj.weight.copy_(merge_heads_out(hw.W_O))
        if self.c_kv.bias is not None:
            self.c_kv.bias.copy_(torch.cat([hw.b_K.reshape(-1), hw.b_V.reshape(-1)]))
            self.c_proj.bias.copy_(hw.b_O)
