"""`iattn report`: report.md and figures from run folders alone (summary.json + metrics.jsonl)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from iattention.experiments.lr_sweep import LrFamily, lr_families, lr_table  # noqa: E402
from iattention.experiments.results import config_value, find_runs, group  # noqa: E402
from iattention.experiments.stats import mean_std, verdict, welch_difference  # noqa: E402
from iattention.utils.atomic import write_text, write_with  # noqa: E402

# Fixed colours for the usual arms; any other arm takes the next colour of tab20 not used yet.
COLORS = {"standard": "tab:blue", "canonical": "tab:orange", "identity_q": "tab:green", "canonical-matched": "tab:red",
          "identity_ko": "tab:purple"}


def arm_colors(arms: list[str]) -> dict:
    import matplotlib.colors as mcolors

    used = {mcolors.to_hex(c) for c in COLORS.values()}
    spare = [c for c in map(mcolors.to_hex, matplotlib.colormaps["tab20"].colors) if c not in used]
    out = {}
    for arm in arms:
        out[arm] = COLORS.get(arm) or spare[len([a for a in out if a not in COLORS]) % len(spare)]
    return out


# The I-Attention paper (GPT-2 small, WikiText-2, 40 epochs, one seed), as published there.
PAPER = {
    "heads": [1, 4, 8, 12],
    "standard": {"best_val_ppl": [345, 291, 297, 295], "best_epoch": [30, 20, 20, 19]},
    "canonical": {"best_val_ppl": [234, 292, 258, 248], "best_epoch": [6, 19, 9, 8]},
}


def _splits(d: dict) -> str:
    """How much of each split the runs used, in words."""
    part = lambda key, name: f"{name} first {d[key]:,} tokens" if d.get(key) else f"{name} whole"  # noqa: E731
    return f"{part('train_tokens', 'train')}, {part('valid_tokens', 'validation')}, test whole"


def _display(folder: Path) -> str:
    """A run folder as a path relative to the working directory when it lies below it."""
    try:
        return str(folder.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(folder)


def _fmt(m: float, s: float, digits: int = 2) -> str:
    return f"{m:.{digits}f} ± {s:.{digits}f}" if math.isfinite(s) else f"{m:.{digits}f}"


def _save(fig, path: Path) -> str:
    # No tight_layout: it would shrink the axes to make room for a legend outside them (_legend);
    # bbox_inches="tight" grows the image around it instead.
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight"))
    plt.close(fig)
    return path.name


def _legend(axes, **kw) -> None:
    """One legend right of the last axes for the entries of all of them (each label once), so
    that with many arms it covers no data."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    axes[-1].legend(entries.values(), entries.keys(), loc="upper left", bbox_to_anchor=(1.02, 1),
                    borderaxespad=0, **kw)


def _curves(groups, out: Path, colors: dict) -> str:
    heads = sorted({h for _, h in groups})
    fig, axes = plt.subplots(1, len(heads), figsize=(4.2 * len(heads), 3.8), squeeze=False, sharey=True)
    for ax, h in zip(axes[0], heads):
        for (att, hh), runs in groups.items():
            if hh != h:
                continue
            n_ep = min(len(r.epochs) for r in runs)
            if n_ep == 0:
                continue
            ep = np.arange(1, n_ep + 1)
            for key, style in (("val_ppl", "-"), ("train_ppl", "--")):
                y = np.array([[r.epochs[i][key] for i in range(n_ep)] for r in runs])
                ax.plot(ep, y.mean(0), style, color=colors[att], label=f"{att} {key[:-4]}")
                if len(runs) > 1:
                    ax.fill_between(ep, y.min(0), y.max(0), color=colors[att], alpha=0.15)
        ax.set(title=f"{h} head{'s' if h > 1 else ''}", xlabel="epoch", yscale="log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("perplexity (log scale)")
    _legend(axes[0], fontsize=7, title="solid: validation, dashed: train\nband: min–max over seeds",
            title_fontsize=7)
    return _save(fig, out / "perplexity_vs_epoch.png")


def _scaling(groups, out: Path, colors: dict, key: str, ylabel: str, fname: str, title: str) -> str:
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for att in colors:
        pts = [(h, [r.summary[key] for r in runs]) for (a, h), runs in groups.items() if a == att]
        if not pts:
            continue
        hs = [h for h, _ in pts]
        ms = [mean_std(v) for _, v in pts]
        ax.errorbar(hs, [m for m, _ in ms], yerr=[0 if not math.isfinite(s) else s for _, s in ms], marker="o",
                    capsize=4, color=colors[att], label=f"{att} (mean ± std over seeds)")
    ax.set(xscale="log", xlabel="number of heads", ylabel=ylabel, title=title)
    hs_all = sorted({h for _, h in groups})
    ax.set_xticks(hs_all, [str(h) for h in hs_all])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(alpha=0.3)
    _legend([ax], fontsize=8)
    return _save(fig, out / fname)


def _lr_figure(families: list[LrFamily], study_lr: float, out: Path, colors: dict) -> str:
    heads = sorted({f.n_head for f in families})
    ticks = sorted({lr / study_lr for f in families for lr in f.by_lr})
    fig, axes = plt.subplots(1, len(heads), figsize=(4.2 * len(heads), 3.8), squeeze=False, sharey=True)
    for ax, h in zip(axes[0], heads):
        for f in (f for f in families if f.n_head == h):
            lrs = sorted(f.by_lr)
            seeds = f"seed{'s' if len(f.seeds) > 1 else ''} {', '.join(map(str, f.seeds))}"
            ax.plot([lr / study_lr for lr in lrs], [f.best_val_ppl(lr)[0] for lr in lrs], "o-",
                    color=colors.get(f.name, "black"), label=f"{f.name} ({seeds})")
        ax.set(title=f"{h} head{'s' if h > 1 else ''}", xlabel="learning rate / study's", xscale="log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(ticks, [f"{m:g}" for m in ticks])
        ax.grid(alpha=0.3)
    _legend(axes[0], fontsize=7)
    axes[0][0].set_ylabel("best validation perplexity")
    return _save(fig, out / "best_val_ppl_vs_lr.png")


def _ci(x, digits=2) -> str:
    return f"{x.mean:+.{digits}f} [{x.low:+.{digits}f}, {x.high:+.{digits}f}]" if x.has_ci \
        else f"{x.mean:+.{digits}f} [undefined: {x.undefined}]"


def reach_targets(groups, reference: str) -> dict[int, float]:
    """Per head count: the validation perplexity every reference seed reached (the worst of their bests)."""
    return {h: max(r.summary["best_val_ppl"] for r in runs) for (arm, h), runs in groups.items() if arm == reference}


def _millions(x: float) -> str:
    return f"{x / 1e6:.2f}M"


def write_report(dirs, out, title: str = "I-Attention study", reference: str = "standard") -> Path:
    from iattention.errors import UserError

    out = Path(out)
    runs = find_runs(dirs)
    groups = group(runs)
    arms = list(dict.fromkeys(a for a, _ in groups))
    if reference not in arms:
        raise UserError(f"reference arm {reference!r} has no runs here (arms: {', '.join(arms)}); pass --reference")
    arms = [reference] + [a for a in arms if a != reference]  # the reference first in every table
    groups = dict(sorted(groups.items(), key=lambda kv: (kv[0][1], arms.index(kv[0][0]))))
    colors = arm_colors(arms)
    targets = reach_targets(groups, reference)
    cfg = next(r for r in runs if r.arm == reference).summary["config"]  # the study config, at its own lr
    study_lr = float(cfg["optim"]["lr"])
    families = lr_families(runs, study_lr)
    # Arms run with one seed only (learning-rate probes) would crowd the figures over heads; they get
    # the learning-rate figure. A study of one seed throughout keeps every arm.
    multi = {a for (a, _), rs in groups.items() if len(rs) > 1}
    plotted = {k: v for k, v in groups.items() if k[0] in multi} if multi else groups
    figs = [_curves(plotted, out, colors),
            _scaling(plotted, out, colors, "best_val_ppl", "best validation perplexity", "best_val_ppl_vs_heads.png",
                     "Best validation perplexity vs heads"),
            _scaling(plotted, out, colors, "best_epoch", "epoch of best validation", "best_epoch_vs_heads.png",
                     "Epoch of best validation vs heads")]
    if families:
        figs.append(_lr_figure(families, study_lr, out, colors))
    m, d, o, t = cfg["model"], cfg["data"], cfg["optim"], cfg["train"]
    arm_lines = []
    for arm in arms:
        keys = sorted({k for r in runs if r.arm == arm for k in r.arm_keys})
        sets = sorted({f"{k}={config_value(r.summary['config'], k)}" for r in runs if r.arm == arm for k in keys})
        arm_lines.append(f"- `{arm}`: {' '.join(f'`{x}`' for x in sets) or '(the study config as is)'}")
    lines = [f"# {title}", "",
             f"{len(runs)} finished runs from {', '.join(str(x) for x in dirs)}. Model: {m['n_layer']} layers, "
             f"d={m['n_embd']}, block {m['block_size']}, vocab {m['vocab_size']} ({d['tokenizer']}); data "
             f"{d['dataset']} ({_splits(d)})" +
             f"; {t['epochs']} epochs, batch {t['batch_size']}, AdamW lr {o['lr']}, warmup {o['warmup_steps']} "
             f"steps, cosine to {o['min_lr_ratio']}×lr, weight decay {o['weight_decay']} (unless an arm sets "
             "otherwise).", "", "Arms (what each sets on top of the study config):", "", *arm_lines, "",
             "## Results (ours)", "",
             f"Tokens to reach: training tokens until validation perplexity first reached the level every "
             f"`{reference}` seed reached at that head count (the worst of their bests), interpolated in log "
             "perplexity between evaluations; mean ± std over the runs that reached it.", "",
             "| arm | heads | learned params | best val ppl | epoch of best | best at last epoch | tokens to reach | "
             "test ppl | train tok/s | seeds |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (arm, h), rs in groups.items():
        s = [r.summary for r in rs]
        reach = [x for r in rs if (x := r.tokens_to_reach(targets[h])) is not None] if h in targets else []
        reach_txt = "n/a" if h not in targets else (
            (f"{_millions(np.mean(reach))} ± {_millions(np.std(reach, ddof=1)) if len(reach) > 1 else '–'}"
             if reach else "–") + f" ({len(reach)} of {len(rs)})")
        lines.append(f"| {arm} | {h} | {s[0]['params']:,} | {_fmt(*mean_std([x['best_val_ppl'] for x in s]))} | "
                     f"{_fmt(*mean_std([x['best_epoch'] for x in s]), digits=1)} | "
                     f"{sum(r.censored for r in rs)} of {len(s)} | {reach_txt} | "
                     f"{_fmt(*mean_std([x['test_ppl'] for x in s]))} | "
                     f"{np.mean([x['train_tokens_per_s'] for x in s]):,.0f} | {len(s)} |")
    lines += ["", "Mean ± sample standard deviation over seeds. \"Best at last epoch\": runs whose validation "
              "perplexity was still falling when training ended, so their epoch of best is a lower bound.", "",
              f"## Each arm − `{reference}`, per head count", "",
              f"95% confidence intervals by Welch's t (unequal variances). Negative = the arm is lower than "
              f"`{reference}`. No interval (and no verdict) with fewer than 2 seeds in an arm or no spread at all; "
              "no epoch verdict when a run's best came at its last epoch (censored)." +
              (" Arms run with one seed only are left out here (no interval); they are in the table above" +
               (" and under Learning rate." if families else ".") if plotted != groups else ""), "",
              "| arm | heads | Δ best val ppl [95% CI] | Δ epoch of best [95% CI] | Δ tokens to reach [95% CI] | "
              "seeds (ref, arm) | verdict |",
              "| --- | ---: | --- | --- | --- | --- | --- |"]
    for arm in arms:
        if arm == reference:
            continue
        for h in sorted({h for _, h in groups}):
            if (reference, h) not in groups or (arm, h) not in groups or (arm, h) not in plotted:
                continue
            a, b = groups[(reference, h)], groups[(arm, h)]
            dp = welch_difference([r.summary["best_val_ppl"] for r in a], [r.summary["best_val_ppl"] for r in b])
            de = welch_difference([r.summary["best_epoch"] for r in a], [r.summary["best_epoch"] for r in b])
            ra = [r.tokens_to_reach(targets[h]) for r in a]
            rb = [r.tokens_to_reach(targets[h]) for r in b]
            if None in rb:
                reach = f"{rb.count(None)} of {len(rb)} never reached"
            else:
                dr = welch_difference(np.array(ra) / 1e6, np.array(rb) / 1e6)
                reach = _ci(dr) + "M"
            censored = sum(r.censored for r in a + b)
            lines.append(f"| {arm} | {h} | {_ci(dp)} | {_ci(de, 1) if not censored else 'censored'} | {reach} | "
                         f"{dp.n_a}, {dp.n_b} | {verdict(dp, de, name=arm, censored=censored)} |")
    if families:
        lines += ["", "## Learning rate", "",
                  f"Best validation perplexity of arms that differ only in `optim.lr`, as a multiple of the study's "
                  f"{study_lr:g} (family: the arm at the study's rate). Each cell: mean over the seeds listed, the "
                  "seeds run at every rate of that row (± std when there are several); bold: the row's best rate.",
                  "", *lr_table(families, study_lr)]
    lines += ["", "## The paper's published numbers (not ours)", "",
              "GPT-2 small (12 layers, d=768), GPT-2 BPE, WikiText-2, 40 epochs, batch 32, one seed, as reported "
              "in the I-Attention paper:", "",
              "| heads | standard best val ppl | canonical best val ppl | standard epoch of best | "
              "canonical epoch of best |", "| ---: | ---: | ---: | ---: | ---: |"]
    for i, h in enumerate(PAPER["heads"]):
        lines.append(f"| {h} | {PAPER['standard']['best_val_ppl'][i]} | {PAPER['canonical']['best_val_ppl'][i]} | "
                     f"{PAPER['standard']['best_epoch'][i]} | {PAPER['canonical']['best_epoch'][i]} |")
    lines += ["", "Our runs are far smaller models on a cut of the data, so absolute perplexities are not "
              "comparable with the paper's; compare directions and sizes of the differences.", "",
              "## Figures", ""]
    if plotted != groups:
        lines += ["Figures over heads and epochs show the arms run with several seeds; the one-seed arms are in the "
                  "tables" + (" and the learning-rate figure." if families else "."), ""]
    lines += [f"![{f}]({f})" for f in figs]
    lines += ["", "## Runs", "", "Every run this report read (each folder keeps config.yaml, summary.json, "
              "metrics.jsonl and arm.json):", ""] + [f"- `{_display(r.folder)}`" for r in runs] + [""]
    path = out / "report.md"
    write_text(path, "\n".join(lines))
    return path
