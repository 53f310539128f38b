"""`iattn report`: report.md and figures from run folders alone (summary.json + metrics.jsonl)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from iattention.checkpoint.run_folder import STEPS, RunFolder  # noqa: E402
from iattention.experiments.lr_sweep import LrFamily, lr_families, lr_table  # noqa: E402
from iattention.experiments.results import config_value, find_runs, group  # noqa: E402
from iattention.experiments.stats import compare, holm, mean_std, verdict, welch_difference  # noqa: E402
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


def _log_axis(ax) -> None:
    """Readable log-scale ticks: plain numbers at 1-2-5 steps, so a narrow range still has labels."""
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.5, 3.0, 4.0, 7.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.tick_params(axis="y", which="minor", labelsize=6)


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
            every = max(1, n_ep // 16)  # markers on at most ~16 epochs, so long runs stay readable
            for key, style, marker in (("val_ppl", "-", "o"), ("train_ppl", "--", "x")):
                y = np.array([[r.epochs[i][key] for i in range(n_ep)] for r in runs])
                ax.plot(ep, y.mean(0), style, color=colors[att], marker=marker, ms=3, markevery=every,
                        label=f"{att} {key[:-4]}")
                if len(runs) > 1:
                    ax.fill_between(ep, y.min(0), y.max(0), color=colors[att], alpha=0.15)
        ax.set(title=f"{h} head{'s' if h > 1 else ''}", xlabel="epoch", yscale="log")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        _log_axis(ax)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("perplexity (log scale)")
    _legend(axes[0], fontsize=7, title="solid, o: validation; dashed, x: train\nband: min–max over seeds",
            title_fontsize=7)
    return _save(fig, out / "perplexity_vs_epoch.png")


def _loss_steps(groups, out: Path, colors: dict) -> str | None:
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
            curves[key] = np.array([x[:n] for x in losses], dtype=float).mean(0)
    if not curves:
        return None
    fig, axes = plt.subplots(1, len(heads), figsize=(4.2 * len(heads), 3.8), squeeze=False, sharey=True)
    for ax, h in zip(axes[0], heads):
        for (att, hh), y in curves.items():
            if hh != h:
                continue
            w = max(1, len(y) // 50)
            smooth = np.convolve(y, np.ones(w) / w, mode="valid")
            ax.plot(np.arange(w, len(y) + 1), smooth, color=colors[att], lw=1, label=att)
        ax.set(title=f"{h} head{'s' if h > 1 else ''}", xlabel="optimizer step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training loss (nats; mean over seeds,\nmoving average over ~2% of the run)")
    _legend(axes[0], fontsize=7)
    return _save(fig, out / "loss_vs_step.png")


def _scaling(groups, out: Path, colors: dict, key: str, ylabel: str, fname: str, title: str) -> str:
    """An arm's mean ± std over seeds per head count. Arms are offset sideways a little so equal values do
    not hide each other; on the epoch-of-best figure a hollow marker means some run's best was its last
    epoch (censored: a lower bound)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    arms = [a for a in colors if any(k[0] == a for k in groups)]
    for i, att in enumerate(arms):
        pts = [(h, runs) for (a, h), runs in groups.items() if a == att]
        offset = 1.0 + 0.035 * (i - (len(arms) - 1) / 2)  # multiplicative: the x axis is logarithmic
        means = []
        for j, (h, runs) in enumerate(pts):
            m, sd = mean_std([r.summary[key] for r in runs])
            means.append(m)
            censored = key == "best_epoch" and any(r.censored for r in runs)
            ax.errorbar([h * offset], [m], yerr=[0 if not math.isfinite(sd) else sd], marker="o", capsize=4,
                        color=colors[att], mfc="white" if censored else colors[att],
                        label=f"{att} (mean ± std over seeds)" if j == 0 else None)
        ax.plot([h * offset for h, _ in pts], means, "-", color=colors[att], lw=1)
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
    m, lo, hi = (round(v, digits) + 0.0 for v in (x.mean, x.low, x.high))  # + 0.0: no "-0.00"
    return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]" if x.has_ci \
        else f"{m:+.{digits}f} [undefined: {x.undefined}]"


def reach_targets(groups, reference: str) -> dict[int, float]:
    """Per head count: the reference arm's mean best validation perplexity (the bar of "tokens to reach"
    in the arms table; the comparisons also use each seed's own reference best)."""
    return {h: float(np.mean([r.summary["best_val_ppl"] for r in runs])) for (arm, h), runs in groups.items()
            if arm == reference}


def _by_seed(runs, key: str) -> dict[int, float]:
    return {r.summary["seed"]: float(r.summary[key]) for r in runs}


def _added_text(added: dict) -> str:
    return "; ".join(f"`{arm}` at {h} head{'s' if int(h) > 1 else ''}: seed{'s' if len(seeds) > 1 else ''} "
                     f"{', '.join(map(str, seeds))}" for arm, by_h in added.items() for h, seeds in by_h.items())


def _added_seeds(added: dict, arm: str, h: int) -> set[int]:
    return {int(s) for hh, seeds in (added.get(arm) or {}).items() if int(hh) == h for s in seeds}


def _fmt_p(p: float) -> str:
    return "–" if not math.isfinite(p) else (f"{p:.3f}" if p >= 0.001 else "<0.001")


def _reached_pairs(a, b) -> tuple[int, int]:
    """(pairs where the arm's run reached its own seed's reference best, pairs)."""
    ref = _by_seed(a, "best_val_ppl")
    pairs = [r for r in b if r.summary["seed"] in ref]
    return sum(r.summary["best_val_ppl"] <= ref[r.summary["seed"]] for r in pairs), len(pairs)


def comparisons(groups, plotted, arms, reference: str, margin_pct: float, added: dict,
                family: list[str] | None = None) -> list[dict]:
    """Every arm x head count against the reference at that head count (pure: numbers, no text). Rows on
    the pre-declared seeds alone follow a row whose seeds include added ones. Holm adjusts the p values
    of the difference tests and of the equivalence tests over the family: the rows on all seeds of the
    arms in `family` (default: every arm); rows outside it keep their unadjusted p values."""
    rows = []
    for arm in arms:
        if arm == reference:
            continue
        for h in sorted({h for _, h in groups}):
            if (reference, h) not in groups or (arm, h) not in groups or (arm, h) not in plotted:
                continue
            extra = _added_seeds(added, arm, h) | _added_seeds(added, reference, h)
            for subset in ("all", "declared") if extra else ("all",):
                drop = extra if subset == "declared" else set()
                a = [r for r in groups[(reference, h)] if r.summary["seed"] not in drop]
                b = [r for r in groups[(arm, h)] if r.summary["seed"] not in drop]
                if not a or not b:
                    continue
                pa, pb = _by_seed(a, "best_val_ppl"), _by_seed(b, "best_val_ppl")
                margin = margin_pct / 100 * float(np.mean(list(pa.values())))
                ppl = compare(pa, pb)
                welch = welch_difference(list(pa.values()), list(pb.values()))
                epoch = compare(_by_seed(a, "best_epoch"), _by_seed(b, "best_epoch"))
                target = float(np.mean(list(pa.values())))
                ta = {r.summary["seed"]: r.tokens_to_reach(target) for r in a}
                tb = {r.summary["seed"]: r.tokens_to_reach(target) for r in b}
                never = sum(v is None for v in tb.values())
                reach = None if never or None in ta.values() else compare(
                    {s: v / 1e6 for s, v in ta.items()}, {s: v / 1e6 for s, v in tb.items()})
                rows.append(dict(arm=arm, heads=h, subset=subset, ppl=ppl, welch=welch, epoch=epoch, margin=margin,
                                 censored=sum(r.censored for r in a + b), reach=reach, never=never, n_b=len(b),
                                 reached_pairs=_reached_pairs(a, b), p=ppl.p, tost=ppl.tost_p(margin)))
    for r in rows:
        r["in_family"] = family is None or r["arm"] in family
    main = [r for r in rows if r["subset"] == "all" and r["in_family"]]
    for key in ("p", "tost"):
        for r, adj in zip(main, holm([r[key] for r in main])):
            r[f"{key}_holm"] = adj
    for r in rows:  # a pre-declared-seed row is adjusted in the family as it would have been: its own p
        if not r["in_family"]:  # in place of its all-seeds row's; rows outside the family stay unadjusted
            r["p_holm"], r["tost_holm"] = r["p"], r["tost"]
        elif r["subset"] == "declared":
            parent = next(i for i, x in enumerate(main) if (x["arm"], x["heads"]) == (r["arm"], r["heads"]))
            for key in ("p", "tost"):
                ps = [x[key] for x in main]
                ps[parent] = r[key]
                r[f"{key}_holm"] = holm(ps)[parent]
    return rows


def comparison_section(groups, plotted, arms, reference: str, margin_pct: float, added: dict,
                       has_lr: bool = False, family: list[str] | None = None) -> list[str]:
    rows = comparisons(groups, plotted, arms, reference, margin_pct, added, family)
    n_family = sum(r["subset"] == "all" and r["in_family"] for r in rows)
    family_text = (f"over the {n_family} rows on all seeds (the report's verdict family)" if family is None else
                   f"over the {n_family} rows on all seeds of the declared verdict family ({', '.join(family)}); "
                   "rows of other arms are exploratory, unadjusted (p and its \"adjusted\" value are equal)")
    kinds = {r["ppl"].kind for r in rows}
    lines = [f"## Each arm − `{reference}`, per head count", "",
             f"Negative = the arm is lower than `{reference}`. Arms that share seeds are compared **paired by "
             "seed** (a seed fixes the data order and, for most arms, the starting function): the mean of the "
             "per-seed differences with a t interval on pairs − 1 degrees of freedom; arms sharing fewer than two "
             "seeds get Welch's interval. Welch's interval is shown beside the paired one for this release, so "
             "readers can see what pairing changed. p: the two-sided paired (or Welch) t test of no difference; "
             f"equivalence: two one-sided tests (TOST) that the difference lies within ±{margin_pct:g}% of "
             f"`{reference}`'s mean best validation perplexity at that head count (the margin declared before "
             f"the runs). Both p values are Holm-adjusted {family_text}; the verdict uses the adjusted values at "
             "α = 0.05 and names what the unadjusted intervals alone would say (a row on the pre-declared seeds "
             "alone is adjusted in the family in place of its row). "
             "\"Level\" means equivalence shown; \"no difference detected\" alone is not \"level\". Reached: pairs "
             f"whose run reached its own seed's `{reference}` best. Tokens to reach: to `{reference}`'s mean "
             "best, paired difference in millions. No epoch verdict when a run's best came at its last epoch "
             "(censored)." + (" Arms run with one seed only are left out here (no interval); they are in the "
                               "table above" + (" and under Learning rate." if has_lr else ".")
                               if plotted != groups else ""), "",
             "| arm | heads | seeds | Δ best val ppl [95% CI] | Welch [95% CI] | p (Holm) | margin | equivalence p "
             "(Holm) | Δ epoch of best [95% CI] | reached | Δ tokens to reach [95% CI] | verdict |",
             "| --- | ---: | --- | --- | --- | --- | ---: | --- | --- | ---: | --- | --- |"]
    for r in rows:
        ppl, epoch = r["ppl"], r["epoch"]
        seeds = f"{ppl.n_a} pairs" if ppl.kind == "paired" else f"{ppl.n_a}, {ppl.n_b} (Welch)"
        if r["subset"] == "declared":
            seeds += ", pre-declared only"
        reach = f"{r['never']} of {r['n_b']} never reached" if r["never"] else (
            _ci(r["reach"]) + "M" if r["reach"] is not None else "–")
        word = verdict(ppl, epoch, name=r["arm"], censored=r["censored"], p_adj=r["p_holm"],
                       tost_adj=r["tost_holm"], margin=r["margin"])
        lines.append(f"| {r['arm']} | {r['heads']} | {seeds} | {_ci(ppl)} | {_ci(r['welch'])} | "
                     f"{_fmt_p(r['p'])} ({_fmt_p(r['p_holm'])}) | ±{r['margin']:.2f} | "
                     f"{_fmt_p(r['tost'])} ({_fmt_p(r['tost_holm'])}) | "
                     f"{_ci(epoch, 1) if not r['censored'] else 'censored'} | "
                     f"{r['reached_pairs'][0]} of {r['reached_pairs'][1]} | {reach} | {word} |")
    if "paired" in kinds:
        lines += ["", "Verdicts that survive Holm (all seeds): " + (", ".join(
            f"`{r['arm']}` at {r['heads']} ({'differs' if r['p_holm'] < 0.05 else 'level'})"
            for r in rows if r["subset"] == "all" and r["in_family"] and (r["p_holm"] < 0.05 or r["tost_holm"] < 0.05))
            or "none") + "."]
    return lines


def _millions(x: float) -> str:
    return f"{x / 1e6:.2f}M"


def _figures(groups, plotted, families, study_lr: float, out: Path, colors: dict) -> list[str]:
    """Every figure of the report (file names under `out`)."""
    figs = [_curves(plotted, out, colors),
            _scaling(plotted, out, colors, "best_val_ppl", "best validation perplexity", "best_val_ppl_vs_heads.png",
                     "Best validation perplexity vs heads"),
            _scaling(plotted, out, colors, "best_epoch", "epoch of best validation", "best_epoch_vs_heads.png",
                     "Epoch of best validation vs heads")]
    loss_fig = _loss_steps(plotted, out, colors)
    if loss_fig:
        figs.append(loss_fig)
    if families:
        figs.append(_lr_figure(families, study_lr, out, colors))
    return figs


def header_section(title: str, runs, dirs, arms: list[str], cfg: dict) -> list[str]:
    """Title, the study config, and what each arm sets."""
    m, d, o, t = cfg["model"], cfg["data"], cfg["optim"], cfg["train"]
    arm_lines = []
    for arm in arms:
        keys = sorted({k for r in runs if r.arm == arm for k in r.arm_keys})
        sets = sorted({f"{k}={config_value(r.summary['config'], k)}" for r in runs if r.arm == arm for k in keys})
        arm_lines.append(f"- `{arm}`: {' '.join(f'`{x}`' for x in sets) or '(the study config as is)'}")
    return [f"# {title}", "",
            f"{len(runs)} finished runs from {', '.join(str(x) for x in dirs)}. Model: {m['n_layer']} layers, "
            f"d={m['n_embd']}, block {m['block_size']}, vocab {m['vocab_size']} ({d['tokenizer']}); data "
            f"{d['dataset']} ({_splits(d)})" +
            f"; {t['epochs']} epochs, batch {t['batch_size']}, AdamW lr {o['lr']}, warmup {o['warmup_steps']} "
            f"steps, cosine to {o['min_lr_ratio']}×lr, weight decay {o['weight_decay']} (unless an arm sets "
            "otherwise).", "", "Arms (what each sets on top of the study config):", "", *arm_lines, ""]


def results_section(groups, reference: str, added: dict) -> list[str]:
    """The table of every (arm, heads): parameters, best validation, epoch of best, tokens to reach, test."""
    targets = reach_targets(groups, reference)
    lines = ["## Results (ours)", "",
             f"Tokens to reach: training tokens until validation perplexity first reached `{reference}`'s mean "
             f"best validation perplexity at that head count, interpolated in log "
             "perplexity between evaluations; mean ± std over the runs that reached it.", "",
             "| arm | heads | learned params | best val ppl | epoch of best | best at last epoch | tokens to reach | "
             "test ppl | train tok/s (load-dependent) | seeds |",
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
              "perplexity was still falling when training ended, so their epoch of best is a lower bound. "
              "\"train tok/s\" is the machine's throughput while the run trained (other runs shared its cores): "
              "load noise, not a property of the arm; see BENCHMARKS.md for timed comparisons.", ""]
    if added:
        lines += [f"Seeds added after the study started because of a result (the rest were fixed before it): "
                  f"{_added_text(added)}. Each comparison they touch is given twice below: on all seeds and on "
                  "the pre-declared seeds alone.", ""]
    return lines


def lr_section(families, study_lr: float) -> list[str]:
    if not families:
        return []
    return ["", "## Learning rate", "",
            f"Best validation perplexity of arms that differ only in `optim.lr`, as a multiple of the study's "
            f"{study_lr:g} (family: the arm at the study's rate). Each cell: mean over the seeds listed, the "
            "seeds run at every rate of that row (± std when there are several); bold: the row's best rate.",
            "", *lr_table(families, study_lr)]


def paper_section() -> list[str]:
    lines = ["", "## The paper's published numbers (not ours)", "",
             "GPT-2 small (12 layers, d=768), GPT-2 BPE, WikiText-2, 40 epochs, batch 32, one seed, as reported "
             "in the I-Attention paper:", "",
             "| heads | standard best val ppl | canonical best val ppl | standard epoch of best | "
             "canonical epoch of best |", "| ---: | ---: | ---: | ---: | ---: |"]
    for i, h in enumerate(PAPER["heads"]):
        lines.append(f"| {h} | {PAPER['standard']['best_val_ppl'][i]} | {PAPER['canonical']['best_val_ppl'][i]} | "
                     f"{PAPER['standard']['best_epoch'][i]} | {PAPER['canonical']['best_epoch'][i]} |")
    return lines + ["", "Our runs are far smaller models on a cut of the data, so absolute perplexities are not "
                    "comparable with the paper's; compare directions and sizes of the differences.", ""]


def figures_section(figs: list[str], runs, one_seed_arms_left_out: bool, has_lr: bool) -> list[str]:
    lines = ["## Figures", ""]
    if one_seed_arms_left_out:
        lines += ["Figures over heads and epochs show the arms run with several seeds; the one-seed arms are in the "
                  "tables" + (" and the learning-rate figure." if has_lr else "."), ""]
    lines += [f"![{f}]({f})" for f in figs]
    return lines + ["", "## Runs", "", "Every run this report read (each folder keeps config.yaml, summary.json, "
                    "metrics.jsonl and arm.json):", ""] + [f"- `{_display(r.folder)}`" for r in runs] + [""]


def write_report(dirs, out, title: str = "I-Attention study", reference: str = "standard",
                 margin_pct: float = 2.0, added: dict | None = None, family: list[str] | None = None) -> Path:
    """report.md and figures. `margin_pct`: the equivalence margin, in % of the reference's mean best
    validation perplexity at each head count; `added`: {arm: {heads: [seeds]}} added after a result;
    `family`: the arms whose comparisons form the Holm family (default: all)."""
    from iattention.errors import UserError

    out, added = Path(out), added or {}
    if not (isinstance(margin_pct, (int, float)) and math.isfinite(margin_pct) and margin_pct > 0):
        raise UserError(f"--margin {margin_pct} is not an equivalence margin: it must be a finite percentage > 0; "
                        "declare it before the runs, e.g. --margin 2")
    runs = find_runs(dirs)
    groups = group(runs)
    arms = list(dict.fromkeys(a for a, _ in groups))
    if reference not in arms:
        raise UserError(f"reference arm {reference!r} has no runs here (arms: {', '.join(arms)}); pass --reference")
    arms = [reference] + [a for a in arms if a != reference]  # the reference first in every table
    if family is not None:
        unknown = [a for a in family if a not in arms]
        if unknown or not set(family) - {reference}:
            raise UserError(f"--family {','.join(family)}: " + (f"arm(s) {', '.join(map(repr, unknown))} have no runs "
                            "here" if unknown else f"names only the reference {reference!r}, so the Holm family "
                            "would be empty") + f"; name compared arms of {', '.join(arms[1:]) or '(none)'}")
    groups = dict(sorted(groups.items(), key=lambda kv: (kv[0][1], arms.index(kv[0][0]))))
    cfg = next(r for r in runs if r.arm == reference).summary["config"]  # the study config, at its own lr
    study_lr = float(cfg["optim"]["lr"])
    families = lr_families(runs, study_lr)
    # Arms run with one seed only (learning-rate probes) would crowd the figures over heads; they get
    # the learning-rate figure. A study of one seed throughout keeps every arm.
    multi = {a for (a, _), rs in groups.items() if len(rs) > 1}
    plotted = {k: v for k, v in groups.items() if k[0] in multi} if multi else groups
    figs = _figures(groups, plotted, families, study_lr, out, arm_colors(arms))
    lines = [*header_section(title, runs, dirs, arms, cfg), *results_section(groups, reference, added),
             *comparison_section(groups, plotted, arms, reference, margin_pct, added, has_lr=bool(families),
                                 family=family),
             *lr_section(families, study_lr), *paper_section(),
             *figures_section(figs, runs, plotted != groups, bool(families))]
    path = out / "report.md"
    write_text(path, "\n".join(lines))
    return path
