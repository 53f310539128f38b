"""Per-head weights in math form, the common currency of the symmetry tools.

Query head h (of H) reads key/value head j = h // g (of G; g = H / G query heads per KV head, the order of
transformers' repeat_kv; GPT-2 is G = H), with head width r (row-vector convention, x is 1 x d):
    q = x W_Q[h] + b_Q[h],  k = x W_K[j] + b_K[j],  v = x W_V[j] + b_V[j]   (W_*: d x r)
    out = sum_h softmax(rope(q) rope(k)^T / sqrt(r)) v W_O[h] + b_O         (W_O[h]: r x d)
RoPE (rope.py) rotates the first `rot` dims of q and k (none for GPT-2).

Where a family normalises its queries and keys (GPTConfig.qk_norm), q and k above are replaced, before RoPE, by
    q = rms(x W_Q + b_Q) * g_Q,  k = rms(x W_K + b_K) * g_K
with rms(y) = y / sqrt(mean(y^2) + eps) over one head's r dims (qk_norm "head", Qwen3: g_Q and g_K are (1, r),
one gain shared by every head of the layer) or over the whole projection's H r (G r) dims (qk_norm "whole", OLMo 2:
g_Q is (H, r), g_K (G, r), a gain per head and dim). Without it g_Q and g_K are None.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch


@dataclass
class HeadWeights:
    W_Q: torch.Tensor  # (H, d, r)
    W_K: torch.Tensor  # (G, d, r)
    W_V: torch.Tensor  # (G, d, r)
    W_O: torch.Tensor  # (H, r, d)
    b_Q: torch.Tensor | None = None  # (H, r)
    b_K: torch.Tensor | None = None  # (G, r)
    b_V: torch.Tensor | None = None  # (G, r)
    b_O: torch.Tensor | None = None  # (d,)
    g_Q: torch.Tensor | None = None  # (1, r) or (H, r): the query norm's gain (qk_norm), else None
    g_K: torch.Tensor | None = None  # (1, r) or (G, r): the key norm's gain

    def to(self, dtype: torch.dtype) -> HeadWeights:
        return replace(self, **{f.name: t.to(dtype) for f in fields(self) if (t := getattr(self, f.name)) is not None})

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

    def per_query_head(self, name: str) -> torch.Tensor | None:
        """W_K, W_V, b_K or b_V repeated for each query head ((H, ...): head h gets its KV head's)."""
        t = getattr(self, name)
        return None if t is None else t.repeat_interleave(self.group, dim=0)


def split_heads_in(W: torch.Tensor, n_head: int) -> torch.Tensor:
    """nn.Linear weight (H*r, d) -> per-head input maps (H, d, r)."""
    out_dim, d = W.shape
    return W.reshape(n_head, out_dim // n_head, d).transpose(1, 2)


def merge_heads_in(W: torch.Tensor) -> torch.Tensor:
    """(H, d, r) -> nn.Linear weight (H*r, d)."""
    H, d, r = W.shape
    return W.transpose(1, 2).reshape(H * r, d)


def split_heads_out(W: torch.Tensor, n_head: int) -> torch.Tensor:
    """nn.Linear weight (d, H*r) of the output projection -> (H, r, d)."""
    d, in_dim = W.shape
    return W.t().reshape(n_head, in_dim // n_head, d)


def merge_heads_out(W: torch.Tensor) -> torch.Tensor:
    """(H, r, d) -> nn.Linear weight (d, H*r)."""
    H, r, d = W.shape
    return W.reshape(H * r, d).t()


def eye_heads_in(d: int, n_head: int, like: torch.Tensor) -> torch.Tensor:
    """I_d as per-head input maps (H, d, r): head h reads coordinates [h r, (h+1) r)."""
    return split_heads_in(torch.eye(d, dtype=like.dtype, device=like.device), n_head)


def eye_heads_out(d: int, n_head: int, like: torch.Tensor) -> torch.Tensor:
    """I_d as per-head output maps (H, r, d): head h writes coordinates [h r, (h+1) r)."""
    return split_heads_out(torch.eye(d, dtype=like.dtype, device=like.device), n_head)


def fused_to_heads(linear, names: str, heads: tuple[int, ...], r: int) -> dict:
    """A fused input projection (an nn.Linear whose outputs are len(names) blocks of heads[i] x r, e.g. names "QKV"
    with heads (H, G, G): GPT-2's c_attn) in math form: {"W_Q": (H, d, r), "b_Q": (H, r) or None, ...}."""
    sizes = [n * r for n in heads]
    biases = linear.bias.split(sizes) if linear.bias is not None else [None] * len(names)
    out = {}
    for name, n, W, b in zip(names, heads, linear.weight.split(sizes, dim=0), biases):
        out[f"W_{name}"] = split_heads_in(W, n)
        out[f"b_{name}"] = None if b is None else b.reshape(n, r)
    return out


@torch.no_grad()
def heads_to_fused(linear, hw: HeadWeights, names: str) -> None:
    """Inverse of `fused_to_heads`: copy hw's W_<name>, b_<name> into the fused nn.Linear."""
    linear.weight.copy_(torch.cat([merge_heads_in(getattr(hw, f"W_{n}")) for n in names], dim=0))
    if linear.bias is not None:
        linear.bias.copy_(torch.cat([getattr(hw, f"b_{n}").reshape(-1) for n in names]))


def out_to_heads(linear, n_head: int) -> dict:
    """The output projection (nn.Linear H r -> d) in math form: {"W_O": (H, r, d), "b_O": (d,) or None}."""
    return {"W_O": split_heads_out(linear.weight, n_head), "b_O": linear.bias}


@torch.no_grad()
def heads_to_out(linear, hw: HeadWeights) -> None:
    linear.weight.copy_(merge_heads_out(hw.W_O))
    if linear.bias is not None:
        linear.bias.copy_(hw.b_O)
