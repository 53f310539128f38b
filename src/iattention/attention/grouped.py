"""Grouped-query attention with RoPE (Llama, Qwen2, Mistral): the math form and the shared layer core.

Row-vector convention as in heads.py. Query head h (of H) reads key/value head j = h // g (of G; g = H / G
query heads per KV head, the order of transformers' repeat_kv), with head width r (not necessarily d / H):
    q = x W_Q[h] + b_Q[h],   k = x W_K[j] + b_K[j],   v = x W_V[j] + b_V[j]        (W_*: d x r)
    out = sum_h softmax(rope(q) rope(k)^T / sqrt(r)) v W_O[h] + b_O                 (W_O[h]: r x d)
MHA is G = H, MQA is G = 1. RoPE (rope.py) rotates the first `rot` dims of q and k; scores then depend on
the relative position only, through q M(j - i) k^T with M block-diagonal (a rotation per frequency pair,
the identity on the pass dims).

Symmetry (symmetry/grouped.py): the scores are unchanged by W_Q[h] -> W_Q[h] A_j and W_K[j] -> W_K[j] A_j^{-T}
for an A_j shared by group j that commutes with every M(n): one complex scalar per rotary pair and any
invertible map on the pass dims (rot + (r - rot)^2 numbers). The output is unchanged by W_V[j] -> W_V[j] S_j
and W_O[h] -> S_j^{-1} W_O[h] for every query head h of group j (r^2 numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from iattention.attention.base import CausalSelfAttention
from iattention.attention.cache import KOnlyCache, KVCache
from iattention.attention.heads import cast_fields
from iattention.attention.rope import apply_rope
from iattention.kernels import attend


@dataclass
class GroupedHeadWeights:
    W_Q: torch.Tensor  # (H, d, r)
    W_K: torch.Tensor  # (G, d, r)
    W_V: torch.Tensor  # (G, d, r)
    W_O: torch.Tensor  # (H, r, d)
    b_Q: torch.Tensor | None = None  # (H, r)
    b_K: torch.Tensor | None = None  # (G, r)
    b_V: torch.Tensor | None = None  # (G, r)
    b_O: torch.Tensor | None = None  # (d,)

    def to(self, dtype: torch.dtype) -> GroupedHeadWeights:
        return cast_fields(self, dtype)

    @property
    def n_head(self) -> int:
        return self.W_Q.shape[0]

    @property
    def n_kv_head(self) -> int:
        return self.W_K.shape[0]

    @property
    def group(self) -> int:
        """g: query heads per key/value head."""
        return self.n_head // self.n_kv_head


class GroupedAttention(CausalSelfAttention):
    """One RoPE + GQA layer. `config` is a LlamaConfig (read: n_head, n_kv_head, n_embd, d_head, rot, rope_layout,
    dropout, qkv_bias, o_bias, n_layer). A variant defines qkv (q: (B, T, H r); k, v: (B, T, G r)),
    project_out ((B, T, H r) -> (B, T, d)), to_heads / load_heads (GroupedHeadWeights) and the class facts of
    CausalSelfAttention; the registry for this family is `GROUPED_REGISTRY`."""

    def __init__(self, config):
        super().__init__(config)
        self.n_kv_head = config.n_kv_head
        self.rot = config.rot
        self.rope_layout = config.rope_layout

    @classmethod
    def redundant_biases(cls, config) -> tuple[str, ...]:
        """b_V when the layer learns both it and an output bias (Llama's attention_bias): attention rows sum to
        one, so b_V[j] adds b_V[j] W_O[h] to every output of query head h, which folds into b_O. Never b_K: under
        RoPE q_i M(j - i) b_K^T depends on the key's position j, so softmax does not drop it (only its pass dims
        are redundant, G (r - rot) numbers per layer, which no variant reduces and no count drops). Without b_O
        (Qwen2) there is nothing to fold b_V into."""
        return ("b_V",) if config.qkv_bias and config.o_bias else ()

    def k_only_value_map(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(W_KV (H, G r, r), offset (H, r) or None) with v_h = k~ W_KV[h] + offset[h] for the pre-RoPE keys
        k~ of all G heads side by side: exact when the key map W_K (d x G r) is square and invertible."""
        hw = self.to_heads()
        G, d, r = hw.W_K.shape
        if G * r != d:
            raise ValueError(f"a K-only cache needs a square key map (n_kv_head x d_head = n_embd), got "
                             f"{G} x {r} = {G * r} key columns for n_embd = {d}")
        W_K = hw.W_K.transpose(0, 1).reshape(d, G * r).double()  # (d, G r): heads side by side
        W_V = hw.W_V.double()[torch.arange(self.n_head) // (self.n_head // G)]  # (H, d, r): each query head's
        W_KV = torch.linalg.solve(W_K, W_V)  # (H, G r, r): x = k~ W_K^{-1} (without b_K)
        offset = None
        if hw.b_K is not None:  # v = (k~ - b_K) W_K^{-1} W_V + b_V
            offset = self.k_only_offset(W_KV, hw.b_K, hw.b_V[torch.arange(self.n_head) // (self.n_head // G)])
        dtype = hw.W_K.dtype
        return W_KV.to(dtype), None if offset is None else offset.to(dtype)

    def forward(self, x: torch.Tensor, cache: KVCache | KOnlyCache | None = None, layer: int = 0,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x (B, T, d); rope = (cos, sin), each (T, rot/2), for these T positions. A KVCache keeps rotated keys
        and values; a KOnlyCache keeps only the pre-RoPE keys (values rebuilt from them, rotation on read)."""
        B, T, _ = x.shape
        H, G, r = self.n_head, self.n_kv_head, self.d_head
        cos, sin = rope
        q, k, v = self.qkv(x)  # (B, T, H r), (B, T, G r), (B, T, G r)
        q = apply_rope(q.reshape(B, T, H, r).transpose(1, 2), cos, sin, self.rope_layout)  # (B, H, T, r)
        k = k.reshape(B, T, G, r).transpose(1, 2)  # (B, G, T, r), before RoPE
        if isinstance(cache, KOnlyCache):
            return self._forward_k_only(q, k, cache, layer, B, T)
        k = apply_rope(k, cos, sin, self.rope_layout)  # (B, G, T, r)
        v = v.reshape(B, T, G, r).transpose(1, 2)  # (B, G, T, r)
        past = None
        if cache is not None:
            past = 0 if cache.keys[layer] is None else cache.keys[layer].shape[2]
            k, v = cache.update(layer, k, v)  # each (B, G, past + T, r)
        y = attend(q, k, v, self.attn_kernel, self.dropout if self.training else 0.0, past)  # (B, H, T, r)
        y = y.transpose(1, 2).reshape(B, T, H * r)  # (B, T, H r): heads side by side
        return self.resid_dropout(self.project_out(y))  # (B, T, d)

    def _forward_k_only(self, q, k_raw, cache: KOnlyCache, layer: int, B: int, T: int) -> torch.Tensor:
        """Scores against the cached pre-RoPE keys, rotated on read; each head's output is
        (p_h K~) W_KV[h] + offset[h] (attention weights times the cached keys first, then a (G r) x r map)."""
        H, G, r = self.n_head, self.n_kv_head, self.d_head
        past = cache.length_of(layer)
        k_all = cache.update(layer, k_raw)  # (B, G, past + T, r), pre-RoPE
        cos, sin = cache.rope(past + T)  # (past + T, rot/2) each
        k_rot = apply_rope(k_all, cos, sin, self.rope_layout)
        mask = torch.ones(T, past + T, dtype=torch.bool, device=q.device).tril(diagonal=past)  # (T, past + T)
        scores = q @ k_rot.repeat_interleave(H // G, dim=1).transpose(-1, -2) / r**0.5  # (B, H, T, past + T)
        p = scores.masked_fill(~mask, float("-inf")).softmax(-1)  # (B, H, T, past + T)
        keys = k_all.transpose(1, 2).reshape(B, 1, past + T, G * r)  # (B, 1, past + T, G r): every head's key
        W_KV, offset = self.frozen_inverse("k_only", self.k_only_value_map)
        y = torch.einsum("bhtc,hcr->bhtr", p @ keys, W_KV)  # (B, H, T, G r) -> (B, H, T, r)
        if offset is not None:
            y = y + offset[:, None, :]
        y = y.transpose(1, 2).reshape(B, T, H * r)  # (B, T, H r)
        return self.resid_dropout(self.project_out(y))
