"""Reading run folders: summary.json and metrics.jsonl, grouped by (attention, heads)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from iattention.errors import UserError


@dataclass
class Run:
    folder: Path
    summary: dict
    epochs: list[dict]  # metrics.jsonl records of kind "epoch"

    @property
    def key(self) -> tuple[str, int]:
        return self.summary["attention"], self.summary["n_head"]


def find_runs(dirs: list[str | Path]) -> list[Run]:
    runs, seen, studies = [], set(), set()
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise UserError(f"{d} is not a folder; give sweep or run folders")
        for summary_path in sorted(d.rglob("summary.json")):
            folder = summary_path.parent
            try:
                summary = json.loads(summary_path.read_text())
            except json.JSONDecodeError:
                raise UserError(f"{summary_path} is corrupt; rerun that run (iattn sweep resumes it)") from None
            study = json.dumps(_study_config(summary["config"]), sort_keys=True)
            ident = (summary["attention"], summary["n_head"], summary["seed"], study)
            if ident in seen:  # the same run merged twice from two folders (a differing config is no duplicate)
                continue
            seen.add(ident)
            epochs = []
            metrics = folder / "metrics.jsonl"
            if metrics.exists():
                epochs = [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("kind") == "epoch"]
            runs.append(Run(folder, summary, epochs))
            studies.add(study)
    if not runs:
        raise UserError(f"no finished runs (summary.json) under {', '.join(map(str, dirs))}")
    if len(studies) > 1:
        raise UserError(f"the folders hold runs of {len(studies)} different study configs (beyond attention, heads "
                        "and seed); report each study separately")
    return runs


def _study_config(cfg: dict) -> dict:
    """The config minus what a study varies (attention, heads, seed) and where/how fast it ran."""
    from iattention.train.config import config_identity

    c = json.loads(json.dumps(config_identity(cfg)))
    for sec, key in (("model", "attention"), ("model", "n_head"), ("train", "seed"), ("train", "device"),
                     ("train", "compile")):
        c.get(sec, {}).pop(key, None)
    return c


def group(runs: list[Run]) -> dict[tuple[str, int], list[Run]]:
    out: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for r in runs:
        out[r.key].append(r)
    return dict(sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0])))
