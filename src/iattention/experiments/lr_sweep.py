"""Learning-rate sweeps inside a study: arms that differ from each other only in `optim.lr`.

Runs are put in one *family* when every key any arm of the study sets, other than `optim.lr`, has
the same value in their configs (so `canonical` and `canonical-lr2x` are one family, `canonical` and
`canonical-matched` are not). Within a family and head count, each learning rate is summarised over
the seeds run at *every* learning rate there, so the columns compare like with like.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from iattention.experiments.results import Run, config_value
from iattention.experiments.stats import mean_std

LR_KEY = "optim.lr"


@dataclass
class LrFamily:
    name: str  # the arm trained at the study's learning rate, else the family's first arm
    n_head: int
    seeds: list[int]  # seeds run at every learning rate of the family
    by_lr: dict[float, list[Run]] = field(default_factory=dict)  # restricted to `seeds`

    def best_val_ppl(self, lr: float) -> tuple[float, float]:
        return mean_std([r.summary["best_val_ppl"] for r in self.by_lr[lr]])

    @property
    def best_lr(self) -> float:
        return min(self.by_lr, key=lambda lr: self.best_val_ppl(lr)[0])


def lr_families(runs: list[Run], study_lr: float) -> list[LrFamily]:
    """Families with runs at two or more learning rates, per head count, in first-seen order."""
    varied = sorted({k for r in runs for k in r.arm_keys} - {LR_KEY})
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        signature = tuple(str(config_value(r.summary["config"], k)) for k in varied)
        groups[(signature, r.summary["n_head"])].append(r)
    out = []
    for (_, heads), members in groups.items():
        lrs = defaultdict(list)
        for r in members:
            lrs[float(r.summary["config"]["optim"]["lr"])].append(r)
        if len(lrs) < 2:
            continue
        seeds = sorted(set.intersection(*({r.summary["seed"] for r in rs} for rs in lrs.values())))
        if not seeds:
            continue
        at_study = [r.arm for r in lrs.get(float(study_lr), []) if LR_KEY not in r.arm_keys]
        name = at_study[0] if at_study else members[0].arm
        by_lr = {lr: [r for r in rs if r.summary["seed"] in seeds] for lr, rs in sorted(lrs.items())}
        out.append(LrFamily(name, heads, seeds, by_lr))
    return sorted(out, key=lambda f: (f.name, f.n_head))


def _multiplier(lr: float, study_lr: float) -> str:
    return f"{lr / study_lr:g}×"


def lr_table(families: list[LrFamily], study_lr: float) -> list[str]:
    """Markdown lines: one row per family and head count, one column per learning-rate multiplier."""
    lrs = sorted({lr for f in families for lr in f.by_lr})
    head = " | ".join(f"lr {_multiplier(lr, study_lr)} ({lr:g})" for lr in lrs)
    lines = ["| family | heads | seeds | " + head + " | best lr |",
             "| --- | ---: | --- | " + " | ".join("---:" for _ in lrs) + " | ---: |"]
    for f in families:
        cells = []
        for lr in lrs:
            if lr not in f.by_lr:
                cells.append("–")
                continue
            m, s = f.best_val_ppl(lr)
            text = f"{m:.2f}" + (f" ± {s:.2f}" if math.isfinite(s) else "")
            cells.append(f"**{text}**" if lr == f.best_lr else text)
        lines.append(f"| {f.name} | {f.n_head} | {', '.join(map(str, f.seeds))} | " + " | ".join(cells) +
                     f" | {_multiplier(f.best_lr, study_lr)} |")
    return lines
