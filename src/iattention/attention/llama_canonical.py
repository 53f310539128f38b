"""Canonical (symmetry-reduced) Llama-family attention: per key/value group, the gauge that keeps every score
and output is fixed, so only the rest is learned.

Group j (KV head j and its g query heads) stores:
  W_Q[h] (d x r) of each query head and W_V[j] (d x r) in full;
  W_K[j]: on each rotary pair k (columns first_k, second_k; see rope.py) the pivot row `rot_perm[j, k, 0]`
    is fixed to (1, 0) and the other d - 1 rows are learned (`W_K_rot_free`, (G, rot/2, d - 1, 2)): the pair's
    complex scalar gauge is used up (2 numbers). On the r - rot pass dims the rows `pass_perm[j, :r - rot]` are
    the identity and the other rows are learned (`W_K_pass_free`): the pass dims' GL(r - rot) is used up;
  W_O of the group's query heads side by side, an r x (g d) matrix [W_O[h_1] ... W_O[h_g]]: the columns
    `o_perm[j, :r]` are the identity, the other g d - r are learned (`W_O_free`, stored transposed).
So each group holds rot + (r - rot)^2 + r^2 fewer numbers than standard, the same function class on an open
dense set (where the fixed entries of a standard model are invertible). `symmetry/grouped.py` picks the blocks
(pivoted: the largest complex entry of each key pair, column-pivoted QR elsewhere) and moves weights in and out.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from iattention.attention.canonical import block_permutation, init_learned_entries
from iattention.attention.grouped import GroupedAttention, GroupedHeadWeights
from iattention.attention.heads import merge_heads_in, merge_heads_out
from iattention.attention.rope import pair_dims


def _place(free: torch.Tensor, perm: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """(N, n - b, c) learned rows + the fixed (b, c) block `top` -> (N, n, c); row perm[i, j] gets source row j."""
    N, n = perm.shape
    src = torch.cat([top.to(free).expand(N, *top.shape), free], dim=1)  # (N, n, c)
    return torch.zeros_like(src).scatter(1, perm.unsqueeze(-1).expand(N, n, src.shape[-1]), src)


def _free(full: torch.Tensor, perm: torch.Tensor, b: int) -> torch.Tensor:
    """Inverse of `_place` on the learned rows: (N, n, c) -> (N, n - b, c)."""
    idx = perm[:, b:]
    return torch.gather(full, 1, idx.unsqueeze(-1).expand(*idx.shape, full.shape[-1]))


def default_blocks(n_kv_head: int, group: int, d: int, r: int, rot: int) -> dict[str, torch.Tensor]:
    """A valid block for every group (coordinates near the group's own; `symmetry/grouped.py` chooses better):
    {'rot': (G, rot/2) pivot rows, 'pass': (G, r - rot) rows, 'out': (G, r) columns of the r x (g d) map}."""
    cpu = dict(device="cpu")  # index bookkeeping, read with tolist(): on the CPU even while building on "meta"
    j = torch.arange(n_kv_head, **cpu)[:, None]
    return {"rot": (j * r + torch.arange(rot // 2, **cpu)) % d,
            "pass": (j * r + rot + torch.arange(r - rot, **cpu)) % d,
            "out": (j * group * r + torch.arange(r, **cpu)) % d}


class LlamaCanonicalAttention(GroupedAttention):
    variant = "canonical"
    full_class = True

    @classmethod
    def removed_params(cls, config) -> int:
        """Per layer and KV group: rot (a complex scalar per rotary pair) + (r - rot)^2 (the pass dims) + r^2
        (the value/output map)."""
        r, rot = config.d_head, config.rot
        return config.n_layer * config.n_kv_head * (rot + (r - rot) ** 2 + r * r)

    @classmethod
    def projection_flops(cls, config) -> int:
        """The full W_K and W_O are assembled, then the same GEMMs as standard run."""
        d, r = config.n_embd, config.d_head
        return 2 * d * r * (2 * config.n_head + 2 * config.n_kv_head)

    def __init__(self, config):
        super().__init__(config)
        H, G, d, r, rot = config.n_head, config.n_kv_head, config.n_embd, config.d_head, config.rot
        self.group = H // G
        p = r - rot
        self.W_Q = nn.Parameter(torch.empty(H, d, r))
        self.W_V = nn.Parameter(torch.empty(G, d, r))
        blocks = default_blocks(G, self.group, d, r, rot)
        if rot:
            self.W_K_rot_free = nn.Parameter(torch.empty(G, rot // 2, d - 1, 2))
            self.register_buffer("rot_perm", block_permutation(blocks["rot"].reshape(-1, 1), d).reshape(G, rot // 2, d))
        if p:
            self.W_K_pass_free = nn.Parameter(torch.empty(G, d - p, p))
            self.register_buffer("pass_perm", block_permutation(blocks["pass"], d))
        self.W_O_free = nn.Parameter(torch.empty(G, self.group * d - r, r))
        self.register_buffer("o_perm", block_permutation(blocks["out"], self.group * d))
        self.b_Q = nn.Parameter(torch.zeros(H, r)) if config.qkv_bias else None
        self.b_K = nn.Parameter(torch.zeros(G, r)) if config.qkv_bias else None
        self.b_V = nn.Parameter(torch.zeros(G, r)) if config.qkv_bias else None
        self.b_O = nn.Parameter(torch.zeros(d)) if config.o_bias else None
        self.residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        self.reset_parameters()

    def head_blocks(self) -> dict[str, list[tuple]]:
        """W_Q per query head, W_V per key/value head; the key map per group, W_K_pass_free as one block and
        W_K_rot_free as one (d - 1) x 2 block per rotary pair (its tensor is 3-D per group); W_O_free per group:
        canonical's output map is fixed per group (r columns of the group's r x (g d) map are the identity), so
        its W_O block is the group's, feeding that group's query heads only."""
        H, G = self.n_head, self.n_kv_head
        blocks = {"W_Q": [(h,) for h in range(H)], "W_V": [(j,) for j in range(G)],
                  "W_O_free": [(j,) for j in range(G)]}
        if self.rot:
            blocks["W_K_rot_free"] = [(j, k) for j in range(G) for k in range(self.rot // 2)]
        if self.d_head > self.rot:
            blocks["W_K_pass_free"] = [(j,) for j in range(G)]
        return blocks

    def reset_parameters(self) -> None:
        init_learned_entries(self)

    @torch.no_grad()
    def set_blocks(self, blocks: dict[str, torch.Tensor]) -> None:
        """Choose the fixed entries: {'rot': (G, rot/2) pivot rows, 'pass': (G, r - rot) rows, 'out': (G, r)
        columns of each group's r x (g d) output map} (see default_blocks)."""
        G, d = self.n_kv_head, self.n_embd
        if self.rot:
            self.rot_perm.copy_(block_permutation(blocks["rot"].reshape(-1, 1), d).reshape(G, self.rot // 2, d))
        if self.d_head > self.rot:
            self.pass_perm.copy_(block_permutation(blocks["pass"], d))
        self.o_perm.copy_(block_permutation(blocks["out"], self.group * d))

    def _frozen(self, name: str, build) -> torch.Tensor:
        """Assembled weights built once inside `frozen_weights` (generation), every call elsewhere."""
        if torch.is_grad_enabled():
            return build()
        return self.frozen_inverse(name, build)

    def _assemble_key(self) -> torch.Tensor:
        G, d, r, rot = self.n_kv_head, self.n_embd, self.d_head, self.rot
        parts = []
        if rot:
            top = torch.tensor([[1.0, 0.0]])
            pairs = _place(self.W_K_rot_free.reshape(-1, d - 1, 2), self.rot_perm.reshape(-1, d), top)
            pairs = pairs.reshape(G, rot // 2, d, 2)
            order = (0, 2, 3, 1) if self.rope_layout == "half" else (0, 2, 1, 3)  # columns [firsts, seconds] or pairs
            parts.append(pairs.permute(*order).reshape(G, d, rot))
        if r > rot:
            parts.append(_place(self.W_K_pass_free, self.pass_perm, torch.eye(r - rot)))
        return torch.cat(parts, dim=2)  # (G, d, r)

    def key_weight(self) -> torch.Tensor:
        return self._frozen("W_K", self._assemble_key)

    def out_weight(self) -> torch.Tensor:
        """(H, r, d): each group's assembled r x (g d) map cut into its query heads' r x d maps."""
        def build():
            H, d, r = self.n_head, self.n_embd, self.d_head
            full = _place(self.W_O_free, self.o_perm, torch.eye(r))  # (G, g d, r)
            return full.reshape(H, d, r).transpose(1, 2)
        return self._frozen("W_O", build)

    def qkv(self, x):
        W = self._frozen("qkv", lambda: merge_heads_in(torch.cat([self.W_Q, self.key_weight(), self.W_V], dim=0)))
        # W: ((H + 2G) r, d)
        b = None
        if self.b_Q is not None:
            b = torch.cat([self.b_Q.reshape(-1), self.b_K.reshape(-1), self.b_V.reshape(-1)])
        H, G, r = self.n_head, self.n_kv_head, self.d_head
        return torch.nn.functional.linear(x, W, b).split([H * r, G * r, G * r], dim=-1)

    def project_out(self, y):
        return torch.nn.functional.linear(y, self._frozen("o", lambda: merge_heads_out(self.out_weight())), self.b_O)

    def to_heads(self) -> GroupedHeadWeights:
        return GroupedHeadWeights(W_Q=self.W_Q, W_K=self.key_weight(), W_V=self.W_V, W_O=self.out_weight(),
                                  b_Q=self.b_Q, b_K=self.b_K, b_V=self.b_V, b_O=self.b_O)

    @torch.no_grad()
    def load_heads(self, hw: GroupedHeadWeights) -> None:
        """Load math-form weights whose fixed entries already hold their values (symmetry.grouped.canonicalize);
        the fixed entries are not read."""
        G, d, r, rot = self.n_kv_head, self.n_embd, self.d_head, self.rot
        self.W_Q.copy_(hw.W_Q)
        self.W_V.copy_(hw.W_V)
        if rot:
            first, second = pair_dims(rot, self.rope_layout)
            pairs = torch.stack([hw.W_K[:, :, first], hw.W_K[:, :, second]], dim=-1)  # (G, d, rot/2, 2)
            pairs = pairs.transpose(1, 2).reshape(-1, d, 2)
            self.W_K_rot_free.copy_(_free(pairs, self.rot_perm.reshape(-1, d), 1).reshape(G, rot // 2, d - 1, 2))
        if r > rot:
            self.W_K_pass_free.copy_(_free(hw.W_K[:, :, rot:], self.pass_perm, r - rot))
        W_O_T = hw.W_O.transpose(1, 2).reshape(G, self.group * d, r)  # (G, g d, r)
        self.W_O_free.copy_(_free(W_O_T, self.o_perm, r))
        for name in ("b_Q", "b_K", "b_V", "b_O"):
            if getattr(self, name) is not None:
                getattr(self, name).copy_(getattr(hw, name))
