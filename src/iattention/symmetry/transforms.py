"""Exact moves along the attention symmetry: random gauge, canonicalize, expand.

Scores depend on W_Q W_K^T and the output on W_V W_O, so for invertible R, S (r x r):
    W_Q -> W_Q R,   b_Q -> b_Q R,   W_K -> W_K R^{-T},  b_K -> b_K R^{-T}
    W_V -> W_V S,   b_V -> b_V S,   W_O -> S^{-1} W_O
leave every head's function unchanged. Canonicalizing picks R^{-T} = B^{-1} with B = W_K[rows]
(so W_K[rows] becomes I) and S = C with C = W_O[:, cols] (so W_O[:, cols] becomes I).
All algebra is done in float64 and cast back to the model's dtype.

These tools take a model only for its `config`, its `attention_layers` (each with `to_heads` /
`load_heads`) and its state dict; a new model is built as `type(model)(config)`. So `symmetry/` sits
below `model/` (whose matched init uses `canonicalize_into`) and never imports the model class.
"""

from __future__ import annotations

import math

import torch

from iattention.attention.heads import HeadWeights
from iattention.errors import SingularBlockError
from iattention.symmetry.blocks import condition_numbers, select_blocks

SINGULAR_COND = 1e12


def _model_dtype(model) -> torch.dtype:
    return model.transformer.wte.weight.dtype


def _copy_non_attention(src, dst) -> None:
    state = {k: v for k, v in src.state_dict().items() if ".attn." not in k}
    missing, unexpected = dst.load_state_dict(state, strict=False)
    assert not unexpected and all(".attn." in k for k in missing), (missing, unexpected)


def _gauge(hw: HeadWeights, R: torch.Tensor, R_inv_T: torch.Tensor, S: torch.Tensor, S_inv: torch.Tensor
           ) -> HeadWeights:
    """Apply per-head R (QK half) and S (VO half); all matrices are (H, r, r)."""
    out = HeadWeights(W_Q=hw.W_Q @ R, W_K=hw.W_K @ R_inv_T, W_V=hw.W_V @ S, W_O=S_inv @ hw.W_O, b_O=hw.b_O)
    if hw.b_Q is not None:
        out.b_Q = (hw.b_Q.unsqueeze(1) @ R).squeeze(1)
        out.b_K = (hw.b_K.unsqueeze(1) @ R_inv_T).squeeze(1)
        out.b_V = (hw.b_V.unsqueeze(1) @ S).squeeze(1)
    return out


def _random_invertible(H: int, r: int, gen: torch.Generator, spread: float) -> torch.Tensor:
    """U diag(s) V with Haar-ish orthogonal U, V and singular values in [1/spread, spread]."""
    U = torch.linalg.qr(torch.randn(H, r, r, generator=gen, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(H, r, r, generator=gen, dtype=torch.float64))[0]
    s = torch.exp((torch.rand(H, r, generator=gen, dtype=torch.float64) * 2 - 1) * torch.log(torch.tensor(spread)))
    return U @ torch.diag_embed(s) @ V


@torch.no_grad()
def random_gauge(model, seed: int = 0, spread: float = 2.0):
    """Apply a random invertible R per head to (W_Q, W_K) and S to (W_V, W_O), in place."""
    if model.config.attention != "standard":
        raise ValueError("random_gauge needs a standard-attention model; expand() it first")
    gen = torch.Generator().manual_seed(seed)
    H, r = model.config.n_head, model.config.d_head
    for attn in model.attention_layers:
        R, S = _random_invertible(H, r, gen, spread), _random_invertible(H, r, gen, spread)
        hw = attn.to_heads().to(torch.float64)
        attn.load_heads(_gauge(hw, R, torch.linalg.inv(R).mT, S, torch.linalg.inv(S)))
    return model


def _check_blocks(layer: int, what: str, W: torch.Tensor, rows: torch.Tensor, block: str) -> None:
    conds = condition_numbers(W, rows)
    for h, c in enumerate(conds):
        if not c < SINGULAR_COND:
            hint = ("use block='pivoted' (--block pivoted) to choose better-conditioned rows"
                    if block == "aligned" else "this head has rank < r and has no canonical form")
            raise SingularBlockError(
                f"layer {layer} head {h}: the {what} block {rows[h].tolist()[:8]}... is singular "
                f"({f'condition number {c:.3g}' if math.isfinite(c) else 'not invertible at all'}); {hint}"
            )


@torch.no_grad()
def fold_biases(hw: HeadWeights) -> HeadWeights:
    """The same heads without b_K (softmax ignores the constant q . b_K it adds to a query's scores)
    and without b_V (attention rows sum to one, so it adds b_V W_O: moved into b_O)."""
    if hw.b_Q is None:
        return hw
    b_O = hw.b_O + torch.einsum("hr,hrd->d", hw.b_V, hw.W_O)
    return HeadWeights(W_Q=hw.W_Q, W_K=hw.W_K, W_V=hw.W_V, W_O=hw.W_O, b_Q=hw.b_Q, b_K=torch.zeros_like(hw.b_K),
                       b_V=torch.zeros_like(hw.b_V), b_O=b_O)


@torch.no_grad()
def canonicalize(model, block: str = "aligned", halves: str = "both", minimal: bool = False):
    """Return an equivalent `canonical` model whose fixed blocks are exactly the identity.
    minimal=True also folds b_V into b_O and drops b_K (model.minimal_bias): the fully reduced form."""
    minimal = minimal and model.config.bias
    cfg = model.config.replace(attention="canonical", canonical_halves=halves, init="gpt2", minimal_bias=minimal)
    out = type(model)(cfg).to(_model_dtype(model))
    out.train(model.training)
    return canonicalize_into(model, out, block)


@torch.no_grad()
def canonicalize_into(model, out, block: str = "aligned"):
    """Fill `out` (a canonical model of the same shape: its config says which halves and whether the biases
    are minimal) with the canonical form of `model`; returns `out`."""
    minimal = out.config.minimal_bias
    _copy_non_attention(model, out)
    H, r = out.config.n_head, out.config.d_head
    eye = torch.eye(r, dtype=torch.float64).expand(H, r, r)
    for layer, (src, dst) in enumerate(zip(model.attention_layers, out.attention_layers)):
        hw = src.to_heads().to(torch.float64)
        k_rows, o_cols = select_blocks(hw.W_K, hw.W_O, block)
        R, R_inv_T, S, S_inv = eye, eye, eye, eye
        if dst.canonical_qk:
            _check_blocks(layer, "key", hw.W_K, k_rows, block)
            Bk = torch.stack([hw.W_K[h][k_rows[h]] for h in range(H)])  # (H, r, r)
            R_inv_T, R = torch.linalg.inv(Bk), Bk.mT
        if dst.canonical_vo:
            W_O_T = hw.W_O.mT
            _check_blocks(layer, "output", W_O_T, o_cols, block)
            C = torch.stack([W_O_T[h][o_cols[h]] for h in range(H)]).mT  # W_O[:, cols], (H, r, r)
            S, S_inv = C, torch.linalg.inv(C)
        dst.set_blocks(k_rows, o_cols)
        hw = _gauge(hw, R, R_inv_T, S, S_inv)
        dst.load_heads(fold_biases(hw) if minimal else hw)
    return out


@torch.no_grad()
def expand(model):
    """Return the equivalent `standard` model (exact: the products are formed, no solve)."""
    dtype = _model_dtype(model)
    cfg = model.config.replace(attention="standard", canonical_halves="both", init="gpt2", minimal_bias=False)
    out = type(model)(cfg).to(dtype)
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
