"""End-to-end tests: not_ours."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import tiny_overrides, write_corpus
from iattention.cli import main
from iattention.errors import UserError

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("notours")
    paths = write_corpus(root)
    return dict(root=root, ov=tiny_overrides(paths, root / "cache", **{"train.epochs": 1}))


def _train(corpus, out, *extra):
    return ["train", "--preset", "tiny", "--quiet", "--out", str(out), *corpus["ov"], *extra]


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("iattn: error: "), err
    return lines[0]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ------------------------------------------------------------------ §3: a closed pipe
def _with_closed_stdout(args: list[str]) -> subprocess.CompletedProcess:
    """Run `iattn ARGS` whose stdout is a pipe already closed by its reader (as `| head -c 1` ends up)."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write gets EPIPE, deterministically
    try:
        return subprocess.run([sys.executable, "-m", "iattention", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=_env())
    finally:
        os.close(write)


# ------------------------------------------------------------------ §4: the sweep's children
def _wait_for(predicate, timeout=90.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


# ------------------------------------------------------------------ §1: the lock is never followed
@pytest.mark.slow
def test_a_symlink_lock_never_truncates_its_target(corpus, tmp_path, capsys):
    """Before: `os.open(O_RDWR|O_CREAT)` followed the link, `ftruncate` emptied the target, and the run trained."""
    victim = tmp_path / "v"
    victim.write_text("precious\n")
    run = tmp_path / "r"
    run.mkdir()
    (run / ".lock").symlink_to(victim)
    assert main(_train(corpus, run)) == 2
    assert "symbolic link" in _error(capsys)
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing written beside it


# ------------------------------------------------------------------ §1: a folder that is not a run
@pytest.mark.slow
def test_a_users_folder_is_not_written_into(corpus, tmp_path, capsys):
    """Before: the run trained into it and overwrote the user's metrics.jsonl (and wrote summary.json, ...)."""
    mine = tmp_path / "m"
    mine.mkdir()
    (mine / "metrics.jsonl").write_text("mine\n")
    assert main(_train(corpus, mine)) == 2
    message = _error(capsys)
    assert "not an iattn run folder" in message and "metrics.jsonl" in message
    assert sorted(p.name for p in mine.iterdir()) == ["metrics.jsonl"]  # not even a .lock
    assert (mine / "metrics.jsonl").read_text() == "mine\n"


@pytest.mark.slow
def test_resume_keeps_a_users_temp_file(corpus, tmp_path, capsys):
    """Before: `--resume` deleted every `.*.tmp` in --out, the user's `.notes.tmp` too, then trained there."""
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / ".notes.tmp").write_text("n\n")
    assert main(_train(corpus, folder, "--resume")) == 2
    assert ".notes.tmp" in _error(capsys)
    assert (folder / ".notes.tmp").read_text() == "n\n"


@pytest.mark.slow
def test_clean_temp_removes_only_our_temps_of_dead_writers(tmp_path):
    """In a real run folder: a user's `.x.tmp` stays, a live writer's temp stays, a dead writer's goes."""
    from iattention.checkpoint.run_folder import RunFolder
    from iattention.utils.atomic import temp_prefix

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {}\n")
    users = [".notes.tmp", ".last.safetensors.123.abcdefgh.tmp", ".summary.json.tmp"]
    for name in users:
        (run / name).write_text("user\n")
    dead = run / f".last.safetensors.iattn-{_dead_pid()}.k2j3h4g5.tmp"
    dead.write_text("torn")
    live = run / (temp_prefix(run / "metrics.jsonl") + "abcd1234.tmp")  # this (live) process's
    live.write_text("being written")
    RunFolder(run).clean_temp()
    assert not dead.exists()
    assert live.exists() and all((run / name).exists() for name in users)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["home", "data"])
def test_the_home_and_data_folders_are_refused_as_out(corpus, tmp_path, monkeypatch, capsys, where):
    """Before: accepted (and `--out /` as root): a run's files were written into them."""
    folder = tmp_path / where
    folder.mkdir()
    monkeypatch.setenv("HOME" if where == "home" else "IATTN_DATA_DIR", str(folder))
    assert main(_train(corpus, folder)) == 2
    assert ("home folder" if where == "home" else "data folder") in _error(capsys)
    assert list(folder.iterdir()) == []


# ------------------------------------------------------------------ §1: scales' JSON beside its table
def test_scales_json_lands_beside_the_table(corpus, tmp_path, monkeypatch, capsys):
    """Before: `rsplit(".", 1)` on the whole path: `results.v2/table` wrote `results.json` beside the folder,
    `./table` wrote `./.json`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results.v2").mkdir()
    (tmp_path / "results.json").write_text("user's\n")
    args = ["scales", "--preset", "tiny", "--arms", "standard", "--steps", "1", *corpus["ov"]]
    assert main([*args, "--out", "results.v2/table"]) == 0
    assert (tmp_path / "results.json").read_text() == "user's\n"
    assert (tmp_path / "results.v2" / "table").exists() and (tmp_path / "results.v2" / "table.json").exists()
    assert main([*args, "--out", "./table"]) == 0
    assert (tmp_path / "table.json").exists() and not (tmp_path / ".json").exists()

    from iattention.cli.experiments import json_beside
    assert json_beside("t.md") == Path("t.json")
    assert json_beside("t.json") == Path("t.json.json")  # never the table itself


# ------------------------------------------------------------------ §1: a refused lock leaves the holder's alone
@pytest.mark.slow
def test_a_trainer_refused_as_in_use_never_removes_the_holders_lock(corpus, tmp_path, monkeypatch):
    """Before: a trainer that had seen the folder as absent (`_created`) and was then refused as "in use"
    unlinked the live holder's `.lock` on its clean-up, so a third trainer could run there at once.
    The other process winning the race is simulated: it creates the folder and takes the lock in the gap."""
    from iattention.checkpoint.run_folder import RunFolder
    from iattention.train import load_config
    from iattention.train.trainer import Trainer
    from iattention.utils.lock import RunLock, holder

    run = tmp_path / "run"
    taken = []
    real_lock = RunFolder.lock

    def other_wins(self):
        taken.append(RunLock(self.path).acquire())  # the other trainer, just before this one's lock
        return real_lock(self)

    monkeypatch.setattr(RunFolder, "lock", other_wins)
    with pytest.raises(UserError, match="in use"):
        Trainer(load_config("tiny", None, corpus["ov"]), run, quiet=True).run()
    assert (run / ".lock").exists() and holder(run) == str(os.getpid())
    with pytest.raises(UserError, match="in use"):  # a third one is refused too
        RunLock(run).acquire()
    taken[0].release()


# ------------------------------------------------------------------ §3: special files, symlink loops
@pytest.mark.slow
def test_a_fifo_checkpoint_is_refused_not_waited_on(corpus, tmp_path):
    """Before: eval, convert --from, generate and --init-from blocked forever opening the FIFO. Run in a
    child with a timeout, so the old behaviour fails the test instead of hanging it."""
    fifo = tmp_path / "x.safetensors"
    os.mkfifo(fifo)
    script = f"""
import sys
from iattention.cli import main
codes = [main(a) for a in (["eval", {str(fifo)!r}], ["generate", {str(fifo)!r}, "--prompt", "a"],
         ["convert", "--from", {str(fifo)!r}, "--to", "canonical", "--out", {str(tmp_path / 'c')!r}],
         ["train", "--preset", "tiny", "--quiet", "--out", {str(tmp_path / 'r')!r}, "--init-from", {str(fifo)!r},
          *{corpus['ov']!r}])]
print(codes)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=_env())
    assert proc.stdout.strip() == "[2, 2, 2, 2]", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 4 and all("not a regular file" in line for line in lines), proc.stderr


@pytest.mark.slow
def test_a_symlink_loop_as_out_is_one_line(corpus, tmp_path, capsys):
    """Before: `OSError: [Errno 40] Too many levels of symbolic links` (a traceback)."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    assert main(_train(corpus, tmp_path / "loop1")) == 2
    assert "symlink loop" in _error(capsys)


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly(corpus, tmp_path):
    """Before: `iattn params --json | head -c 1` and `iattn generate ... | head -c 20` ended in BrokenPipeError."""
    import torch

    from iattention.checkpoint.state import save_checkpoint
    from iattention.model.gpt import GPT
    from iattention.train import load_config

    cfg = load_config("tiny", None, [*corpus["ov"], "model.vocab_size=256"])
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.safetensors", GPT(cfg.model), {"config": cfg.to_dict()})
    for args in (["params", "--preset", "tiny", "--json"],
                 ["generate", str(tmp_path / "m.safetensors"), "--prompt", "the", "--max-new-tokens", "300"]):
        proc = _with_closed_stdout(args)
        assert proc.returncode in (0, 141) and proc.stderr == "", (args, proc.returncode, proc.stderr)


# ------------------------------------------------------------------ §3: a bad failpoint, a late Ctrl-C
@pytest.mark.slow
def test_a_malformed_failpoint_is_one_line_at_start(corpus, tmp_path, monkeypatch, capsys):
    """Before: `IATTN_FAULT=ckpt_write:abc` trained an epoch, then `int('abc')` raised ValueError."""
    monkeypatch.setenv("IATTN_FAULT", "ckpt_write:abc")
    assert main(_train(corpus, tmp_path / "run")) == 2
    assert "IATTN_FAULT" in _error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_ctrl_c_during_exit_prints_no_traceback(tmp_path):
    """Before: a second Ctrl-C while the process ran its atexit handlers printed "Exception ignored in atexit
    callback" and a KeyboardInterrupt traceback. The late Ctrl-C comes from an atexit handler that runs last."""
    script = """
import atexit, os, signal, sys, time
def late():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)
atexit.register(late)
sys.argv = ["iattn", "params", "--preset", "tiny"]
from iattention.cli import main
sys.exit(main())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, \
        proc.stderr


@pytest.mark.slow
def test_sigterm_to_a_sweep_stops_its_training_child(corpus, tmp_path):
    """Before: `kill -TERM <sweep pid>` orphaned the child, which kept training and holding the lock
    (a rerun said "skipped (running)")."""
    from iattention.utils.lock import holder

    out = tmp_path / "sweep"
    run = out / "standard-h2-s0"
    sweep = subprocess.Popen([sys.executable, "-m", "iattention", "sweep", "--preset", "tiny", "--arms", "standard",
                              "--heads", "2", "--seeds", "0", "--out", str(out), *corpus["ov"], "train.epochs=200"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    child = int(_wait_for(lambda: holder(run)))
    sweep.send_signal(signal.SIGTERM)
    try:
        _, err = sweep.communicate(timeout=60)
        orphan = holder(run)
        assert orphan is None, f"the training child (pid {orphan}) still runs"
        assert sweep.returncode == 128 + signal.SIGTERM and err.strip() == "iattn: stopped by SIGTERM", err
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)
    finally:
        sweep.kill()
        left = holder(run)
        if left:  # the old code's orphan: stop it, the test has failed already
            os.kill(int(left), signal.SIGKILL)


# ------------------------------------------------------------------ §4: messages
@pytest.mark.slow
@pytest.mark.parametrize("name, says", [("r\udcffun", "UTF-8"), ("r\nun", "control characters")])
def test_an_out_that_no_message_can_name_is_refused_first(corpus, tmp_path, capsys, name, says):
    """Before: a non-UTF-8 --out trained fully, then said best.safetensors was corrupt ("delete it");
    a newline in --out split every error into two lines."""
    with pytest.raises(SystemExit) as e:
        main(_train(corpus, str(tmp_path) + "/" + name))
    assert e.value.code == 2 and says in _error(capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_every_error_is_one_line(tmp_path, capsys):
    """A newline in any path a message names (here a config file) cannot split the message."""
    assert main(["train", "--config", f"{tmp_path}/a\nb.yaml", "--quiet", "--out", str(tmp_path / "run")]) == 2
    assert "a\\nb.yaml" in _error(capsys)


@pytest.mark.slow
def test_a_seed_beyond_int64_is_refused_before_the_sweep_writes(corpus, tmp_path, capsys):
    """Before: `sweep --seeds 100000000000000000000` created the run folder and arm.json, then its child
    refused the seed, nested as "iattn: error: run ... failed (exit 2): iattn: error: ..."."""
    out = tmp_path / "sweep"
    assert main(["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "2", "--seeds",
                 "100000000000000000000", "--out", str(out), *corpus["ov"]]) == 2
    message = _error(capsys)
    assert message.count("iattn: error:") == 1 and "train.seed" in message
    assert not out.exists()


@pytest.mark.slow
def test_a_data_dir_that_is_a_file_is_called_a_file(tmp_path, capsys):
    """Before: `IATTN_DATA_DIR=<a file>` said the folder "does not exist"."""
    (tmp_path / "f").write_text("x")
    assert main(["train", "--preset", "tiny", "--quiet", "--out", str(tmp_path / "run"),
                 "--data-dir", str(tmp_path / "f")]) == 2
    assert "is a file, not a folder" in _error(capsys)


@pytest.mark.slow
def test_a_foreign_init_from_file_is_never_called_ours_to_delete(corpus, tmp_path, capsys):
    """Before: `--init-from /etc/passwd` said "corrupt or truncated; delete it"."""
    theirs = tmp_path / "passwd"
    theirs.write_text("root:x:0:0:root:/root:/bin/bash\n")
    assert main(_train(corpus, tmp_path / "run", "--init-from", str(theirs))) == 2
    message = _error(capsys)
    assert "delete" not in message and "not a safetensors file" in message
    assert theirs.exists()


@pytest.mark.slow
def test_a_converted_model_folder_respects_the_umask(corpus, tmp_path, capsys):
    """Before: a converted model's folder kept mkdtemp's 0700 (and its checkpoint mkstemp's 0600)."""
    import torch

    from iattention.checkpoint.state import save_checkpoint
    from iattention.model.gpt import GPT
    from iattention.train import load_config

    cfg = load_config("tiny", None, [*corpus["ov"], "model.vocab_size=256"])
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.safetensors", GPT(cfg.model), {"config": cfg.to_dict()})
    old = os.umask(0o022)
    try:
        assert main(["convert", "--from", str(tmp_path / "m.safetensors"), "--to", "canonical",
                     "--out", str(tmp_path / "c")]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "c").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "c" / "model.safetensors").stat().st_mode & 0o777 == 0o644
