"""when (issue 40): every number of report.md, the figure, and the verdict blocks of README.md and
results/README.md, recomputed from the committed runs (runs/*/summary.json, metrics.jsonl, steps.jsonl,
config.yaml's copy in summary.json) and gpu-session/. The decision rules (D1–D5, D1m) are PLAN.md's; the rules of
report.md's "Why?" section (the shift test, equal fit at canonical's epochs 5–16, "every matched point lower",
the hypotheses' marks) and D2's Holm correction are this file's own, exploratory, written after the first
lease's runs (issue 51, issue 65), not declared in PLAN.md. Usage (repository root):
`.venv/bin/python results/when/analyze.py` (needs no data); `--check` only says whether the committed files are
what the runs give (exit 1 if not).
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from iattention.experiments.stats import paired_difference  # noqa: E402
from iattention.train.schedule import lr_at  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from study import GROUPS, QUEUE, batches, check_batches, group, run_name  # noqa: E402

ROOT = HERE.parent.parent
# Our own protocol at full size (the paper preset: dropout 0.1, warmup 100, cosine decay), the 2026-11-23 grid
OUR_PROTOCOL = ROOT / "results/paper/h100-2026-11-23/runs"
MARGIN = 0.02  # PLAN.md: equivalence margin, a fraction of the reference arm's mean best
VERDICT_FILES = (ROOT / "README.md", ROOT / "results/README.md")


def load_runs() -> dict[tuple[str, int, int], dict]:
    runs = {}
    for arm, heads, seed in QUEUE:
        folder = HERE / "runs" / run_name(arm, heads, seed)
        if (folder / "summary.json").is_file():
            s = json.loads((folder / "summary.json").read_text())
            recs = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
            s["curve"] = {r["epoch"]: r["val_ppl"] for r in recs if r["kind"] == "epoch"}
            s["epochs"] = [r for r in recs if r["kind"] == "epoch"]
            s["start_val_loss"] = next(r["val_loss"] for r in recs if r["kind"] == "start")
            steps = [json.loads(x) for x in (folder / "steps.jsonl").read_text().splitlines() if x.strip()]
            assert [r["step"] for r in steps] == list(range(1, s["steps"] + 1)), folder
            s["step_lr"] = [r["lr"] for r in steps]  # the rate of steps 1, 2, ...
            assert s["n_head"] == heads and s["seed"] == seed and s["eval_dtype"] == "float32", folder
            assert min(s["curve"].values()) == s["best_val_ppl"] or abs(min(s["curve"].values()) / s["best_val_ppl"]
                                                                        - 1) < 1e-12, folder
            runs[(arm, heads, seed)] = s
    return runs


def compare(runs: dict, ref: str, arm: str, heads: int, key: str = "best_val_ppl"):
    """arm − ref paired by seed over the seeds both finished: (Difference, ref's mean over those seeds, seeds)."""
    a = {s: r[key] for (x, h, s), r in runs.items() if x == ref and h == heads}
    b = {s: r[key] for (x, h, s), r in runs.items() if x == arm and h == heads}
    seeds = sorted(set(a) & set(b))
    mean = sum(a[s] for s in seeds) / len(seeds) if seeds else float("nan")
    return paired_difference(a, b), mean, seeds


def fmt(d, ref: float) -> str:
    if not d.has_ci:
        return f"{d.mean:+.2f} ({d.n_a} pair{'s' if d.n_a != 1 else ''}, no interval)"
    return f"{d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] ({100 * d.mean / ref:+.1f}% of {ref:.2f})"


def d1_rule(d, ref: float) -> str:
    """PLAN.md's D1 rule: below 0 → better, above 0 → worse, inside ±2% → level, else not settled."""
    if not d.has_ci:
        return "no verdict (fewer than 2 pairs)"
    if d.high < 0:
        return "canonical better"
    if d.low > 0:
        return "canonical worse"
    if -MARGIN * ref < d.low and d.high < MARGIN * ref:
        return "level"
    return "not settled"


def runs_table(runs: dict) -> list[str]:
    lines = ["| run | params | best val ppl (epoch) | epochs run | test ppl | val ppl at epoch 1 / 6 / 12 | "
             "train tok/s (runs at once: What ran) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (arm, heads, seed), s in runs.items():
        c = s["curve"]
        at = " / ".join(f"{c[e]:.2f}" if e in c else "–" for e in (1, 6, 12))
        lines.append(f"| {run_name(arm, heads, seed)} | {s['params'] / 1e6:.2f}M | {s['best_val_ppl']:.2f} "
                     f"({s['best_epoch']}) | {s['epochs_run']} | {s['test_ppl']:.2f} | {at} | "
                     f"{s['train_tokens_per_s']:,.0f} |")
    return lines


def progress(runs: dict) -> list[str]:
    lines = []
    for prio, (name, _, _) in enumerate(GROUPS, 1):
        members = [r for r in QUEUE if group(r[0], r[1]) == name]
        done = [run_name(*r) for r in members if r in runs]
        cut = [run_name(*r) for r in members if run_name(*r) in started_cut()]
        missing = [run_name(*r) for r in members if r not in runs and run_name(*r) not in cut]
        lines.append(f"- Priority {prio} ({name}{', added 2026-11-26' if prio > 5 else ''}): {len(done)} of "
                     f"{len(members)} runs finished"
                     + (f"; started and cut by the end of the lease: {', '.join(cut)}" if cut else "")
                     + (f"; not run: {', '.join(missing)}" if missing else "") + ".")
    return lines


def gpu_cpu_agreement(runs: dict) -> list[str]:
    lines = []
    for f in sorted((HERE / "gpu-session").glob("eval-cpu-*.json")):
        e = json.loads(f.read_text())
        name = f.stem.removeprefix("eval-cpu-")
        s = next(s for r, s in runs.items() if run_name(*r) == name)
        lines.append(f"- {name}: best validation perplexity {s['best_val_ppl']:.5f} on the H100 (float32, during "
                     f"training) and {e['ppl']:.5f} by `iattn eval --split valid` on the same machine's CPU: "
                     f"{abs(s['best_val_ppl'] / e['ppl'] - 1):.1e} relative.")
    return lines


def figure(runs: dict, path: Path) -> None:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw=dict(width_ratios=(3, 2)))
    for (arm, heads, seed), s in runs.items():
        if heads != 12 or arm not in ("standard", "canonical"):
            continue
        ep = sorted(s["curve"])
        ax.plot(ep, [s["curve"][e] for e in ep], color="tab:blue" if arm == "standard" else "tab:orange",
                marker="o" if arm == "standard" else "s", ms=3, lw=1,
                label=arm if seed == min(x for a, h, x in runs if a == arm and h == 12) else None)
    ax.set(yscale="log", ylim=(80, 400), xlabel="epoch", ylabel="validation perplexity (float32)",
           title="S-warm, 12 heads: every finished seed")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.legend()
    d, ref, seeds = compare(runs, "standard", "canonical", 12)
    per_seed = [runs[("canonical", 12, s)]["best_val_ppl"] - runs[("standard", 12, s)]["best_val_ppl"]
                for s in seeds]
    bx.scatter(seeds, per_seed, color="tab:orange", zorder=3, label="canonical − standard, per seed")
    if d.has_ci:
        bx.axhspan(d.low, d.high, color="tab:orange", alpha=0.2, label="mean, 95% t interval")
        bx.axhline(d.mean, color="tab:orange")
    bx.axhspan(-MARGIN * ref, MARGIN * ref, color="grey", alpha=0.15, label="±2% of standard (margin)")
    bx.axhline(0, color="black", lw=0.8)
    bx.set(xlabel="seed", ylabel="Δ best validation perplexity", xticks=seeds, title="paired by seed")
    bx.legend(fontsize=8, loc="lower right")
    _save(fig, path)


# ---- What the committed runs say about why (issue 51 §2): per seed, then paired by seed ------------------

FIT_EPOCHS = range(5, 17)  # canonical's epochs whose training loss standard's curve is read at (issue 51)


def pairs(runs: dict) -> list[int]:
    return sorted(s for a, h, s in runs if a == "canonical" and h == 12 and ("standard", 12, s) in runs)


def at_best(s: dict) -> dict:
    """The learning rate of the best epoch's last step, and Σ lr over every step up to it."""
    step = s["epochs"][s["best_epoch"] - 1]["step"]
    return dict(step=step, lr=s["step_lr"][step - 1], lr_sum=float(sum(s["step_lr"][:step])))


def lr_analysis(runs: dict) -> dict:
    seeds = pairs(runs)
    out = {arm: {sd: at_best(runs[(arm, 12, sd)]) for sd in seeds} for arm in ("standard", "canonical")}
    for key in ("lr", "lr_sum"):
        out[key] = paired_difference({sd: out["standard"][sd][key] for sd in seeds},
                                     {sd: out["canonical"][sd][key] for sd in seeds})
    return out


def _val_curve(s: dict) -> tuple[np.ndarray, np.ndarray]:
    """(epochs, validation loss) from the start evaluation (epoch 0) on."""
    ep = [0] + [r["epoch"] for r in s["epochs"]]
    return np.array(ep, float), np.array([s["start_val_loss"]] + [r["val_loss"] for r in s["epochs"]])


def shift_analysis(runs: dict) -> dict:
    """Each standard epoch up to its best matched to the canonical epoch (linear in epoch between canonical's
    evaluations, on canonical's falling part) with the same validation loss: lag = that epoch − standard's."""
    out = {}
    for sd in pairs(runs):
        std, can = runs[("standard", 12, sd)], runs[("canonical", 12, sd)]
        ce, cv = _val_curve(can)
        ce, cv = ce[:can["best_epoch"] + 1], cv[:can["best_epoch"] + 1]
        assert np.all(np.diff(cv) < 0), f"canonical s{sd} does not fall monotonically to its best"
        se, sv = _val_curve(std)
        lag = {}
        for e, v in zip(se[1:], sv[1:]):
            if cv[-1] <= v <= cv[0]:
                lag[int(e)] = float(np.interp(v, cv[::-1], ce[::-1]) - e)
        falling = [lag[e] for e in lag if e <= std["best_epoch"]]
        mean = float(np.mean(falling[1:]))  # epoch 1 left out: both arms' first epoch is their own transient
        peak = max(lag, key=lambda e: lag[e])
        out[sd] = dict(lag=lag, falling=falling, mean=mean, std_best=std["best_epoch"], can_best=can["best_epoch"],
                       peak=lag[peak], peak_epoch=peak, at_best=lag[std["best_epoch"]],
                       more=can["best_epoch"] - std["best_epoch"], gain=1 - can["best_val_ppl"] / std["best_val_ppl"])
    return out


def _equal_fit(a: dict, b: dict) -> dict[int, float]:
    """b's validation loss minus a's at the same training loss, at b's epochs in FIT_EPOCHS inside a's range
    (a's epoch-mean training loss, linear between its epochs)."""
    at = np.array([r["train_loss"] for r in a["epochs"]])
    av = np.array([r["val_loss"] for r in a["epochs"]])
    assert np.all(np.diff(at) < 0), "training loss not falling"
    return {r["epoch"]: r["val_loss"] - float(np.interp(r["train_loss"], at[::-1], av[::-1]))
            for r in b["epochs"] if r["epoch"] in FIT_EPOCHS and at[-1] <= r["train_loss"] <= at[0]}


def fit_analysis(runs: dict) -> dict:
    """Generalization at equal fit, canonical − standard in nats: at canonical's epochs 5–16 (`gap`), and the
    other way round, at standard's epochs 5–16 (`rev`, sign kept canonical − standard); also whether canonical's
    training loss is above standard's at every epoch both ran."""
    out = {}
    for sd in pairs(runs):
        std, can = runs[("standard", 12, sd)], runs[("canonical", 12, sd)]
        common = range(1, min(len(std["epochs"]), len(can["epochs"])) + 1)
        higher = [can["epochs"][e - 1]["train_loss"] > std["epochs"][e - 1]["train_loss"] for e in common]
        rev = {e: -g for e, g in _equal_fit(can, std).items()}
        out[sd] = dict(gap=_equal_fit(std, can), rev_falling={e: g for e, g in rev.items() if e <= std["best_epoch"]},
                       rev_after={e: g for e, g in rev.items() if e > std["best_epoch"]}, higher=sum(higher),
                       common=len(higher), gain_nats=std["best_val_loss"] - can["best_val_loss"],
                       can_best=can["best_epoch"])
    return out


def hypotheses(runs: dict) -> list[str]:
    """Each candidate explanation marked by what the committed runs support or rule out (the rule in words)."""
    fit, shift = fit_analysis(runs), shift_analysis(runs)
    n = len(fit)
    higher_all = all(f["higher"] == f["common"] for f in fit.values())
    gaps = [g for f in fit.values() for g in f["gap"].values()]
    rev = [g for f in fit.values() for g in f["rev_falling"].values()]
    not_shift = all(s["gain"] > 0 and s["more"] > 0 and s["at_best"] < s["peak"] / 2 for s in shift.values())
    sh = {k: (min(s[k] for s in shift.values()), max(s[k] for s in shift.values())) for k in
          ("peak", "at_best", "more", "gain")}
    e1 = {a: _span(runs, a, 1) for a in ("canonical", "standard")}
    s0 = {a: [r["start_val_loss"] for (x, h, _), r in runs.items() if x == a and h == 12]
          for a in ("canonical", "standard")}
    s0 = {a: f"{np.exp(min(v)):,.0f}–{np.exp(max(v)):,.0f}" for a, v in s0.items()}
    return [
        "- **Better optimization** (canonical fits the training set faster): "
        + ("**ruled out**: canonical's training loss is above standard's at every epoch both ran, in all "
           f"{n} seeds." if higher_all else "**open**: canonical's training loss is not above standard's at every "
                                            "epoch."),
        "- **A slower effective learning rate** (canonical is standard delayed): "
        + (f"**open**; a pure delay is **ruled out**: canonical lags by up to {sh['peak'][0]:.2f}–{sh['peak'][1]:.2f} "
           f"epochs while both fall, but the lag shrinks to between {sh['at_best'][0]:+.2f} and "
           f"{sh['at_best'][1]:+.2f} by "
           f"standard's best, and canonical keeps falling {sh['more'][0]}–{sh['more'][1]} epochs longer, to a best "
           f"{100 * sh['gain'][0]:.1f}–{100 * sh['gain'][1]:.1f}% lower, in every seed; whether standard at a lower "
           "rate does the same is D2's question (next section)." if not_shift else
           "**open**: the shift test does not separate canonical from a delayed standard in every seed."),
        "- **Better generalization** (lower validation loss at the same training loss): "
        + (f"**supported**: canonical's validation loss is lower at all {len(gaps)} of its epochs "
           f"{FIT_EPOCHS.start}–{FIT_EPOCHS.stop - 1} matched to standard's fit ({n} seeds, {min(gaps):+.3f} to "
           f"{max(gaps):+.3f} nats), and at all {len(rev)} of standard's epochs up to its best matched the other way "
           f"({min(rev):+.3f} to {max(rev):+.3f}); the largest gap of each seed is "
           + ("at least" if all(-min(f["gap"].values()) >= f["gain_nats"] for f in fit.values()) else "below")
           + " its gain in best validation loss." if gaps and max(gaps) < 0 and max(rev) < 0 else
           "**ruled out**: canonical's validation loss is higher at every matched point." if gaps and min(gaps) > 0
           else "**open**: the sign differs between matched points: " + sign_split(fit) + "."),
        "- **A different starting function**: **open**. Both start near the same validation perplexity "
        f"(epoch 0: canonical {s0['canonical']}, standard {s0['standard']}), but after epoch 1 canonical's is "
        f"{e1['canonical']} against {e1['standard']}; `canonical-matched` (`model.init=matched`, batch 2) starts "
        "canonical from standard's very function and separates the two.",
    ]


def analyses_report(runs: dict) -> list[str]:
    lr, shift, fit = lr_analysis(runs), shift_analysis(runs), fit_analysis(runs)
    seeds = pairs(runs)
    lines = ["## Why? What the committed runs already show (issue 51 §2; exploratory: `analyze.py`'s rules, not "
             "PLAN.md's)", "",
             "### Learning rate at the best epoch (`lr_at_best.png`)", "",
             "The rate of the best epoch's last step and Σ lr over every step up to it, from `steps.jsonl`.", "",
             "| seed | standard: best epoch, lr, Σ lr | canonical: best epoch, lr, Σ lr |", "| ---: | --- | --- |"]
    for sd in seeds:
        a, b = lr["standard"][sd], lr["canonical"][sd]
        lines.append(f"| {sd} | {runs[('standard', 12, sd)]['best_epoch']}, {sci(a['lr'], 2)}, {a['lr_sum']:.4f} | "
                     f"{runs[('canonical', 12, sd)]['best_epoch']}, {sci(b['lr'], 2)}, {b['lr_sum']:.4f} |")
    lines += ["", f"Paired (canonical − standard): lr at the best {sci(lr['lr'].mean, 2)} "
              f"[{sci(lr['lr'].low, 2)}, {sci(lr['lr'].high, 2)}], Σ lr {lr['lr_sum'].mean:+.4f} "
              f"[{lr['lr_sum'].low:+.4f}, {lr['lr_sum'].high:+.4f}]. Standard's best comes at a lower rate and after "
              "less summed rate in every seed." if all(lr["standard"][sd]["lr_sum"] < lr["canonical"][sd]["lr_sum"]
                                                       for sd in seeds) else "", "",
              "![lr_at_best](lr_at_best.png)", "", "### Shift test (`shift.png`)", "",
              "Each standard epoch matched to the canonical epoch (interpolated linearly between canonical's "
              "evaluations, from its start to its best) with the same validation loss; lag = that epoch minus "
              "standard's. The mean leaves out epoch 1 (both arms' first-epoch transient).", "",
              "| seed | lag at standard's epochs 1, 2, … up to its best | mean (epochs 2–best) | largest (epoch) | at "
              "standard's best | best epoch, standard / canonical | best, standard / canonical |",
              "| ---: | --- | ---: | ---: | ---: | --- | --- |"]
    for sd in seeds:
        s = shift[sd]
        best = [runs[(arm, 12, sd)]["best_val_ppl"] for arm in ("standard", "canonical")]
        lines.append(f"| {sd} | {', '.join(f'{x:+.2f}' for x in s['falling'])} | {s['mean']:+.2f} | "
                     f"{s['peak']:+.2f} ({s['peak_epoch']}) | {s['at_best']:+.2f} | {s['std_best']} / "
                     f"{s['can_best']} | {best[0]:.2f} / {best[1]:.2f} ({100 * s['gain']:.1f}% lower) |")
    lines += ["", "A pure delay would keep the lag constant and give canonical standard's best perplexity, later; "
              "the hypotheses below say what the table shows.", "",
              "![shift](shift.png)", "", "### Generalization at equal fit (`equal_fit.png`)", "",
              f"Canonical's validation loss at each of its epochs {FIT_EPOCHS.start}–{FIT_EPOCHS.stop - 1} minus "
              "standard's validation loss at the same training loss (standard's epoch-mean training loss, "
              "interpolated linearly between its epochs; training loss is the mean over the epoch, validation is "
              "at its end, the same for both arms).", "",
              "| seed | Δ val loss at equal training loss (nats), canonical's epochs "
              f"{FIT_EPOCHS.start}–{FIT_EPOCHS.stop - 1} | range | mean | the other way: standard's epochs up to its "
              "best / after it | gain in best val loss (nats) | epochs with canonical's training loss higher |",
              "| ---: | --- | --- | ---: | --- | ---: | ---: |"]
    for sd in seeds:
        f = fit[sd]
        g, rf, ra = list(f["gap"].values()), list(f["rev_falling"].values()), list(f["rev_after"].values())
        lines.append(f"| {sd} | {', '.join(f'{x:+.3f}' for x in g)} | {min(g):+.3f} to {max(g):+.3f} | "
                     f"{np.mean(g):+.3f} | {min(rf):+.3f} to {max(rf):+.3f} / "
                     + (f"{min(ra):+.3f} to {max(ra):+.3f}" if ra else "none") + f" | {f['gain_nats']:.3f} | "
                     f"{f['higher']} of {f['common']} |")
    lines += ["", "![equal_fit](equal_fit.png)", "",
              "### Hypotheses, marked by the data (exploratory rules, in each line)", ""] + hypotheses(runs)
    return lines


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _two_panels():
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    return fig, ax, bx, plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _zero_panel(ax, **labels) -> None:
    """A per-seed panel of differences: the zero line, its labels, its legend."""
    ax.axhline(0, color="black", lw=0.8)
    ax.set(**labels)
    ax.legend(fontsize=8)


def lr_figure(runs: dict, path: Path) -> None:
    lr, seeds = lr_analysis(runs), pairs(runs)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, label in ((axes[0], "lr", "lr at the best epoch"), (axes[1], "lr_sum", "Σ lr up to the best")):
        for arm, color, dx in (("standard", "tab:blue", -0.1), ("canonical", "tab:orange", 0.1)):
            ax.scatter([sd + dx for sd in seeds], [lr[arm][sd][key] for sd in seeds], color=color, label=arm)
        for sd in seeds:
            ax.plot([sd - 0.1, sd + 0.1], [lr["standard"][sd][key], lr["canonical"][sd][key]], color="grey", lw=0.8)
        ax.set(xlabel="seed", ylabel=label, xticks=seeds, title=f"{label}, per seed (paired)")
        ax.legend(fontsize=8)
    _save(fig, path)


def shift_figure(runs: dict, path: Path) -> None:
    shift, seeds = shift_analysis(runs), pairs(runs)
    fig, ax, bx, colors = _two_panels()
    for i, sd in enumerate(seeds):
        std, can = runs[("standard", 12, sd)], runs[("canonical", 12, sd)]
        se, sv = _val_curve(std)
        ce, cv = _val_curve(can)
        ax.plot(ce[1:], np.exp(cv[1:]), color=colors[i], lw=1.2, label=f"canonical s{sd}")
        ax.plot(se[1:] + shift[sd]["mean"], np.exp(sv[1:]), color=colors[i], lw=1, ls="--",
                label=f"standard s{sd}, shifted {shift[sd]['mean']:+.2f}")
        e = list(range(1, len(shift[sd]["falling"]) + 1))
        bx.plot(e, shift[sd]["falling"], color=colors[i], marker="o", ms=3, label=f"seed {sd}")
        bx.axvline(std["best_epoch"], color=colors[i], lw=0.6, ls=":")
    ax.set(yscale="log", ylim=(80, 300), xlim=(3, 20), xlabel="epoch", ylabel="validation perplexity",
           title="canonical against standard delayed by its mean lag")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks([80, 90, 100, 120, 150, 200, 300])
    ax.legend(fontsize=7, ncol=2)
    _zero_panel(bx, xlabel="standard's epoch", ylabel="lag (epochs) to canonical's equal validation loss",
                title="lag per epoch, up to standard's best (dotted)")
    _save(fig, path)


def fit_figure(runs: dict, path: Path) -> None:
    fit, seeds = fit_analysis(runs), pairs(runs)
    fig, ax, bx, colors = _two_panels()
    for i, sd in enumerate(seeds):
        for arm, ls in (("standard", "--"), ("canonical", "-")):
            ep = runs[(arm, 12, sd)]["epochs"]
            ax.plot([r["train_loss"] for r in ep], [r["val_loss"] for r in ep], color=colors[i], ls=ls, lw=1,
                    marker="o" if arm == "standard" else "s", ms=2.5,
                    label=f"canonical s{sd}" if arm == "canonical" else "standard (dashed), every seed"
                    if sd == seeds[0] else None)
        e = sorted(fit[sd]["gap"])
        bx.plot(e, [fit[sd]["gap"][x] for x in e], color=colors[i], marker="o", ms=3, label=f"seed {sd}")
    ax.set(xlim=(5.9, 2.9), ylim=(4.45, 5.2), xlabel="training loss (epoch mean; falls to the right)",
           ylabel="validation loss", title="validation against training loss (solid: canonical)")
    ax.legend(fontsize=7)
    _zero_panel(bx, xlabel="canonical's epoch", ylabel="Δ validation loss at equal training loss (nats)",
                title="canonical − standard at equal fit")
    _save(fig, path)


def sci(x: float, digits: int = 1) -> str:
    """4.2e-4, not 4.2e-04."""
    mantissa, power = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(power)}"


def regime(runs: dict) -> str:
    """What the S-warm runs trained on, from their configs and step logs (PLAN.md names a flat peak after the
    warmup; whether any run reached it is the data's to say)."""
    warm = [r for (a, _, _), r in runs.items() if a in ("standard", "canonical")]
    optim = {json.dumps(r["config"]["optim"], sort_keys=True) for r in warm}
    assert len(optim) == 1, "the S-warm runs differ in their optimizer settings"
    o = json.loads(optim.pop())
    assert o["min_lr_ratio"] == 1.0 and all(r["config"]["model"]["dropout"] == 0.0 for r in warm)
    last = [r["steps"] for r in warm]
    top = max(max(r["step_lr"]) for r in warm)
    past = sum(n > o["warmup_steps"] for n in last)
    head = f"no dropout and nanoGPT's {o['warmup_steps']:,}-step linear warmup towards lr {sci(o['lr'])}, flat after it"
    if past == 0:
        return (f"{head}; every run stopped early inside the warmup, at step {min(last):,}–{max(last):,}, so each "
                f"trained on a pure linear ramp, reaching at most lr {sci(top)}")
    return f"{head}; {past} of {len(last)} runs went past the warmup (last step {min(last):,}–{max(last):,})"


def d1_missing(runs: dict) -> list[str]:
    """The declared D1 runs (QUEUE's first priority) not finished, each said as what happened to it."""
    said = []
    for r in [r for r in QUEUE if group(r[0], r[1]) == "replicate"]:
        if r in runs:
            continue
        name = run_name(*r)
        said.append(f"{name} {'was cut by the end of the lease' if name in started_cut() else 'did not run'}")
    return said


def started_cut() -> list[str]:
    """Runs gpu-session/queue.log started and never ended (the lease ran out), and that no later session
    finished."""
    log = HERE / "gpu-session" / "queue.log"
    text = log.read_text() if log.exists() else ""
    started = re.findall(r"^\S+ start (\S+):", text, flags=re.M)
    ended = set(re.findall(r"^\S+ end (\S+):", text, flags=re.M))
    return [n for n in started if n not in ended and not (HERE / "runs" / n / "summary.json").exists()]


def _first_lease_log() -> str:
    log = HERE / "gpu-session" / "queue.log"
    return log.read_text() if log.exists() else ""


def cut_then_finished() -> dict[str, dict]:
    """Runs the first lease's queue.log started and never ended (cut by the lease's end) that a later window
    finished (committed under runs/): {name: {"at": its start time there, "patience": its patience there}}."""
    text = _first_lease_log()
    ended = set(re.findall(r"^\S+ end (\S+):", text, flags=re.M))
    return {m.group(2): dict(at=m.group(1), patience=re.search(r"train\.patience=\d+", m.group(3)).group(0))
            for m in re.finditer(r"^(\S+) start (\S+): (.*)$", text, flags=re.M)
            if m.group(2) not in ended and (HERE / "runs" / m.group(2) / "summary.json").exists()}


def windows() -> list[dict]:
    """Each committed GPU window (gpu-session/window-<UTC start>/, written by study.py unpack): its folder, the
    card (window.log's nvidia-smi line), the commands it held (one "when window: start" line each), the most runs
    the queue had going at once, the runs it finished, and the runs cut by a command's deadline with the epoch
    each was cut after and whether a later command resumed it (queue.log's start/end/cut lines)."""
    out = []
    for folder in sorted((HERE / "gpu-session").glob("window-*")):
        wlog = (folder / "window.log").read_text()
        card = re.search(r"^when window: start .*\n([^,\n]+),", wlog, flags=re.M)
        going, most, cuts, resumed, ended, secs, since = set(), 0, {}, set(), [], {}, {}
        for m in re.finditer(r"^(\S+) (start|end|cut) (\S+):(.*)$", (folder / "queue.log").read_text(), flags=re.M):
            at, kind, name, rest = m.groups()
            if kind == "start":
                since[name] = clock(at)
            else:
                secs[name] = secs.get(name, 0) + clock(at) - since[name]
            if kind == "start":
                going.add(name)
                most = max(most, len(going))
                if "--resume" in rest.split() and name in cuts:
                    resumed.add(name)
            else:
                going.discard(name)
                if kind == "cut":
                    cuts[name] = int(re.search(r"after epoch (\d+)", rest).group(1))
                elif name not in ended:
                    ended.append(name)
        out.append(dict(folder=folder.name, card=card.group(1) if card else "?", commands=wlog.count("when window: start"),
                        most=most, ended=ended, cuts=cuts, resumed=resumed, secs=secs))
    return out


def clock(stamp: str) -> int:
    """Seconds into the day of a queue line's time (HH:MM:SS, or a UTC stamp ending in HH:MM:SSZ; the windows so
    far each lie inside one UTC day)."""
    h, m, sec = map(int, stamp.rstrip("Z")[-8:].split(":"))
    return 3600 * h + 60 * m + sec


def first_lease_at_once() -> str:
    """How the first lease's queue (gpu-session/queue.log) shared the card: the most runs at once and how long its
    first runs took from their common start to their end lines."""
    going, most, start, took = set(), 0, {}, []
    for at, kind, name in re.findall(r"^(\S+) (start|end) (\S+):", _first_lease_log(), flags=re.M):
        if kind == "start":
            going.add(name)
            start[name] = clock(at)
            most = max(most, len(going))
        else:
            going.discard(name)
            took.append((name, clock(at) - start[name]))
    first = [t for n, t in took[:most]]
    return (f"- the first lease (`gpu-session/queue.log`; batch 1's own log was not kept): at most {most} runs on the "
            f"card at once; its first {len(first)} runs ended {min(first)}–{max(first)} s after they started.") \
        if first else ""


def window_notes(runs: dict) -> list[str]:
    """One line per committed GPU window: where, how many runs at once, and what a deadline cut and a resume did."""
    lines = [first_lease_at_once()] if first_lease_at_once() else []
    for w in windows():
        text = (f"- `gpu-session/{w['folder']}/`: {w['card']}, {w['commands']} command(s) in one lease, at most "
                f"{w['most']} run(s) on the card at once; finished {', '.join(w['ended']) or 'none'}, taking "
                + ", ".join(f"{w['secs'][n]} s" for n in w["ended"]) + " from start to end line (a cut run's "
                "commands summed).")
        for name, epoch in w["cuts"].items():
            done = (HERE / "runs" / name / "summary.json").exists()
            text += (f" {name} was cut by a command's deadline after epoch {epoch}; "
                     + (f"the next command on the same machine resumed it from its last checkpoint (`--resume`)"
                        + (f", to epoch {runs[run_key(name)]['epochs_run']}" if done else "")
                        if name in w["resumed"] else "it was not resumed there") + ".")
        lines.append(text)
    return lines


def run_key(name: str) -> tuple[str, int, int]:
    return next(r for r in QUEUE if run_name(*r) == name)


def batch_of(name: str) -> int:
    return next(i for i, b in enumerate(batches(), 1) if run_key(name) in b)


def _keys(d: dict, prefix: str = "") -> set[str]:
    return {k for key, v in d.items() for k in (_keys(v, f"{prefix}{key}.") if isinstance(v, dict)
                                                  else {f"{prefix}{key}"})}


def newer_code(runs: dict, *names: str) -> str:
    """What the run files say about the code these reruns ran on against the first lease's finished runs: the
    config keys theirs have and none of the first lease's has (the files record no commit)."""
    ended = set(re.findall(r"^\S+ end (\S+):", _first_lease_log(), flags=re.M))
    first = set.union(*(_keys(runs[run_key(n)]["config"]) for n in ended))
    new = set.intersection(*(_keys(runs[run_key(n)]["config"]) for n in names)) - first
    if not new:
        return "on code whose config keys are the first lease's (the run files record no commit)"
    return (f"on newer code: {'their' if len(names) > 1 else 'its'} config.yaml has keys that none of the first "
            f"lease's {len(ended)} finished runs has, {', '.join(f'`{k}`' for k in sorted(new))} (the run files "
            "record no commit)")


def sign_flip(runs: dict, arm: str = "canonical", ref: str = "standard") -> tuple[float, float, int]:
    """The exact two-sided sign-flip (permutation) test of the paired differences arm − ref: (its p, the smallest p
    it can give with these pairs, 2 / 2^n, the number of pairs)."""
    _, _, seeds = compare(runs, ref, arm, 12)
    d = np.array([runs[(arm, 12, s)]["best_val_ppl"] - runs[(ref, 12, s)]["best_val_ppl"] for s in seeds])
    flips = np.array(list(itertools.product((1, -1), repeat=len(d))))
    means = np.abs((flips * d).mean(axis=1))
    return float(np.mean(means >= abs(d.mean()) - 1e-12)), 2 / 2 ** len(d), len(d)


def sign_flip_words(runs: dict) -> str:
    p, floor, n = sign_flip(runs)
    return (f"Beside the t interval: with {n} pairs an exact two-sided sign-flip test cannot give p below "
            f"2/2^{n} = {floor:.4g}; here it gives p = {p:.4g}" + (" (its floor)." if p <= floor else "."))


def early_words(runs: dict) -> str:
    """Canonical against standard after epochs 1 and 6 and at the epoch of best, each counted over the seed pairs."""
    seeds = pairs(runs)
    above = {e: sum(runs[("canonical", 12, sd)]["curve"][e] > runs[("standard", 12, sd)]["curve"][e] for sd in seeds)
             for e in (1, 6)}
    later = sum(runs[("canonical", 12, sd)]["best_epoch"] > runs[("standard", 12, sd)]["best_epoch"] for sd in seeds)
    return (f"Canonical's validation perplexity is above standard's after epoch 1 in {above[1]} of {len(seeds)} seeds "
            f"({_span(runs, 'canonical', 1)} against {_span(runs, 'standard', 1)}) and after epoch 6 in {above[6]} of "
            f"{len(seeds)} ({_span(runs, 'canonical', 6)} against {_span(runs, 'standard', 6)}); its best epoch is "
            f"later in {later} of {len(seeds)}")


def overfit_words(runs: dict) -> str:
    """How many S-warm standard runs' validation loss rose at every epoch after their best while their training
    loss fell at every epoch: the words behind "overfits"."""
    std = [r for (a, h, _), r in runs.items() if a == "standard" and h == 12]
    assert all(r["config"]["model"]["dropout"] == 0.0 for r in std)
    ep = [[e for e in r["epochs"]] for r in std]
    rose = sum(all(b["val_loss"] > a["val_loss"] for a, b in zip(e[r["best_epoch"] - 1:], e[r["best_epoch"]:])) and
               all(b["train_loss"] < a["train_loss"] for a, b in zip(e, e[1:])) for r, e in zip(std, ep))
    return (f"in {rose} of its {len(std)} runs its validation loss rose at every epoch after its best while its "
            "training loss kept falling")


def our_protocol() -> dict[str, dict]:
    """The full-size grid under our own protocol (bf16-evaluated), by run name."""
    return {f.parent.name: json.loads(f.read_text()) for f in sorted(OUR_PROTOCOL.glob("*/summary.json"))}


def protocol_words(s: dict) -> str:
    c = s["config"]
    return (f"dropout {c['model']['dropout']:g}, warmup {c['optim']['warmup_steps']}, "
            f"{c['optim'].get('schedule', 'cosine')} decay to {c['optim']['min_lr_ratio']:g}×")


def baseline_context(runs: dict) -> tuple[str, dict]:
    """S-warm's standard against our protocol's 12-head standard: the baseline the win is against."""
    ours = our_protocol()
    std = sorted(s["best_val_ppl"] for n, s in ours.items() if n.startswith("standard-h12-"))
    warm = [r["best_val_ppl"] for (a, h, _), r in runs.items() if a == "standard" and h == 12]
    can = [r["best_val_ppl"] for (a, h, _), r in runs.items() if a == "canonical" and h == 12]
    mean = sum(warm) / len(warm)
    up = sorted(100 * (mean / x - 1) for x in std)
    can_up = (100 * (min(can) / max(std) - 1), 100 * (max(can) / min(std) - 1))
    proto = protocol_words(next(s for n, s in ours.items() if n.startswith("standard-h12-")))
    text = (f"The baseline it beats is not our protocol's: under our own protocol ({proto}; evaluated under bf16 "
            f"autocast, `results/paper/h100-2026-11-23/`) the same 12-head standard reaches "
            f"{std[0]:.2f}–{std[-1]:.2f} ({len(std)} seeds), while S-warm's standard best averages {mean:.2f} "
            f"({len(warm)} seeds), {up[0]:.0f}–{up[-1]:.0f}% higher, and even canonical's S-warm best "
            f"({min(can):.2f}–{max(can):.2f}) is {can_up[0]:.0f}–{can_up[1]:.0f}% above it")
    return text, dict(std=std, mean=mean, up=up, can_up=can_up)


def does_not(ours: dict) -> str:
    """At full size under our protocol: one head, and twelve heads paired by seed."""
    h1 = ours["canonical-h1-s0"]["best_val_ppl"] / ours["standard-h1-s0"]["best_val_ppl"] - 1
    seeds = sorted(int(n.rsplit("-s", 1)[1]) for n in ours if n.startswith("standard-h12-")
                   and n.replace("standard", "canonical") in ours)
    rel = [ours[f"canonical-h12-s{s}"]["best_val_ppl"] / ours[f"standard-h12-s{s}"]["best_val_ppl"] - 1
           for s in seeds]
    return (f"**When it does not:** at one head at full size under our protocol it is worse ({100 * h1:+.1f}%, one "
            "seed; at one head in the CPU studies too: verdict table in `results/README.md`), and at 12 heads under "
            "our protocol it differs from standard by " + " and ".join(f"{100 * x:+.2f}%" for x in rel)
            + f" on {len(seeds)} seed pairs, too few to test equivalence.")


def sign_split(fit: dict) -> str:
    """How many of the equal-fit points (canonical's epochs, then standard's up to its best) are lower, and where
    the others are."""
    gaps = [(sd, e, g) for sd, f in fit.items() for e, g in f["gap"].items()]
    rev = [(sd, e, g) for sd, f in fit.items() for e, g in f["rev_falling"].items()]
    up = [f"{g:+.3f} nats at seed {sd}'s canonical epoch {e} ({e - fit[sd]['can_best']:+d} from its best)"
          for sd, e, g in gaps if g >= 0]
    return (f"canonical's validation loss is lower at {sum(g < 0 for *_, g in gaps)} of {len(gaps)} of its epochs "
            f"{FIT_EPOCHS.start}–{FIT_EPOCHS.stop - 1} matched to standard's fit ({len(fit)} seeds) and at "
            f"{sum(g < 0 for *_, g in rev)} of {len(rev)} of standard's epochs up to its best matched the other way"
            + (f"; not lower: {', '.join(up)}" if up else ""))


def why(runs: dict) -> str:
    """The committed runs' answer to why, in one sentence (the rules are hypotheses()')."""
    fit = fit_analysis(runs)
    gaps = [g for f in fit.values() for g in f["gap"].values()]
    higher = all(f["higher"] == f["common"] for f in fit.values())
    if not (gaps and max(gaps) < 0 and higher):
        return ("The committed runs do not settle better generalization by `analyze.py`'s exploratory rule (every "
                "matched point lower; not PLAN.md's): " + sign_split(fit) + ".") if gaps and higher else \
            "The committed runs do not single out better generalization (report.md, hypotheses)."
    return (f"The committed runs point (exploratory, by `analyze.py`'s rules, not PLAN.md's) to better generalization, "
            f"not faster optimization: canonical's training loss is "
            f"higher at every epoch, yet at equal training loss its validation loss is {-max(gaps):.3f}–"
            f"{-min(gaps):.3f} nats lower in all {len(fit)} seeds (report.md; whether its different starting "
            "function causes that is open).")


def verdict(runs: dict) -> str:
    """The sentences README.md and results/README.md carry, every number from the runs."""
    written = ("replicate", "learning rate", "matched init")  # the groups the sentences below say what to make of
    later = [a for a, h, _ in runs if group(a, h) not in written]
    if later:
        raise SystemExit(f"analyze.py: runs beyond D1 and D2 are committed ({', '.join(sorted(set(later)))}) but the "
                         "verdict still says they are not run; rewrite verdict() for them")
    d, ref, seeds = compare(runs, "standard", "canonical", 12)
    ep, _, _ = compare(runs, "standard", "canonical", 12, "best_epoch")
    can = [runs[("canonical", 12, s)]["best_val_ppl"] for s in seeds]
    std = [runs[("standard", 12, s)]["best_val_ppl"] for s in seeds]
    lower = sum(c < s for c, s in zip(can, std))
    n_declared = sum(1 for a, h, s in QUEUE if group(a, h) == "replicate" and a == "standard")
    hardware = sorted({r["hardware"] for r in runs.values()})
    rule = d1_rule(d, ref)
    context, _ = baseline_context(runs)
    flip = sign_flip(runs)
    text = (f"**When it helps:** in the one regime where we have seen it win, GPT-2 small on WikiText-2 at 12 heads "
            f"under S-warm (`results/when/`, {' and '.join(hardware)}, float32 evaluation: {regime(runs)}), "
            f"canonical's best validation perplexity is lower on {lower} of {len(seeds)} seed pairs run so far "
            f"({min(can):.2f}–{max(can):.2f} against {min(std):.2f}–{max(std):.2f}): "
            f"Δ {d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] (95% t interval; an exact sign-flip test on these "
            f"{flip[2]} pairs gives p = {flip[0]:.4g}, and none on {flip[2]} pairs can give less than {flip[1]:.4g}), "
            f"{100 * d.mean / ref:+.1f}% of standard's mean, its best "
            f"{abs(ep.mean):.1f} epochs {'later' if ep.mean > 0 else 'earlier'} on average; by the declared rule, "
            f"\"{rule}\" in this regime ({len(seeds)} of the {n_declared} declared pairs; "
            f"{'; '.join(d1_missing(runs)) or 'all finished'}). {context}: the win is against a baseline without "
            f"dropout ({overfit_words(runs)}), not against our own protocol's standard. " + why(runs) + " "
            + d2_sentence(runs) + " " + d1m_sentence(runs) + " Whether it needs the overfitting regime (dropout 0.1) "
            f"or holds at 1, 4 and 8 heads is declared in `results/when/PLAN.md` and not yet run. "
            f"{does_not(our_protocol())}")
    return text


D1M = "canonical-matched"  # PLAN.md amendment 2026-11-26: canonical from standard's initial function, "D1m"
D1M_READINGS = {  # PLAN.md declared the first; the others say what the rule's other outcomes leave
    "level": "the win comes from canonical's start, not from its parameterization (the reading PLAN.md declared)",
    "canonical better": "canonical wins from standard's very start, so the win is not its starting function alone",
    "canonical worse": "from standard's start canonical is worse, so the win needs canonical's own start"}


def d1m(runs: dict):
    """canonical-matched − standard, paired by seed, by D1's rule: (Difference, standard's mean, seeds, rule)."""
    d, ref, seeds = compare(runs, "standard", D1M, 12)
    return d, ref, seeds, d1_rule(d, ref) if seeds else None


def d1m_sentence(runs: dict) -> str:
    """D1m as far as it has run: per run below 2 pairs (no verdict, PLAN.md), else D1's rule and its reading."""
    d, ref, seeds, rule = d1m(runs)
    if not seeds:
        return "Whether it comes from canonical's start (`canonical-matched`) is not yet run."
    best = {(a, s): r["best_val_ppl"] for (a, h, s), r in runs.items() if h == 12}
    per_run = "; ".join(
        f"seed {s} {best[(D1M, s)]:.2f} against standard {best[('standard', s)]:.2f}"
        + (f" and canonical {runs[('canonical', 12, s)]['best_val_ppl']:.2f}" if ("canonical", 12, s) in runs else "")
        for s in seeds)
    head = ("From standard's start (D1m, `canonical-matched`: canonical's parameterization started from the very "
            f"function standard starts from), best validation perplexity {per_run}")
    if not d.has_ci:
        return f"{head}: one seed pair, so no verdict yet (PLAN.md needs 2)."
    reading = "" if rule == "not settled" else f": {D1M_READINGS[rule]}"
    p, floor, n = sign_flip(runs, D1M)
    return (f"{head}: Δ against standard {fmt(d, ref)} (an exact sign-flip test on these {n} pairs gives p = {p:.4g}, "
            f"and none on {n} pairs can give less than {floor:.4g}), by D1's rule \"{rule}\"{reading}.")


def d1m_report(runs: dict) -> list[str]:
    """D1m's runs beside the same seed's standard and canonical: the best, its epoch, and the first epoch's
    validation perplexity (canonical's own start is about four times standard's there: the candidate cause)."""
    lines = ["## D1m: canonical's start or its parameterization? (S-warm, 12 heads, canonical-matched − standard)", ""]
    done = sorted(s for a, h, s in runs if a == D1M and h == 12)
    if not done:
        return lines + ["Not run yet; no verdict."]
    lines += ["| seed | canonical-matched: best (epoch), after epoch 1 | standard | canonical |",
              "| ---: | --- | --- | --- |"]
    for seed in done:
        cells_ = []
        for arm in (D1M, "standard", "canonical"):
            r = runs.get((arm, 12, seed))
            cells_.append(f"{r['best_val_ppl']:.2f} ({r['best_epoch']}), {r['curve'][1]:,.2f}" if r else "–")
        lines.append(f"| {seed} | " + " | ".join(cells_) + " |")
    d, ref, seeds, rule = d1m(runs)
    lines += ["", d1m_sentence(runs)]
    if d.has_ci:
        dc, refc, seedsc = compare(runs, "canonical", D1M, 12)
        lines.append(f"- canonical-matched − canonical (not a declared rule; context): {fmt(dc, refc)}, seeds "
                     f"{', '.join(map(str, seedsc))}.")
    return lines


D2_ARMS = ("standard-lr0.7", "standard-lr0.5")  # PLAN.md D2: standard at a lower peak rate, against canonical ×1.0


def reached(s: dict) -> float:
    """The highest learning rate a run's steps took (steps.jsonl), checked against its config's schedule
    (train/schedule.py's lr_at over the steps it made): under S-warm no run left the warmup, so it is the last
    step's, below the configured peak."""
    o, spe = s["config"]["optim"], s["epochs"][0]["step"]
    total = s["config"]["train"]["epochs"] * spe
    want = max(lr_at(i, total, o["lr"], o["warmup_steps"], o["min_lr_ratio"], o.get("schedule", "cosine"))
               for i in range(s["steps"]))
    top = max(s["step_lr"])
    assert abs(top / want - 1) < 1e-9, (top, want)
    return top


def multiplier(runs: dict, s: dict) -> float:
    """A run's configured peak rate as a multiple of the ×1.0 arms' (standard's and canonical's, one value)."""
    base = {r["config"]["optim"]["lr"] for (a, _, _), r in runs.items() if a in ("standard", "canonical")}
    assert len(base) == 1, base
    return s["config"]["optim"]["lr"] / base.pop()


def rate_words(runs: dict, arm: str, seed: int) -> str:
    """e.g. '×0.7, reached 2.33e-4': the multiplier of the configured peak and the rate the run reached."""
    s = runs[(arm, 12, seed)]
    return f"×{multiplier(runs, s):.1f}, reached {sci(reached(s), 3)}"


def step_ratio(runs: dict, arm: str, seed: int) -> tuple[int, float]:
    """Over the steps this run and standard (same seed) both made: how many, and the largest relative deviation of
    this run's rate from its multiplier times standard's (0 while both are inside the same warmup)."""
    a, b = runs[("standard", 12, seed)]["step_lr"], runs[(arm, 12, seed)]["step_lr"]
    m = multiplier(runs, runs[(arm, 12, seed)])
    return min(len(a), len(b)), max(abs(y / (m * x) - 1) for x, y in zip(a, b))


def d2(runs: dict) -> dict[str, tuple]:
    """Each lowered-rate standard arm − canonical (×1.0), paired by seed (PLAN.md D2): (Difference, canonical's
    mean over those seeds, seeds, PLAN.md's reading or None when there are too few pairs for an interval, the
    reading with "for some multiplier" corrected by Holm over the two arms or None). PLAN.md takes "for some
    multiplier" uncorrected; for an existence claim over two one-sided tests Holm's first step is Bonferroni's,
    so the corrected reading of "equivalent to or better" asks the upper end of the 97.5% interval (one-sided
    1.25%) to be ≤ +2%. "For both above +2%" is an intersection and needs no correction."""
    out = {}
    for arm in D2_ARMS:
        d, ref, seeds = compare(runs, "canonical", arm, 12)
        if not seeds:
            continue
        reading = holm = None
        if d.has_ci:
            reading = ("equivalent to or better than canonical" if d.high <= MARGIN * ref else
                       "above canonical by more than the margin" if d.low > MARGIN * ref else "not settled")
            a = {sd: runs[("canonical", 12, sd)]["best_val_ppl"] for sd in seeds}
            b = {sd: runs[(arm, 12, sd)]["best_val_ppl"] for sd in seeds}
            wide = paired_difference(a, b, level=1 - 0.05 / len(D2_ARMS))
            holm = ("equivalent to or better than canonical" if wide.high <= MARGIN * ref else
                    "above canonical by more than the margin" if d.low > MARGIN * ref else "not settled")
        out[arm] = (d, ref, seeds, reading, holm)
    return out


def d2_correction(runs: dict) -> str:
    """How D2's "for some multiplier" is corrected for, and how many pairs each arm has so far."""
    res = d2(runs)
    n = ", ".join(f"`{arm}` {len(r[2])}" for arm, r in res.items())
    return ("Multiplicity: the two comparisons share canonical's runs, and PLAN.md's \"for some multiplier\" "
            "(a learning-rate effect if either arm's interval ends at or below +2%) is not corrected in PLAN.md. "
            "This report (added 2026-11-28, issue 65, before D2 has 2 pairs for any arm) gives, beside PLAN.md's "
            "uncorrected reading, the reading corrected by Holm over the two comparisons: for \"some\" its first "
            "step is Bonferroni's, so an arm counts only if its 97.5% interval ends at or below +2%; \"both above "
            f"+2%\" needs no correction. Pairs so far: {n}"
            + ("; no interval yet, so neither reading is given." if all(r[3] is None for r in res.values()) else "."))


def d2_sentence(runs: dict) -> str:
    """D2 as far as it has run: per run while an arm has fewer than 2 seeds (no verdict, PLAN.md)."""
    res = d2(runs)
    if not res:
        return "Whether it is a slower effective learning rate (standard at a lower rate) is not yet run."
    parts = []
    for arm, (d, ref, seeds, reading, holm) in res.items():
        if reading is None:
            s = seeds[0]
            parts.append(f"`{arm}` ({rate_words(runs, arm, s)}) {runs[(arm, 12, s)]['best_val_ppl']:.2f} at seed {s}")
        else:
            parts.append(f"`{arm}` − canonical {fmt(d, ref)} over seeds {', '.join(map(str, seeds))}: {reading} "
                         f"(PLAN.md, uncorrected; Holm over the two: {holm})")
    one = [arm for arm, r in res.items() if r[3] is None]
    if len(one) == len(res):
        s = res[one[0]][2][0]
        std, can = runs[("standard", 12, s)]["best_val_ppl"], runs[("canonical", 12, s)]["best_val_ppl"]
        lowered = [runs[(a, 12, s)]["best_val_ppl"] for a in one if (a, 12, s) in runs]
        direction = ("further from canonical than standard at ×1.0" if min(lowered) > std else
                     "closer to canonical than standard at ×1.0" if max(lowered) < std else
                     "in both directions (one multiplier closer to canonical, one further)")
        return (f"A slower effective learning rate (D2, standard with its peak rate lowered, and with it every step's "
                f"rate of the warmup no run left): so far one seed, {'; '.join(parts)}, against standard "
                f"{std:.2f} ({rate_words(runs, 'standard', s)}) and canonical {can:.2f} "
                f"({rate_words(runs, 'canonical', s)}): lowering standard's rate moved its best {direction}, on one "
                "seed pair, so no verdict yet (PLAN.md needs 2).")
    return "A slower effective learning rate (D2): " + "; ".join(parts) + "."


def _span(runs: dict, arm: str, epoch: int) -> str:
    v = [r["curve"][epoch] for (a, h, _), r in runs.items() if a == arm and h == 12 and epoch in r["curve"]]
    return f"{min(v):,.2f}–{max(v):,.2f}"


def report(runs: dict) -> str:
    d, ref, seeds = compare(runs, "standard", "canonical", 12)
    ep, _, _ = compare(runs, "standard", "canonical", 12, "best_epoch")
    test, test_ref, _ = compare(runs, "standard", "canonical", 12, "test_ppl")
    cut = HERE / "gpu-session" / "canonical-h12-s4-cut.metrics.jsonl"
    cut_epochs = [json.loads(x) for x in cut.read_text().splitlines() if json.loads(x)["kind"] == "epoch"] \
        if cut.exists() else []
    lines = ["# when: when does I-Attention help? (issue 40)", "",
             "Written by `results/when/analyze.py` from `runs/` (arms, seeds and the decision rules D1–D5: "
             "`PLAN.md`, committed, by its own account, before the first run, whose files record no time or commit; "
             "D1m: its amendment of 2026-11-26, before any D1m run). The "
             "section \"Why?\" is **exploratory**: its rules (the shift test, equal fit at canonical's epochs "
             f"{FIT_EPOCHS.start}–{FIT_EPOCHS.stop - 1}, \"every matched point lower\", the hypotheses' marks) are "
             "`analyze.py`'s own, written after the first lease's runs (issue 51), not PLAN.md's. All numbers "
             "ours: GPT-2 small on WikiText-2, best validation perplexity per GPT-2 token, evaluated in float32 "
             "(TF32 off) on the whole validation split at every epoch end.", "",
             "## Runs", ""] + runs_table(runs) + ["", "## What ran", ""] + progress(runs)
    rerun = runs.get(("canonical", 12, 4))
    if cut_epochs and rerun:
        both = [(r["epoch"], r["val_ppl"], rerun["curve"][r["epoch"]]) for r in cut_epochs]
        rel = max(abs(b / a - 1) for _, a, b in both)
        lines.append(f"- canonical-h12-s4, cut by the end of the first lease after epoch {cut_epochs[-1]['epoch']} "
                     "(`gpu-session/canonical-h12-s4-cut.metrics.jsonl`, not a run of the study), ran afresh "
                     f"in batch 1 with patience {rerun['config']['train']['patience']} (the amendment); its validation "
                     f"perplexity at epochs 1–{both[-1][0]} is the cut run's within {rel:.1e} relative (same seed, run "
                     f"again in a later lease); it ran {newer_code(runs, 'canonical-h12-s4')}.")
    elif cut_epochs:
        last, prev = cut_epochs[-1]["val_ppl"], cut_epochs[-2]["val_ppl"]
        lines.append(f"- canonical-h12-s4 was cut by the end of the lease after epoch {cut_epochs[-1]['epoch']} "
                     f"(validation {last:.2f}, {'still falling' if last < prev else 'rising'}: {prev:.2f} the "
                     "epoch before); its metrics are kept in `gpu-session/canonical-h12-s4-cut.metrics.jsonl` and it "
                     "is not a run of the study.")
    again = [n for n in cut_then_finished() if n != "canonical-h12-s4"]
    if again:
        starts = cut_then_finished()
        lines.append(f"- {' and '.join(again)} {'were' if len(again) > 1 else 'was'} started in the first lease, when "
                     "two runs of priority 1 ended, and cut by the lease's end (`gpu-session/queue.log`: started at "
                     + " and ".join(starts[n]["at"] for n in again) + ", no end line; "
                     + " and ".join(sorted({f"`{starts[n]['patience']}`" for n in again})) + " on the command line); "
                     "their metrics were not kept. "
                     + ("Both" if len(again) > 1 else "It") + " ran afresh in batch "
                     + " and ".join(sorted({str(batch_of(n)) for n in again})) + " with patience "
                     + " and ".join(sorted({str(runs[run_key(n)]['config']['train']['patience']) for n in again}))
                     + f" (the amendment), {newer_code(runs, *again)}. The rows above are those runs.")
    others = [n for n in started_cut() if n != "canonical-h12-s4"]
    if others:
        lines.append(f"- {' and '.join(others)} {'were' if len(others) > 1 else 'was'} started when two runs of "
                     "priority 1 ended and cut by the end of the same lease (`gpu-session/queue.log`: a start line, no "
                     "end line); their metrics were not kept.")
    lines += window_notes(runs)
    lines += ["", "## D1: replication (S-warm, 12 heads, canonical − standard, paired by seed)", "",
              f"- Best validation perplexity: {fmt(d, ref)}, seeds {', '.join(map(str, seeds))}. "
              f"Rule: **{d1_rule(d, ref)}**. {sign_flip_words(runs)}",
              f"- Epoch of best: {fmt(ep, float('nan')).split(' (')[0]} ("
              + ("canonical later" if ep.low > 0 else "canonical earlier" if ep.high < 0 else "no direction settled")
              + ").",
              f"- {early_words(runs)} (the learning rate at each arm's best and what the curves say about why: next "
              "section).",
              f"- Test perplexity at the best checkpoint: {fmt(test, test_ref)}.", ""] + analyses_report(runs) + ["",
              ] + d2_report(runs) + [""] + d1m_report(runs) + ["", "## D3–D5", "",
              "Not run yet (the queue's later batches); no verdict.", "",
              ] + cpu_analog() + ["", "## Evaluation on the GPU equals evaluation on a CPU", ""] + \
        gpu_cpu_agreement(runs) + [
              "", "## Verdict", "", verdict(runs), "", "![curves](curves.png)", ""]
    return "\n".join(lines)


def d2_report(runs: dict) -> list[str]:
    """D2's runs next to the same seed's standard and canonical at ×1.0: each named by its peak-rate multiplier and
    the rate it reached (no S-warm run left the warmup, so none reached its configured peak), with the rate at each
    best."""
    lines = ["## D2: a learning-rate effect? (S-warm, 12 heads, standard with a lower peak-rate multiplier)", ""]
    done = sorted((r for r in runs if group(r[0], r[1]) == "learning rate"), key=lambda r: (r[2], r[0]))
    if not done:
        return lines + ["Not run yet; no verdict."]
    o = runs[done[0]]["config"]["optim"]
    ratios = [step_ratio(runs, a, sd) for a, _, sd in done if ("standard", 12, sd) in runs]
    base = o["lr"] / multiplier(runs, runs[done[0]])
    lines += [f"Each run is named by its multiplier of the configured peak ({sci(base)} at ×1.0) and the rate it "
              "reached (its highest step's, from `steps.jsonl`, equal to its config's schedule): the peak comes "
              f"after the {o['warmup_steps']:,}-step warmup, which no run left, so no run reached it. At every step "
              "it made, each lowered run's rate is its multiplier times standard's (same seed; over "
              f"{' and '.join(sorted({f'{n:,}' for n, _ in ratios}))} steps each, within "
              f"{max(r[1] for r in ratios):.1e} relative): lowering the peak lowered every step's rate.", "",
              "| run | multiplier (configured peak, not reached) | rate reached (last step) | best val ppl (epoch) | "
              "steps | lr at the best, Σ lr up to it | same seed at ×1.0: standard, canonical (rate reached) |",
              "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for arm, heads, seed in done:
        s, b = runs[(arm, heads, seed)], at_best(runs[(arm, heads, seed)])
        ref = [(a, runs.get((a, 12, seed))) for a in ("standard", "canonical")]
        lines.append(f"| {run_name(arm, heads, seed)} | ×{multiplier(runs, s):.1f} "
                     f"({sci(s['config']['optim']['lr'])}) | "
                     f"{sci(reached(s), 3)} | {s['best_val_ppl']:.2f} ({s['best_epoch']}) | {s['steps']:,} | "
                     f"{sci(b['lr'], 2)}, {b['lr_sum']:.4f} | "
                     + ", ".join(f"{r['best_val_ppl']:.2f} ({r['best_epoch']}; {sci(reached(r), 3)})" if r else "–"
                                 for _, r in ref) + " |")
    lines += ["", d2_sentence(runs)]
    for arm, (d, ref, _seeds, reading, holm) in d2(runs).items():
        lines.append(f"- `{arm}` − canonical, paired by seed: {fmt(d, ref)}"
                     + (f"; PLAN.md's reading (uncorrected): **{reading}**; Holm over the two: **{holm}**." if reading
                        else "; no verdict (fewer than 2 pairs)."))
    lines.append(f"- {d2_correction(runs)}")
    return lines


def cells(runs: dict) -> dict[str, str]:
    """This study's column of the verdict table in results/README.md."""
    d, ref, seeds = compare(runs, "standard", "canonical", 12)
    ep, _, _ = compare(runs, "standard", "canonical", 12, "best_epoch")
    h1 = [r for r in runs if r[1] == 1]
    return {"regime": regime(runs),"h1": "not run yet (PLAN.md priority 4)" if not h1 else "see `when/report.md`",
            "ep": f"1 head not run yet; at 12 heads canonical's best is later: {ep.mean:+.2f} "
                  f"[{ep.low:+.2f}, {ep.high:+.2f}] epochs, {len(seeds)} pairs",
            "heads": f"12 heads: {d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] ({100 * d.mean / ref:+.1f}%), "
                     f"{len(seeds)} pairs: **{d1_rule(d, ref)}**; 4 and 8 heads not run yet"}


def cpu_analog() -> list[str]:
    """Setting 1 of cpu-analog/PLAN.md: seed 0 at 16 and 8 heads, and its declared futility rule."""
    runs = {}
    for f in sorted((HERE / "cpu-analog" / "runs").glob("*/summary.json")):
        s = json.loads(f.read_text())
        runs[(s["attention"], s["n_head"], s["seed"])] = s
    lines = ["## CPU analog (`cpu-analog/PLAN.md`, setting 1: cpu-study model, 26k tokens, S-warm)", ""]
    worse = []
    for heads in (16, 8):
        a, b = runs.get(("standard", heads, 0)), runs.get(("canonical", heads, 0))
        if a is None or b is None:
            lines.append(f"- {heads} heads, seed 0: not run.")
            continue
        rel = b["best_val_ppl"] / a["best_val_ppl"] - 1
        worse.append(rel >= 0.05)
        lines.append(f"- {heads} heads, seed 0: canonical {b['best_val_ppl']:.2f} (epoch {b['best_epoch']}) against "
                     f"standard {a['best_val_ppl']:.2f} (epoch {a['best_epoch']}), {100 * rel:+.1f}%.")
    if len(worse) == 2 and all(worse):
        lines.append("- By the declared futility rule (canonical ≥ 5% worse at both head counts on seed 0), seeds 1 "
                     "and 2 were not run: **no CPU analog in setting 1** (one seed). Settings 2 and 3 are not run.")
    return lines


def replace_block(text: str, block: str, cell: dict[str, str] | None = None) -> str:
    pattern = re.compile(r"(<!-- when-verdict -->\n)(?:.*?\n)?(<!-- /when-verdict -->)", re.S)
    assert pattern.search(text), "no <!-- when-verdict --> block"
    text = pattern.sub(lambda m: m.group(1) + block + "\n" + m.group(2), text)
    for key, value in (cell or {}).items():
        marks = re.compile(rf"(<!-- when:{key} -->).*?(<!-- /when:{key} -->)")
        assert marks.search(text), f"no when:{key} cell"
        text = marks.sub(lambda m, v=value: m.group(1) + v + m.group(2), text)
    return text


def main() -> None:
    check = "--check" in sys.argv[1:]
    runs = load_runs()
    want = {HERE / "report.md": report(runs) + ""}
    for f in VERDICT_FILES:
        want[f] = replace_block(f.read_text(), verdict(runs), cells(runs) if f.name == "README.md" and
                                f.parent.name == "results" else None)
    stale = [f for f, text in want.items() if not f.exists() or f.read_text() != text] if check else []
    if check:
        problems = check_batches()  # study.py's queue against PLAN.md's declared batches
        print("up to date" if not stale else "stale: " + ", ".join(str(f.relative_to(ROOT)) for f in stale))
        print("\n".join(problems) or "batches as PLAN.md declares")
        sys.exit(1 if stale or problems else 0)
    for f, text in want.items():
        f.write_text(text)
    figure(runs, HERE / "curves.png")
    lr_figure(runs, HERE / "lr_at_best.png")
    shift_figure(runs, HERE / "shift.png")
    fit_figure(runs, HERE / "equal_fit.png")
    print(want[HERE / "report.md"])


if __name__ == "__main__":
    main()
