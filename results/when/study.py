"""The "when" study's runs (PLAN.md): its arms, its queue in priority order, and the push-button parts a GPU
session needs (run the queue, show where it stands, pack the small files of its runs; here, unpack them).

    python results/when/study.py queue --root ROOT --data-dir DIR [--jobs 3] [--preset paper] [--limit N]
                                  [KEY=VALUE ...]
    python results/when/study.py status --root ROOT
    python results/when/study.py pack --root ROOT --out FILE.tgz
    python results/when/study.py unpack FILE.tgz          # finished runs -> results/when/runs/<run>/, the
                                                          # window's logs -> results/when/gpu-session/window-<start>/
    python results/when/study.py list                     # the queue, and which runs are committed
    python results/when/study.py batches [--check]        # the queue in batches of three (--check: as PLAN.md)

`queue` runs every run of QUEUE not yet finished (committed under results/when/runs/, or finished under
ROOT/runs/), `--jobs` at a time, each as its own `iattn train` process (log in ROOT/logs/), in QUEUE's order;
a run folder left unfinished under ROOT on this machine is resumed. `--batch` takes only the next batch of
three not finished (PLAN.md's amendment of 2026-11-26: one batch a GPU window); `--deadline S` stops starting
runs S seconds from now and cuts those still going (a cut run is lost). `gpu.sh` wraps it for a lent GPU.
Extra KEY=VALUE overrides go to every run (a dry run: `--preset tiny train.epochs=2`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "runs"
SESSIONS = HERE / "gpu-session"  # each window's logs, committed with its runs (window-<its UTC start>/)
SMALL_FILES = ("config.yaml", "summary.json", "metrics.jsonl", "steps.jsonl")

# Every run of the study: 40 epochs, early stop after PATIENCE epochs without a new best (the schedule stays the
# 40-epoch one). grad_accum and tensorboard are execution only (PLAN.md). Patience was 5 for the 9 runs of the
# first lease; 3 from the 2026-11-26 amendment on (every committed run's validation rose at every epoch after
# its best and fell at every epoch before it, so 3 stops 2 epochs sooner at the same best).
PATIENCE = 3
COMMON = ["train.epochs=40", f"train.patience={PATIENCE}", "train.grad_accum=4", "train.tensorboard=false",
          "train.threads=4"]
S_WARM = ["optim.warmup_steps=2000", "optim.min_lr_ratio=1.0", "model.dropout=0.0"]
S_LOW = ["optim.lr=6e-5"]
S_HF = ["optim.lr=5e-5", "optim.warmup_steps=0", "optim.min_lr_ratio=0.0", "optim.schedule=linear"]
PEAK_LR = 6e-4  # the paper preset's


def _lr(mult: float) -> list[str]:
    return [f"optim.lr={PEAK_LR * mult:.6g}"]


ARMS: dict[str, list[str]] = {}
for _variant in ("standard", "canonical"):
    _a = [f"model.attention={_variant}"]
    ARMS[_variant] = _a + S_WARM
    ARMS[f"{_variant}-drop0.1"] = _a + S_WARM[:2] + ["model.dropout=0.1"]
    ARMS[f"{_variant}-slow"] = _a + S_LOW
    ARMS[f"{_variant}-shf"] = _a + S_HF
for _arm, _mult in (("standard", 0.5), ("standard", 0.7), ("canonical", 0.7), ("canonical", 1.4)):
    ARMS[f"{_arm}-lr{_mult}"] = ARMS[_arm] + _lr(_mult)
ARMS["canonical-matched"] = ARMS["canonical"] + ["model.init=matched"]  # amendment 2026-11-26

# PLAN.md's groups (what report.md's "What ran" lists), each with its arms and head counts.
GROUPS = (("replicate", ("standard", "canonical"), (12,)),
          ("learning rate", ("standard-lr0.7", "standard-lr0.5", "canonical-lr0.7", "canonical-lr1.4"), (12,)),
          ("regularization", ("standard-drop0.1", "canonical-drop0.1"), (12,)),
          ("heads", ("standard", "canonical"), (1, 8, 4)),
          ("other schedules", ("standard-slow", "canonical-slow", "standard-shf", "canonical-shf"), (12,)),
          ("matched init", ("canonical-matched",), (12,)))


def _pairs(arms, heads, seeds):
    return [(arm, h, s) for h in heads for s in seeds for arm in arms]


# The queue as amended on 2026-11-26 (PLAN.md): batches of three, one a GPU window, ranked by information per
# GPU-minute; the D1 runs of the first lease come first (committed, so skipped).
_D1 = _pairs(("standard", "canonical"), (12,), range(5))
_FIRST = [("canonical", 12, 4), ("standard-lr0.7", 12, 0), ("standard-lr0.5", 12, 0),             # batch 1
          ("canonical-matched", 12, 0), ("canonical-matched", 12, 1), ("canonical-matched", 12, 2),  # batch 2
          ("standard-drop0.1", 12, 0), ("canonical-drop0.1", 12, 0), ("standard-lr0.7", 12, 1)]  # batch 3
_D2_D3 = ("standard-lr0.7", "standard-lr0.5", "canonical-lr0.7", "canonical-lr1.4", "standard-drop0.1",
          "canonical-drop0.1")
QUEUE: list[tuple[str, int, int]] = list(dict.fromkeys(
    _D1 + _FIRST
    + _pairs(("standard", "canonical"), (1,), range(3))       # D4's one head, moved up (amendment 2026-11-28)
    + [(arm, 12, s) for s in range(3) for arm in _D2_D3]                                 # the rest of D2, D3 by seed
    + _pairs(("standard", "canonical"), (8, 4), range(3))                                 # D4: 8, then 4 heads
    + _pairs(("standard-slow", "canonical-slow", "standard-shf", "canonical-shf"), (12,), (0,))))  # D5
BATCH = 3  # runs a GPU window holds (three on the card at once)
BATCH_H1 = 2  # one-head runs train at 0.40x the 12-head rate: one seed pair a lease (amendment 2026-11-28)


def batches() -> list[list[tuple[str, int, int]]]:
    """The queue after the first lease's runs, in batches (batch 1 first): BATCH runs, or BATCH_H1 for one-head
    runs (a batch never mixes one-head runs with others)."""
    rest = [r for r in QUEUE if r not in _D1 or r in _FIRST]
    out: list[list[tuple[str, int, int]]] = []
    for r in rest:
        size = BATCH_H1 if r[1] == 1 else BATCH
        if out and len(out[-1]) < size and (out[-1][0][1] == 1) == (r[1] == 1):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def group(arm: str, heads: int) -> str:
    return next(name for name, arms, hs in GROUPS if arm in arms and heads in hs)


def now() -> str:
    """The UTC time for a log line: '2026-11-28T03:41:07Z' (the queue's lines say the day too)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def run_name(arm: str, heads: int, seed: int) -> str:
    return f"{arm}-h{heads}-s{seed}"


def overrides(arm: str, heads: int, seed: int) -> list[str]:
    return ARMS[arm] + [f"model.n_head={heads}", f"train.seed={seed}"] + COMMON


def finished(name: str, root: Path | None = None) -> bool:
    return (COMMITTED / name / "summary.json").exists() or root is not None and (root / "runs" / name /
                                                                                 "summary.json").exists()


def next_batch(root: Path | None = None) -> tuple[int, list[tuple[str, int, int]]]:
    """The first batch with a run not finished (committed, or under root), and its unfinished runs; (0, []) when
    every batch is done."""
    for i, b in enumerate(batches(), 1):
        todo = [r for r in b if not finished(run_name(*r), root)]
        if todo:
            return i, todo
    return 0, []


def queue(root: Path, data_dir: str, jobs: int, preset: str, extra: list[str], limit: int = 0,
          batch: bool = False, deadline: float = 0) -> int:
    """Run the queue's unfinished runs (only the next batch's if `batch`; the first `limit` of them, if > 0),
    `jobs` at a time, in order; at `deadline` seconds from now (if > 0) start nothing more and stop every run
    still going, reporting it as cut. Returns how many failed or were cut."""
    t0 = time.monotonic()
    (root / "runs").mkdir(parents=True, exist_ok=True)
    (root / "logs").mkdir(exist_ok=True)
    if batch:
        number, runs = next_batch(root)
        todo = [run_name(*r) for r in runs]
        print(f"{now()} batch {number}: {', '.join(todo)}" if todo else "every batch is done",
              flush=True)
    else:
        todo = [run_name(*r) for r in QUEUE if not finished(run_name(*r), root)]
    todo = todo[:limit] if limit > 0 else todo
    spec = {run_name(*r): r for r in QUEUE}
    running: dict[str, subprocess.Popen] = {}
    failed = 0
    while todo or running:
        if deadline > 0 and time.monotonic() - t0 > deadline:
            failed += len(running) + len(todo)
            for name in todo:
                print(f"{now()} not started {name}: past the deadline", flush=True)
            for name, proc in running.items():
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                ep = _epochs(root / "runs" / name)
                at = f"after epoch {ep[-1]['epoch']} (validation {ep[-1]['val_ppl']:.2f})" if ep else "before epoch 1"
                print(f"{now()} cut {name}: the deadline ({deadline:.0f} s) came {at}", flush=True)
            break
        while todo and len(running) < jobs:
            name = todo.pop(0)
            out = root / "runs" / name
            resume = ["--resume"] if (out / "config.yaml").exists() else []
            cmd = [sys.executable, "-m", "iattention", "train", "--preset", preset, "--quiet", "--out", str(out),
                   "--data-dir", data_dir, *resume, *overrides(*spec[name]), *extra]
            log = open(root / "logs" / f"{name}.log", "a")
            print(f"{now()} start {name}: {' '.join(cmd[2:])}", flush=True)
            running[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        time.sleep(2)
        for name, proc in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                failed += proc.returncode != 0
                print(f"{now()} end {name}: exit {proc.returncode}", flush=True)
                for ckpt in (root / "runs" / name).glob("*.safetensors*"):
                    if ckpt.name.startswith("last"):  # the resumable checkpoint (1.5 GB) of a finished run
                        ckpt.unlink()
    return failed


def declared_batches(plan: Path = HERE / "PLAN.md") -> list[list[str]]:
    """The batches the last amendment of PLAN.md declares (its `- batch N: run, run, run` lines)."""
    text = plan.read_text().split("## Amendment")[-1]
    return [[x.strip() for x in m.group(2).split(",")]
            for m in re.finditer(r"^- batch (\d+): (.+?)\.?$", text, flags=re.M)]


def check_batches() -> list[str]:
    """Where the queue's batches differ from PLAN.md's declared ones (empty: they agree)."""
    declared = declared_batches()
    ours = [[run_name(*r) for r in b] for b in batches()[:len(declared)]]
    problems = [f"batch {i}: PLAN.md declares {', '.join(d)}; study.py runs {', '.join(o)}"
                for i, (d, o) in enumerate(zip(declared, ours), 1) if d != o]
    return problems or ([] if declared else ["PLAN.md declares no batch"])


def _epochs(run: Path) -> list[dict]:
    m = run / "metrics.jsonl"
    recs = [json.loads(line) for line in m.read_text().splitlines() if line.strip()] if m.exists() else []
    return [r for r in recs if r.get("kind") == "epoch"]


def status(root: Path) -> None:
    for run in sorted((root / "runs").iterdir()) if (root / "runs").exists() else []:
        ep = _epochs(run)
        if not ep:
            print(f"{run.name:<26} no epoch yet")
            continue
        best = min(ep, key=lambda r: r["val_loss"])
        state = "finished" if (run / "summary.json").exists() else "running"
        print(f"{run.name:<26} {state:<8} epoch {ep[-1]['epoch']:>2}  val ppl {ep[-1]['val_ppl']:8.2f}  best "
              f"{best['val_ppl']:8.2f} (epoch {best['epoch']:>2})  {ep[-1]['tokens_per_s']:>8.0f} tok/s  "
              f"wall {ep[-1]['wall_time']:5.0f}s")


def pack(root: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)  # $OUT exists on the device; a dry run's OUT may not yet
    with tarfile.open(out, "w:gz") as tar:
        for run in sorted((root / "runs").iterdir()) if (root / "runs").exists() else []:
            for f in SMALL_FILES:
                if (run / f).exists():
                    tar.add(run / f, arcname=f"runs/{run.name}/{f}")
        for log in sorted((root / "logs").glob("*.log")) if (root / "logs").exists() else []:
            tar.add(log, arcname=f"logs/{log.name}")
        for log in ("queue.log", "window.log"):  # window.log: gpu.sh's whole output, its start and end lines too
            if (root / log).exists():
                tar.add(root / log, arcname=log)


def window_folder(log: str) -> str | None:
    """gpu-session's folder for a window, named by the start line gpu.sh writes first in window.log."""
    m = re.search(r"^when window: start (\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)Z", log, flags=re.M)
    return "window-{}{}{}T{}{}{}Z".format(*m.groups()) if m else None


def extends(kept: Path, packed: bytes) -> bool:
    """Whether a pack's window.log continues the kept one (same window, a later command on the same machine)."""
    return kept.is_file() and len(packed) > kept.stat().st_size and packed.startswith(kept.read_bytes())


def unpack(tgz: Path) -> None:
    """Copy the finished runs of a pack (those with summary.json) into results/when/runs/, and the window's logs
    (window.log, queue.log, logs/) into results/when/gpu-session/window-<start>/; never overwrite a run, and
    replace kept logs only by a later pack of the same window whose window.log continues them."""
    names = {run_name(*r) for r in QUEUE}
    with tarfile.open(tgz) as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        window = members.get("window.log")
        folder = window_folder(tar.extractfile(window).read().decode()) if window else None
        if window is None or folder is None:
            print("no window.log with its start line in the pack: the window's logs are not kept")
        elif (SESSIONS / folder).exists() and not extends(SESSIONS / folder / "window.log",
                                                          tar.extractfile(window).read()):
            print(f"skip the window's logs ({SESSIONS.name}/{folder} already committed)")
        else:
            # A later command on the same warm machine appends to ROOT's logs, so its pack's window.log begins
            # with the one kept: the kept logs are then replaced by the longer ones (nothing kept is lost).
            old = SESSIONS / folder if (SESSIONS / folder).exists() else None
            tmp = SESSIONS / f".{folder}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            for name, m in members.items():
                if name in ("window.log", "queue.log") or name.startswith("logs/") and name.endswith(".log"):
                    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / name).write_bytes(tar.extractfile(m).read())
            if old is not None:
                shutil.rmtree(old)
            os.replace(tmp, SESSIONS / folder)
            print(f"{'extended' if old else 'unpacked'} the window's logs in {SESSIONS.name}/{folder}")
        done = sorted({n.split("/")[1] for n in members if n.startswith("runs/") and n.endswith("/summary.json")})
        for name in done:
            if name not in names or (COMMITTED / name).exists():
                print(f"skip {name} ({'not in the queue' if name not in names else 'already committed'})")
                continue
            tmp = COMMITTED / f".{name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for f in SMALL_FILES:
                m = members.get(f"runs/{name}/{f}")
                if m is not None:
                    (tmp / f).write_bytes(tar.extractfile(m).read())
            os.replace(tmp, COMMITTED / name)
            print(f"unpacked {name}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("queue")
    q.add_argument("--root", type=Path, required=True)
    q.add_argument("--data-dir", required=True)
    q.add_argument("--jobs", type=int, default=3)
    q.add_argument("--preset", default="paper")
    q.add_argument("--limit", type=int, default=0)
    q.add_argument("--batch", action="store_true", help="only the next unfinished batch of three")
    q.add_argument("--deadline", type=float, default=0, help="seconds from now: stop there, cutting what runs")
    q.add_argument("extra", nargs="*")
    for name in ("status", "pack"):
        s = sub.add_parser(name)
        s.add_argument("--root", type=Path, required=True)
        if name == "pack":
            s.add_argument("--out", type=Path, required=True)
    sub.add_parser("unpack").add_argument("tgz", type=Path)
    sub.add_parser("list")
    sub.add_parser("batches").add_argument("--check", action="store_true",
                                           help="exit 1 if the batches differ from PLAN.md's declared ones")
    a = p.parse_args()
    if a.cmd == "queue":
        sys.exit(1 if queue(a.root, a.data_dir, a.jobs, a.preset, a.extra, a.limit, a.batch, a.deadline) else 0)
    elif a.cmd == "batches":
        problems = check_batches()
        if a.check:
            print("\n".join(problems) or "batches as PLAN.md declares")
            sys.exit(1 if problems else 0)
        for i, b in enumerate(batches(), 1):
            names = [run_name(*r) for r in b]
            done = sum(finished(n) for n in names)
            print(f"batch {i:>2}: {', '.join(names)}" + (f"  ({done} of {len(b)} committed)" if done else ""))
    elif a.cmd == "status":
        status(a.root)
    elif a.cmd == "pack":
        pack(a.root, a.out)
    elif a.cmd == "unpack":
        unpack(a.tgz)
    else:
        for i, r in enumerate(QUEUE, 1):
            print(f"{i:>3} {run_name(*r):<26} {'committed' if finished(run_name(*r)) else ''}")


if __name__ == "__main__":
    main()
