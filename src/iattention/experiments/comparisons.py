"""Every arm against the reference, per head count: the numbers of a report (no text, no figures):
paired (or Welch) differences, equivalence tests, Holm over the declared family, reached pairs and
tokens to reach."""

from __future__ import annotations

import math

import numpy as np

from iattention.experiments.stats import compare, holm, welch_difference


def reach_targets(groups, reference: str) -> dict[int, float]:
    """Per head count: the reference arm's mean best validation perplexity (the bar of "tokens to reach"
    in the arms table; the comparisons also use each seed's own reference best)."""
    return {h: float(np.mean([r.summary["best_val_ppl"] for r in runs])) for (arm, h), runs in groups.items()
            if arm == reference}

def by_seed(runs, key: str) -> dict[int, float]:
    return {r.summary["seed"]: float(r.summary[key]) for r in runs}

def added_seeds(added: dict, arm: str, h: int) -> set[int]:
    return {int(s) for hh, seeds in (added.get(arm) or {}).items() if int(hh) == h for s in seeds}

def reached_pairs(a, b) -> tuple[int, int]:
    """(pairs where the arm's run reached its own seed's reference best, pairs)."""
    ref = by_seed(a, "best_val_ppl")
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
            extra = added_seeds(added, arm, h) | added_seeds(added, reference, h)
            for subset in ("all", "declared") if extra else ("all",):
                drop = extra if subset == "declared" else set()
                a = [r for r in groups[(reference, h)] if r.summary["seed"] not in drop]
                b = [r for r in groups[(arm, h)] if r.summary["seed"] not in drop]
                if not a or not b:
                    continue
                pa, pb = by_seed(a, "best_val_ppl"), by_seed(b, "best_val_ppl")
                margin = margin_pct / 100 * float(np.mean(list(pa.values())))
                ppl = compare(pa, pb)
                welch = welch_difference(list(pa.values()), list(pb.values()))
                epoch = compare(by_seed(a, "best_epoch"), by_seed(b, "best_epoch"))
                target = float(np.mean(list(pa.values())))
                ta = {r.summary["seed"]: r.tokens_to_reach(target) for r in a}
                tb = {r.summary["seed"]: r.tokens_to_reach(target) for r in b}
                never = sum(v is None for v in tb.values())
                reach = None if never or None in ta.values() else compare(
                    {s: v / 1e6 for s, v in ta.items()}, {s: v / 1e6 for s, v in tb.items()})
                rows.append(dict(arm=arm, heads=h, subset=subset, ppl=ppl, welch=welch, epoch=epoch, margin=margin,
                                 ref_mean=target,
                                 censored=sum(r.censored for r in a + b), reach=reach, never=never, n_b=len(b),
                                 reached_pairs=reached_pairs(a, b), p=ppl.p, tost=ppl.tost_p(margin)))
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

def holm_family_size(members: list[dict]) -> str:
    """The Holm family in words: m = the comparisons that have a test (holm() skips a nan p), and the
    rows on all seeds that have none (an arm with one seed there)."""
    m = sum(math.isfinite(r["p"]) for r in members)
    untested = [f"`{r['arm']}` at {r['heads']}" for r in members if not math.isfinite(r["p"])]
    text = f"m = {m} comparison{'' if m == 1 else 's'}"
    if untested:
        text += (f", the {len(members)} rows on all seeds less {len(untested)} with no test (one seed in an "
                 f"arm: {', '.join(untested)})")
    return text
