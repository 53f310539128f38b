"""Shared causal self-attention core: project, split heads, SDPA, merge, project out."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from iattention.attention.cache import KVCache
from iattention.attention.heads import HeadWeights
from iattention.kernels import kernel_for, triton_causal_attention


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
        self.attn_kernel = getattr(config, "attn_kernel", "auto")  # kernels/__init__.py
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

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        """x (B, T, d). With a cache, x holds only the new positions; keys and values of the earlier
        ones come from the cache (slot `layer`), and the new ones are appended to it."""
        B, T, C = x.shape  # (B, T, d): C = d = H * r
        q, k, v = self.qkv(x)  # each (B, T, d)
        shape = (B, T, self.n_head, self.d_head)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))  # each (B, H, T, r)
        past = 0
        if cache is not None:
            past = 0 if cache.keys[layer] is None else cache.keys[layer].shape[2]
            k, v = cache.update(layer, k, v)  # each (B, H, past + T, r)
        dropout = self.dropout if self.training else 0.0
        if cache is None and kernel_for(self.attn_kernel, x.device.type, self.d_head, dropout) == "triton":
            y = triton_causal_attention(q, k, v)  # (B, H, T, r): wide heads (kernels/wide_attention.py)
        else:
            mask = None
            if past and T > 1:  # new position i sees every cached position and new ones up to itself
                mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)  # (T, past + T)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                               is_causal=past == 0)  # (B, H, T, r)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, H, r) -> (B, T, d): heads side by side
        return self.resid_dropout(self.project_out(y))  # (B, T, d)
