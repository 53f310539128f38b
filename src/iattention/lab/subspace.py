"""Subspace selection: with orthonormal, mutually orthogonal bases A (d x m) and B (d x p),
M = A A^T projects onto span(A), so M (v_a + v_b) = v_a exactly.

If B is tilted towards A, M v_b = A A^T v_b != 0 and the error is exactly ||A^T v_b||, which grows
like sin(theta) for a tilt angle theta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from iattention.lab.common import DTYPE, orthonormal


@dataclass
class SubspaceResult:
    d: int
    m: int
    p: int
    orthogonal_error: float  # max over trials of ||M (v_a + v_b) - v_a||, orthogonal subspaces
    angles: list[float]  # tilt angle theta in radians
    tilted_error: list[float]  # measured ||M (v_a + v_b) - v_a||
    tilted_predicted: list[float]  # ||A^T v_b||


def run_subspace(d: int = 64, m: int = 8, p: int = 8, trials: int = 200, seed: int = 0,
                 angles=None) -> SubspaceResult:
    gen = torch.Generator().manual_seed(seed)
    angles = list(angles if angles is not None else [i * math.pi / 40 for i in range(21)])
    worst = 0.0
    for _ in range(trials):
        basis = orthonormal(d, m + p, gen)
        A, B = basis[:, :m], basis[:, m:]
        v_a = A @ torch.randn(m, generator=gen, dtype=DTYPE)
        v_b = B @ torch.randn(p, generator=gen, dtype=DTYPE)
        worst = max(worst, ((A @ A.T) @ (v_a + v_b) - v_a).norm().item())
    basis = orthonormal(d, m + p, gen)
    A, B = basis[:, :m], basis[:, m:]
    a = torch.randn(m, generator=gen, dtype=DTYPE)
    b = torch.randn(p, generator=gen, dtype=DTYPE)
    measured, predicted = [], []
    for theta in angles:
        # rotate B's first min(m, p) directions towards A's by theta: B' = cos(theta) B + sin(theta) A[:, :p]
        k = min(m, p)
        Bt = B.clone()
        Bt[:, :k] = math.cos(theta) * B[:, :k] + math.sin(theta) * A[:, :k]
        v_a, v_b = A @ a, Bt @ b
        measured.append(((A @ A.T) @ (v_a + v_b) - v_a).norm().item())
        predicted.append((A.T @ v_b).norm().item())
    return SubspaceResult(d, m, p, worst, angles, measured, predicted)
