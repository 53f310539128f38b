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

from iattention.attention.base import CausalSelfAttention, row_blocks, unsplit_heads
from iattention.attention.heads import HeadWeights, eye_heads_in, eye_heads_out, fused_to_heads, heads_to_fused
from iattention.errors import UserError


class IdentityKOAttention(CausalSelfAttention):
    variant = "identity_ko"

    def __init__(self, config):
        super().__init__(config)
        d = config.n_embd
        self.c_qv = nn.Linear(d, 2 * d, bias=config.qkv_bias)
        self.b_K = nn.Parameter(torch.zeros(d)) if config.qkv_bias else None
        self.b_O = nn.Parameter(torch.zeros(d)) if config.o_bias else None

    @classmethod
    def unsupported(cls, config) -> str | None:
        return unsplit_heads(config, "the keys are the input split into heads, the heads' outputs the layer's output")

    @classmethod
    def removed_params(cls, config) -> int:
        """W_K and W_O (d^2 each) per layer, whatever the head count."""
        return config.n_layer * 2 * config.n_embd**2

    @classmethod
    def redundant_biases(cls, config) -> tuple[str, ...]:
        return cls.learned_redundant_biases(config)

    @classmethod
    def projection_flops(cls, config) -> int:
        """Q and V only (4 d^2), at every head count."""
        return 4 * config.n_embd**2

    def qkv(self, x):
        q, v = self.c_qv(x).split(self.n_embd, dim=2)
        k = x if self.b_K is None else x + self.b_K
        return q, k, v

    def project_out(self, y):
        return y if self.b_O is None else y + self.b_O

    def head_blocks(self) -> dict[str, list[tuple]]:
        return {"c_qv.weight": row_blocks((self.n_head, self.n_head), self.d_head)}

    def to_heads(self) -> HeadWeights:
        H, d = self.n_head, self.n_embd
        qv = fused_to_heads(self.c_qv, "QV", (H, H), self.d_head)
        like = qv["W_Q"]
        hw = HeadWeights(W_K=eye_heads_in(d, H, like), W_O=eye_heads_out(d, H, like), **qv)
        hw.b_K = None if self.b_K is None else self.b_K.reshape(H, -1)
        hw.b_O = self.b_O
        return hw

    @torch.no_grad()
    def load_heads(self, hw: HeadWeights) -> None:
        H, d = self.n_head, self.n_embd
        if not (torch.equal(hw.W_K, eye_heads_in(d, H, hw.W_K)) and torch.equal(hw.W_O, eye_heads_out(d, H, hw.W_O))):
            raise UserError("identity_ko attention can only hold heads whose W_K and W_O are the identity "
                            "(a smaller class than standard); keep the model as standard or canonical")
        heads_to_fused(self.c_qv, hw, "QV")
        if self.b_K is not None:
            self.b_K.copy_(hw.b_K.reshape(-1))
        if self.b_O is not None:
            self.b_O.copy_(hw.b_O)
