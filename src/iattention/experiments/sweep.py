"""A grid of runs (arms x heads x seeds), each a separate `iattn train` run folder `<arm>-h<heads>-s<seed>`.

Resumable: a finished run (summary.json present) is skipped only if its config is the one this
sweep would train (else a one-line error names the differing key); interrupted runs resume from
their last checkpoint; nothing is overwritten. Any subset can run on any machine, straight into a
committed results folder; `report` merges the folders afterwards. Each run folder gets `arm.json`
(the arm's name and overrides), which the report groups by.
"""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from iattention.checkpoint.run_folder import RunFolder
from iattention.errors import UserError
from iattention.experiments.arms import Arm
from iattention.utils.lock import holder


@dataclass(frozen=True)
class RunSpec:
    arm: Arm
    n_head: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm.name}-h{self.n_head}-s{self.seed}"

    def overrides(self) -> list[str]:
        return [*self.arm.overrides, f"model.n_head={self.n_head}", f"train.seed={self.seed}"]


def grid(arms: list[Arm], heads: list[int], seeds: list[int]) -> list[RunSpec]:
    """Seed-major order, so a sweep cut short still holds complete seeds across head counts."""
    return [RunSpec(a, h, s) for s, h, a in itertools.product(seeds, heads, arms)]


def expected_config(spec: RunSpec, preset: str, overrides: list[str]) -> dict:
    from iattention.config import load_config

    return json.loads(json.dumps(load_config(preset, None, spec.overrides() + list(overrides)).to_dict()))


def finished_mismatch(spec: RunSpec, folder: RunFolder, preset: str, overrides: list[str]) -> str | None:
    """None if the finished run in `folder` is the run this sweep asks for, else the first differing key."""
    want = expected_config(spec, preset, overrides)
    if want["model"].get("vocab_size") == 0:  # "from the tokenizer": compare with what it resolves to now
        want["model"]["vocab_size"] = _kept_vocab(folder, want["data"]) or _auto_vocab(
            json.dumps(want["data"], sort_keys=True))
    return folder.summary_mismatch(want)


def _kept_vocab(folder: RunFolder, data: dict) -> int | None:
    """A finished bpe:N run keeps the tokenizer it trained with (tokenizer.json): its vocabulary is what
    model.vocab_size=0 resolved to, read without any data (a finished run needs none)."""
    from iattention.checkpoint.run_folder import TOKENIZER
    from iattention.config import GPTConfig, resolve_vocab
    from iattention.data.tokenizers import tokenizer_from_file

    spec = str(data.get("tokenizer", ""))
    if not spec.startswith("bpe:") or not (folder.path / TOKENIZER).is_file():
        return None
    built = tokenizer_from_file(folder.path / TOKENIZER, spec).vocab_size
    return resolve_vocab(GPTConfig(vocab_size=0), spec, built).vocab_size


@functools.cache
def _auto_vocab(data_json: str) -> int:
    """The vocabulary `model.vocab_size=0` resolves to for a data config: exact for gpt2 and byte; a bpe:N
    tokenizer is built (or read from the cache) from its train split, since it can hold fewer than N."""
    from iattention.config import GPTConfig, resolve_vocab
    from iattention.data import DataConfig
    from iattention.data.dataset import tokenizer_of

    data = json.loads(data_json)
    built = tokenizer_of(DataConfig(**data)).vocab_size if str(data.get("tokenizer", "")).startswith("bpe:") else None
    return resolve_vocab(GPTConfig(vocab_size=0), data["tokenizer"], built).vocab_size


def run_one(spec: RunSpec, preset: str, out: Path, overrides: list[str], threads: int, quiet: bool) -> dict:
    folder = RunFolder(out / spec.name)
    if folder.has_summary():
        return folder.read_summary() | {"_status": "skipped (finished)"}
    pid = holder(folder.path)
    if pid:  # another sweep (another terminal or machine) is training it now
        return {"_status": f"skipped (running, pid {pid})", "best_val_ppl": float("nan"), "best_epoch": "-"}
    folder.path.mkdir(parents=True, exist_ok=True)
    arm = {"arm": spec.arm.name, "overrides": list(spec.arm.overrides)}
    old = folder.read_arm()
    if old is None:
        folder.write_arm(arm)
    elif old["arm"] != spec.arm.name:  # a refused run keeps its arm.json as it was
        raise UserError(f"{folder.path} holds a run of arm {old['arm']!r}, not {spec.arm.name!r}; choose another --out")
    cmd = [sys.executable, "-m", "iattention", "train", "--preset", preset, "--out", str(folder.path), "--resume",
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
    folder.write_arm(arm)  # the arm's overrides as this sweep ran it
    return folder.read_summary() | {"_status": f"ran in {time.time() - t0:.0f}s"}


def check_finished(preset: str, specs: list[RunSpec], out: Path, overrides: list[str]) -> None:
    """Before anything runs: refuse a sweep whose folder holds finished runs of another config."""
    for spec in specs:
        folder = RunFolder(out / spec.name)
        if folder.has_summary():
            diff = finished_mismatch(spec, folder, preset, overrides)
            if diff:
                raise UserError(f"{folder.path} holds a finished run with another config ({diff}); use the same preset "
                                "and overrides, or choose another --out")


def run_sweep(preset: str, specs: list[RunSpec], out: str | Path, overrides: list[str] = (), jobs: int = 1,
              quiet: bool = True, log=print, threads: int = 0) -> list[dict]:
    out = Path(out)
    if jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {jobs}")
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {out} is a file; choose a folder for --out")
    if out.is_dir():
        check_finished(preset, specs, out, list(overrides))
    out.mkdir(parents=True, exist_ok=True)
    threads = threads or (0 if jobs == 1 else 1)
    printing = threading.Lock()  # parallel jobs: one whole line at a time

    def work(spec):
        summary = run_one(spec, preset, out, list(overrides), threads, quiet)
        with printing:
            log(f"{spec.name:<28} {summary['_status']:<20} best val ppl {summary['best_val_ppl']:8.2f} "
                f"(epoch {summary['best_epoch']})")
        return summary | {"_arm": spec.arm.name}

    if jobs == 1:
        return [work(s) for s in specs]
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(work, specs))
