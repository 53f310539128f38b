"""I-Attention: each head's key and output maps carry an r x r identity block.

Head h stores W_Q[h], W_V[h] (d x r) in full. Of W_K[h] (d x r) the r rows `k_perm[h, :r]`
form the identity and only the other d - r rows are learned (`W_K_free`). Of W_O[h] (r x d)
the r columns `o_perm[h, :r]` form the identity and only the other d - r columns are learned
(`W_O_free`, stored transposed). Same function class as standard attention wherever the
corresponding blocks of a standard head are invertible, with 2 r^2 fewer parameters per head.

At one head (r = d) the keys are a permutation of the input (plus b_K) and the output map is a
permutation: both are index copies, no GEMM; with the default (aligned) block the permutation is
the identity and even the copy is skipped (keys = x + b_K, output = y + b_O).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from iattention.attention.base import CausalSelfAttention
from iattention.attention.heads import HeadWeights, merge_heads_in, merge_heads_out


def aligned_blocks(n_head: int, d_head: int) -> torch.Tensor:
    """Default block: head h uses coordinates [h r, (h+1) r). Returns (H, r) indices."""
    return torch.arange(n_head * d_head).reshape(n_head, d_head)


def block_permutation(blocks: torch.Tensor, d: int) -> torch.Tensor:
    """(H, r) chosen indices -> (H, d) permutation: the block first, then the rest in order."""
    rows = []
    for sel in blocks.tolist():
        chosen = set(sel)
        if len(chosen) != len(sel) or not all(0 <= i < d for i in sel):
            raise ValueError(f"block indices must be {len(sel)} distinct values in [0, {d}), got {sel}")
        rows.append(sel + [i for i in range(d) if i not in chosen])
    return torch.tensor(rows, dtype=torch.long)


def assemble(free: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """(H, d-r, r) learned rows + identity block -> full (H, d, r); row perm[h, j] gets source row j."""
    H, d = perm.shape
    r = free.shape[-1]
    eye = torch.eye(r, dtype=free.dtype, device=free.device).expand(H, r, r)
    src = torch.cat([eye, free], dim=1)
    return torch.zeros_like(src).scatter(1, perm.unsqueeze(-1).expand(H, d, r), src)


def take_free(full: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Inverse of `assemble` on the learned rows: (H, d, r) -> (H, d-r, r)."""
    r = full.shape[-1]
    idx = perm[:, r:]
    return torch.gather(full, 1, idx.unsqueeze(-1).expand(*idx.shape, r))



@torch.no_grad()
def init_learned_entries(layer: nn.Module) -> None:
    """GPT-2 style for a canonical layer's learned entries: N(0, 0.02), the output map's N(0, residual_std)
    (the layer's `residual_std`), biases zero."""
    for name, p in layer.named_parameters():
        if name.startswith("b_"):
            p.zero_()
        else:
            p.normal_(0.0, layer.residual_std if name.startswith("W_O") else 0.02)

class CanonicalAttention(CausalSelfAttention):
    variant = "canonical"
    full_class = True

    @classmethod
    def removed_params(cls, config) -> int:
        """r^2 per head per canonical half, per layer; with minimal_bias also b_K and b_V (2 d per layer)."""
        halves = 2 if config.canonical_halves == "both" else 1
        biases = 2 * config.n_embd if config.minimal_bias and config.bias else 0
        return (halves * config.d_head**2 * config.n_head + biases) * config.n_layer

    @classmethod
    def redundant_biases(cls, config) -> tuple[str, ...]:
        """b_K and b_V, unless minimal_bias already dropped them (b_V folded into b_O)."""
        return ("b_K", "b_V") if config.bias and not config.minimal_bias else ()

    @classmethod
    def projection_flops(cls, config) -> int:
        """With H > 1 the full W_K / W_O are assembled and the standard GEMMs run (8 d^2); at H = 1 keys
        and output are index copies, so only the fused Q,V GEMM runs (4 d^2; 6 d^2 for "qk" or "vo")."""
        if config.n_head > 1:
            return 8 * config.n_embd**2
        skipped = {"both": 2, "qk": 1, "vo": 1}[config.canonical_halves]
        return (8 - 2 * skipped) * config.n_embd**2

    def __init__(self, config):
        super().__init__(config)
        H, d, r = config.n_head, config.n_embd, config.d_head
        self.canonical_qk = config.canonical_halves in ("both", "qk")
        self.canonical_vo = config.canonical_halves in ("both", "vo")
        self.W_Q = nn.Parameter(torch.empty(H, d, r))
        self.W_V = nn.Parameter(torch.empty(H, d, r))
        perm = block_permutation(aligned_blocks(H, r), d)
        if self.canonical_qk:
            self.W_K_free = nn.Parameter(torch.empty(H, d - r, r))
            self.register_buffer("k_perm", perm.clone())
        else:
            self.W_K = nn.Parameter(torch.empty(H, d, r))
        if self.canonical_vo:
            self.W_O_free = nn.Parameter(torch.empty(H, d - r, r))
            self.register_buffer("o_perm", perm.clone())
        else:
            self.W_O = nn.Parameter(torch.empty(H, r, d))
        self.minimal_bias = config.minimal_bias
        if config.bias:
            self.b_Q = nn.Parameter(torch.zeros(H, r))
            self.b_K = None if config.minimal_bias else nn.Parameter(torch.zeros(H, r))
            self.b_V = None if config.minimal_bias else nn.Parameter(torch.zeros(H, r))
            self.b_O = nn.Parameter(torch.zeros(d))
        else:
            self.b_Q = self.b_K = self.b_V = self.b_O = None
        self.residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        self.reset_parameters()
        self._refresh_identity_flags()
        # A checkpoint may carry another block choice: re-derive the flags after every load.
        self.register_load_state_dict_post_hook(lambda module, _keys: module._refresh_identity_flags())

    def _refresh_identity_flags(self) -> None:
        """Python-level flags (so torch.compile specialises on them): is a 1-head permutation trivial?"""
        def trivial(name):
            perm = getattr(self, name, None)
            return (self.n_head == 1 and perm is not None and
                    torch.equal(perm[0].cpu(), torch.arange(perm.shape[1])))
        self._k_identity, self._o_identity = trivial("k_perm"), trivial("o_perm")

    def reset_parameters(self) -> None:
        init_learned_entries(self)

    def set_blocks(self, k_rows: torch.Tensor | None, o_cols: torch.Tensor | None) -> None:
        """Choose which r rows of W_K[h] / columns of W_O[h] are the identity, (H, r) each."""
        d = self.n_embd
        if k_rows is not None and self.canonical_qk:
            self.k_perm.copy_(block_permutation(k_rows, d))
        if o_cols is not None and self.canonical_vo:
            self.o_perm.copy_(block_permutation(o_cols, d))
        self._refresh_identity_flags()

    def _memoized(self, name: str, build, *tensors: torch.Tensor) -> torch.Tensor:
        """build(), memoised only inside `frozen_weights` (generation), where the assembly of the full
        matrices would otherwise run on every decoding step; everywhere else (training, evaluation) it
        runs every time. Inside, the memo is still keyed by the tensors' storage and version counters."""
        if not self.weights_frozen or torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return build()
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
        memo = self.__dict__.setdefault("_memo", {})
        if memo.get(name, (None,))[0] != key:
            memo[name] = (key, build())
        return memo[name][1]

    def key_weight(self) -> torch.Tensor:
        return assemble(self.W_K_free, self.k_perm) if self.canonical_qk else self.W_K

    def out_weight(self) -> torch.Tensor:
        return assemble(self.W_O_free, self.o_perm).transpose(1, 2) if self.canonical_vo else self.W_O

    def _weight_sources(self) -> list[torch.Tensor]:
        """Every tensor the fused weights (Q,K,V in; O out) are built from: the memo key of `_memoized`."""
        return [t for t in (self.W_Q, self.W_V, getattr(self, "W_K_free", None), getattr(self, "k_perm", None),
                            getattr(self, "W_K", None), getattr(self, "W_O_free", None), getattr(self, "o_perm", None),
                            getattr(self, "W_O", None)) if t is not None]

    def _bias(self, *parts):
        """Fused bias of the given per-head biases; a bias dropped by minimal_bias counts as zeros."""
        if self.b_Q is None:
            return None
        return torch.cat([self.b_Q.new_zeros(self.b_Q.numel()) if p is None else p.reshape(-1) for p in parts])

    def qkv(self, x):
        d = self.n_embd
        if self.canonical_qk and self.n_head == 1:
            # r = d: the key map is a permutation of the input, so no key GEMM.
            W = self._memoized("qv", lambda: merge_heads_in(torch.cat([self.W_Q, self.W_V], dim=0)),
                               *self._weight_sources())
            q, v = F.linear(x, W, self._bias(self.b_Q, self.b_V)).split(d, dim=2)
            k = x if self._k_identity else x.index_select(-1, self.k_perm[0])
            if self.b_K is not None:  # None without bias or with minimal_bias
                k = k + self.b_K.reshape(-1)
            return q, k, v
        W = self._memoized("qkv", lambda: merge_heads_in(torch.cat([self.W_Q, self.key_weight(), self.W_V], dim=0)),
                           *self._weight_sources())
        return F.linear(x, W, self._bias(self.b_Q, self.b_K, self.b_V)).split(d, dim=2)

    def project_out(self, y):
        if self.canonical_vo and self.n_head == 1:
            # r = d: the output map is a permutation, so no output GEMM.
            out = y if self._o_identity else torch.zeros_like(y).index_copy(-1, self.o_perm[0], y)
            return out if self.b_O is None else out + self.b_O
        W = self._memoized("o", lambda: merge_heads_out(self.out_weight()), *self._weight_sources())
        return F.linear(y, W, self.b_O)

    def k_only_value_map(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """At one head the key map is a permutation (k = x P + b_K, P = k_perm's columns), so the cached keys are
        the layer input itself, permuted: x = (k - b_K) P^T, and W_KV = P^T W_V is W_V's rows in k_perm's order,
        an index copy (no solve). Otherwise the general solve (CausalSelfAttention)."""
        if not (self.canonical_qk and self.n_head == 1):
            return super().k_only_value_map()
        hw = self.to_heads()
        W_KV = hw.W_V[:, self.k_perm[0], :]  # (1, d, r): row j is W_V's row k_perm[0, j]
        return W_KV, self.k_only_offset(W_KV, hw.b_K, hw.b_V)

    def to_heads(self) -> HeadWeights:
        zeros = None if self.b_Q is None else torch.zeros_like(self.b_Q)
        return HeadWeights(W_Q=self.W_Q, W_K=self.key_weight(), W_V=self.W_V, W_O=self.out_weight(), b_Q=self.b_Q,
                           b_K=zeros if self.minimal_bias else self.b_K, b_V=zeros if self.minimal_bias else self.b_V,
                           b_O=self.b_O)

    @torch.no_grad()
    def canonical_view(self) -> dict[str, torch.Tensor]:
        """The layer in its own terms, per head, read from `to_heads` (TransformerLens shapes: W_Q, W_K, W_V
        (H, d, r), W_O (H, r, d)): W_Q, W_V as learned; of W_K, the fixed rows `k_rows` (H, r), the block
        they form `W_K_fixed` (H, r, r: the identity) and the learned rest `W_K_learned` (H, d - r, r: the
        other rows in increasing order, the parameter W_K_free); of W_O, the fixed columns `o_cols`,
        `W_O_fixed` (H, r, r: the identity) and `W_O_learned` (H, r, d - r); a half left standard ("qk" or
        "vo") gives its full W_K or W_O instead. `W_QK` (H, d, d) = W_Q W_K^T: the score of query i and key j
        at head h is x_i W_QK[h] x_j^T / sqrt(r), plus bias terms. At one head W_K is the permutation with
        ones at (k_rows[j], j), so `W` (d, d) = W_QK[0] is W_Q[0] with column j moved to column k_rows[j]:
        W_Q[0] itself with the aligned block (k_rows = 0..d-1)."""
        hw = self.to_heads()
        r = self.d_head
        view = {"W_Q": hw.W_Q, "W_V": hw.W_V}

        def split(full, perm, name, rows):  # full (H, d, r): fixed rows perm[:, :r], learned the rest
            view[rows] = perm[:, :r]
            view[f"{name}_fixed"] = torch.gather(full, 1, perm[:, :r, None].expand(-1, -1, r))
            view[f"{name}_learned"] = take_free(full, perm)

        if self.canonical_qk:
            split(hw.W_K, self.k_perm, "W_K", "k_rows")
        else:
            view["W_K"] = hw.W_K
        if self.canonical_vo:
            split(hw.W_O.transpose(1, 2), self.o_perm, "W_O", "o_cols")
            view["W_O_fixed"], view["W_O_learned"] = (view[k].transpose(1, 2) for k in ("W_O_fixed", "W_O_learned"))
        else:
            view["W_O"] = hw.W_O
        view["W_QK"] = hw.W_Q @ hw.W_K.transpose(1, 2)
        if self.n_head == 1:
            view["W"] = view["W_QK"][0]
        return {k: v.detach() for k, v in view.items()}

    @torch.no_grad()
    def load_heads(self, hw: HeadWeights) -> None:
        """Load math-form weights whose chosen blocks are already the identity."""
        self.W_Q.copy_(hw.W_Q)
        self.W_V.copy_(hw.W_V)
        if self.canonical_qk:
            self.W_K_free.copy_(take_free(hw.W_K, self.k_perm))
        else:
            self.W_K.copy_(hw.W_K)
        if self.canonical_vo:
            self.W_O_free.copy_(take_free(hw.W_O.transpose(1, 2), self.o_perm))
        else:
            self.W_O.copy_(hw.W_O)
        if self.b_Q is not None:
            if self.minimal_bias and bool(hw.b_V.any()):
                raise ValueError("a minimal_bias layer holds no b_V: fold it into b_O first "
                                 "(canonicalize(..., minimal=True))")
            for name in ("b_Q", "b_O") if self.minimal_bias else ("b_Q", "b_K", "b_V", "b_O"):
                getattr(self, name).copy_(getattr(hw, name))
