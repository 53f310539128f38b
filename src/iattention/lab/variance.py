"""Why several heads help: one head that must average two values, vs two heads that each copy one.

Keys k_i = mu_i + z_i with orthonormal means mu_i and z_i ~ N(0, eps I), except
z_a ~ N(0, eps I + s2 mu_a mu_a^T) (k_a's norm along mu_a fluctuates, s2 = 1/2 by default).

Single head, q = beta (mu_a + mu_b): s_a - s_b = beta (mu_a + mu_b).(z_a - z_b) ~ N(0, beta^2 (s2 + 4 eps)).
With the other scores near 0 and e^beta >> n, alpha_a ~= sigmoid(s_a - s_b) and
c ~= alpha_a v_a + (1 - alpha_a) v_b, so  Var(c) := E||c - E c||^2 ~= Var(alpha_a) ||v_a - v_b||^2,
which tends to ||v_a - v_b||^2 / 4 as beta grows: c swings between v_a and v_b.

Two heads averaged, q_1 = beta mu_a, q_2 = beta mu_b: head 1 scores k_a with beta (1 + mu_a.z_a) and the
rest with beta mu_a.z_i ~ N(0, beta^2 eps), so it copies v_a whenever k_a^T q_1 = beta(1 + mu_a.z_a) >> 0,
and head 2 copies v_b. c ~= (v_a + v_b) / 2. What variance remains comes from samples where k_a^T q_1 is
positive but not above the noise of the other scores (1 + mu_a.z_a of the order of sqrt(eps)): it shrinks
with eps and s2, and does not vanish with beta alone (the other scores grow with beta too).
If instead both heads use the single-head query, they compute the same c: averaging them cannot remove a
variance both share (ratio exactly 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from iattention.lab.common import DTYPE, attend, orthonormal


@dataclass
class VarianceSetting:
    beta: float = 20.0
    eps: float = 0.01
    s2: float = 0.5  # variance of k_a along mu_a ("norm scale")
    n: int = 16
    d: int = 16
    samples: int = 20000
    seed: int = 0


@dataclass
class VarianceStats:
    var_all: float  # E||c - E c||^2 over every sample
    var_pos: float  # the same, over samples with k_a^T q > 0 (head 1's query for multi-head)
    frac_pos: float  # fraction of samples with k_a^T q > 0
    mean_alpha_a: float
    var_alpha_a: float


@dataclass
class SingleHeadResult:
    setting: VarianceSetting
    stats: VarianceStats
    predicted_var: float  # Var(sigmoid(D)) ||v_a - v_b||^2, D ~ N(0, beta^2 (s2 + 4 eps))
    alpha_a_hist: list[float] = field(default_factory=list)  # a subsample, for the figure


@dataclass
class MultiHeadResult:
    setting: VarianceSetting
    single: VarianceStats
    multi: VarianceStats  # q_1 = beta mu_a, q_2 = beta mu_b, outputs averaged
    identical: VarianceStats  # both heads use q = beta (mu_a + mu_b)
    reduction_pos: float  # single.var_pos / multi.var_pos
    reduction_all: float
    identical_ratio: float  # identical.var_all / single.var_all (no reduction: 1)


@dataclass
class MultiHeadSweep:
    default: MultiHeadResult
    sweeps: dict[str, list[MultiHeadResult]]  # parameter name -> results along its grid


def _sample(st: VarianceSetting):
    gen = torch.Generator().manual_seed(st.seed)
    mu = orthonormal(st.d, st.n, gen).T  # (n, d) orthonormal means
    V = orthonormal(st.n, st.n, gen).T  # orthonormal values: ||v_a - v_b||^2 = 2
    z = torch.randn(st.samples, st.n, st.d, generator=gen, dtype=DTYPE) * st.eps**0.5
    g = torch.randn(st.samples, generator=gen, dtype=DTYPE) * st.s2**0.5
    z[:, 0] += g[:, None] * mu[0]  # a = 0 gets the extra variance along mu_a
    return mu, V, mu + z


def _stats(c: torch.Tensor, alpha_a: torch.Tensor, pos: torch.Tensor) -> VarianceStats:
    def var(x):
        return float(((x - x.mean(0)) ** 2).sum(-1).mean()) if len(x) else float("nan")

    return VarianceStats(var(c), var(c[pos]), float(pos.double().mean()), float(alpha_a.mean()),
                         float(alpha_a.var()))


def predicted_single_var(st: VarianceSetting, dist2: float = 2.0) -> float:
    """Var(sigmoid(D)) * ||v_a - v_b||^2 with D ~ N(0, beta^2 (s2 + 4 eps)), by Gauss-Hermite quadrature."""
    x, w = np.polynomial.hermite_e.hermegauss(201)
    w = w / w.sum()
    sd = st.beta * (st.s2 + 4 * st.eps) ** 0.5
    sig = 1.0 / (1.0 + np.exp(-sd * x))
    return float(((sig**2 * w).sum() - (sig * w).sum() ** 2) * dist2)


def run_single_head(st: VarianceSetting | None = None) -> SingleHeadResult:
    st = st or VarianceSetting()
    mu, V, K = _sample(st)
    q = st.beta * (mu[0] + mu[1])
    alpha, c = attend(K, q.expand(st.samples, -1), V.expand(st.samples, -1, -1))
    pos = (K[:, 0] @ q) > 0
    return SingleHeadResult(st, _stats(c, alpha[:, 0], pos), predicted_single_var(st),
                            alpha[:2000, 0].tolist())


def run_multi_head(st: VarianceSetting | None = None) -> MultiHeadResult:
    st = st or VarianceSetting()
    mu, V, K = _sample(st)
    Vb = V.expand(st.samples, -1, -1)
    q = st.beta * (mu[0] + mu[1])
    alpha_s, c_single = attend(K, q.expand(st.samples, -1), Vb)
    alpha_1, c1 = attend(K, (st.beta * mu[0]).expand(st.samples, -1), Vb)
    _, c2 = attend(K, (st.beta * mu[1]).expand(st.samples, -1), Vb)
    c_multi = 0.5 * (c1 + c2)
    c_identical = 0.5 * (c_single + c_single)
    pos_single = (K[:, 0] @ q) > 0
    pos_multi = (K[:, 0] @ (st.beta * mu[0])) > 0
    single = _stats(c_single, alpha_s[:, 0], pos_single)
    multi = _stats(c_multi, alpha_1[:, 0], pos_multi)
    identical = _stats(c_identical, alpha_s[:, 0], pos_single)
    return MultiHeadResult(st, single, multi, identical, single.var_pos / multi.var_pos,
                           single.var_all / multi.var_all, identical.var_all / single.var_all)


SWEEPS = {"beta": [2.0, 5.0, 10.0, 20.0, 40.0], "eps": [0.001, 0.003, 0.01, 0.03, 0.1],
          "s2": [0.05, 0.1, 0.25, 0.5, 1.0]}


def run_multi_head_sweep(base: VarianceSetting | None = None, samples: int = 5000) -> MultiHeadSweep:
    base = base or VarianceSetting()
    sweeps = {}
    for name, grid in SWEEPS.items():
        sweeps[name] = [run_multi_head(VarianceSetting(**{**base.__dict__, name: v, "samples": samples}))
                        for v in grid]
    return MultiHeadSweep(run_multi_head(base), sweeps)
