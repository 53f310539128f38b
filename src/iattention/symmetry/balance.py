"""Balancedness: the quantities gradient flow conserves along the symmetry.

For a product A B^T trained by gradient flow without weight decay, A^T A - B^T B is constant in
time. With biases the maps act on [x, 1], so we use the bias-augmented matrices
W~_Q = [W_Q; b_Q] etc. Per head we report
    qk = || W~_Q^T W~_Q - W~_K^T W~_K ||_F,   vo = || W~_V^T W~_V - W_O W_O^T ||_F.
A change of these during training shows how far the optimizer (weight decay, Adam's
preconditioning, finite steps) moved the weights along the symmetry orbit.
"""

from __future__ import annotations

import torch


def _augment(W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return W if b is None else torch.cat([W, b.unsqueeze(1)], dim=1)


@torch.no_grad()
def balancedness(model) -> dict[str, torch.Tensor]:
    """{'qk': (n_layer, n_head), 'vo': (n_layer, n_head)} Frobenius norms, float64."""
    qk, vo = [], []
    for attn in model.attention_layers:
        hw = attn.to_heads().to(torch.float64)
        Q, K, V = _augment(hw.W_Q, hw.b_Q), _augment(hw.W_K, hw.b_K), _augment(hw.W_V, hw.b_V)
        qk.append(torch.linalg.matrix_norm(Q.mT @ Q - K.mT @ K))
        vo.append(torch.linalg.matrix_norm(V.mT @ V - hw.W_O @ hw.W_O.mT))
    return {"qk": torch.stack(qk), "vo": torch.stack(vo)}
