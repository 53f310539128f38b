"""Standard multi-head / grouped-query attention, stored as the model's family stores it (config.projection):
"fused": one input projection `c_attn` with [H r | G r | G r] outputs and `c_proj` (GPT-2's names);
"separate": `q_proj`, `k_proj`, `v_proj`, `o_proj` (transformers' Llama / Qwen2 / Mistral names);
"neox": `query_key_value` with the rows of each head together, [q_h k_h v_h] per head, and `dense` (GPT-NeoX's)."""

from __future__ import annotations

import torch
from torch import nn

from iattention.attention.base import CausalSelfAttention, column_blocks, row_blocks
from iattention.attention.heads import (
    HeadWeights,
    fused_to_heads,
    heads_to_fused,
    heads_to_out,
    merge_heads_in,
    out_to_heads,
    split_heads_in,
)


class StandardAttention(CausalSelfAttention):
    variant = "standard"
    full_class = True

    def __init__(self, config):
        super().__init__(config)
        d, r, H, G = config.n_embd, config.d_head, config.n_head, config.n_kv_head
        self.projection = config.projection
        self.fused = config.projection == "fused"
        if self.fused:
            self.c_attn = nn.Linear(d, (H + 2 * G) * r, bias=config.qkv_bias)
            self.c_proj = nn.Linear(H * r, d, bias=config.o_bias)
        elif self.projection == "neox":  # G = H (config checks)
            self.query_key_value = nn.Linear(d, 3 * H * r, bias=config.qkv_bias)
            self.dense = nn.Linear(H * r, d, bias=config.o_bias)
        else:
            self.q_proj = nn.Linear(d, H * r, bias=config.qkv_bias)
            self.k_proj = nn.Linear(d, G * r, bias=config.qkv_bias)
            self.v_proj = nn.Linear(d, G * r, bias=config.qkv_bias)
            self.o_proj = nn.Linear(H * r, d, bias=config.o_bias)
        self.out_proj.residual_scale = True  # GPT-2 init: std 0.02 / sqrt(2 n_layer)

    @property
    def out_proj(self) -> nn.Linear:
        return self.c_proj if self.fused else self.dense if self.projection == "neox" else self.o_proj

    @classmethod
    def removed_params(cls, config) -> int:
        return 0

    @classmethod
    def projection_flops(cls, config) -> int:
        """2 per weight entry: Q and O are d x H r, K and V d x G r."""
        d, r = config.n_embd, config.d_head
        return 2 * d * r * (2 * config.n_head + 2 * config.n_kv_head)

    @classmethod
    def redundant_biases(cls, config) -> tuple[str, ...]:
        return cls.learned_redundant_biases(config)

    def _heads(self) -> tuple[int, int, int]:
        return self.n_head, self.n_kv_head, self.n_kv_head

    def qkv(self, x):
        if self.fused:
            return self.c_attn(x).split([n * self.d_head for n in self._heads()], dim=2)
        if self.projection == "neox":
            B, T, _ = x.shape
            q, k, v = self.query_key_value(x).view(B, T, self.n_head, 3 * self.d_head).chunk(3, dim=-1)  # (B,T,H,r)
            return (t.reshape(B, T, self.n_head * self.d_head) for t in (q, k, v))
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def project_out(self, y):
        return self.out_proj(y)

    def head_blocks(self) -> dict[str, list[tuple]]:
        """Rows per query head (and per key/value head) of the input projections, the column block per query head
        of the output projection."""
        H, G, r = self.n_head, self.n_kv_head, self.d_head
        if self.fused:
            return {"c_attn.weight": row_blocks((H, G, G), r), "c_proj.weight": column_blocks(r, H)}
        if self.projection == "neox":  # head h's q, k and v rows: [3 h r, 3 (h+1) r) in three blocks
            return {"query_key_value.weight": row_blocks((3 * H,), r), "dense.weight": column_blocks(r, H)}
        return {"q_proj.weight": row_blocks((H,), r), "k_proj.weight": row_blocks((G,), r),
                "v_proj.weight": row_blocks((G,), r), "o_proj.weight": column_blocks(r, H)}

    def to_heads(self) -> HeadWeights:
        out = {**out_to_heads(self.out_proj, self.n_head), **self.norm_gains()}
        if self.fused:
            return HeadWeights(**fused_to_heads(self.c_attn, "QKV", self._heads(), self.d_head), **out)
        if self.projection == "neox":
            H, r = self.n_head, self.d_head
            W = self.query_key_value.weight.view(H, 3, r, -1)  # (H, [q k v], r, d)
            b = None if self.query_key_value.bias is None else self.query_key_value.bias.view(H, 3, r)
            return HeadWeights(**{f"W_{n}": W[:, i].transpose(1, 2) for i, n in enumerate("QKV")},
                               **{f"b_{n}": None if b is None else b[:, i] for i, n in enumerate("QKV")}, **out)
        parts = {}
        for name, linear, n in (("Q", self.q_proj, self.n_head), ("K", self.k_proj, self.n_kv_head),
                                ("V", self.v_proj, self.n_kv_head)):
            parts[f"W_{name}"] = split_heads_in(linear.weight, n)
            parts[f"b_{name}"] = None if linear.bias is None else linear.bias.reshape(n, -1)
        return HeadWeights(**parts, **out)

    def load_heads(self, hw: HeadWeights) -> None:
        if self.fused:
            heads_to_fused(self.c_attn, hw, "QKV")
        elif self.projection == "neox":
            H, r = self.n_head, self.d_head
            self.query_key_value.weight.data.copy_(
                torch.stack([hw.W_Q, hw.W_K, hw.W_V], dim=1).transpose(2, 3).reshape(3 * H * r, -1))
            if self.query_key_value.bias is not None:
                self.query_key_value.bias.data.copy_(torch.stack([hw.b_Q, hw.b_K, hw.b_V], dim=1).reshape(-1))
        else:
            for name, linear in (("Q", self.q_proj), ("K", self.k_proj), ("V", self.v_proj)):
                linear.weight.data.copy_(merge_heads_in(getattr(hw, f"W_{name}")))
                if linear.bias is not None:
                    linear.bias.data.copy_(getattr(hw, f"b_{name}").reshape(-1))
        heads_to_out(self.out_proj, hw)
        self.load_norm_gains(hw)
