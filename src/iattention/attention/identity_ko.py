"""The paper's literal variant: W_K = I_d and W_O = I_d as whole d x d maps ("110M at every head count").

Head h's keys are the residual coordinates [h r, (h+1) r) plus b_K; the concatenated head outputs
are added to the residual unprojected, plus b_O. W_Q and W_V are learned in full (one fused GEMM
`c_qv`); there is no key or output GEMM at any head count. Learned attention parameters per
layer: 2 d^2 + 4 d, i.e. 2 d^2 fewer than standard whatever the head count.

At one head (r = d) this is exactly `canonical` with the aligned block. With H > 1 heads it is
a strictly smaller function class than standard attention: per head, canonical fixes only an
r x r block of W_K[h] (d x r) and learns the other d - r rows; here those rows are zero.
"""

from __future__ import annotations

import torch
from torch import nn

from iattention.attention.base import CausalSelfAttention
from iattention.attention.heads import HeadWeights, merge_heads_in, split_heads_in, split_heads_out
from iattention.errors import UserError


class IdentityKOAttention(CausalSelfAttention):
    variant = "identity_ko"

    def __init__(self, config):
        super().__init__(config)
        d = config.n_embd
        self.c_qv = nn.Linear(d, 2 * d, bias=config.bias)
        self.b_K = nn.Parameter(torch.zeros(d)) if config.bias else None
        self.b_O = nn.Parameter(torch.zeros(d)) if config.bias else None

    def qkv(self, x):
        q, v = self.c_qv(x).split(self.n_embd, dim=2)
        k = x if self.b_K is None else x + self.b_K
        return q, k, v

    def project_out(self, y):
        return y if self.b_O is None else y + self.b_O

    def _eye_in(self, like: torch.Tensor) -> torch.Tensor:
        """W_K = I_d split into heads: (H, d, r), head h picks coordinates [h r, (h+1) r)."""
        return split_heads_in(torch.eye(self.n_embd, dtype=like.dtype, device=like.device), self.n_head)

    def _eye_out(self, like: torch.Tensor) -> torch.Tensor:
        """W_O = I_d split into heads: (H, r, d)."""
        return split_heads_out(torch.eye(self.n_embd, dtype=like.dtype, device=like.device), self.n_head)

    def to_heads(self) -> HeadWeights:
        H, r = self.n_head, self.d_head
        Wq, Wv = self.c_qv.weight.split(self.n_embd, dim=0)
        hw = HeadWeights(W_Q=split_heads_in(Wq, H), W_K=self._eye_in(Wq), W_V=split_heads_in(Wv, H),
                         W_O=self._eye_out(Wq))
        if self.c_qv.bias is not None:
            bq, bv = self.c_qv.bias.split(self.n_embd)
            hw.b_Q, hw.b_K, hw.b_V, hw.b_O = bq.reshape(H, r), self.b_K.reshape(H, r), bv.reshape(H, r), self.b_O
        return hw

    @torch.no_grad()
    def load_heads(self, hw: HeadWeights) -> None:
        if not (torch.equal(hw.W_K, self._eye_in(hw.W_K)) and torch.equal(hw.W_O, self._eye_out(hw.W_O))):
            raise UserError("identity_ko attention can only hold heads whose W_K and W_O are the identity "
                            "(a smaller class than standard); keep the model as standard or canonical")
        self.c_qv.weight.copy_(torch.cat([merge_heads_in(hw.W_Q), merge_heads_in(hw.W_V)], dim=0))
        if self.c_qv.bias is not None:
            self.c_qv.bias.copy_(torch.cat([hw.b_Q.reshape(-1), hw.b_V.reshape(-1)]))
            self.b_K.copy_(hw.b_K.reshape(-1))
            self.b_O.copy_(hw.b_O)
