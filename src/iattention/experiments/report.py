"""`iattn report`: report.md and figures from run folders alone (summary.json + metrics.jsonl)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from iattention.experiments.results import find_runs, group  # noqa: E402
from iattention.experiments.stats import mean_std, verdict, welch_difference  # noqa: E402
from iattention.utils.atomic import write_text, write_with  # noqa: E402

COLORS = {"standard": "tab:blue", "canonical": "tab:orange", "identity_q": "tab:green"}

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


def _fmt(m: float, s: float, digits: int = 2) -> str:
    return f"{m:.{digits}f} ± {s:.{digits}f}" if math.isfinite(s) else f"{m:.{digits}f}"


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path.name


def _curves(groups, out: Path) -> str:
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
                ax.plot(ep, y.mean(0), style, color=COLORS.get(att), label=f"{att} {key[:-4]}")
                if len(runs) > 1:
                    ax.fill_between(ep, y.min(0), y.max(0), color=COLORS.get(att), alpha=0.15)
        ax.set(title=f"{h} head{'s' if h > 1 else ''}", xlabel="epoch", yscale="log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("perplexity (log scale)")
    axes[0][-1].legend(fontsize=7, title="solid: validation, dashed: train\nband: min–max over seeds",
                       title_fontsize=7)
    return _save(fig, out / "perplexity_vs_epoch.png")


def _scaling(groups, out: Path, key: str, ylabel: str, fname: str, title: str) -> str:
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for att in COLORS:
        pts = [(h, [r.summary[key] for r in runs]) for (a, h), runs in groups.items() if a == att]
        if not pts:
            continue
        hs = [h for h, _ in pts]
        ms = [mean_std(v) for _, v in pts]
        ax.errorbar(hs, [m for m, _ in ms], yerr=[0 if not math.isfinite(s) else s for _, s in ms], marker="o",
                    capsize=4, color=COLORS[att], label=f"{att} (mean ± std over seeds)")
    ax.set(xscale="log", xlabel="number of heads", ylabel=ylabel, title=title)
    hs_all = sorted({h for _, h in groups})
    ax.set_xticks(hs_all, [str(h) for h in hs_all])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / fname)


def write_report(dirs, out, title: str = "I-Attention study") -> Path:
    out = Path(out)
    runs = find_runs(dirs)
    groups = group(runs)
    figs = [_curves(groups, out),
            _scaling(groups, out, "best_val_ppl", "best validation perplexity", "best_val_ppl_vs_heads.png",
                     "Best validation perplexity vs heads"),
            _scaling(groups, out, "best_epoch", "epoch of best validation", "best_epoch_vs_heads.png",
                     "Epoch of best validation vs heads")]
    cfg = runs[0].summary["config"]
    m, d, o, t = cfg["model"], cfg["data"], cfg["optim"], cfg["train"]
    lines = [f"# {title}", "",
             f"{len(runs)} finished runs from {', '.join(str(x) for x in dirs)}. Model: {m['n_layer']} layers, "
             f"d={m['n_embd']}, block {m['block_size']}, vocab {m['vocab_size']} ({d['tokenizer']}); data "
             f"{d['dataset']} ({_splits(d)})" +
             f"; {t['epochs']} epochs, batch {t['batch_size']}, AdamW lr {o['lr']}, warmup {o['warmup_steps']} "
             f"steps, cosine to {o['min_lr_ratio']}×lr, weight decay {o['weight_decay']}.", "",
             "## Results (ours)", "",
             "| attention | heads | learned params | best val ppl | epoch of best | best at last epoch | test ppl | "
             "train tok/s | seeds |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (att, h), rs in groups.items():
        s = [r.summary for r in rs]
        lines.append(f"| {att} | {h} | {s[0]['params']:,} | {_fmt(*mean_std([x['best_val_ppl'] for x in s]))} | "
                     f"{_fmt(*mean_std([x['best_epoch'] for x in s]), digits=1)} | "
                     f"{sum(x['best_epoch'] == x['epochs_run'] for x in s)} of {len(s)} | "
                     f"{_fmt(*mean_std([x['test_ppl'] for x in s]))} | "
                     f"{np.mean([x['train_tokens_per_s'] for x in s]):,.0f} | {len(s)} |")
    lines += ["", "Mean ± sample standard deviation over seeds. \"Best at last epoch\": runs whose validation "
              "perplexity was still falling when training ended, so their epoch of best is a lower bound.", "",
              "## Canonical − standard, per head count", "",
              "95% confidence intervals by Welch's t (unequal variances). Negative = canonical lower.", "",
              "| heads | Δ best val ppl [95% CI] | Δ epoch of best [95% CI] | seeds (std, can) | verdict |",
              "| ---: | --- | --- | --- | --- |"]
    for h in sorted({h for _, h in groups}):
        if ("standard", h) not in groups or ("canonical", h) not in groups:
            continue
        a, b = groups[("standard", h)], groups[("canonical", h)]
        dp = welch_difference([r.summary["best_val_ppl"] for r in a], [r.summary["best_val_ppl"] for r in b])
        de = welch_difference([r.summary["best_epoch"] for r in a], [r.summary["best_epoch"] for r in b])

        def ci(x, digits=2):
            return f"{x.mean:+.{digits}f} [{x.low:+.{digits}f}, {x.high:+.{digits}f}]" if x.has_ci \
                else f"{x.mean:+.{digits}f} [n/a]"

        lines.append(f"| {h} | {ci(dp)} | {ci(de, 1)} | {dp.n_a}, {dp.n_b} | {verdict(dp, de)} |")
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
              "## Figures", ""] + [f"![{f}]({f})" for f in figs] + [""]
    path = out / "report.md"
    write_text(path, "\n".join(lines))
    return path
