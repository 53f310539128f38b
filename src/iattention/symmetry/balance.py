"""Balancedness: the quantities gradient flow conserves along the symmetry.

For a product A B^T trained by gradient flow without weight decay, A^T A - B^T B is constant in
time. With biases the maps act on [x, 1], so we use the bias-augmented matrices
W~_Q = [W_Q; b_Q] etc. Per KV group j (a head, where each has its own keys), whose g query heads h share
its key and value maps (and so its gauge A_j, S_j), we report
    qk = || P( sum_h W~_Q[h]^T W~_Q[h] - W~_K[j]^T W~_K[j] ) ||_F,
    vo = || W~_V[j]^T W~_V[j] - sum_h W_O[h] W_O[h]^T ||_F.
P keeps what the gauge can move: all of it without rotary dims; with them A_j commutes with RoPE (a complex
scalar per rotary pair, any matrix on the pass dims), so only the pass dims' block and each rotary pair's mean
diagonal entry are conserved (the rest is what RoPE's positions act on). A change of these during training
shows how far the optimizer (weight decay, Adam's preconditioning, finite steps) moved the weights along the
symmetry orbit.
"""

from __future__ import annotations

import torch

from iattention.attention.rope import pair_dims


def _augment(W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return W if b is None else torch.cat([W, b.unsqueeze(1)], dim=1)


def _conserved_norm(M: torch.Tensor, rot: int, layout: str) -> torch.Tensor:
    """|| P(M) ||_F per group of M (G, r, r) symmetric: the pass block's entries, and each rotary pair's
    mean diagonal on both its dims."""
    first, second = pair_dims(rot, layout)
    pairs = (M[:, first, first] + M[:, second, second]) / 2  # (G, rot/2); a pair's rotation part is 0 (M = M^T)
    return (2 * pairs.square().sum(-1) + M[:, rot:, rot:].square().sum((-2, -1))).sqrt()


@torch.no_grad()
def balancedness(model) -> dict[str, torch.Tensor]:
    """{'qk': (n_layer, n_kv_head), 'vo': (n_layer, n_kv_head)} Frobenius norms, float64."""
    c = model.config
    qk, vo = [], []
    for attn in model.attention_layers:
        hw = attn.to_heads().to(torch.float64)
        G, r = hw.n_kv_head, hw.W_K.shape[2]
        Q, K, V = _augment(hw.W_Q, hw.b_Q), _augment(hw.W_K, hw.b_K), _augment(hw.W_V, hw.b_V)
        QQ, OO = ((m @ m.mT).reshape(G, -1, r, r).sum(1) for m in (Q.mT, hw.W_O))  # each group's heads summed
        qk.append(_conserved_norm(QQ - K.mT @ K, attn.rot, c.rope_layout))
        vo.append(torch.linalg.matrix_norm(V.mT @ V - OO))
    return {"qk": torch.stack(qk), "vo": torch.stack(vo)}
