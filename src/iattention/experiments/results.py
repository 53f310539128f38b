"""Reading run folders: summary.json, metrics.jsonl and arm.json, grouped by (arm, heads)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from iattention.checkpoint.run_folder import CONFIG, METRICS, SUMMARY, RunFolder
from iattention.config import GPTConfig, config_identity
from iattention.config.families import FAMILIES
from iattention.errors import UserError
from iattention.experiments.arms import override_key

# Files a finished run keeps in git (checkpoints and TensorBoard events stay out).
RUN_FILES = (CONFIG, SUMMARY, METRICS)


@dataclass
class Run:
    folder: Path
    summary: dict
    evals: list[dict]  # metrics.jsonl: every validation record (kinds "step" and "epoch"), in order
    arm: str
    arm_keys: tuple[str, ...] = ()  # the config keys the arm sets ("model.init", ...)

    @property
    def key(self) -> tuple[str, int]:
        return self.arm, self.summary["n_head"]

    @property
    def epochs(self) -> list[dict]:
        return [r for r in self.evals if r.get("kind") == "epoch"]

    @property
    def censored(self) -> bool:
        """The best validation came at the last epoch run: the epoch of best is only a lower bound."""
        return self.summary["best_epoch"] >= self.summary["epochs_run"]

    def tokens_per_step(self) -> int:
        c = self.summary["config"]
        return c["train"]["batch_size"] * c["model"]["block_size"]

    def tokens_to_reach(self, target_ppl: float) -> float | None:
        """Training tokens until validation perplexity first reached `target_ppl`, interpolated linearly
        in log perplexity between the two evaluations around the crossing; None if it never did."""
        per_step = self.tokens_per_step()
        prev = None
        for rec in self.evals:
            tokens, ppl = rec["step"] * per_step, rec["val_ppl"]
            if ppl <= target_ppl:
                if prev is None or prev[1] <= ppl:
                    return float(tokens)
                frac = (math.log(prev[1]) - math.log(target_ppl)) / (math.log(prev[1]) - math.log(ppl))
                return prev[0] + frac * (tokens - prev[0])
            prev = (tokens, ppl)
        return None


def _arm_of(folder: RunFolder, summary: dict) -> tuple[str, tuple[str, ...]]:
    meta = folder.read_arm()
    if meta is not None:
        return meta["arm"], tuple(sorted({override_key(o) for o in meta["overrides"]}))
    return summary["attention"], ("model.attention",)  # a run from before arms: its variant is its arm


def find_runs(dirs: list[str | Path]) -> list[Run]:
    found = []
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise UserError(f"{d} is not a folder; give sweep or run folders")
        for summary_path in sorted(d.rglob(SUMMARY)):
            folder = RunFolder(summary_path.parent)
            summary, evals = folder.read_results()  # checked against metrics.jsonl
            arm, arm_keys = _arm_of(folder, summary)
            found.append(Run(folder.path, summary, evals, arm, arm_keys))
    if not found:
        raise UserError(f"no finished runs (summary.json) under {', '.join(map(str, dirs))}")
    # What any arm sets is what the study varies; everything else must agree across all runs.
    varied = tuple(sorted({k for r in found for k in r.arm_keys}))
    studies = {r.folder: json.dumps(_study_config(r.summary["config"], varied), sort_keys=True) for r in found}
    if len(set(studies.values())) > 1:
        raise UserError(f"the folders hold runs of {len(set(studies.values()))} different study configs (beyond what "
                        "the arms set, heads and seed); report each study separately")
    runs, seen = [], {}
    for r in found:
        ident = (r.arm, r.summary["n_head"], r.summary["seed"])
        config = config_identity_json(r.summary["config"])
        if ident in seen:
            if seen[ident][1] == config:
                continue  # the same run merged twice from two folders
            raise UserError(f"two runs of arm {r.arm!r}, {ident[1]} heads, seed {ident[2]} differ in config "
                            f"({seen[ident][0]} and {r.folder}); name the arms apart or report them separately")
        seen[ident] = (r.folder, config)
        runs.append(r)
    return runs


def config_value(cfg: dict, dotted: str):
    """cfg["optim"]["lr"] for "optim.lr"; None where the section or key is absent."""
    section, key = dotted.split(".", 1)
    return (cfg.get(section) or {}).get(key)


def config_identity_json(cfg: dict) -> str:
    return json.dumps(config_identity(cfg), sort_keys=True)


def _study_config(cfg: dict, arm_keys: tuple[str, ...] = ()) -> dict:
    """The config minus what a study varies (the arm's keys, heads, seed) and where/how fast it ran."""
    c = json.loads(json.dumps(config_identity(cfg)))
    drop = {("model", "attention"), ("model", "n_head"), ("train", "seed"), ("train", "device"), ("train", "compile"),
            ("train", "compile_scope"), ("train", "compile_mode")}
    drop |= {tuple(k.split(".", 1)) for k in arm_keys}
    m = c.get("model", {})
    # d_head and rot as n_head makes them are left out of a saved config (normal_form), so they vary with heads
    # unseen; n_kv_head equal to n_head is left out too: a Llama-family study keeps its key/value head count
    # across head counts (as the two-family layout wrote it), so 2 KV heads at 2 and at 4 query heads are one study
    if FAMILIES.get(m.get("family", GPTConfig.family), FAMILIES[GPTConfig.family]).grouped and m.get("n_head"):
        m.setdefault("n_kv_head", m["n_head"])
    for sec, key in drop:
        c.get(sec, {}).pop(key, None)
    return c


def group(runs: list[Run]) -> dict[tuple[str, int], list[Run]]:
    out: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for r in runs:
        out[r.key].append(r)
    arms = list(dict.fromkeys(r.arm for r in runs))
    return dict(sorted(out.items(), key=lambda kv: (kv[0][1], arms.index(kv[0][0]))))
