"""A grid of runs (arms x heads x seeds), each a separate `iattn train` run folder `<arm>-h<heads>-s<seed>`.

Resumable: a finished run (summary.json present) is skipped only if its config is the one this
sweep would train (else a one-line error names the differing key); interrupted runs resume from
their last checkpoint; nothing is overwritten. Any subset can run on any machine, straight into a
committed results folder; `report` merges the folders afterwards. Each run folder gets `arm.json`
(the arm's name and overrides), which the report groups by.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from iattention.checkpoint.run_folder import TOKENIZER, RunFolder
from iattention.config import GPTConfig, load_config, resolve_vocab
from iattention.config.load import config_from_dict
from iattention.data import DataConfig
from iattention.data.dataset import tokenizer_of
from iattention.data.sources import resolved_data_dir
from iattention.data.tokenizers import tokenizer_from_file
from iattention.errors import Stopped, UserError
from iattention.experiments.arms import Arm
from iattention.train.init_from import with_init_tokenizer
from iattention.utils.files import check_out_folder
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

    args = spec.overrides() + list(overrides)  # as the run's child `iattn train` derives it (an HF folder's tokenizer)
    cfg = with_init_tokenizer(load_config(preset, None, args), None, args, missing_ok=True)
    return json.loads(json.dumps(cfg.to_dict()))


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

    spec = str(data.get("tokenizer", ""))
    if not spec.startswith("bpe:") or not (folder.path / TOKENIZER).is_file():
        return None
    built = tokenizer_from_file(folder.path / TOKENIZER, spec).vocab_size
    return resolve_vocab(GPTConfig(vocab_size=0), spec, built).vocab_size


@functools.cache
def _auto_vocab(data_json: str) -> int:
    """The vocabulary `model.vocab_size=0` resolves to for a data config: exact for gpt2 and byte; a bpe:N
    tokenizer is built (or read from the cache) from its train split, since it can hold fewer than N."""

    data = json.loads(data_json)
    built = tokenizer_of(DataConfig(**data)).vocab_size if str(data.get("tokenizer", "")).startswith("bpe:") else None
    return resolve_vocab(GPTConfig(vocab_size=0), data["tokenizer"], built).vocab_size


def run_one(spec: RunSpec, preset: str, out: Path, overrides: list[str], threads: int, quiet: bool,
            launch=None) -> dict:
    """One run of the grid: skipped when finished or held by another process, else trained by a child
    process (`launch(cmd, quiet, name)`, default: here; `SubmititLauncher`: as a job)."""
    folder = RunFolder(out / spec.name)
    if folder.has_summary():
        return folder.read_results()[0] | {"_status": "skipped (finished)"}
    pid = holder(folder.path)
    if pid:  # another sweep (another terminal or machine) is training it now
        return {"_status": f"skipped (running, pid {pid})", "best_val_ppl": float("nan"), "best_epoch": "-"}
    folder.check_ours()  # a user's folder of that name: nothing is written into it
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
    code, stderr = (launch or _run_child_here)(cmd, quiet, spec.name)
    if code != 0:
        pid = holder(folder.path)
        if pid:  # another sweep's run took the lock between our look and our child's start: it is running
            return {"_status": f"skipped (running, pid {pid})", "best_val_ppl": float("nan"), "best_epoch": "-"}
        raise UserError(_child_failure(spec.name, code, stderr))
    folder.write_arm(arm)  # the arm's overrides as this sweep ran it
    return folder.read_results()[0] | {"_status": f"ran in {time.time() - t0:.0f}s"}


ERROR_PREFIX = "iattn: error: "


def _child_failure(name: str, code: int, stderr: str | None) -> str:
    """One line for a run that failed: the child's own one-line error (its prefix not repeated); a crash
    (a traceback: a bug) has its output shown above, never relayed as the message."""
    lines = (stderr or "").strip().splitlines()
    errors = [line[len(ERROR_PREFIX):] for line in lines if line.startswith(ERROR_PREFIX)]
    if errors:
        return f"run {name} failed: {errors[-1]}"
    if code < 0:
        return f"run {name} was killed by {signal.Signals(-code).name}; rerun the sweep to resume it"
    if stderr:
        sys.stderr.write(stderr if stderr.endswith("\n") else stderr + "\n")
    return (f"run {name} crashed (exit {code}; its output is above): a bug in iattn, please report it; rerun the "
            "sweep to resume the other runs")


# The sweep's training children, so that a signal to the sweep reaches them (a SIGTERM used to leave an
# orphan that went on training and holding its run's lock). Reentrant: the handler runs in the main thread,
# which may hold it.
_children: set[subprocess.Popen] = set()
_children_lock = threading.RLock()
_stopping: list[int] = []  # the signal that stops the sweep, once one came: no child starts after it


def _run_child_here(cmd: list[str], quiet: bool, name: str = "") -> tuple[int, str | None]:
    return _run_child(cmd, quiet)


def run_command(cmd: list[str]) -> tuple[int, str]:
    """What a submitit job runs: the training command, its exit code and stderr (a cluster job's output
    also lands in its log under <out>/submitit/). Module-level, so submitit can pickle it by name. On the
    local executor a SIGTERM (the sweep cancelling the job, through submitit's controller) is passed on to
    the training, which stops as `iattn train` does; submitit's own handler would ignore it."""
    proc = subprocess.Popen(cmd, stdout=None, stderr=subprocess.PIPE, text=True)
    if os.environ.get("SUBMITIT_EXECUTOR") == "local" and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    _, stderr = proc.communicate()
    sys.stderr.write(stderr)
    return proc.returncode, stderr


class SubmititLauncher:
    """Each run as a job through submitit (AutoExecutor: SLURM where `sbatch` exists, its local executor
    otherwise); the sweep's threads wait for their jobs, so skipping, locks and resume are the sweep's own.
    Job logs go to <out>/submitit/. A signal to the sweep cancels the jobs it submitted."""

    def __init__(self, out: Path, slurm_partition: str | None = None, slurm_time_min: int = 60 * 24,
                 gpus_per_run: int = 0, cpus_per_run: int | None = None):
        try:
            import submitit  # optional: pip install "iattention[cluster]"
        except ImportError:
            raise UserError("--launcher submitit needs the submitit package: pip install \"iattention[cluster]\" "
                            "(or pip install submitit)") from None
        logs = out / "submitit"
        if logs.exists() and not logs.is_dir() or logs.is_symlink() and not logs.exists():
            raise UserError(f"{logs} is not a folder; --launcher submitit keeps its job logs there: rename or move it, "
                            "or choose another --out")
        self.executor = submitit.AutoExecutor(folder=str(logs))
        params = dict(timeout_min=int(slurm_time_min), gpus_per_node=int(gpus_per_run), nodes=1, tasks_per_node=1)
        if cpus_per_run:
            params["cpus_per_task"] = int(cpus_per_run)
        if slurm_partition:
            params["slurm_partition"] = slurm_partition
        self.executor.update_parameters(**params)
        self.cluster = self.executor.cluster  # "slurm" or "local"
        self.jobs = []
        self._lock = threading.Lock()

    def __call__(self, cmd: list[str], quiet: bool, name: str) -> tuple[int, str | None]:
        with self._lock:
            _check_stopping()
            self.executor.update_parameters(name=f"iattn-{name}")
            # submitit's local controller (and the job under it) inherit this mask: a terminal's Ctrl-C reaches
            # the sweep alone, which cancels them with SIGTERM (the controller answers SIGINT with a traceback)
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                job = self.executor.submit(run_command, cmd)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            self.jobs.append(job)
        try:
            code, stderr = job.result()
        except Exception as e:  # the job died (killed, timed out, node failure): its log says why
            _check_stopping()
            return 1, f"{ERROR_PREFIX}job {job.job_id} failed ({str(e).strip().splitlines()[-1][:200]}); " \
                      f"its log is under {self.executor.folder}\n"
        _check_stopping()
        return code, stderr

    def cancel(self) -> None:
        for job in self.jobs:
            if job.done():
                continue
            if self.cluster == "local":  # the job id is the controller's pid; it passes SIGTERM on to the job
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(job.job_id), signal.SIGTERM)
            else:
                job.cancel(check=False)


_launchers: list[SubmititLauncher] = []  # cancelled by a signal to the sweep


def _run_child(cmd: list[str], quiet: bool) -> tuple[int, str | None]:
    with _children_lock:
        _check_stopping()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if quiet else None,
                                stderr=subprocess.PIPE if quiet else None, text=True)
        _children.add(proc)
        if _stopping:  # the signal came while it started
            proc.send_signal(_stopping[0])
    try:
        _, stderr = proc.communicate()
    finally:
        proc.wait()
        with _children_lock:
            _children.discard(proc)
    _check_stopping()
    return proc.returncode, stderr


def _check_stopping() -> None:
    """The sweep was told to stop: it ends (once its children have), and no new run starts."""
    if _stopping:
        raise KeyboardInterrupt if _stopping[0] == signal.SIGINT else Stopped(_stopping[0])


@contextmanager
def _forwarding_signals():
    """While the sweep runs: SIGTERM, SIGHUP and SIGINT are passed on to every training child; each run's
    thread then waits for its child to end and stops the sweep (Stopped, or KeyboardInterrupt for SIGINT).
    Only the main thread can set handlers; elsewhere (a sweep run from a library thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum, frame):
        with _children_lock:
            if not _stopping:
                _stopping.append(signum)
            for child in _children:
                if child.returncode is None:
                    child.send_signal(signum)
            for launcher in _launchers:
                launcher.cancel()

    sigs = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    previous = {sig: signal.signal(sig, forward) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with _children_lock:
            _stopping.clear()


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


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
              quiet: bool = True, log=print, threads: int = 0, launcher: dict | None = None) -> list[dict]:
    """Every run of the grid, `jobs` at a time, here (default) or as submitit jobs (`launcher`: the
    SubmititLauncher's arguments; then `jobs` is how many are queued at once)."""
    out = Path(out)
    if jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {jobs}")
    # Every run's config is checked before anything is created (a bad seed was refused by the first child,
    # after its folder and arm.json existed).
    configs = [expected_config(spec, preset, list(overrides)) for spec in specs]
    check_out_folder(out, resolved_data_dir(config_from_dict(configs[0]).data) if configs else None)
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {out} is a file; choose a folder for --out")
    if out.is_dir():
        check_finished(preset, specs, out, list(overrides))
    out.mkdir(parents=True, exist_ok=True)
    threads = threads or (0 if jobs == 1 else 1)
    printing = threading.Lock()  # parallel jobs: one whole line at a time

    # Progress: a line when a run starts, and with each result the count of runs done and an ETA from the
    # mean wall time of the runs this sweep trained (finished runs found on disk cost nothing).
    todo = [s for s in specs if not RunFolder(out / s.name).has_summary()]
    log(f"sweep {preset}: {len(specs)} runs, {len(specs) - len(todo)} already finished, {len(todo)} to train "
        f"({jobs} at a time) -> {out}")
    done, trained = [0], []

    launch = None
    if launcher is not None:
        launch = SubmititLauncher(out, **launcher)
        _launchers.append(launch)
        log(f"launcher: submitit ({launch.cluster} executor), job logs in {out / 'submitit'}")

    def work(spec):
        t0 = time.time()
        if spec in todo:
            with printing:
                log(f"{spec.name:<28} {'submitted' if launch else 'started'}")
        summary = run_one(spec, preset, out, list(overrides), threads, quiet, launch)
        with printing:
            done[0] += 1
            if summary["_status"].startswith("ran"):
                trained.append(time.time() - t0)
            left = len(todo) - len(trained)
            eta = (f", ETA {_minutes(sum(trained) / len(trained) * left / min(jobs, max(left, 1)))}"
                   if trained and left else "")
            log(f"{spec.name:<28} {summary['_status']:<20} best val ppl {summary['best_val_ppl']:8.2f} "
                f"(epoch {summary['best_epoch']})   [{done[0]}/{len(specs)} done{eta}]")
        return summary | {"_arm": spec.arm.name}

    try:
        with _forwarding_signals():
            if jobs == 1:
                return [work(s) for s in specs]
            pool = ThreadPoolExecutor(jobs)
            try:
                return list(pool.map(work, specs))
            finally:  # on a signal: no queued run starts, and the sweep waits for the running ones to end
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        if launch is not None:
            _launchers.remove(launch)
