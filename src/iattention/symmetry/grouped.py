"""The gauge of Llama-family attention (RoPE, grouped-query; attention/grouped.py) and its canonical form.

Per KV group j, with A_j (r x r) commuting with every RoPE rotation and S_j (r x r) invertible:
    W_Q[h] -> W_Q[h] A_j,  b_Q[h] -> b_Q[h] A_j       for every query head h of group j (one A_j for all of them)
    W_K[j] -> W_K[j] A_j^{-T},  b_K[j] -> b_K[j] A_j^{-T}
    W_V[j] -> W_V[j] S_j,  b_V[j] -> b_V[j] S_j,  W_O[h] -> S_j^{-1} W_O[h]
leave every logit unchanged. A_j commutes with the rotations iff it is a complex scalar [[a, b], [-b, a]] on each
rotary pair (columns first_k, second_k; rope.py) and any invertible block on the pass dims: rot + (r - rot)^2
numbers, not r^2 (RoPE's rotations at distinct frequencies leave no other freedom). A shear inside a pair, a swap
of two pairs, a map mixing a rotary and a pass dim, or different A for two query heads of one group changes the
function.

The canonical form (attention/llama_canonical.py) uses A_j to make, on each rotary pair, the key row with the
largest complex modulus (1, 0) ("complete pivoting" for a 1 x 1 complex block: every entry of the pair then has
modulus <= 1) and the column-pivoted-QR rows of the pass block the identity; S_j makes r columns of the group's
r x (g d) output map [W_O[h_1] ... W_O[h_g]] the identity. All algebra in float64. Takes models only for their
config, `attention_layers` and state dict; a new model is `type(model)(config)`.
"""

from __future__ import annotations

import torch

from iattention.attention.grouped import GroupedHeadWeights
from iattention.attention.llama_canonical import default_blocks
from iattention.attention.rope import pair_dims
from iattention.errors import SingularBlockError
from iattention.symmetry.blocks import BLOCKS, pivoted_rows

SINGULAR_COND = 1e12


def is_grouped(model) -> bool:
    """A Llama-family model (its layers hold GroupedHeadWeights)."""
    return hasattr(model.config, "n_kv_head")


def _dtype(model) -> torch.dtype:
    return model.model.embed_tokens.weight.dtype


def gauge(hw: GroupedHeadWeights, A: torch.Tensor, S: torch.Tensor) -> GroupedHeadWeights:
    """Apply A (G, r, r) to the query/key half and S (G, r, r) to the value/output half, per KV group."""
    g = hw.group
    A_q, S_o = A.repeat_interleave(g, dim=0), S.repeat_interleave(g, dim=0)  # (H, r, r): each query head's group's
    A_inv_T = torch.linalg.inv(A).mT
    out = GroupedHeadWeights(W_Q=hw.W_Q @ A_q, W_K=hw.W_K @ A_inv_T, W_V=hw.W_V @ S,
                             W_O=torch.linalg.solve(S_o, hw.W_O), b_O=hw.b_O)
    if hw.b_Q is not None:
        out.b_Q = (hw.b_Q.unsqueeze(1) @ A_q).squeeze(1)
        out.b_K = (hw.b_K.unsqueeze(1) @ A_inv_T).squeeze(1)
        out.b_V = (hw.b_V.unsqueeze(1) @ S).squeeze(1)
    return out


def complex_scalars(z: torch.Tensor, r: int, rot: int, layout: str) -> torch.Tensor:
    """(G, rot/2) complex -> (G, r, r) real: z_k acting on pair k as a right factor, zeros on the pass dims."""
    first, second = pair_dims(rot, layout)
    A = torch.zeros(*z.shape[:-1], r, r, dtype=torch.float64)
    a, b = z.real.double(), z.imag.double()
    # columns [u v] of a pair times z = a + i b: u' = a u - b v, v' = b u + a v
    A[..., first, first], A[..., second, first] = a, -b
    A[..., first, second], A[..., second, second] = b, a
    return A


def random_commuting(G: int, r: int, rot: int, layout: str, gen: torch.Generator) -> torch.Tensor:
    """(G, r, r): a random complex scalar per rotary pair (modulus in [1/2, 2]) and a random well-conditioned
    invertible block on the pass dims."""
    modulus = torch.exp((torch.rand(G, rot // 2, generator=gen, dtype=torch.float64) * 2 - 1) * 0.7)
    phase = torch.rand(G, rot // 2, generator=gen, dtype=torch.float64) * 2 * torch.pi
    A = complex_scalars(torch.polar(modulus, phase), r, rot, layout)
    p = r - rot
    if p:
        M = torch.randn(G, p, p, generator=gen, dtype=torch.float64) / p**0.5
        A[:, rot:, rot:] = torch.eye(p, dtype=torch.float64) + 0.5 * M
    return A


def random_invertible(G: int, r: int, gen: torch.Generator) -> torch.Tensor:
    M = torch.randn(G, r, r, generator=gen, dtype=torch.float64) / r**0.5
    return torch.eye(r, dtype=torch.float64) + 0.5 * M


@torch.no_grad()
def random_gauge(model, seed: int = 0):
    """Move a standard Llama-family model along its symmetry by a random commuting A and a random S per group,
    in place (the function is unchanged)."""
    if model.config.attention != "standard":
        raise ValueError("random_gauge needs a standard-attention model; expand() it first")
    c = model.config
    gen = torch.Generator().manual_seed(seed)
    for attn in model.attention_layers:
        A = random_commuting(c.n_kv_head, c.d_head, c.rot, c.rope_layout, gen)
        S = random_invertible(c.n_kv_head, c.d_head, gen)
        attn.load_heads(gauge(attn.to_heads().to(torch.float64), A, S))
    return model


def _pairs(W_K: torch.Tensor, rot: int, layout: str) -> torch.Tensor:
    """(G, d, r) key maps -> (G, rot/2, d) complex: pair k's column first_k + i second_k."""
    first, second = pair_dims(rot, layout)
    return torch.complex(W_K[:, :, first], W_K[:, :, second]).transpose(1, 2)


def select_blocks(hw: GroupedHeadWeights, rot: int, layout: str, block: str) -> dict[str, torch.Tensor]:
    """The fixed entries: {'rot': (G, rot/2) pivot rows, 'pass': (G, r - rot) rows, 'out': (G, r) columns of the
    group's r x (g d) output map}. "pivoted": the largest-modulus row per pair, column-pivoted QR for the blocks;
    "aligned": default_blocks (coordinates near the group's own, whatever their conditioning)."""
    G, d, r = hw.W_K.shape
    if block == "aligned":
        return default_blocks(G, hw.group, d, r, rot)
    if block != "pivoted":
        raise ValueError(f"unknown block {block!r}; choose one of {', '.join(BLOCKS)}")
    W_O_T = hw.W_O.mT.reshape(G, hw.group * d, r)  # (G, g d, r)
    return {"rot": _pairs(hw.W_K, rot, layout).abs().argmax(-1) if rot else torch.zeros(G, 0, dtype=torch.long),
            "pass": torch.tensor([pivoted_rows(hw.W_K[j, :, rot:]) for j in range(G)]).reshape(G, r - rot),
            "out": torch.tensor([pivoted_rows(W_O_T[j]) for j in range(G)])}


def conditioning(hw: GroupedHeadWeights, rot: int, layout: str, blocks: dict) -> dict[str, torch.Tensor]:
    """Per group: 'rotary': the smallest pivot ratio |c_p| / ||c|| over its pairs (1: one row carries the pair,
    small: the division by c_p magnifies the rest); 'pass' and 'output': the fixed blocks' condition numbers."""
    G, d, r = hw.W_K.shape
    out = {}
    if rot:
        c = _pairs(hw.W_K, rot, layout)  # (G, rot/2, d)
        pivot = torch.gather(c.abs(), 2, blocks["rot"].unsqueeze(-1)).squeeze(-1)
        out["rotary"] = (pivot / torch.linalg.vector_norm(c, dim=-1)).min(-1).values
    if r > rot:
        out["pass"] = torch.linalg.cond(torch.stack([hw.W_K[j, blocks["pass"][j], rot:] for j in range(G)]))
    W_O_T = hw.W_O.mT.reshape(G, hw.group * d, r)
    out["output"] = torch.linalg.cond(torch.stack([W_O_T[j, blocks["out"][j]] for j in range(G)]))
    return out


def canonical_gauge(hw: GroupedHeadWeights, rot: int, layout: str, blocks: dict, layer: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, S), each (G, r, r), that make the chosen entries (1, 0) / the identity."""
    G, d, r = hw.W_K.shape
    cond = conditioning(hw, rot, layout, blocks)
    for what in ("pass", "output"):
        for j, c in enumerate(cond.get(what, [])):
            if not c < SINGULAR_COND:
                raise SingularBlockError(f"layer {layer} group {j}: the fixed {what} block is singular (condition "
                                         f"number {float(c):.3g}); use block='pivoted' (--block pivoted), or this "
                                         "group has rank < r and no canonical form")
    A = torch.zeros(G, r, r, dtype=torch.float64)
    if rot:
        pivot = torch.gather(_pairs(hw.W_K, rot, layout), 2, blocks["rot"].unsqueeze(-1)).squeeze(-1)  # (G, rot/2)
        if bool((pivot == 0).any()):
            raise SingularBlockError(f"layer {layer}: a rotary pair's pivot entry of W_K is 0; use block='pivoted'")
        # key pair columns times w = 1 / c_p makes the pivot 1 + 0i; A^{-T} = that complex scalar, so A's is conj(c_p)
        A += complex_scalars(pivot.conj(), r, rot, layout)
    if r > rot:
        B = torch.stack([hw.W_K[j, blocks["pass"][j], rot:] for j in range(G)])  # (G, p, p): pass rows
        A[:, rot:, rot:] = B.mT  # W_K_pass A_pass^{-T} = W_K_pass B^{-1}: the rows become I
    W_O_T = hw.W_O.mT.reshape(G, hw.group * d, r)
    S = torch.stack([W_O_T[j, blocks["out"][j]] for j in range(G)]).mT  # (G, r, r): the chosen columns
    return A, S


def _copy_non_attention(src, dst) -> None:
    state = {k: v for k, v in src.state_dict().items() if ".self_attn." not in k}
    missing, unexpected = dst.load_state_dict(state, strict=False)
    assert not unexpected and all(".self_attn." in k for k in missing), (missing, unexpected)


@torch.no_grad()
def canonicalize(model, block: str = "pivoted"):
    """An equivalent `canonical` Llama-family model whose fixed entries are exactly (1, 0) / the identity."""
    out = type(model)(model.config.replace(attention="canonical")).to(_dtype(model))
    out.train(model.training)
    _copy_non_attention(model, out)
    for layer, (src, dst) in enumerate(zip(model.attention_layers, out.attention_layers)):
        canonicalize_layer(src, dst, model.config, block, layer)
    return out


@torch.no_grad()
def canonicalize_layer(src, dst, c, block: str = "pivoted", layer: int = 0) -> dict[str, torch.Tensor]:
    """One layer's canonical form: `dst` (a canonical attention layer of config `c`) gets the function of `src`
    (any variant), the algebra in float64 (what `canonicalize` does for every layer; a streaming conversion calls
    it one layer at a time). Returns the blocks it fixed (select_blocks)."""
    hw = src.to_heads().to(torch.float64)
    blocks = select_blocks(hw, c.rot, c.rope_layout, block)
    A, S = canonical_gauge(hw, c.rot, c.rope_layout, blocks, layer)
    dst.set_blocks(blocks)
    dst.load_heads(gauge(hw, A, S))
    return blocks


@torch.no_grad()
def expand(model):
    """The equivalent `standard` Llama-family model (exact: the assembled matrices are copied)."""
    out = type(model)(model.config.replace(attention="standard")).to(_dtype(model))
    out.train(model.training)
    _copy_non_attention(model, out)
    for src, dst in zip(model.attention_layers, out.attention_layers):
        dst.load_heads(src.to_heads())
    return out


def removed_per_layer(n_kv_head: int, d_head: int, rot: int) -> dict[str, int]:
    """{'qk': G (rot + (r - rot)^2), 'vo': G r^2}: the parameters canonical removes from one layer."""
    return {"qk": n_kv_head * (rot + (d_head - rot) ** 2), "vo": n_kv_head * d_head**2}
