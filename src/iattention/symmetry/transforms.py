"""Exact moves along the attention symmetry, for every family: the gauge, a random gauge, canonicalize, expand.

Per KV group j (GPT-2: per head), with A_j (r x r) commuting with every RoPE rotation and S_j (r x r) invertible:
    W_Q[h] -> W_Q[h] A_j,  b_Q[h] -> b_Q[h] A_j       for every query head h of group j (one A_j for all of them)
    W_K[j] -> W_K[j] A_j^{-T},  b_K[j] -> b_K[j] A_j^{-T}
    W_V[j] -> W_V[j] S_j,  b_V[j] -> b_V[j] S_j,  W_O[h] -> S_j^{-1} W_O[h]
leave every logit unchanged. Without rotary dims A_j is any invertible matrix (GPT-2's GL(r) x GL(r) per head);
with them it commutes with the rotations iff it is a complex scalar [[a, b], [-b, a]] on each rotary pair (columns
first_k, second_k; rope.py) and any invertible block on the pass dims: rot + (r - rot)^2 numbers (RoPE's rotations
at distinct frequencies leave no other freedom). A shear inside a pair, a swap of two pairs, a map mixing a rotary
and a pass dim, or different A for two query heads of one group changes the function.

The canonical form (attention/canonical.py) uses A_j to make, on each rotary pair, the key row with the largest
complex modulus (1, 0) ("complete pivoting" for a 1 x 1 complex block: every entry of the pair then has modulus
<= 1) and r - rot rows of the pass block the identity (B = W_K[rows], A^{-T} = B^{-1}); S_j makes r columns of the
group's r x (g d) output map [W_O[h_1] ... W_O[h_g]] the identity (S = C = those columns). "aligned" takes the
group's own coordinates, "pivoted" column-pivoted QR (blocks.py). All algebra in float64, cast back to the
model's dtype.

Under a query/key norm (GPTConfig.qk_norm; HeadWeights' g_Q, g_K) the A_j above is no symmetry: W_Q and W_K keep
only discrete ones (sign flips, a quarter turn of a pair with its gains swapped), and the continuous symmetry left is
    g_Q -> g_Q C,  g_K -> g_K C^{-1}      (C diagonal, nonzero, equal on the two dims of each rotary pair)
with one C per layer where the gains are shared by the heads (qk_norm "head") and one per KV group, the group's
query heads sharing it, where they are per head ("whole"); docs/conversion.md proves it. The canonical form uses C
to make the key gain 1 on one dim of each pair (pivoted: the one of larger modulus; aligned: the first) and on every
pass dim; S_j is as above.

These tools take a model only for its `config`, its `attention_layers` (each with `to_heads` / `load_heads`) and
its state dict; a new model is built as `type(model)(config)`. So `symmetry/` sits below `model/` (whose matched
init uses `canonicalize_into`) and never imports the model class.
"""

from __future__ import annotations

import math

import torch

from iattention.attention.canonical import default_blocks
from iattention.attention.heads import HeadWeights
from iattention.attention.rope import pair_dims
from iattention.errors import SingularBlockError
from iattention.symmetry.blocks import BLOCKS, pivoted_rows

SINGULAR_COND = 1e12


def _model_dtype(model) -> torch.dtype:
    return model.transformer.wte.weight.dtype


def _copy_non_attention(src, dst) -> None:
    state = {k: v for k, v in src.state_dict().items() if ".attn." not in k}
    missing, unexpected = dst.load_state_dict(state, strict=False)
    assert not unexpected and all(".attn." in k for k in missing), (missing, unexpected)


def gauge(hw: HeadWeights, A: torch.Tensor, S: torch.Tensor, A_inv_T: torch.Tensor | None = None,
          S_inv: torch.Tensor | None = None, C: torch.Tensor | None = None) -> HeadWeights:
    """Apply A (G, r, r) to the query/key half and S (G, r, r) to the value/output half, per KV group; A^{-T} and
    S^{-1} are formed here unless given. `C` (the key gain's rows, (1 or G, r), nonzero): the query/key norms'
    rescaling, g_K / C and g_Q C (each query head with its group's row; a layer with a query/key norm takes A = I)."""
    g = hw.group
    A_inv_T = torch.linalg.inv(A).mT if A_inv_T is None else A_inv_T
    S_inv = torch.linalg.inv(S) if S_inv is None else S_inv
    A_q, S_inv_o = A.repeat_interleave(g, dim=0), S_inv.repeat_interleave(g, dim=0)  # (H, r, r): each head's group's
    out = HeadWeights(W_Q=hw.W_Q @ A_q, W_K=hw.W_K @ A_inv_T, W_V=hw.W_V @ S, W_O=S_inv_o @ hw.W_O, b_O=hw.b_O,
                      g_Q=hw.g_Q, g_K=hw.g_K)
    if C is not None:
        out.g_K = hw.g_K / C
        out.g_Q = hw.g_Q * (C if C.shape[0] == hw.g_Q.shape[0] else C.repeat_interleave(g, dim=0))
    if hw.b_Q is not None:
        out.b_Q = (hw.b_Q.unsqueeze(1) @ A_q).squeeze(1)
    if hw.b_K is not None:
        out.b_K = (hw.b_K.unsqueeze(1) @ A_inv_T).squeeze(1)
    if hw.b_V is not None:
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


def _random_invertible(H: int, r: int, gen: torch.Generator, spread: float) -> torch.Tensor:
    """U diag(s) V with Haar-ish orthogonal U, V and singular values in [1/spread, spread]."""
    U = torch.linalg.qr(torch.randn(H, r, r, generator=gen, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(H, r, r, generator=gen, dtype=torch.float64))[0]
    s = torch.exp((torch.rand(H, r, generator=gen, dtype=torch.float64) * 2 - 1) * torch.log(torch.tensor(spread)))
    return U @ torch.diag_embed(s) @ V


def random_commuting(G: int, r: int, rot: int, layout: str, gen: torch.Generator, spread: float = 2.0) -> torch.Tensor:
    """(G, r, r): a random complex scalar per rotary pair (modulus in [1/spread, spread]) and a random invertible
    block on the pass dims (_random_invertible): an A that commutes with every rotation."""
    modulus = torch.exp((torch.rand(G, rot // 2, generator=gen, dtype=torch.float64) * 2 - 1) * math.log(spread))
    phase = torch.rand(G, rot // 2, generator=gen, dtype=torch.float64) * 2 * torch.pi
    A = complex_scalars(torch.polar(modulus, phase), r, rot, layout)
    if r > rot:
        A[:, rot:, rot:] = _random_invertible(G, r - rot, gen, spread)
    return A


def pair_constant(values: torch.Tensor, rot: int, layout: str) -> torch.Tensor:
    """(n, rot/2 + r - rot) numbers -> (n, r): one per rotary pair, put on both its dims, then one per pass dim: a
    diagonal C that commutes with every rotation."""
    first, second = pair_dims(rot, layout)
    n, k = values.shape
    r = k + rot // 2
    C = values.new_empty(n, r)
    C[:, first], C[:, second], C[:, rot:] = values[:, :rot // 2], values[:, :rot // 2], values[:, rot // 2:]
    return C


def random_norm_scale(hw: HeadWeights, rot: int, layout: str, gen: torch.Generator, spread: float = 2.0):
    """A random C for a layer with a query/key norm: (rows of g_K, r), modulus in [1/spread, spread], either sign,
    constant on each rotary pair."""
    rows, r = hw.g_K.shape
    k = rot // 2 + r - rot
    modulus = torch.exp((torch.rand(rows, k, generator=gen, dtype=torch.float64) * 2 - 1) * math.log(spread))
    sign = torch.where(torch.rand(rows, k, generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0)
    return pair_constant(modulus * sign, rot, layout)


@torch.no_grad()
def random_gauge(model, seed: int = 0, spread: float = 2.0):
    """Move a standard model along its symmetry by a random A (commuting with RoPE) and a random S per KV group, in
    place (the function is unchanged); under a query/key norm A = I and a random C rescales the norms' gains."""
    if model.config.attention != "standard":
        raise ValueError("random_gauge needs a standard-attention model; expand() it first")
    c = model.config
    gen = torch.Generator().manual_seed(seed)
    eye = torch.eye(c.d_head, dtype=torch.float64).expand(c.n_kv_head, -1, -1)
    for attn in model.attention_layers:
        hw = attn.to_heads().to(torch.float64)
        C = None
        if hw.g_K is not None:  # no A survives the norm; the gains' rescaling does
            A, C = eye, random_norm_scale(hw, attn.rot, c.rope_layout, gen, spread)
        elif attn.rot:  # the layer's own rotary width (none on a layer without RoPE)
            A = random_commuting(c.n_kv_head, c.d_head, attn.rot, c.rope_layout, gen, spread)
        else:
            A = _random_invertible(c.n_kv_head, c.d_head, gen, spread)
        S = _random_invertible(c.n_kv_head, c.d_head, gen, spread)
        attn.load_heads(gauge(hw, A, S, C=C))
    return model


def _pairs(W_K: torch.Tensor, rot: int, layout: str) -> torch.Tensor:
    """(G, d, r) key maps -> (G, rot/2, d) complex: pair k's column first_k + i second_k."""
    first, second = pair_dims(rot, layout)
    return torch.complex(W_K[:, :, first], W_K[:, :, second]).transpose(1, 2)


def _out_map(hw: HeadWeights) -> torch.Tensor:
    """(G, g d, r): each group's output maps side by side, transposed."""
    return hw.W_O.mT.reshape(hw.n_kv_head, hw.group * hw.W_O.shape[2], hw.W_O.shape[1])


def select_blocks(hw: HeadWeights, rot: int, layout: str, block: str) -> dict[str, torch.Tensor]:
    """The fixed entries: {'rot': (G, rot/2) pivot rows, 'pass': (G, r - rot) rows, 'out': (G, r) columns of the
    group's r x (g d) output map}. "pivoted": the largest-modulus row per pair, column-pivoted QR for the blocks;
    "aligned": default_blocks (coordinates near the group's own, whatever their conditioning). Under a query/key
    norm, {'knorm': (rows of g_K, rot/2 + r - rot) the key gain's dims fixed to 1 (pivoted: the one of larger
    modulus in each pair; aligned: the first), then every pass dim, 'out': as above}."""
    G, d, r = hw.W_K.shape
    rows = 0 if hw.g_K is None else hw.g_K.shape[0]
    aligned = default_blocks(G, hw.group, d, r, rot, rows, layout)
    if block == "aligned":
        return {k: v for k, v in aligned.items() if k in ("knorm", "out")} if rows else aligned
    if block != "pivoted":
        raise ValueError(f"unknown block {block!r}; choose one of {', '.join(BLOCKS)}")
    W_O_T = _out_map(hw)
    out = torch.tensor([pivoted_rows(W_O_T[j]) for j in range(G)], dtype=torch.long)
    if rows:
        first, second = pair_dims(rot, layout)
        larger = torch.where(hw.g_K[:, second].abs() > hw.g_K[:, first].abs(), second, first)
        return {"knorm": torch.cat([larger, aligned["knorm"][:, rot // 2:]], dim=1), "out": out}
    return {"rot": _pairs(hw.W_K, rot, layout).abs().argmax(-1) if rot else torch.zeros(G, 0, dtype=torch.long),
            "pass": torch.tensor([pivoted_rows(hw.W_K[j, :, rot:]) for j in range(G)], dtype=torch.long).reshape(
                G, r - rot),
            "out": out}


def _fixed(hw: HeadWeights, rot: int, blocks: dict) -> dict[str, torch.Tensor]:
    """{'key': (G, r - rot, r - rot) the pass rows of W_K, 'output': (G, r, r) the chosen rows of each group's
    transposed output map}: the blocks canonical fixes to the identity."""
    G = hw.n_kv_head
    W_O_T = _out_map(hw)
    out = {"output": torch.stack([W_O_T[j, blocks["out"][j]] for j in range(G)])}
    if "pass" in blocks:
        out["key"] = torch.stack([hw.W_K[j, blocks["pass"][j], rot:] for j in range(G)])
    return out


def conditioning(hw: HeadWeights, rot: int, layout: str, blocks: dict) -> dict[str, torch.Tensor]:
    """Per group: 'rotary': the smallest pivot ratio |c_p| / ||c|| over its pairs (1: one row carries the pair,
    small: the division by c_p magnifies the rest); 'pass' and 'output': the fixed blocks' condition numbers (under a
    query/key norm 'output' only: W_K has no fixed block)."""
    out = {}
    if rot and "rot" in blocks:
        c = _pairs(hw.W_K, rot, layout)  # (G, rot/2, d)
        pivot = torch.gather(c.abs(), 2, blocks["rot"].unsqueeze(-1)).squeeze(-1)
        out["rotary"] = (pivot / torch.linalg.vector_norm(c, dim=-1)).min(-1).values
    fixed = _fixed(hw, rot, blocks)
    if "key" in fixed and hw.W_K.shape[2] > rot:
        out["pass"] = torch.linalg.cond(fixed["key"])
    out["output"] = torch.linalg.cond(fixed["output"])
    return out


def _check_block(layer: int, what: str, M: torch.Tensor, rows: torch.Tensor, block: str, group: int) -> None:
    for j, c in enumerate(torch.linalg.cond(M).tolist()):
        if not c < SINGULAR_COND:
            hint = ("use block='pivoted' (--block pivoted) to choose better-conditioned rows"
                    if block == "aligned" else f"this {'head' if group == 1 else 'group'} has rank < r and has no "
                    "canonical form")
            raise SingularBlockError(
                f"layer {layer} {'head' if group == 1 else 'group'} {j}: the {what} block {rows[j].tolist()[:8]}... "
                f"is singular ({f'condition number {c:.3g}' if math.isfinite(c) else 'not invertible at all'}); {hint}")


def canonical_gauge(hw: HeadWeights, rot: int, layout: str, blocks: dict, layer: int = 0, block: str = "pivoted",
                    halves: str = "both") -> tuple[torch.Tensor, ...]:
    """(A, A^{-T}, S, S^{-1}), each (G, r, r), that make the chosen entries of the canonical halves (1, 0) / the
    identity (the identity for a half kept standard)."""
    G, d, r = hw.W_K.shape
    eye = torch.eye(r, dtype=torch.float64).expand(G, r, r)
    A, A_inv_T, S, S_inv = eye, eye, eye, eye
    fixed = _fixed(hw, rot, blocks)
    if halves in ("both", "qk") and hw.g_K is None:
        if r > rot:
            _check_block(layer, "key", fixed["key"], blocks["pass"], block, hw.group)
        if rot:
            pivot = torch.gather(_pairs(hw.W_K, rot, layout), 2, blocks["rot"].unsqueeze(-1)).squeeze(-1)
            if bool((pivot == 0).any()):
                raise SingularBlockError(f"layer {layer}: a rotary pair's pivot entry of W_K is 0; use "
                                         "block='pivoted'")
            # key pair columns times w = 1 / c_p makes the pivot 1 + 0i; A^{-T} is that complex scalar, so A's is
            # conj(c_p)
            A = complex_scalars(pivot.conj(), r, rot, layout)
            if r > rot:
                A[:, rot:, rot:] = fixed["key"].mT  # W_K_pass A_pass^{-T} = W_K_pass B^{-1}: the rows become I
            A_inv_T = torch.linalg.inv(A).mT
        else:
            A, A_inv_T = fixed["key"].mT, torch.linalg.inv(fixed["key"])
    if halves in ("both", "vo"):
        _check_block(layer, "output", fixed["output"], blocks["out"], block, hw.group)
        S = fixed["output"].mT  # (G, r, r): the chosen columns
        S_inv = torch.linalg.inv(S)
    return A, A_inv_T, S, S_inv


def canonical_norm_scale(hw: HeadWeights, rot: int, layout: str, blocks: dict, layer: int = 0) -> torch.Tensor:
    """C (rows of g_K, r) with g_K / C equal to 1 on the fixed dims blocks['knorm'] (each pair's C its fixed dim's
    gain, each pass dim's its own)."""
    fixed = torch.gather(hw.g_K, 1, blocks["knorm"])  # (rows, rot/2 + r - rot)
    if bool((fixed == 0).any()):
        raise SingularBlockError(f"layer {layer}: a fixed entry of the key norm's gain is 0; this layer has no "
                                 "canonical form with it (use block='pivoted')")
    return pair_constant(fixed, rot, layout)


@torch.no_grad()
def fold_biases(hw: HeadWeights, rot: int) -> HeadWeights:
    """The same heads without b_K on the pass dims (softmax ignores the constant q . b_K it adds there to a query's
    scores; on the first `rot`, rotary, dims it depends on the key's position and stays) and without b_V
    (attention rows sum to one, so it adds b_V W_O: moved into b_O)."""
    if hw.b_Q is None:
        return hw
    b_O = hw.b_O + torch.einsum("hr,hrd->d", hw.per_query_head("b_V"), hw.W_O)
    b_K = torch.cat([hw.b_K[:, :rot], torch.zeros_like(hw.b_K[:, rot:])], dim=1)
    return HeadWeights(W_Q=hw.W_Q, W_K=hw.W_K, W_V=hw.W_V, W_O=hw.W_O, b_Q=hw.b_Q, b_K=b_K,
                       b_V=torch.zeros_like(hw.b_V), b_O=b_O)


@torch.no_grad()
def canonicalize_layer(src, dst, c, block: str = "aligned", layer: int = 0) -> dict[str, torch.Tensor]:
    """One layer's canonical form: `dst` (a canonical attention layer of config `c`: its halves and minimal_bias
    say what is fixed) gets the function of `src` (any variant), the algebra in float64 (what `canonicalize` does
    for every layer; a streaming conversion calls it one layer at a time). Returns the blocks it fixed."""
    hw = src.to_heads().to(torch.float64)
    rot = dst.rot  # the layer's own (c.layer(layer)'s): 0 on a layer without RoPE
    blocks = select_blocks(hw, rot, c.rope_layout, block)
    A, A_inv_T, S, S_inv = canonical_gauge(hw, rot, c.rope_layout, blocks, layer, block, c.canonical_halves)
    C = canonical_norm_scale(hw, rot, c.rope_layout, blocks, layer) \
        if hw.g_K is not None and c.canonical_halves in ("both", "qk") else None
    dst.set_blocks(blocks)
    hw = gauge(hw, A, S, A_inv_T, S_inv, C)
    dst.load_heads(fold_biases(hw, rot) if c.minimal_bias else hw)
    return blocks


@torch.no_grad()
def canonicalize(model, block: str = "aligned", halves: str = "both", minimal: bool = False):
    """Return an equivalent `canonical` model whose fixed entries are exactly (1, 0) / the identity.
    minimal=True also folds b_V into b_O and drops b_K on the pass dims (model.minimal_bias): the fully reduced
    form, where the model has both biases and no query/key norm (its b_K is inside the key norm)."""
    c = model.config
    minimal = minimal and c.qkv_bias and c.o_bias and not c.qk_norm  # under a query/key norm b_K is not redundant
    cfg = c.replace(attention="canonical", canonical_halves=halves, init=c.standard_init,
                    minimal_bias=minimal)
    out = type(model)(cfg).to(_model_dtype(model))
    out.train(model.training)
    return canonicalize_into(model, out, block)


@torch.no_grad()
def canonicalize_into(model, out, block: str = "aligned"):
    """Fill `out` (a canonical model of the same shape: its config says which halves and whether the biases
    are minimal) with the canonical form of `model`; returns `out`."""
    _copy_non_attention(model, out)
    for layer, (src, dst) in enumerate(zip(model.attention_layers, out.attention_layers)):
        canonicalize_layer(src, dst, out.config, block, layer)
    return out


@torch.no_grad()
def expand(model):
    """Return the equivalent `standard` model (exact: the products are formed, no solve)."""
    c = model.config
    cfg = c.replace(attention="standard", canonical_halves="both", init=c.standard_init,
                    minimal_bias=False)
    out = type(model)(cfg).to(_model_dtype(model))
    out.train(model.training)
    return load_into(model, out)


@torch.no_grad()
def load_into(model, out):
    """Fill `out` (a model of `model`'s shape whose variant can hold its heads) with `model`'s function: the
    other weights copied, each attention layer moved by to_heads / load_heads; returns `out`."""
    _copy_non_attention(model, out)
    for src, dst in zip(model.attention_layers, out.attention_layers):
        dst.load_heads(src.to_heads())
    return out
