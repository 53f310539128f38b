"""A grid of runs (attention x heads x seeds), each a separate `iattn train` run folder.

Resumable: finished runs (summary.json present) are skipped, interrupted runs resume from
their last checkpoint, nothing is overwritten. Any subset can run on any machine; `report`
merges the folders afterwards.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from iattention.errors import UserError


@dataclass(frozen=True)
class RunSpec:
    attention: str
    n_head: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.attention}-h{self.n_head}-s{self.seed}"

    def overrides(self) -> list[str]:
        return [f"model.attention={self.attention}", f"model.n_head={self.n_head}", f"train.seed={self.seed}"]


def grid(attentions: list[str], heads: list[int], seeds: list[int]) -> list[RunSpec]:
    """Seed-major order, so a sweep cut short still holds complete seeds across head counts."""
    return [RunSpec(a, h, s) for s, h, a in itertools.product(seeds, heads, attentions)]


def run_one(spec: RunSpec, preset: str, out: Path, overrides: list[str], threads: int, quiet: bool) -> dict:
    folder = out / spec.name
    if (folder / "summary.json").exists():
        return json.loads((folder / "summary.json").read_text()) | {"_status": "skipped (finished)"}
    cmd = [sys.executable, "-m", "iattention", "train", "--preset", preset, "--out", str(folder), "--resume",
           *spec.overrides(), *overrides]
    if threads:
        cmd.append(f"train.threads={threads}")
    if quiet:
        cmd.append("--quiet")
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=quiet, text=True)
    if proc.returncode != 0:
        err = (proc.stderr or "").strip().splitlines()
        raise UserError(f"run {spec.name} failed (exit {proc.returncode}): {err[-1] if err else 'see its output'}")
    summary = json.loads((folder / "summary.json").read_text())
    return summary | {"_status": f"ran in {time.time() - t0:.0f}s"}


def run_sweep(preset: str, specs: list[RunSpec], out: str | Path, overrides: list[str] = (), jobs: int = 1,
              quiet: bool = True, log=print, threads: int = 0) -> list[dict]:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {out} is a file; choose a folder for --out")
    out.mkdir(parents=True, exist_ok=True)
    threads = threads or (0 if jobs == 1 else 1)

    def work(spec):
        summary = run_one(spec, preset, out, list(overrides), threads, quiet)
        log(f"{spec.name:<24} {summary['_status']:<20} best val ppl {summary['best_val_ppl']:8.2f} "
            f"(epoch {summary['best_epoch']})")
        return summary

    if jobs == 1:
        return [work(s) for s in specs]
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(work, specs))
