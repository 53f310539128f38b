"""Shared causal self-attention core: project, split heads, SDPA, merge, project out."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from iattention.attention.cache import KOnlyCache, KVCache
from iattention.attention.heads import HeadWeights
from iattention.kernels import attend


def row_blocks(n_proj: int, d: int, r: int, n_head: int) -> list[tuple]:
    """Per-head blocks of a fused input projection's weight (n_proj * d, d), e.g. c_attn: one (r, d) row
    block per projection and head (projection-major, as `fused_to_heads` lays them out)."""
    return [(slice(k * d + h * r, k * d + (h + 1) * r),) for k in range(n_proj) for h in range(n_head)]


def column_blocks(r: int, n_head: int) -> list[tuple]:
    """Per-head blocks of an output projection's weight (d, d): head h's W_O^T is the (d, r) column block."""
    return [(slice(None), slice(h * r, (h + 1) * r)) for h in range(n_head)]


@contextmanager
def frozen_weights(model: nn.Module):
    """Declare that `model`'s weights do not change inside the block (generation), so attention layers may
    build derived weights once (canonical assembles its full W_K, W_O) instead of at every call. Outside
    it nothing is cached: an in-place update cannot be detected in general (fused AdamW does not bump
    tensors' version counters), and a stale cache silently evaluates old weights."""
    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    for m in layers:
        m.weights_frozen = True
    try:
        yield model
    finally:
        for m in layers:
            m.weights_frozen = False
            m.__dict__.pop("_memo", None)


class CausalSelfAttention(nn.Module):
    """One attention layer. A variant is a subclass in its own file plus one line in `registry.py`; all
    the generic code (config checks, parameter counts, FLOPs, symmetry tools, training) asks the class.

    A subclass defines how q, k, v are made from x (`qkv`), how the merged heads are mapped back to d
    (`project_out`), and its weights in math form (`to_heads` / `load_heads`). It states:
      variant: its registry name;
      full_class: whether it holds every standard head exactly (on an open dense set), which
        `model.init=matched` needs;
      removed_params(config): learned parameters it removes relative to standard, whole model (biases
        included: a layer built from `config` has standard's count minus this / n_layer);
      projection_flops(config): matmul FLOPs per token of its projections, one layer, forward pass;
      redundant_biases(config): which math-form biases the layer learns that change no function
        (no default: every variant states its own);
      head_blocks(): each learned matrix's per-head 2-D blocks, for Muon (the default covers only
        (H, a, b) tensors and refuses a variant with any other matrix).
    The defaults of removed_params and projection_flops measure a layer built from `config` (fine for
    small shapes). `tests/unit/attention/test_registry.py` checks every registered variant against all of this.

    `config` is a GPTConfig (read: n_head, n_embd, d_head, n_layer, dropout, bias and the variant's keys).
    """

    variant = "abstract"
    full_class = False
    weights_frozen = False  # set by `frozen_weights` only

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.d_head = config.d_head
        self.dropout = config.dropout
        self.attn_kernel = config.attn_kernel  # kernels/__init__.py
        self.resid_dropout = nn.Dropout(config.dropout)

    @classmethod
    def removed_params(cls, config) -> int:
        """Parameters removed relative to standard (4 d^2 + 4 d per layer with biases): measured on a
        layer built from `config`, times n_layer."""
        d = config.n_embd
        standard = 4 * d * d + (4 * d if config.bias else 0)
        return config.n_layer * (standard - sum(p.numel() for p in cls(config).parameters()))

    @classmethod
    def projection_flops(cls, config) -> int:
        """2 FLOPs per learned matrix entry per token: what a layer that applies each matrix once runs."""
        return 2 * sum(p.numel() for p in cls(config).parameters() if p.dim() >= 2)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, d) -> q, k, v, each (B, T, d): all heads side by side (head h in [h r, (h+1) r))."""
        raise NotImplementedError

    def project_out(self, y: torch.Tensor) -> torch.Tensor:
        """Merged head outputs (B, T, d) -> the layer's output (B, T, d), before residual dropout."""
        raise NotImplementedError

    @classmethod
    def redundant_biases(cls, config) -> tuple[str, ...]:
        """The math-form biases ("b_K", "b_V") that a layer built from `config` learns and that change no
        function: a learned b_K adds q_i . b_K to every score of query i, which softmax ignores; a learned
        b_V adds b_V W_O to every output (attention rows sum to one), which folds into a learned b_O.
        `symmetry.fully_reduced_count` drops d parameters per layer for each name. No default: a variant
        without a key bias, or without an output bias to fold b_V into, says so here."""
        raise NotImplementedError(f"{cls.__name__} must state redundant_biases(config)")

    def head_blocks(self) -> dict[str, list[tuple]]:
        """Each learned matrix's per-head 2-D blocks, as indices into the parameter: {local parameter name:
        [index of head 0's block, ...]}, so that a per-matrix optimizer (Muon) treats every variant's
        heads alike. Default: a 3-D parameter (H, a, b) splits along its first axis; any other learned
        matrix makes it refuse, so a variant storing heads side by side in one matrix (a fused nn.Linear)
        must override this (see `row_blocks`, `column_blocks`) rather than have Muon take the whole
        matrix as one block."""
        blocks, other = {}, []
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() < 2 or leaf == "bias" or leaf.startswith("b_"):
                continue
            if p.dim() == 3 and p.shape[0] == self.n_head:
                blocks[name] = [(h,) for h in range(self.n_head)]
            else:
                other.append(f"{name} {tuple(p.shape)}")
        if other:
            raise NotImplementedError(f"{type(self).__name__} learns matrices that are not (n_head, a, b) tensors "
                                      f"({', '.join(other)}): override head_blocks to give each head's block")
        return blocks

    def to_heads(self) -> HeadWeights:
        """The layer's weights in math form (see heads.py)."""
        raise NotImplementedError

    def load_heads(self, hw: HeadWeights) -> None:
        """Set the layer's weights from math form (inverse of to_heads)."""
        raise NotImplementedError

    def frozen_inverse(self, name: str, build) -> torch.Tensor:
        """build() once per frozen_weights block (generation), else every call."""
        if not self.weights_frozen:
            return build()
        memo = self.__dict__.setdefault("_memo", {})
        if name not in memo:
            memo[name] = build()
        return memo[name]

    @staticmethod
    def k_only_offset(W_KV: torch.Tensor, b_K: torch.Tensor | None, b_V: torch.Tensor | None):
        """(H, r) offset[h] = b_V[h] - b_K W_KV[h] (b_K of all key heads side by side), or None without biases."""
        if b_K is None and b_V is None:
            return None
        off = torch.zeros(W_KV.shape[0], W_KV.shape[2], dtype=W_KV.dtype, device=W_KV.device)
        if b_V is not None:
            off = off + b_V.to(W_KV)
        if b_K is not None:
            off = off - torch.einsum("c,hcr->hr", b_K.reshape(-1).to(W_KV), W_KV)
        return off

    def k_only_value_map(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(W_KV (H, d, r), offset (H, r) or None): v_h = k W_KV[h] + offset[h] for the keys k of all heads side
        by side. Exact because the key map W_K (d x H r = d x d) is square: x = (k - b_K) W_K^{-1}."""
        hw = self.to_heads()
        H, d, r = hw.W_K.shape
        W_K = hw.W_K.transpose(0, 1).reshape(d, H * r).double()  # (d, d): heads side by side
        W_KV = torch.linalg.solve(W_K, hw.W_V.double())  # (H, d, r)
        offset = self.k_only_offset(W_KV, hw.b_K, hw.b_V)
        dtype = hw.W_K.dtype
        return W_KV.to(dtype), None if offset is None else offset.to(dtype)

    def _forward_k_only(self, q, k, cache: KOnlyCache, layer: int) -> torch.Tensor:
        """Attention against the cached keys only: each head's output is (p_h K) W_KV[h] + offset[h], the
        attention weights times every head's keys, then a d x r map (k_only_value_map)."""
        B, T, d = q.shape
        H, r = self.n_head, self.d_head
        q = q.reshape(B, T, H, r).transpose(1, 2)  # (B, H, T, r)
        past = cache.length_of(layer)
        k_all = cache.update(layer, k.reshape(B, T, H, r).transpose(1, 2))  # (B, H, past + T, r)
        mask = torch.ones(T, past + T, dtype=torch.bool, device=q.device).tril(diagonal=past)  # (T, past + T)
        p = (q @ k_all.transpose(-1, -2) / r**0.5).masked_fill(~mask, float("-inf")).softmax(-1)  # (B, H, T, past+T)
        keys = k_all.transpose(1, 2).reshape(B, 1, past + T, d)  # (B, 1, past + T, d): every head's key
        W_KV, offset = self.frozen_inverse("k_only", self.k_only_value_map)
        y = torch.einsum("bhtc,hcr->bhtr", p @ keys, W_KV)  # (B, H, T, d) -> (B, H, T, r)
        if offset is not None:
            y = y + offset[:, None, :]
        return self.resid_dropout(self.project_out(y.transpose(1, 2).reshape(B, T, d)))  # (B, T, d)

    def forward(self, x: torch.Tensor, cache: KVCache | KOnlyCache | None = None, layer: int = 0) -> torch.Tensor:
        """x (B, T, d). With a cache, x holds only the new positions; keys and values of the earlier
        ones come from the cache (slot `layer`), and the new ones are appended to it. A KOnlyCache keeps the
        keys alone; the values are rebuilt from them (_forward_k_only)."""
        B, T, C = x.shape  # (B, T, d): C = d = H * r
        q, k, v = self.qkv(x)  # each (B, T, d)
        if isinstance(cache, KOnlyCache):
            return self._forward_k_only(q, k, cache, layer)
        shape = (B, T, self.n_head, self.d_head)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))  # each (B, H, T, r)
        past = None
        if cache is not None:
            past = 0 if cache.keys[layer] is None else cache.keys[layer].shape[2]
            k, v = cache.update(layer, k, v)  # each (B, H, past + T, r)
        y = attend(q, k, v, self.attn_kernel, self.dropout if self.training else 0.0, past)  # (B, H, T, r)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, H, r) -> (B, T, d): heads side by side
        return self.resid_dropout(self.project_out(y))  # (B, T, d)
