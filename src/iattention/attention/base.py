"""Shared causal self-attention core, for every family: project, split heads, rotate (RoPE), attend, merge,
project out. GPT-2 is the case G = H key/value heads and rot = 0 rotary dims; the Llama family's grouped-query
attention with RoPE is G <= H and rot > 0 (heads.py gives the math form).

Symmetry (symmetry/transforms.py): the scores are unchanged by W_Q[h] -> W_Q[h] A_j and W_K[j] -> W_K[j] A_j^{-T}
for an A_j shared by group j that commutes with every rotation: one complex scalar per rotary pair and any
invertible map on the pass dims (rot + (r - rot)^2 numbers; GL(r) at rot = 0). The output is unchanged by
W_V[j] -> W_V[j] S_j and W_O[h] -> S_j^{-1} W_O[h] for every query head h of group j (r^2 numbers).

With a query/key norm (GPTConfig.qk_norm) the query/key gauge above is gone: what is left of it is a rescaling of
the two norms' gains, g_Q -> g_Q C and g_K -> g_K C^{-1} with C diagonal and constant on each rotary pair, one C
per layer (qk_norm "head": the gains are shared by the heads) or per KV group ("whole"); `qk_gauge` counts it and
docs/conversion.md proves it. The value/output gauge is untouched (no norm on v)."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from iattention.attention.cache import KOnlyCache, KVCache
from iattention.attention.heads import HeadWeights
from iattention.attention.norm import RMSNorm
from iattention.attention.rope import apply_rope
from iattention.kernels import attend
from iattention.kernels.math_path import causal_mask
from iattention.utils.flags import switched_on


def qk_gauge(config) -> tuple[str, int]:
    """(kind, numbers per layer) of the exact query/key symmetry of a layer of `config` (its own rotary width):
    "commutant": per KV group an invertible A commuting with every RoPE rotation, a complex scalar per rotary pair
    and GL(r - rot) on the pass dims, G (rot + (r - rot)^2) numbers (GL(r) without RoPE);
    "norm gains per layer" (qk_norm "head"): a nonzero scale per rotary pair and per pass dim of the query norm's
    gain, its inverse on the key norm's, one for the layer (the gains are shared by its heads): rot/2 + r - rot;
    "norm gains per KV group" (qk_norm "whole": a gain per head and dim): G (rot/2 + r - rot)."""
    r, rot, G = config.d_head, config.rot, config.n_kv_head
    scales = rot // 2 + r - rot
    if config.qk_norm == "head":
        return "norm gains per layer", scales
    if config.qk_norm == "whole":
        return "norm gains per KV group", G * scales
    return "commutant", G * (rot + (r - rot) ** 2)


def row_blocks(heads: tuple[int, ...], r: int) -> list[tuple]:
    """Per-head blocks of an input projection's weight (sum(heads) r, d), e.g. c_attn with heads (H, G, G): one
    (r, d) row block per projection and head (projection-major, as `fused_to_heads` lays them out)."""
    return [(slice(h * r, (h + 1) * r),) for h in range(sum(heads))]


def column_blocks(r: int, n_head: int) -> list[tuple]:
    """Per-head blocks of an output projection's weight (d, d): head h's W_O^T is the (d, r) column block."""
    return [(slice(None), slice(h * r, (h + 1) * r)) for h in range(n_head)]


def unsplit_heads(config, why: str) -> str | None:
    """Why a variant whose fixed maps are the input (or the output) split into heads cannot serve `config` (`why`:
    what it splits), or None: it needs G = H key/value heads and n_head x d_head = n_embd, and no query/key norm
    (whose gauge has no identity block to fix: docs/conversion.md)."""
    if config.qk_norm:
        return (f"fixes a whole W_Q or W_K, which a query/key norm (model.qk_norm={config.qk_norm}) leaves no gauge "
                "for: use standard or canonical")
    if config.n_kv_head == config.n_head and config.n_head * config.d_head == config.n_embd:
        return None
    return (f"needs as many key/value heads as query heads and n_head x d_head = n_embd ({why}); this model has "
            f"{config.n_kv_head} KV heads for {config.n_head} query heads of width {config.d_head}, n_embd "
            f"{config.n_embd}: use standard or canonical")


@contextmanager
def frozen_weights(model: nn.Module):
    """Declare that `model`'s weights do not change inside the block (generation), so attention layers may
    build derived weights once (canonical assembles its full W_K, W_O) instead of at every call. Outside
    it nothing is cached: an in-place update cannot be detected in general (fused AdamW does not bump
    tensors' version counters), and a stale cache silently evaluates old weights."""
    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    try:
        with switched_on(layers, "weights_frozen"):
            yield model
    finally:
        for m in layers:
            m.__dict__.pop("_memo", None)


class CausalSelfAttention(nn.Module):
    """One attention layer. A variant is a subclass in its own file plus one line in `registry.py`; all
    the generic code (config checks, parameter counts, FLOPs, symmetry tools, training) asks the class.

    A subclass defines how q, k, v are made from x (`qkv`: q (B, T, H r); k, v (B, T, G r)), how the merged heads
    are mapped back to d (`project_out`), and its weights in math form (`to_heads` / `load_heads`). It states:
      variant: its registry name;
      full_class: whether it holds every standard head exactly (on an open dense set), which
        `model.init=matched` needs;
      unsupported(config): None, or why a layer of `config` cannot be built (e.g. a shape it has no form for);
      removed_params(config): learned parameters it removes relative to standard, whole model (biases
        included: a layer built from `config` has standard's count minus this / n_layer);
      projection_flops(config): matmul FLOPs per token of its projections, one layer, forward pass;
      redundant_biases(config): which math-form biases the layer learns that change no function
        (no default: every variant states its own);
      the query/key norms (qk_norm): `q_norm`, `k_norm` (RMSNorm modules, built here; a variant may replace
        one), applied by `forward` to what `qkv` gives, and in math form g_Q, g_K (`norm_gains`, `load_norm_gains`);
      head_blocks(): each learned matrix's per-head 2-D blocks, for Muon (the default covers only
        (H, a, b) and (G, a, b) tensors and refuses a variant with any other matrix).
    The defaults of removed_params and projection_flops measure a layer built from `config` (fine for
    small shapes). `tests/unit/attention/test_registry.py` checks every registered variant against all of this.

    `config` is a GPTConfig (read: n_head, n_kv_head, n_embd, d_head, rot, rope_layout, n_layer, dropout, the
    bias flags and the variant's keys).
    """

    variant = "abstract"
    full_class = False
    weights_frozen = False  # set by `frozen_weights` only

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.n_embd = config.n_embd
        self.d_head = config.d_head
        self.rot = config.rot
        self.rope_layout = config.rope_layout
        self.dropout = config.dropout
        self.attn_kernel = config.attn_kernel  # kernels/__init__.py
        # sliding window (0: none): query i sees keys i - W < j <= i; per layer (GPTConfig.window_of), set by the
        # model that holds the layer, so a layer built alone attends over its whole block
        self.window = 0
        self.resid_dropout = nn.Dropout(config.dropout)
        # a query/key norm before RoPE (qk_norm): Qwen3's over each head's r dims, one gain of r for every head;
        # OLMo 2's over the whole projection, a gain per head and dim
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            whole = config.qk_norm == "whole"
            self.q_norm = RMSNorm(config.d_head * (config.n_head if whole else 1), config.norm_eps)
            self.k_norm = RMSNorm(config.d_head * (config.n_kv_head if whole else 1), config.norm_eps)

    @classmethod
    def unsupported(cls, config) -> str | None:
        return None

    @staticmethod
    def standard_params(config) -> int:
        """One standard layer's parameters: Q and O are d x H r, K and V d x G r; the biases the config asks for; the
        query/key norms' gains (qk_norm)."""
        d, r, H, G = config.n_embd, config.d_head, config.n_head, config.n_kv_head
        gains = {"": 0, "head": 2 * r, "whole": (H + G) * r}[config.qk_norm]  # the query/key norms' gains
        return d * r * (2 * H + 2 * G) + config.qkv_bias * r * (H + 2 * G) + config.o_bias * d + gains

    @classmethod
    def removed_params(cls, config) -> int:
        """Parameters removed relative to standard: measured on a layer built from `config`, times n_layer."""
        return config.n_layer * (cls.standard_params(config) - sum(p.numel() for p in cls(config).parameters()))

    @classmethod
    def projection_flops(cls, config) -> int:
        """2 FLOPs per learned matrix entry per token: what a layer that applies each matrix once runs."""
        return 2 * sum(p.numel() for p in cls(config).parameters() if p.dim() >= 2)

    @staticmethod
    def learned_redundant_biases(config) -> tuple[str, ...]:
        """The rule for a layer that learns every bias the config asks for: b_K where it meets a pass dim (it adds
        q_i . b_K to every score of query i there, which softmax ignores; on a rotary dim q_i M(j - i) b_K^T
        depends on the key's position, so it is not redundant), and b_V when there is an output bias to fold it
        into (attention rows sum to one, so b_V adds b_V W_O to every output). Under a query/key norm b_K is inside
        the key's norm, so no dim of it is redundant."""
        return (("b_K",) if config.qkv_bias and config.rot < config.d_head and not config.qk_norm else ()) + \
            (("b_V",) if config.qkv_bias and config.o_bias else ())

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, d) -> q (B, T, H r), k, v (B, T, G r): heads side by side (head h in [h r, (h+1) r))."""
        raise NotImplementedError

    def project_out(self, y: torch.Tensor) -> torch.Tensor:
        """Merged head outputs (B, T, H r) -> the layer's output (B, T, d), before residual dropout."""
        raise NotImplementedError

    @classmethod
    def redundant_biases(cls, config) -> tuple[str, ...]:
        """The math-form biases ("b_K", "b_V") that a layer built from `config` learns and that change no
        function (see `learned_redundant_biases`). `symmetry.bias_redundancy` drops, per layer, G (r - rot)
        numbers for b_K and G r for b_V. No default: a variant without a key bias, or without an output bias to
        fold b_V into, says so here."""
        raise NotImplementedError(f"{cls.__name__} must state redundant_biases(config)")

    def head_blocks(self) -> dict[str, list[tuple]]:
        """Each learned matrix's per-head 2-D blocks, as indices into the parameter: {local parameter name:
        [index of head 0's block, ...]}, so that a per-matrix optimizer (Muon) treats every variant's
        heads alike. Default: a 3-D parameter (H, a, b) or (G, a, b) splits along its first axis; any other learned
        matrix makes it refuse, so a variant storing heads side by side in one matrix (an nn.Linear)
        must override this (see `row_blocks`, `column_blocks`) rather than have Muon take the whole
        matrix as one block."""
        blocks, other = {}, []
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() < 2 or leaf == "bias" or leaf.startswith("b_"):
                continue
            if p.dim() == 3 and p.shape[0] in (self.n_head, self.n_kv_head):
                blocks[name] = [(h,) for h in range(p.shape[0])]
            else:
                other.append(f"{name} {tuple(p.shape)}")
        if other:
            raise NotImplementedError(f"{type(self).__name__} learns matrices that are not (n_head, a, b) tensors "
                                      f"({', '.join(other)}): override head_blocks to give each head's block")
        return blocks

    def norm_gains(self) -> dict[str, torch.Tensor]:
        """{"g_Q": (1 or H, r), "g_K": (1 or G, r)}: the query/key norms' gains in math form (heads.py); {} without."""
        if not self.qk_norm:
            return {}
        r = self.d_head
        return {"g_Q": self.q_norm.gain().reshape(-1, r), "g_K": self.k_norm.gain().reshape(-1, r)}

    @torch.no_grad()
    def load_norm_gains(self, hw: HeadWeights) -> None:
        """Set the query/key norms' gains from math form, where the layer has them (a norm holding fewer numbers,
        canonical's k_norm, takes its learned entries: `RMSNorm.load_gain`)."""
        if self.qk_norm:
            self.q_norm.load_gain(hw.g_Q)
            self.k_norm.load_gain(hw.g_K)

    def qk_normed(self, t: torch.Tensor, norm) -> torch.Tensor:
        """t (B, n, T, r) queries or keys before RoPE, through `norm` (q_norm or k_norm): over each head's r dims
        (qk_norm "head"), or over all n r dims of a position ("whole")."""
        if self.qk_norm == "head":
            return norm(t)
        B, n, T, r = t.shape
        return norm(t.transpose(1, 2).reshape(B, T, n * r)).reshape(B, T, n, r).transpose(1, 2)

    def to_heads(self) -> HeadWeights:
        """The layer's weights in math form (see heads.py)."""
        raise NotImplementedError

    def load_heads(self, hw: HeadWeights) -> None:
        """Set the layer's weights from math form (inverse of to_heads)."""
        raise NotImplementedError

    def memoized(self, name: str, build) -> torch.Tensor:
        """build(), memoised only inside `frozen_weights` (generation), where a derived weight (canonical's
        assembled W_K, W_O; the K-only cache's value map) would otherwise be rebuilt at every decoding step;
        everywhere else (training, evaluation) it runs every time. Inside, the memo is still keyed by the
        tensors' storage and version counters."""
        tensors = [*self.parameters(), *self.buffers()]
        if not self.weights_frozen or torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return build()
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
        memo = self.__dict__.setdefault("_memo", {})
        if memo.get(name, (None,))[0] != key:
            memo[name] = (key, build())
        return memo[name][1]

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
        """(W_KV (H, G r, r), offset (H, r) or None) with v_h = k~ W_KV[h] + offset[h] for the (pre-RoPE) keys k~
        of all G heads side by side: exact when the key map W_K (d x G r) is square and invertible, x = (k~ -
        b_K) W_K^{-1} (GPT-2's always is: G r = d)."""
        hw = self.to_heads()
        G, d, r = hw.W_K.shape
        if G * r != d:
            raise ValueError(f"a K-only cache needs a square key map (n_kv_head x d_head = n_embd), got "
                             f"{G} x {r} = {G * r} key columns for n_embd = {d}")
        W_K = hw.W_K.transpose(0, 1).reshape(d, G * r).double()  # (d, G r): heads side by side
        W_KV = torch.linalg.solve(W_K, hw.per_query_head("W_V").double())  # (H, G r, r)
        offset = self.k_only_offset(W_KV, hw.b_K, hw.per_query_head("b_V"))
        dtype = hw.W_K.dtype
        return W_KV.to(dtype), None if offset is None else offset.to(dtype)

    def forward(self, x: torch.Tensor, cache: KVCache | KOnlyCache | None = None, layer: int = 0,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d); rope = (cos, sin), each (T, rot/2) or (B, 1, T, rot/2), for these T positions (None: no rotary
        dims). With a cache, x holds only the new positions; keys and values of the earlier ones come from the cache
        (slot `layer`), and the new ones are appended to it. A KOnlyCache keeps the pre-RoPE keys alone; the values
        are rebuilt from them and the keys rotated on read (_forward_k_only). key_mask (B, past + T) bool: False on
        a padding position, which no other query sees (kernels.attend)."""
        B, T, _ = x.shape
        H, G, r = self.n_head, self.n_kv_head, self.d_head
        rope = rope if self.rot else None  # a layer without RoPE (GPTConfig.nope_every) in a rotary model
        q, k, v = self.qkv(x)  # (B, T, H r), (B, T, G r), (B, T, G r)
        q = q.reshape(B, T, H, r).transpose(1, 2)  # (B, H, T, r)
        k = k.reshape(B, T, G, r).transpose(1, 2)  # (B, G, T, r), before RoPE
        if self.qk_norm:  # before RoPE; the K-only cache keeps the keys before their norm (values are linear in them)
            q = self.qk_normed(q, self.q_norm)
        if rope is not None:
            q = apply_rope(q, *rope, self.rope_layout)
        if isinstance(cache, KOnlyCache):
            if key_mask is not None:
                raise ValueError("the K-only cache takes no padding mask; use the full cache for a padded batch")
            return self._forward_k_only(q, k, cache, layer)
        if self.qk_norm:
            k = self.qk_normed(k, self.k_norm)
        if rope is not None:
            k = apply_rope(k, *rope, self.rope_layout)
        v = v.reshape(B, T, G, r).transpose(1, 2)  # (B, G, T, r)
        past = None
        if cache is not None:
            past = cache.length_of(layer)
            k, v = cache.update(layer, k, v)  # each (B, G, past + T, r)
        y = attend(q, k, v, self.attn_kernel, self.dropout if self.training else 0.0, past,
                   self.window, key_mask)  # (B, H, T, r)
        y = y.transpose(1, 2).reshape(B, T, H * r)  # (B, T, H r): heads side by side
        return self.resid_dropout(self.project_out(y))  # (B, T, d)

    def _forward_k_only(self, q, k_raw, cache: KOnlyCache, layer: int) -> torch.Tensor:
        """Scores against the cached pre-RoPE keys, rotated on read; each head's output is (p_h K~) W_KV[h] +
        offset[h] (attention weights times the cached keys of every head first, then a (G r) x r map)."""
        B, H, T, r = q.shape
        G = self.n_kv_head
        past = cache.length_of(layer)
        k_all = cache.update(layer, k_raw)  # (B, G, past + T, r), pre-RoPE (and before the key norm)
        rotates = cache.rope is not None and self.rot  # not on a layer without RoPE
        k_read = self.qk_normed(k_all, self.k_norm) if self.qk_norm else k_all
        k_rot = apply_rope(k_read, *cache.rope(past + T), self.rope_layout) if rotates else k_read
        mask = causal_mask(T, past + T, q.device, self.window)  # (T, past + T)
        scores = q @ k_rot.repeat_interleave(H // G, dim=1).transpose(-1, -2) / r**0.5  # (B, H, T, past + T)
        p = scores.masked_fill(~mask, float("-inf")).softmax(-1)  # (B, H, T, past + T)
        keys = k_all.transpose(1, 2).reshape(B, 1, past + T, G * r)  # (B, 1, past + T, G r): every head's key
        W_KV, offset = self.memoized("k_only", self.k_only_value_map)
        y = torch.einsum("bhtc,hcr->bhtr", p @ keys, W_KV)  # (B, H, T, G r) -> (B, H, T, r)
        if offset is not None:
            y = y + offset[:, None, :]
        y = y.transpose(1, 2).reshape(B, T, H * r)  # (B, T, H r)
        return self.resid_dropout(self.project_out(y))
