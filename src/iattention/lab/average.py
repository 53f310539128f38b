"""Averaging: orthonormal keys, q = beta (k_a + k_b) gives scores beta, beta, 0, ..., 0, so

alpha_a = alpha_b = e^beta / (2 e^beta + n - 2), and with m = (v_a + v_b) / 2,
c - m = (n - 2) / (2 e^beta + n - 2) * (mean of the other values - m),
||c - m|| <= (n - 2) / (2 e^beta + n - 2) * max_{i != a,b} ||v_i - m||.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from iattention.lab.common import DTYPE, attend, orthonormal


@dataclass
class AverageResult:
    n: int
    betas: list[float]
    alpha_a_measured: list[float]
    alpha_a_predicted: list[float]
    error: list[float]  # ||c - (v_a + v_b)/2||
    error_exact: list[float]  # (n-2)/(2e^b+n-2) ||mean_others - m||
    bound: list[float]
    max_abs_alpha_error: float


def run_average(n: int = 32, d: int = 32, d_v: int = 16, betas=None, seed: int = 0) -> AverageResult:
    gen = torch.Generator().manual_seed(seed)
    betas = list(betas if betas is not None else [0.5 * i for i in range(31)])
    K = orthonormal(d, n, gen).T  # n orthonormal keys (rows)
    V = torch.randn(n, d_v, generator=gen, dtype=DTYPE)
    a, b = 0, 1
    m = 0.5 * (V[a] + V[b])
    others = V[2:]
    out = AverageResult(n, betas, [], [], [], [], [], 0.0)
    for beta in betas:
        alpha, c = attend(K, beta * (K[a] + K[b]), V)
        w = (n - 2) / (2 * math.exp(beta) + n - 2)
        out.alpha_a_measured.append(alpha[a].item())
        out.alpha_a_predicted.append(math.exp(beta) / (2 * math.exp(beta) + n - 2))
        out.error.append((c - m).norm().item())
        out.error_exact.append(w * (others.mean(0) - m).norm().item())
        out.bound.append(w * (others - m).norm(dim=1).max().item())
    out.max_abs_alpha_error = max(abs(x - y) for x, y in zip(out.alpha_a_measured, out.alpha_a_predicted))
    return out
