"""Copying: alpha_j -> 1 when score j beats every other score i by a margin Delta_i.

alpha_j = e^{s_j} / sum_i e^{s_i} = 1 / (1 + sum_{i != j} e^{-Delta_i})  with Delta_i = s_j - s_i, and
||c - v_j|| = ||sum_{i != j} alpha_i (v_i - v_j)|| <= (1 - alpha_j) max_i ||v_i - v_j||.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from iattention.lab.common import DTYPE, attend, orthonormal


@dataclass
class CopyResult:
    deltas: list[float]
    ns: list[int]
    alpha_measured: dict[int, list[float]] = field(default_factory=dict)  # n -> per delta
    alpha_predicted: dict[int, list[float]] = field(default_factory=dict)
    copy_error: dict[int, list[float]] = field(default_factory=dict)  # ||c - v_j||
    copy_bound: dict[int, list[float]] = field(default_factory=dict)  # (1 - alpha_j) max ||v_i - v_j||
    max_abs_alpha_error: float = 0.0  # over everything, uneven margins included
    bound_holds: bool = True


def run_copy(deltas=None, ns=(2, 8, 64, 512), d_v: int = 16, seed: int = 0) -> CopyResult:
    deltas = list(deltas if deltas is not None else [0.5 * i for i in range(25)])
    gen = torch.Generator().manual_seed(seed)
    res = CopyResult(deltas=deltas, ns=list(ns))
    worst = 0.0
    for n in ns:
        Q = orthonormal(n, n, gen)  # keys: rows of an orthogonal matrix; q = K^T s gives scores K q = s
        V = torch.randn(n, d_v, generator=gen, dtype=DTYPE)
        j = 0
        spread = (V - V[j]).norm(dim=1).max().item()
        for key in ("alpha_measured", "alpha_predicted", "copy_error", "copy_bound"):
            getattr(res, key)[n] = []
        for delta in deltas:
            for uneven in (False, True):
                margins = torch.full((n,), float(delta), dtype=DTYPE)
                if uneven:  # Delta_i = Delta + U[0, 2): the formula must hold margin by margin
                    margins += 2 * torch.rand(n, generator=gen, dtype=DTYPE)
                margins[j] = 0.0
                s = float(delta) + 3.0 - margins  # s_j - s_i = Delta_i
                alpha, c = attend(Q, Q.T @ s, V)
                predicted = 1.0 / (1.0 + torch.exp(-margins[torch.arange(n) != j]).sum()).item()
                worst = max(worst, abs(alpha[j].item() - predicted))
                err = (c - V[j]).norm().item()
                bound = (1 - alpha[j].item()) * spread
                res.bound_holds &= err <= bound + 1e-12
                if not uneven:
                    res.alpha_measured[n].append(alpha[j].item())
                    res.alpha_predicted[n].append(predicted)
                    res.copy_error[n].append(err)
                    res.copy_bound[n].append(bound)
    res.max_abs_alpha_error = worst
    return res
