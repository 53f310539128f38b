"""Standard GPT-2 multi-head attention: fused QKV projection `c_attn`, output projection `c_proj`."""

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


class StandardAttention(CausalSelfAttention):
    variant = "standard"

    def __init__(self, config):
        super().__init__(config)
        d = config.n_embd
        self.c_attn = nn.Linear(d, 3 * d, bias=config.bias)
        self.c_proj = nn.Linear(d, d, bias=config.bias)
        self.c_proj.residual_scale = True  # GPT-2 init: std 0.02 / sqrt(2 n_layer)

    def qkv(self, x):
        return self.c_attn(x).split(self.n_embd, dim=2)

    def project_out(self, y):
        return self.c_proj(y)

    def to_heads(self) -> HeadWeights:
        H, r = self.n_head, self.d_head
        Wq, Wk, Wv = self.c_attn.weight.split(self.n_embd, dim=0)
        hw = HeadWeights(
            W_Q=split_heads_in(Wq, H), W_K=split_heads_in(Wk, H), W_V=split_heads_in(Wv, H),
            W_O=split_heads_out(self.c_proj.weight, H),
        )
        if self.c_attn.bias is not None:
            hw.b_Q, hw.b_K, hw.b_V = (b.reshape(H, r) for b in self.c_attn.bias.split(self.n_embd))
            hw.b_O = self.c_proj.bias
        return hw

    @torch.no_grad()
    def load_heads(self, hw: HeadWeights) -> None:
        self.c_attn.weight.copy_(torch.cat([merge_heads_in(hw.W_Q), merge_heads_in(hw.W_K),
                                            merge_heads_in(hw.W_V)], dim=0))
        self.c_proj.weight.copy_(merge_heads_out(hw.W_O))
        if self.c_attn.bias is not None:
            self.c_attn.bias.copy_(torch.cat([hw.b_Q.reshape(-1), hw.b_K.reshape(-1), hw.b_V.reshape(-1)]))
            self.c_proj.bias.copy_(hw.b_O)
