"""Standard GPT-2 multi-head attention: fused QKV projection `c_attn`, output projection `c_proj`."""

from __future__ import annotations

from torch import nn

from iattention.attention.base import CausalSelfAttention, column_blocks, row_blocks
from iattention.attention.heads import HeadWeights, fused_to_heads, heads_to_fused, heads_to_out, out_to_heads


class StandardAttention(CausalSelfAttention):
    variant = "standard"
    full_class = True

    def __init__(self, config):
        super().__init__(config)
        d = config.n_embd
        self.c_attn = nn.Linear(d, 3 * d, bias=config.bias)
        self.c_proj = nn.Linear(d, d, bias=config.bias)
        self.c_proj.residual_scale = True  # GPT-2 init: std 0.02 / sqrt(2 n_layer)

    @classmethod
    def removed_params(cls, config) -> int:
        return 0

    @classmethod
    def redundant_biases(cls, config) -> tuple[str, ...]:
        """b_K and b_V (learned, with a learned b_O to fold b_V into)."""
        return ("b_K", "b_V") if config.bias else ()

    def qkv(self, x):
        return self.c_attn(x).split(self.n_embd, dim=2)

    def project_out(self, y):
        return self.c_proj(y)

    def head_blocks(self) -> dict[str, list[tuple]]:
        d, r, H = self.n_embd, self.d_head, self.n_head
        return {"c_attn.weight": row_blocks(3, d, r, H), "c_proj.weight": column_blocks(r, H)}

    def to_heads(self) -> HeadWeights:
        return HeadWeights(**fused_to_heads(self.c_attn, "QKV", self.n_head), **out_to_heads(self.c_proj, self.n_head))

    def load_heads(self, hw: HeadWeights) -> None:
        heads_to_fused(self.c_attn, hw, "QKV")
        heads_to_out(self.c_proj, hw)
