"""I-Attention: the gauge of each key/value group is fixed, so only the rest of its maps is learned.

Group j (KV head j and its g query heads; GPT-2: each head, g = 1) stores W_Q[h] (d x r) of each query head and
W_V[j] (d x r) in full, and of the rest:
  W_K[j], the query/key half (canonical_halves "both" or "qk"):
    on each rotary pair k (columns first_k, second_k; rope.py) the pivot row `rot_perm[j, k, 0]` is fixed to
    (1, 0) and the other d - 1 rows are learned (`W_K_rot_free`, (G, rot/2, d - 1, 2)): the pair's complex scalar
    gauge is used up (2 numbers);
    on the r - rot pass dims (all r without RoPE) the rows `k_perm[j, :r - rot]` are the identity and the other
    rows are learned (`W_K_free`): the pass dims' GL(r - rot) is used up;
  W_O, the value/output half ("both" or "vo"): the group's query heads side by side, an r x (g d) matrix
    [W_O[h_1] ... W_O[h_g]]; the columns `o_perm[j, :r]` are the identity, the other g d - r are learned
    (`W_O_free`, stored transposed).
So each group holds rot + (r - rot)^2 + r^2 fewer numbers than standard (2 r^2 per GPT-2 head): the same function
class on an open dense set (where the fixed entries of a standard model are invertible). `symmetry/transforms.py`
picks the blocks (pivoted: the largest complex entry of each key pair, column-pivoted QR elsewhere) and moves
weights in and out.

Under a query/key norm (GPTConfig.qk_norm) W_K has no gauge left to fix (docs/conversion.md, "Query/key norms"): it
is learned in full, and the query/key half fixes instead the key norm's gain (`k_norm`, a `PinnedRMSNorm`) to 1 on
one dim of each rotary pair (`k_norm.gain_perm`) and on every pass dim, per layer (qk_norm "head") or per KV group
("whole"): rot/2 + r - rot numbers each, the rescaling of the two gains that is the only continuous symmetry left.

At one head without RoPE (r = d) the keys are a permutation of the input (plus b_K) and the output map is a
permutation: both are index copies, no GEMM; with the default (aligned) block the permutation is the identity and
even the copy is skipped (keys = x + b_K, output = y + b_O).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from iattention.attention.base import CausalSelfAttention, qk_gauge
from iattention.attention.heads import HeadWeights, merge_heads_in, merge_heads_out
from iattention.attention.norm import RMSNorm
from iattention.attention.rope import pair_dims


def block_permutation(blocks: torch.Tensor, d: int) -> torch.Tensor:
    """(N, b) chosen indices -> (N, d) permutation: the block first, then the rest in order."""
    rows = []
    for sel in blocks.tolist():
        chosen = set(sel)
        if len(chosen) != len(sel) or not all(0 <= i < d for i in sel):
            raise ValueError(f"block indices must be {len(sel)} distinct values in [0, {d}), got {sel}")
        rows.append(sel + [i for i in range(d) if i not in chosen])
    return torch.tensor(rows, dtype=torch.long)


def place(free: torch.Tensor, perm: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """(N, n - b, c) learned rows + the fixed (b, c) block `top` -> (N, n, c); row perm[i, j] gets source row j."""
    N, n = perm.shape
    src = torch.cat([top.to(free).expand(N, *top.shape), free], dim=1)  # (N, n, c)
    return torch.zeros_like(src).scatter(1, perm.unsqueeze(-1).expand(N, n, src.shape[-1]), src)


def take_free(full: torch.Tensor, perm: torch.Tensor, b: int) -> torch.Tensor:
    """Inverse of `place` on the learned rows: (N, n, c) -> (N, n - b, c)."""
    idx = perm[:, b:]
    return torch.gather(full, 1, idx.unsqueeze(-1).expand(*idx.shape, full.shape[-1]))


def default_blocks(n_kv_head: int, group: int, d: int, r: int, rot: int, norm_rows: int = 0,
                   layout: str = "half") -> dict[str, torch.Tensor]:
    """A valid block for every group, coordinates near the group's own (GPT-2: head h's [h r, (h+1) r)):
    {'rot': (G, rot/2) pivot rows, 'pass': (G, r - rot) rows, 'out': (G, r) columns of the r x (g d) map}; with
    `norm_rows` (a query/key norm's key gain rows: 1 or G) 'knorm': (norm_rows, rot/2 + r - rot) the key gain's
    dims fixed to 1, the first of each rotary pair and every pass dim."""
    cpu = dict(device="cpu")  # index bookkeeping, read with tolist(): on the CPU even while building on "meta"
    j = torch.arange(n_kv_head, **cpu)[:, None]
    out = {"rot": (j * r + torch.arange(rot // 2, **cpu)) % d,
           "pass": (j * r + rot + torch.arange(r - rot, **cpu)) % d,
           "out": (j * group * r + torch.arange(r, **cpu)) % d}
    if norm_rows:
        first = pair_dims(rot, layout, device="cpu")[0]
        out["knorm"] = torch.cat([first, torch.arange(rot, r, **cpu)]).expand(norm_rows, -1).clone()
    return out


class PinnedRMSNorm(RMSNorm):
    """Canonical's key norm under a query/key norm: an RMSNorm over `width` dims whose gain, seen as `rows` rows of
    r, is 1 on `r - free` chosen dims of each row (`gain_perm[i, :r - free]`, the rest learned: `free_gain`)."""

    def __init__(self, rows: int, r: int, fixed: torch.Tensor, eps: float):
        nn.Module.__init__(self)
        self.eps, self.rows, self.r, self.n_fixed = eps, rows, r, fixed.shape[1]
        self.free_gain = nn.Parameter(torch.ones(rows * (r - self.n_fixed)))  # 1-D: a gain, not a matrix (Muon)
        self.register_buffer("gain_perm", block_permutation(fixed, r))  # STRUCTURAL: *_perm

    def gain(self) -> torch.Tensor:
        ones = torch.ones(self.n_fixed, 1)
        free = self.free_gain.reshape(self.rows, self.r - self.n_fixed, 1)
        return place(free, self.gain_perm, ones)[..., 0].reshape(-1)

    @torch.no_grad()
    def set_fixed(self, fixed: torch.Tensor) -> None:
        self.gain_perm.copy_(block_permutation(fixed, self.r))

    @torch.no_grad()
    def load_gain(self, gain: torch.Tensor) -> None:
        """The learned entries of `gain` (the fixed ones, 1 there after canonicalize, are not read)."""
        full = gain.reshape(self.rows, self.r, 1).to(self.free_gain)
        self.free_gain.copy_(take_free(full, self.gain_perm, self.n_fixed).reshape(-1))


@torch.no_grad()
def init_learned_entries(layer: nn.Module) -> None:
    """The model's init for a canonical layer's learned entries: N(0, 0.02), the output map's N(0, residual_std)
    (the layer's: scaled by 1 / sqrt(2 n_layer) under init=gpt2, as standard's output projection), biases zero,
    query/key norm gains one."""
    for name, p in layer.named_parameters():
        if "norm" in name:  # a query/key norm's gain: 1, as every norm's
            p.fill_(1.0)
        elif name.startswith("b_"):
            p.zero_()
        else:
            p.normal_(0.0, layer.residual_std if name.startswith("W_O") else 0.02)


class CanonicalAttention(CausalSelfAttention):
    variant = "canonical"
    full_class = True

    @classmethod
    def removed_params(cls, config) -> int:
        """Per layer and KV group: rot (a complex scalar per rotary pair) + (r - rot)^2 (the pass dims) on the
        query/key half (under a query/key norm: the key gain's fixed dims, `qk_gauge`), r^2 on the value/output half;
        with minimal_bias also b_K's pass dims and b_V (r - rot + r)."""
        r, rot, G = config.d_head, config.rot, config.n_kv_head
        qk = qk_gauge(config)[1] if config.canonical_halves in ("both", "qk") else 0
        vo = G * r * r if config.canonical_halves in ("both", "vo") else 0
        biases = G * (2 * r - rot) if config.minimal_bias else 0
        return config.n_layer * (qk + vo + biases)

    @classmethod
    def redundant_biases(cls, config) -> tuple[str, ...]:
        """The standard rule, unless minimal_bias already dropped them (b_K's pass dims; b_V folded into b_O)."""
        return () if config.minimal_bias else cls.learned_redundant_biases(config)

    @classmethod
    def index_copy_head(cls, config) -> bool:
        """One head as wide as the model (r = d), no rotary dims: keys and output are index copies of the canonical
        half's block."""
        return config.n_head == 1 and config.rot == 0 and config.d_head == config.n_embd

    @classmethod
    def projection_flops(cls, config) -> int:
        """The full W_K and W_O are assembled and the standard GEMMs run (2 d r (2 H + 2 G)); at one head without
        RoPE keys and output are index copies, so only the fused Q,V GEMM runs (4 d^2; 6 d^2 for "qk" or "vo"; under a
        query/key norm the key GEMM runs)."""
        d, r = config.n_embd, config.d_head
        if not cls.index_copy_head(config):
            return 2 * d * r * (2 * config.n_head + 2 * config.n_kv_head)
        halves = config.canonical_halves
        skipped = (halves in ("both", "vo")) + (halves in ("both", "qk") and not config.qk_norm)
        return (8 - 2 * skipped) * d**2

    def __init__(self, config):
        super().__init__(config)
        H, G, d, r, rot = config.n_head, config.n_kv_head, config.n_embd, config.d_head, config.rot
        self.group = H // G
        p = r - rot
        self.canonical_qk = config.canonical_halves in ("both", "qk")
        self.canonical_vo = config.canonical_halves in ("both", "vo")
        # the query/key half: W_K's blocks, or under a query/key norm the key gain's pinned dims (W_K in full)
        self.k_blocks = self.canonical_qk and not config.qk_norm
        self.k_pinned = self.canonical_qk and bool(config.qk_norm)
        self.one_head = self.index_copy_head(config)
        self.W_Q = nn.Parameter(torch.empty(H, d, r))
        self.W_V = nn.Parameter(torch.empty(G, d, r))
        norm_rows = (G if config.qk_norm == "whole" else 1) if self.k_pinned else 0
        blocks = default_blocks(G, self.group, d, r, rot, norm_rows, config.rope_layout)
        if self.k_pinned:
            self.k_norm = PinnedRMSNorm(norm_rows, r, blocks["knorm"], config.norm_eps)
        if self.k_blocks:
            if rot:
                self.W_K_rot_free = nn.Parameter(torch.empty(G, rot // 2, d - 1, 2))
                self.register_buffer("rot_perm",
                                     block_permutation(blocks["rot"].reshape(-1, 1), d).reshape(G, rot // 2, d))
            if p:
                self.W_K_free = nn.Parameter(torch.empty(G, d - p, p))
                self.register_buffer("k_perm", block_permutation(blocks["pass"], d))
        else:
            self.W_K = nn.Parameter(torch.empty(G, d, r))
        if self.canonical_vo:
            self.W_O_free = nn.Parameter(torch.empty(G, self.group * d - r, r))
            self.register_buffer("o_perm", block_permutation(blocks["out"], self.group * d))
        else:
            self.W_O = nn.Parameter(torch.empty(H, r, d))
        self.minimal_bias = config.minimal_bias
        kv_bias = config.qkv_bias and not config.minimal_bias
        self.b_Q = nn.Parameter(torch.zeros(H, r)) if config.qkv_bias else None
        self.b_K = nn.Parameter(torch.zeros(G, r)) if kv_bias else None
        # minimal_bias keeps b_K on the rotary dims (the first rot of a head), where it is not redundant
        self.b_K_rot = nn.Parameter(torch.zeros(G, rot)) if config.qkv_bias and config.minimal_bias and rot else None
        self.b_V = nn.Parameter(torch.zeros(G, r)) if kv_bias else None
        self.b_O = nn.Parameter(torch.zeros(d)) if config.o_bias else None
        # the init's std for a projection into the residual stream: GPT-2's scaled one, 0.02 under init=normal
        self.residual_std = 0.02 / math.sqrt(2 * config.n_layer) if config.standard_init == "gpt2" else 0.02
        self.reset_parameters()
        self._refresh_identity_flags()
        # A checkpoint may carry another block choice: re-derive the flags after every load.
        self.register_load_state_dict_post_hook(lambda module, _keys: module._refresh_identity_flags())

    def _refresh_identity_flags(self) -> None:
        """Python-level flags (so torch.compile specialises on them): is a 1-head permutation trivial?"""
        def trivial(name):
            perm = getattr(self, name, None)
            return self.one_head and perm is not None and torch.equal(perm[0].cpu(), torch.arange(perm.shape[1]))
        self._k_identity, self._o_identity = trivial("k_perm"), trivial("o_perm")

    def reset_parameters(self) -> None:
        init_learned_entries(self)

    def head_blocks(self) -> dict[str, list[tuple]]:
        """W_Q per query head, W_V per key/value head; the key map per group (W_K_free as one block, W_K_rot_free
        as one (d - 1) x 2 block per rotary pair); W_O_free per group: its r columns fixed per group, the block
        feeds that group's query heads only. A standard half (W_K, W_O) per head."""
        H, G = self.n_head, self.n_kv_head
        blocks = {"W_Q": [(h,) for h in range(H)], "W_V": [(j,) for j in range(G)]}
        if self.k_blocks:
            if self.rot:
                blocks["W_K_rot_free"] = [(j, k) for j in range(G) for k in range(self.rot // 2)]
            if self.d_head > self.rot:
                blocks["W_K_free"] = [(j,) for j in range(G)]
        else:
            blocks["W_K"] = [(j,) for j in range(G)]
        blocks["W_O_free" if self.canonical_vo else "W_O"] = [(j,) for j in range(G if self.canonical_vo else H)]
        return blocks

    @torch.no_grad()
    def set_blocks(self, blocks: dict[str, torch.Tensor]) -> None:
        """Choose the fixed entries: {'rot': (G, rot/2) pivot rows, 'pass': (G, r - rot) rows, 'out': (G, r)
        columns of each group's r x (g d) output map; under a query/key norm 'knorm': the key gain's fixed dims} (see
        default_blocks); the halves this layer keeps standard ignore theirs."""
        G, d = self.n_kv_head, self.n_embd
        if self.k_pinned:
            self.k_norm.set_fixed(blocks["knorm"])
        if self.k_blocks and self.rot:
            self.rot_perm.copy_(block_permutation(blocks["rot"].reshape(-1, 1), d).reshape(G, self.rot // 2, d))
        if self.k_blocks and self.d_head > self.rot:
            self.k_perm.copy_(block_permutation(blocks["pass"], d))
        if self.canonical_vo:
            self.o_perm.copy_(block_permutation(blocks["out"], self.group * d))
        self._refresh_identity_flags()

    def key_weight(self) -> torch.Tensor:
        """(G, d, r): the assembled key maps."""
        if not self.k_blocks:
            return self.W_K
        G, d, r, rot = self.n_kv_head, self.n_embd, self.d_head, self.rot
        parts = []
        if rot:
            top = torch.tensor([[1.0, 0.0]])
            pairs = place(self.W_K_rot_free.reshape(-1, d - 1, 2), self.rot_perm.reshape(-1, d), top)
            pairs = pairs.reshape(G, rot // 2, d, 2)
            order = (0, 2, 3, 1) if self.rope_layout == "half" else (0, 2, 1, 3)  # columns [firsts, seconds] or pairs
            parts.append(pairs.permute(*order).reshape(G, d, rot))
        if r > rot:
            parts.append(place(self.W_K_free, self.k_perm, torch.eye(r - rot)))
        return torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]

    def out_weight(self) -> torch.Tensor:
        """(H, r, d): each group's assembled r x (g d) map cut into its query heads' r x d maps."""
        if not self.canonical_vo:
            return self.W_O
        H, d, r = self.n_head, self.n_embd, self.d_head
        full = place(self.W_O_free, self.o_perm, torch.eye(r))  # (G, g d, r)
        return full.reshape(H, d, r).transpose(1, 2)

    def _head_biases(self) -> dict[str, torch.Tensor]:
        """b_Q (H, r), b_K and b_V (G, r), what minimal_bias dropped as zeros (b_K's pass dims, b_V); {} without
        query/key/value biases."""
        if self.b_Q is None:
            return {}
        if self.b_V is not None:  # b_K and b_V learned in full (no minimal_bias): nothing to fill in
            return {"b_Q": self.b_Q, "b_K": self.b_K, "b_V": self.b_V}
        zeros = self.b_Q.new_zeros(self.n_kv_head, self.d_head)
        b_K = zeros if self.b_K_rot is None else F.pad(self.b_K_rot, (0, self.d_head - self.rot))
        return {"b_Q": self.b_Q, "b_K": b_K, "b_V": zeros}

    def _bias(self, *parts):
        """Fused bias of the given per-head biases (_head_biases), or None."""
        biases = self._head_biases()
        return torch.cat([biases[n].reshape(-1) for n in parts]) if biases else None

    def qkv(self, x):
        H, G, r = self.n_head, self.n_kv_head, self.d_head
        if self.k_blocks and self.one_head:
            # r = d: the key map is a permutation of the input, so no key GEMM.
            W = self.memoized("qv", lambda: merge_heads_in(torch.cat([self.W_Q, self.W_V], dim=0)))
            q, v = F.linear(x, W, self._bias("b_Q", "b_V")).split(r, dim=2)
            k = x if self._k_identity else x.index_select(-1, self.k_perm[0])
            if self.b_K is not None:  # None without bias or with minimal_bias
                k = k + self.b_K.reshape(-1)
            return q, k, v
        W = self.memoized("qkv", lambda: merge_heads_in(torch.cat([self.W_Q, self.key_weight(), self.W_V], dim=0)))
        return F.linear(x, W, self._bias("b_Q", "b_K", "b_V")).split([H * r, G * r, G * r], dim=2)

    def project_out(self, y):
        if self.canonical_vo and self.one_head:
            # r = d: the output map is a permutation, so no output GEMM.
            out = y if self._o_identity else torch.zeros_like(y).index_copy(-1, self.o_perm[0], y)
            return out if self.b_O is None else out + self.b_O
        return F.linear(y, self.memoized("o", lambda: merge_heads_out(self.out_weight())), self.b_O)

    def k_only_value_map(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """At one head the key map is a permutation (k = x P + b_K, P = k_perm's columns), so the cached keys are
        the layer input itself, permuted: x = (k - b_K) P^T, and W_KV = P^T W_V is W_V's rows in k_perm's order,
        an index copy (no solve). Otherwise the general solve (CausalSelfAttention)."""
        if not (self.k_blocks and self.one_head):
            return super().k_only_value_map()
        hw = self.to_heads()
        W_KV = hw.W_V[:, self.k_perm[0], :]  # (1, d, r): row j is W_V's row k_perm[0, j]
        return W_KV, self.k_only_offset(W_KV, hw.b_K, hw.b_V)

    def to_heads(self) -> HeadWeights:
        return HeadWeights(W_Q=self.W_Q, W_K=self.key_weight(), W_V=self.W_V, W_O=self.out_weight(),
                           **self._head_biases(), b_O=self.b_O, **self.norm_gains())

    @torch.no_grad()
    def canonical_view(self) -> dict[str, torch.Tensor]:
        """The layer in its own terms, read from `to_heads` (TransformerLens shapes: W_Q (H, d, r), W_K, W_V
        (G, d, r), W_O (H, r, d)): W_Q, W_V as learned; of W_K's pass dims, the fixed rows `k_rows` (G, r - rot),
        the block they form `W_K_fixed` (G, r - rot, r - rot: the identity) and the learned rest `W_K_learned`
        (G, d - r + rot, r - rot: the other rows in increasing order, the parameter W_K_free); with RoPE also
        `rot_rows` (G, rot/2), each rotary pair's pivot row (fixed to (1, 0)); of W_O, the fixed columns `o_cols`
        (G, r) of each group's r x (g d) map, `W_O_fixed` (G, r, r: the identity) and `W_O_learned` (G, r, g d -
        r); a half left standard ("qk" or "vo") gives its full W_K or W_O instead. `W_QK` (H, d, d) = W_Q W_K^T
        (each query head with its group's keys): the score of query i and key j at head h is x_i W_QK[h] x_j^T /
        sqrt(r) without RoPE, plus bias terms. At one head without RoPE W_K is the permutation with ones at
        (k_rows[j], j), so `W` (d, d) = W_QK[0] is W_Q[0] with column j moved to column k_rows[j]: W_Q[0] itself
        with the aligned block (k_rows = 0..d-1)."""
        hw = self.to_heads()
        r, rot, G, d = self.d_head, self.rot, self.n_kv_head, self.n_embd
        view = {"W_Q": hw.W_Q, "W_V": hw.W_V}

        def split(full, perm, name, rows, b):  # full (N, n, c): fixed rows perm[:, :b], learned the rest
            view[rows] = perm[:, :b]
            view[f"{name}_fixed"] = torch.gather(full, 1, perm[:, :b, None].expand(-1, -1, full.shape[-1]))
            view[f"{name}_learned"] = take_free(full, perm, b)

        if self.k_pinned:  # W_K learned in full; the key gain's dims fixed to 1
            fixed = self.k_norm.gain_perm[:, :self.k_norm.n_fixed]
            view.update(W_K=hw.W_K, g_Q=hw.g_Q, g_K=hw.g_K, k_norm_fixed=fixed)
        elif self.canonical_qk:
            if rot:
                view["rot_rows"] = self.rot_perm[:, :, 0]
            if r > rot:
                split(hw.W_K[:, :, rot:], self.k_perm, "W_K", "k_rows", r - rot)
        else:
            view["W_K"] = hw.W_K
        if self.canonical_vo:
            split(hw.W_O.transpose(1, 2).reshape(G, self.group * d, r), self.o_perm, "W_O", "o_cols", r)
            view["W_O_fixed"], view["W_O_learned"] = (view[k].transpose(1, 2) for k in ("W_O_fixed", "W_O_learned"))
        else:
            view["W_O"] = hw.W_O
        view["W_QK"] = hw.W_Q @ hw.per_query_head("W_K").transpose(1, 2)
        if self.n_head == 1 and not rot:
            view["W"] = view["W_QK"][0]
        return {k: v.detach() for k, v in view.items()}

    @torch.no_grad()
    def load_heads(self, hw: HeadWeights) -> None:
        """Load math-form weights whose fixed entries already hold their values (symmetry.canonicalize); the
        fixed entries are not read."""
        G, d, r, rot = self.n_kv_head, self.n_embd, self.d_head, self.rot
        self.W_Q.copy_(hw.W_Q)
        self.W_V.copy_(hw.W_V)
        self.load_norm_gains(hw)
        if not self.k_blocks:
            self.W_K.copy_(hw.W_K)
        else:
            if rot:
                first, second = pair_dims(rot, self.rope_layout)
                pairs = torch.stack([hw.W_K[:, :, first], hw.W_K[:, :, second]], dim=-1)  # (G, d, rot/2, 2)
                pairs = pairs.transpose(1, 2).reshape(-1, d, 2)
                free = take_free(pairs, self.rot_perm.reshape(-1, d), 1)  # (G rot/2, d - 1, 2)
                self.W_K_rot_free.copy_(free.reshape(G, rot // 2, d - 1, 2))
            if r > rot:
                self.W_K_free.copy_(take_free(hw.W_K[:, :, rot:], self.k_perm, r - rot))
        if self.canonical_vo:
            self.W_O_free.copy_(take_free(hw.W_O.transpose(1, 2).reshape(G, self.group * d, r), self.o_perm, r))
        else:
            self.W_O.copy_(hw.W_O)
        if self.minimal_bias and hw.b_V is not None and bool(hw.b_V.any()):
            raise ValueError("a minimal_bias layer holds no b_V: fold it into b_O first "
                             "(canonicalize(..., minimal=True))")
        for name in ("b_Q", "b_K", "b_V", "b_O"):
            if getattr(self, name) is not None:
                getattr(self, name).copy_(getattr(hw, name))
        if self.b_K_rot is not None:  # its pass dims are dropped: redundant, so the function stays
            self.b_K_rot.copy_(hw.b_K[:, :rot])
