"""Llama-family attention as transformers has it: separate `q_proj`, `k_proj`, `v_proj`, `o_proj` (nn.Linear),
H query heads and G key/value heads of width r; biases on q/k/v (Qwen2, Llama's attention_bias) and on o
(Llama's attention_bias only)."""

from __future__ import annotations

from torch import nn

from iattention.attention.base import column_blocks, row_blocks
from iattention.attention.grouped import GroupedAttention, GroupedHeadWeights
from iattention.attention.heads import merge_heads_in, merge_heads_out, split_heads_in, split_heads_out


class LlamaStandardAttention(GroupedAttention):
    variant = "standard"
    full_class = True

    def __init__(self, config):
        super().__init__(config)
        d, r, H, G = config.n_embd, config.d_head, config.n_head, config.n_kv_head
        self.q_proj = nn.Linear(d, H * r, bias=config.qkv_bias)
        self.k_proj = nn.Linear(d, G * r, bias=config.qkv_bias)
        self.v_proj = nn.Linear(d, G * r, bias=config.qkv_bias)
        self.o_proj = nn.Linear(H * r, d, bias=config.o_bias)

    @classmethod
    def removed_params(cls, config) -> int:
        return 0

    @classmethod
    def projection_flops(cls, config) -> int:
        """2 per weight entry: Q and O are d x H r, K and V d x G r."""
        d, r = config.n_embd, config.d_head
        return 2 * d * r * (2 * config.n_head + 2 * config.n_kv_head)

    def head_blocks(self) -> dict[str, list[tuple]]:
        """q_proj's rows per query head, k_proj's and v_proj's per key/value head, o_proj's column block per
        query head."""
        H, G, r = self.n_head, self.n_kv_head, self.d_head
        return {"q_proj.weight": row_blocks(1, H * r, r, H), "k_proj.weight": row_blocks(1, G * r, r, G),
                "v_proj.weight": row_blocks(1, G * r, r, G), "o_proj.weight": column_blocks(r, H)}

    def qkv(self, x):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def project_out(self, y):
        return self.o_proj(y)

    def to_heads(self) -> GroupedHeadWeights:
        H, G = self.n_head, self.n_kv_head

        def bias(linear, n):
            return None if linear.bias is None else linear.bias.reshape(n, -1)

        return GroupedHeadWeights(
            W_Q=split_heads_in(self.q_proj.weight, H), W_K=split_heads_in(self.k_proj.weight, G),
            W_V=split_heads_in(self.v_proj.weight, G), W_O=split_heads_out(self.o_proj.weight, H),
            b_Q=bias(self.q_proj, H), b_K=bias(self.k_proj, G), b_V=bias(self.v_proj, G), b_O=self.o_proj.bias)

    def load_heads(self, hw: GroupedHeadWeights) -> None:
        for linear, W, b in ((self.q_proj, hw.W_Q, hw.b_Q), (self.k_proj, hw.W_K, hw.b_K),
                             (self.v_proj, hw.W_V, hw.b_V)):
            linear.weight.data.copy_(merge_heads_in(W))
            if linear.bias is not None:
                linear.bias.data.copy_(b.reshape(-1))
        self.o_proj.weight.data.copy_(merge_heads_out(hw.W_O))
        if self.o_proj.bias is not None:
            self.o_proj.bias.data.copy_(hw.b_O)
