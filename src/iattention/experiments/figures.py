"""The report's figures (matplotlib): perplexity per epoch, loss per step, best perplexity and epoch of best
over heads, the learning-rate figure, and the forest plot of every paired difference."""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from iattention.checkpoint.run_folder import STEPS, RunFolder  # noqa: E402
from iattention.experiments.lr_sweep import LrFamily  # noqa: E402
from iattention.experiments.stats import mean_std  # noqa: E402
from iattention.utils.atomic import write_with  # noqa: E402

TICK_SIZE = 8  # every tick label of every figure, major and minor

class Style(NamedTuple):
    """How one arm is drawn in every figure: its colour and its marker."""
    color: str
    marker: str
    width: float = 1.2


# The reference arm, whatever its name: black squares, a heavier line, drawn under the others (an arm level
# with it still shows).
REFERENCE = Style("#000000", "s", 2.0)
# Fixed colours (with circles) for the usual arms; any other arm takes the next colour-and-marker pair no
# arm of the report has (tab10's colours less its gray, then the next marker), so no two arms look alike.
COLORS = {"standard": "tab:blue", "canonical": "tab:orange", "identity_q": "tab:green", "canonical-matched": "tab:red",
          "identity_ko": "tab:purple"}
MARKERS = ("o", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p", "d")
TRAIN_CURVES_MAX_ARMS = 6  # more arms: the epoch figure draws validation only (train curves would double it)


def arm_styles(arms: list[str], reference: str | None = None) -> dict[str, Style]:
    """A distinct Style per arm (len(MARKERS) x 9 pairs before any repeats), the reference always REFERENCE."""
    import matplotlib.colors as mcolors  # lazy: matplotlib, only when a figure is drawn

    palette = [c for c in map(mcolors.to_hex, matplotlib.colormaps["tab10"].colors) if c != "#7f7f7f"]
    pairs = [Style(c, m) for m in MARKERS for c in palette]
    out = {reference: REFERENCE} if reference in arms else {}
    fixed = {a: Style(mcolors.to_hex(COLORS[a]), "o") for a in arms if a in COLORS and a not in out}
    out.update(fixed)
    free = (st for st in pairs if st not in set(fixed.values()))
    for arm in arms:
        if arm not in out:
            out[arm] = next(free, None) or pairs[len(out) % len(pairs)]
    return {a: out[a] for a in arms}


def save(fig, path: Path) -> str:
    # No tight_layout: it would shrink the axes to make room for a legend outside them (_legend);
    # bbox_inches="tight" grows the image around it instead.
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight"))
    plt.close(fig)
    return path.name

def legend(axes, **kw) -> None:
    """One legend right of the last axes for the entries of all of them (each label once), so
    that with many arms it covers no data."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    axes[-1].legend(entries.values(), entries.keys(), loc="upper left", bbox_to_anchor=(1.02, 1),
                    borderaxespad=0, **kw)

def log_axis(ax) -> None:
    """Readable log-scale ticks: plain numbers at 1-2-5 steps, so a narrow range still has labels."""
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.5, 3.0, 4.0, 7.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.tick_params(axis="y", which="both", labelsize=TICK_SIZE)

def curves(groups, out: Path, styles: dict) -> str:
    heads = sorted({h for _, h in groups})
    n_arms = len({a for a, _ in groups})
    keys = (("val_ppl", "-"), ("train_ppl", "--")) if n_arms <= TRAIN_CURVES_MAX_ARMS else (("val_ppl", "-"),)
    fig, axes = plt.subplots(1, len(heads), figsize=(4.2 * len(heads), 3.8), squeeze=False, sharey=True)
    for ax, h in zip(axes[0], heads):
        for (att, hh), runs in groups.items():
            if hh != h:
                continue
            n_ep = min(len(r.epochs) for r in runs)
            if n_ep == 0:
                continue
            st = styles[att]
            # Epoch 0: the evaluation before the first step, where every run of the group recorded one
            # (a "start" record), so a matched start is visible as one point.
            starts = [next((e for e in r.evals if e.get("kind") == "start"), None) for r in runs]
            first = 0 if all(x is not None for x in starts) else 1
            series = [([starts[j]] if first == 0 else []) + r.epochs[:n_ep] for j, r in enumerate(runs)]
            ep = np.arange(first, n_ep + 1)
            every = max(1, n_ep // 16)  # markers on at most ~16 epochs, so long runs stay readable
            for key, line in keys:
                x, recs = ep, series
                if any(rec.get(key) is None for x_ in series for rec in x_):  # a start has no train loss
                    if key != "train_ppl" or first != 0:
                        continue
                    x, recs = ep[1:], [x_[1:] for x_ in series]
                y = np.array([[rec[key] for rec in r_] for r_ in recs])
                ax.plot(x, y.mean(0), line, color=st.color, marker=st.marker, ms=3.5, markevery=every, lw=st.width,
                        mfc=st.color if key == "val_ppl" else "white", zorder=1.9 if st is REFERENCE else 2,
                        label=f"{att} {key[:-4]}" if len(keys) > 1 else att)
                if len(runs) > 1:
                    ax.fill_between(x, y.min(0), y.max(0), color=st.color, alpha=0.12, lw=0)
        ax.set(title=f"{h} head{'s' if h > 1 else ''}", xlabel="epoch", yscale="log")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        log_axis(ax)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("perplexity (log scale)" if len(keys) > 1 else "validation perplexity (log scale)")
    title = ("solid, filled: validation; dashed, hollow: train" if len(keys) > 1 else
             f"validation only ({n_arms} arms; train curves\nwith at most {TRAIN_CURVES_MAX_ARMS}: "
             "iattn report --arms)")
    legend(axes[0], fontsize=7, title=f"{title}\nband: min–max over seeds", title_fontsize=7)
    return save(fig, out / "perplexity_vs_epoch.png")


def loss_steps(groups, out: Path, styles: dict) -> str | None:
    """Training loss per optimizer step (steps.jsonl), mean over seeds, smoothed over a window; None when
    no run kept its steps."""
    heads = sorted({h for _, h in groups})
    curves = {}
    for key, runs in groups.items():
        losses = []
        for r in runs:
            steps = RunFolder(r.folder).read_records(STEPS, finished=True)
            if steps:
                losses.append([rec["loss"] for rec in steps])
        if losses:
            n = min(map(len, losses))
            curves[key] = np.array([x[:n] for x in losses], dtype=float)  # (seeds, steps)
    if not curves:
        return None
    fig, axes = plt.subplots(1, len(heads), figsize=(4.2 * len(heads), 3.8), squeeze=False, sharey=True)
    for ax, h in zip(axes[0], heads):
        for (att, hh), ys in curves.items():
            if hh != h:
                continue
            w = max(1, ys.shape[1] // 50)
            smooth = np.array([np.convolve(y, np.ones(w) / w, mode="valid") for y in ys])
            x = np.arange(w, ys.shape[1] + 1)
            seeds = f"{len(ys)} seed{'s' if len(ys) > 1 else ''}"
            st = styles[att]
            ax.plot(x, smooth.mean(0), color=st.color, lw=st.width * 0.8, marker=st.marker, ms=3.5,
                    markevery=max(1, len(x) // 8), zorder=1.9 if st is REFERENCE else 2, label=f"{att} ({seeds})")
            if len(ys) > 1:
                ax.fill_between(x, smooth.min(0), smooth.max(0), color=st.color, alpha=0.12, lw=0)
        ax.set(title=f"{h} head{'s' if h > 1 else ''}", xlabel="optimizer step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training loss (nats; mean over seeds,\nmoving average over ~2% of the run)")
    legend(axes[0], fontsize=7, title="band: min–max over seeds", title_fontsize=7)
    return save(fig, out / "loss_vs_step.png")

def scaling(groups, out: Path, styles: dict, key: str, ylabel: str, fname: str, title: str) -> str:
    """An arm's mean ± std over seeds per head count. Arms are offset sideways a little so equal values do
    not hide each other; on the epoch-of-best figure a hollow marker means some run's best was its last
    epoch (censored: a lower bound)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    arms = [a for a in styles if any(k[0] == a for k in groups)]
    for i, att in enumerate(arms):
        pts = [(h, runs) for (a, h), runs in groups.items() if a == att]
        offset = 1.0 + 0.035 * (i - (len(arms) - 1) / 2)  # multiplicative: the x axis is logarithmic
        means = []
        for j, (h, runs) in enumerate(pts):
            m, sd = mean_std([r.summary[key] for r in runs])
            means.append(m)
            censored = key == "best_epoch" and any(r.censored for r in runs)
            st = styles[att]
            ax.errorbar([h * offset], [m], yerr=[0 if not math.isfinite(sd) else sd], marker=st.marker, capsize=4,
                        color=st.color, mfc="white" if censored else st.color, zorder=1.9 if st is REFERENCE else 2,
                        label=f"{att} (mean ± std over seeds)" if j == 0 else None)
        ax.plot([h * offset for h, _ in pts], means, "-", color=styles[att].color, lw=styles[att].width * 0.8)
    ax.set(xscale="log", xlabel="number of heads (arms offset sideways)", ylabel=ylabel, title=title)
    hs_all = sorted({h for _, h in groups})
    ax.set_xticks(hs_all, [str(h) for h in hs_all])
    ax.set_xlim(min(hs_all) / 1.6, max(hs_all) * 1.6)  # fixed margins: one head count must not zoom in on the offsets
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if key == "best_epoch":
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, math.floor(lo) - 0.5), max(hi, math.ceil(hi) + 0.5))
        ax.plot([], [], "o", mfc="white", color="gray", label="hollow: some run's best at its last epoch (censored)")
    ax.grid(alpha=0.3)
    legend([ax], fontsize=8)
    return save(fig, out / fname)

def lr_figure(families: list[LrFamily], study_lr: float, out: Path, styles: dict) -> str:
    heads = sorted({f.n_head for f in families})
    ticks = sorted({lr / study_lr for f in families for lr in f.by_lr})
    fig, axes = plt.subplots(1, len(heads), figsize=(4.2 * len(heads), 3.8), squeeze=False, sharey=True)
    for ax, h in zip(axes[0], heads):
        for f in (f for f in families if f.n_head == h):
            lrs = sorted(f.by_lr)
            seeds = f"seed{'s' if len(f.seeds) > 1 else ''} {', '.join(map(str, f.seeds))}"
            st = styles.get(f.name, Style("#000000", "o"))
            ax.plot([lr / study_lr for lr in lrs], [f.best_val_ppl(lr)[0] for lr in lrs], "-", marker=st.marker,
                    color=st.color, lw=st.width, label=f"{f.name} ({seeds})")
        ax.set(title=f"{h} head{'s' if h > 1 else ''}", xlabel="learning rate / study's", xscale="log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(ticks, [f"{m:g}" for m in ticks])
        ax.grid(alpha=0.3)
    legend(axes[0], fontsize=7)
    axes[0][0].set_ylabel("best validation perplexity")
    return save(fig, out / "best_val_ppl_vs_lr.png")

def all_figures(groups, plotted, families, study_lr: float, out: Path, styles: dict, rows: list[dict] | None = None,
                reference: str = "standard", margin_pct: float = 2.0, margin_declared: bool = False) -> list[str]:
    """Every figure of the report (file names under `out`)."""
    figs = [f for f in [forest(rows or [], reference, margin_pct, margin_declared, out, styles)] if f]
    figs += [curves(plotted, out, styles),
            scaling(plotted, out, styles, "best_val_ppl", "best validation perplexity", "best_val_ppl_vs_heads.png",
                     "Best validation perplexity vs heads"),
            scaling(plotted, out, styles, "best_epoch", "epoch of best validation", "best_epoch_vs_heads.png",
                     "Epoch of best validation vs heads")]
    loss_fig = loss_steps(plotted, out, styles)
    if loss_fig:
        figs.append(loss_fig)
    if families:
        figs.append(lr_figure(families, study_lr, out, styles))
    return figs


def forest(rows: list[dict], reference: str, margin_pct: float, margin_declared: bool, out: Path,
           styles: dict) -> str | None:
    """Every comparison on all seeds: the difference in best validation perplexity as % of the
    reference's mean at that head count, with its 95% interval (paired, or Welch), and the equivalence
    margin as a band. A hollow marker: no interval (one seed in an arm). None when there is no row."""
    rows = [r for r in rows if r["subset"] == "all"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7.0, 0.9 + 0.32 * len(rows)))
    ys = np.arange(len(rows))[::-1]
    ax.axvspan(-margin_pct, margin_pct, color="0.88", lw=0,
               label=f"±{margin_pct:g}% margin" + (" (declared before the runs)" if margin_declared else
                                                    " (not declared in advance)"))
    ax.axvline(0, color="0.4", lw=0.8)
    for y, r in zip(ys, rows):
        ref, d = r["ref_mean"], r["ppl"]
        st = styles.get(r["arm"], Style("#000000", "o"))
        m = 100 * d.mean / ref
        if d.has_ci:
            ax.errorbar([m], [y], xerr=[[m - 100 * d.low / ref], [100 * d.high / ref - m]], fmt=st.marker,
                        color=st.color, capsize=3, ms=4)
        else:
            ax.plot([m], [y], st.marker, mfc="white", color=st.color, ms=4)
    ax.set_yticks(ys, [f"{r['arm']}, {r['heads']} head{'s' if r['heads'] > 1 else ''}" +
                       (f" ({r['ppl'].n_a} pairs)" if r["ppl"].kind == "paired" else " (Welch)") for r in rows],
                  fontsize=TICK_SIZE)
    ax.tick_params(axis="x", labelsize=TICK_SIZE)
    ax.set(xlabel=f"Δ best validation perplexity vs {reference}, % of its mean (95% interval)",
           ylim=(-0.7, len(rows) - 0.3))
    ax.plot([], [], "o", mfc="white", color="gray", label="no interval (one seed in an arm)")
    ax.grid(alpha=0.3, axis="x")
    legend([ax], fontsize=7)
    return save(fig, out / "forest.png")
