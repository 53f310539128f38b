"""One figure per lab experiment (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from iattention.utils.atomic import write_with  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def plot_copy(r, path):
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for n in r.ns:
        a.plot(r.deltas, r.alpha_measured[n], "o", ms=4, label=f"measured, n={n}")
        a.plot(r.deltas, r.alpha_predicted[n], "-", lw=1, color=a.lines[-1].get_color())
        b.semilogy(r.deltas, r.copy_error[n], "o", ms=4, label=f"n={n}")
        b.semilogy(r.deltas, r.copy_bound[n], "--", lw=1, color=b.lines[-1].get_color())
    a.set(title="Copying: attention weight on the winning key", xlabel="score margin Δ (nats)",
          ylabel=r"$\alpha_j$  (dots: softmax, lines: $1/(1+\sum_i e^{-\Delta_i})$)")
    b.set(title="Copy error ‖c − v_j‖ (dashed: (1−α_j)·max‖v_i−v_j‖)", xlabel="score margin Δ (nats)",
          ylabel="‖c − v_j‖")
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    return _save(fig, path)


def plot_subspace(r, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    deg = [t * 180 / 3.141592653589793 for t in r.angles]
    ax.plot(deg, r.tilted_error, "o", label="measured ‖M(v_a+v_b) − v_a‖")
    ax.plot(deg, r.tilted_predicted, "-", label="predicted ‖Aᵀ v_b‖")
    ax.axhline(max(r.orthogonal_error, 1e-17), color="gray", ls=":",
               label=f"orthogonal subspaces: {r.orthogonal_error:.1e}")
    ax.set(title=f"Subspace selection with M = AAᵀ (d={r.d}, m={r.m}, p={r.p})",
           xlabel="tilt of span(B) towards span(A) (degrees)", ylabel="error (Euclidean norm)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_average(r, path):
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(r.betas, r.alpha_a_measured, "o", ms=4, label="measured α_a")
    a.plot(r.betas, r.alpha_a_predicted, "-", label=r"$e^\beta / (2e^\beta + n - 2)$")
    a.axhline(0.5, color="gray", ls=":")
    a.set(title=f"Averaging two keys (n={r.n})", xlabel="query scale β", ylabel="α_a (= α_b)")
    b.semilogy(r.betas, r.error, "o", ms=4, label="measured ‖c − ½(v_a+v_b)‖")
    b.semilogy(r.betas, r.error_exact, "-", label=r"exact: $\frac{n-2}{2e^\beta+n-2}\,\|\bar v_{others} - m\|$")
    b.semilogy(r.betas, r.bound, "--", label=r"bound: $\frac{n-2}{2e^\beta+n-2}\,\max_i \|v_i - m\|$")
    b.set(title="Distance from the average", xlabel="query scale β", ylabel="‖c − ½(v_a+v_b)‖")
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    return _save(fig, path)


def plot_single_head(r, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(r.alpha_a_hist, bins=40, color="tab:red", alpha=0.8)
    st = r.setting
    ax.set(title=f"Single head: α_a over key samples (β={st.beta}, ε={st.eps})\n"
                 f"Var(c) measured {r.stats.var_all:.3f}, predicted {r.predicted_var:.3f}",
           xlabel="α_a (weight on v_a; 1 − α_a goes mostly to v_b)", ylabel="samples")
    return _save(fig, path)


def plot_multi_head(r, path):
    names = {"beta": "query scale β", "eps": "key noise ε", "s2": "variance of k_a along μ_a"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, results) in zip(axes, r.sweeps.items()):
        xs = [getattr(x.setting, key) for x in results]
        ax.loglog(xs, [x.single.var_all for x in results], "o-", color="tab:red", label="single head")
        ax.loglog(xs, [x.multi.var_pos for x in results], "s-", color="tab:blue",
                  label="two heads, k_aᵀq₁ > 0")
        ax.loglog(xs, [x.multi.var_all for x in results], "s--", color="tab:blue", alpha=0.6,
                  label="two heads, all samples")
        ax.loglog(xs, [x.identical.var_all for x in results], "x:", color="black",
                  label="two identical heads")
        ax.set(title=f"Var(c) vs {names[key]}", xlabel=names[key], ylabel="E‖c − Ec‖²")
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.legend(fontsize=7)
    return _save(fig, path)
