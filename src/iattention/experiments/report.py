"""`iattn report`: report.md from run folders alone (summary.json + metrics.jsonl): the markdown. The numbers
are `comparisons.py`, the figures `figures.py`, the paper's published table `paper.py`."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from iattention.config.families import FAMILIES
from iattention.config.model import GPTConfig, upgrade_model_keys
from iattention.errors import UserError
from iattention.experiments.comparisons import comparisons, holm_family_size, reach_targets
from iattention.experiments.figures import all_figures, arm_styles
from iattention.experiments.lr_sweep import lr_families, lr_table
from iattention.experiments.paper import PAPER
from iattention.experiments.results import config_value, find_runs, group
from iattention.experiments.stats import mean_std, verdict
from iattention.utils.atomic import write_text


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


def _ci(x, digits=2) -> str:
    m, lo, hi = (round(v, digits) + 0.0 for v in (x.mean, x.low, x.high))  # + 0.0: no "-0.00"
    return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]" if x.has_ci \
        else f"{m:+.{digits}f} [undefined: {x.undefined}]"


def _per_word(summaries: list[dict]) -> str:
    """Mean ± std of the best validation word perplexity over the runs that recorded it (older runs did
    not): "–" when none did, "(k of n)" when only some."""
    have = [x["best_val_word_ppl"] for x in summaries if isinstance(x.get("best_val_word_ppl"), (int, float))]
    if not have:
        return "–"
    return _fmt(*mean_std(have)) + (f" ({len(have)} of {len(summaries)})" if len(have) < len(summaries) else "")


def _added_text(added: dict) -> str:
    return "; ".join(f"`{arm}` at {h} head{'s' if int(h) > 1 else ''}: seed{'s' if len(seeds) > 1 else ''} "
                     f"{', '.join(map(str, seeds))}" for arm, by_h in added.items() for h, seeds in by_h.items())


def _fmt_p(p: float) -> str:
    return "–" if not math.isfinite(p) else (f"{p:.3f}" if p >= 0.001 else "<0.001")


def margin_words(margin_pct: float, given: bool, declared: str | None) -> str:
    """Where the equivalence margin comes from, in words: say "declared before the runs" only when a plan
    file says so (--declared), never for a default."""
    if declared:
        return f"the margin declared before the runs in {declared}"
    if given:
        return "the margin given with --margin; no plan file (--declared) shows it was declared before the runs"
    return f"default ±{margin_pct:g}%, not declared in advance"


def comparison_section(rows: list[dict], groups, plotted, reference: str, margin_pct: float, margin_note: str,
                       has_lr: bool = False, family: list[str] | None = None) -> list[str]:
    members = [r for r in rows if r["subset"] == "all" and r["in_family"]]
    family_text = (f"the report's verdict family (every arm): {holm_family_size(members)}" if family is None else
                   f"the declared verdict family ({', '.join(family)}): {holm_family_size(members)}; "
                   "rows of other arms are exploratory, unadjusted (p and its \"adjusted\" value are equal)")
    kinds = {r["ppl"].kind for r in rows}
    lines = [f"## Each arm − `{reference}`, per head count", "",
             f"Negative = the arm is lower than `{reference}`. Arms that share seeds are compared **paired by "
             "seed** (a seed fixes the data order and, for most arms, the starting function): the mean of the "
             "per-seed differences with a t interval on pairs − 1 degrees of freedom; arms sharing fewer than two "
             "seeds get Welch's interval. Welch's interval is shown beside the paired one for this release, so "
             "readers can see what pairing changed. p: the two-sided paired (or Welch) t test of no difference; "
             f"equivalence: two one-sided tests (TOST) that the difference lies within ±{margin_pct:g}% of "
             f"`{reference}`'s mean best validation perplexity at that head count ({margin_note}). "
             f"Both p values are Holm-adjusted over {family_text}; the verdict uses the adjusted values at "
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


def _where(dirs) -> str:
    """The folders a report read, in words: many run folders of one parent are named by the parent."""
    parents = {Path(x).resolve().parent for x in dirs}
    if len(dirs) > 3 and len(parents) == 1 and all((Path(x) / "summary.json").is_file() for x in dirs):
        return f"{len(dirs)} run folders named on the command line, in {Path(str(dirs[0])).parent}"
    return ", ".join(str(x) for x in dirs)


_MLP_WORDS = {"swiglu": "SwiGLU", "gelu_tanh": "GELU (tanh)", "gelu": "GELU"}
_NORM_WORDS = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}


def _family(m: dict) -> str:
    """A saved model section's family (a two-family layout's `arch: llama` read as its family)."""
    return upgrade_model_keys(m).get("family", GPTConfig.family)


def _family_words(family) -> str:
    return FAMILIES[family].label if isinstance(family, str) and family in FAMILIES else str(family)


def _is_paper(m: dict) -> bool:
    """A model section of the paper's family (GPT-2: the report adds its published table)."""
    family = _family(m)
    return isinstance(family, str) and family in FAMILIES and FAMILIES[family].paper


def _model_words(m: dict) -> str:
    """What a model section of another family than GPT-2 adds to the header's shape ("" for GPT-2)."""
    if _is_paper(m):
        return ""
    try:
        c = GPTConfig.from_dict(m)  # every key at its value: the saved section leaves out what its family gives
    except (UserError, TypeError):
        return f"{_family_words(_family(m))} family, "
    rope = ("full RoPE" if c.rot == c.d_head else f"RoPE on {c.rot} of {c.d_head} head dims" if c.rot
            else "no RoPE")
    return (f"{_family_words(c.family)} family ({c.n_head} query heads sharing {c.n_kv_head} key/value "
            f"heads of width {c.d_head}, {rope}, {_MLP_WORDS.get(c.mlp, c.mlp)} {c.d_mlp}, "
            f"{_NORM_WORDS.get(c.norm, c.norm)}, {'tied' if c.tie_embeddings else 'untied'} embeddings), ")


def header_section(title: str, runs, dirs, arms: list[str], cfg: dict) -> list[str]:
    """Title, the study config, and what each arm sets."""
    m, d, o, t = cfg["model"], cfg["data"], cfg["optim"], cfg["train"]
    arm_lines = []
    for arm in arms:
        keys = sorted({k for r in runs if r.arm == arm for k in r.arm_keys})
        sets = sorted({f"{k}={config_value(r.summary['config'], k)}" for r in runs if r.arm == arm for k in keys})
        arm_lines.append(f"- `{arm}`: {' '.join(f'`{x}`' for x in sets) or '(the study config as is)'}")
    return [f"# {title}", "",
            f"{len(runs)} finished runs from {_where(dirs)}. Model: {_model_words(m)}{m['n_layer']} layers, "
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
             "test ppl | best val ppl per word | train tok/s (load-dependent) | seeds |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (arm, h), rs in groups.items():
        s = [r.summary for r in rs]
        reach = [x for r in rs if (x := r.tokens_to_reach(targets[h])) is not None] if h in targets else []
        reach_txt = "n/a" if h not in targets else (
            (f"{_millions(np.mean(reach))} ± {_millions(np.std(reach, ddof=1)) if len(reach) > 1 else '–'}"
             if reach else "–") + f" ({len(reach)} of {len(rs)})")
        lines.append(f"| {arm} | {h} | {s[0]['params']:,} | {_fmt(*mean_std([x['best_val_ppl'] for x in s]))} | "
                     f"{_fmt(*mean_std([x['best_epoch'] for x in s]), digits=1)} | "
                     f"{sum(r.censored for r in rs)} of {len(s)} | {reach_txt} | "
                     f"{_fmt(*mean_std([x['test_ppl'] for x in s]))} | {_per_word(s)} | "
                     f"{np.mean([x['train_tokens_per_s'] for x in s]):,.0f} | {len(s)} |")
    lines += ["", "Mean ± sample standard deviation over seeds. \"Best at last epoch\": runs whose validation "
              "perplexity was still falling when training ended, so their epoch of best is a lower bound. "
              "\"Per word\": the best validation loss per word of the validation text instead of per token "
              "(lm-evaluation-harness's word perplexity, comparable across tokenizers; docs/evaluation.md), "
              "\"–\" for runs from before it was recorded. "
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
                 margin_pct: float | None = None, added: dict | None = None, family: list[str] | None = None,
                 declared: str | None = None, select: list[str] | None = None) -> Path:
    """report.md and figures. `margin_pct`: the equivalence margin, in % of the reference's mean best
    validation perplexity at each head count; `added`: {arm: {heads: [seeds]}} added after a result;
    `family`: the arms whose comparisons form the Holm family (default: all); `declared`: the plan file that
    declared margin and family before the runs (None: the report says they were not shown to be); `select`:
    the arms to report (with the reference, always; None: every arm found)."""
    out, added = Path(out), added or {}
    if margin_pct is not None and not (isinstance(margin_pct, (int, float)) and math.isfinite(margin_pct)
                                       and margin_pct > 0):
        raise UserError(f"--margin {margin_pct} is not an equivalence margin: it must be a finite percentage > 0; "
                        "declare it before the runs, e.g. --margin 2")
    runs = find_runs(dirs)
    groups = group(runs)
    arms = list(dict.fromkeys(a for a, _ in groups))
    if reference not in arms:
        raise UserError(f"reference arm {reference!r} has no runs here (arms: {', '.join(arms)}); pass --reference")
    if select is not None:
        unknown = [a for a in select if a not in arms]
        if unknown:
            raise UserError(f"--arms: arm(s) {', '.join(map(repr, unknown))} have no runs here; choose among "
                            f"{', '.join(arms)}")
        runs = [r for r in runs if r.arm in set(select) | {reference}]
        groups = group(runs)
        arms = list(dict.fromkeys(a for a, _ in groups))
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
    margin_note = margin_words(2.0 if margin_pct is None else margin_pct, margin_pct is not None, declared)
    margin_pct = 2.0 if margin_pct is None else margin_pct
    rows = comparisons(groups, plotted, arms, reference, margin_pct, added, family)
    figs = all_figures(groups, plotted, families, study_lr, out, arm_styles(arms, reference), rows=rows,
                       reference=reference, margin_pct=margin_pct, margin_declared=bool(declared))
    lines = [*header_section(title, runs, dirs, arms, cfg), *results_section(groups, reference, added),
             *comparison_section(rows, groups, plotted, reference, margin_pct, margin_note, has_lr=bool(families),
                                 family=family),
             *lr_section(families, study_lr), *(paper_section() if _is_paper(cfg["model"]) else []),
             *figures_section(figs, runs, plotted != groups, bool(families))]
    path = out / "report.md"
    write_text(path, "\n".join(lines))
    return path
