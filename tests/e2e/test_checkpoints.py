"""Run folders and checkpoints: a damaged, crafted, foreign or special file, a header declaring more than the
file holds, non-finite or all-zero weights, a summary that disagrees with its log, a checkpoint without its
optimizer state or from other data: every command that reads one refuses it in one line. What resume and
--init-from accept."""

import contextlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import uuid

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from helpers import SWEEP_RUN as RUN
from helpers import copy_tree as _copy
from helpers import copy_tree as _copy_folder
from helpers import edit_meta as _edit_meta
from helpers import garbage as _garbage
from helpers import one_line_error, sparse_checkpoint
from helpers import one_line_naming as _one_line_naming
from helpers import plant as _plant
from helpers import refused as _refused
from helpers import rewrite_safetensors as _rewrite
from helpers import run_cli as _run
from helpers import subprocess_env as _env
from helpers import train_argv as _train
from iattention.cli import main


# ------------------------------------------------------------------ damaged run files (a fuzz of each file's bytes)
def _commands(env, case_root):
    """Every command a user would run on the finished run, each a fresh argv (outputs under case_root)."""
    run, ov = case_root / "sw" / RUN, env["ov"]
    resume = ["train", "--preset", "tiny", "--out", str(run), "--resume", "--quiet", *ov,
              "model.n_head=2", "model.attention=standard", "train.seed=0"]
    return {
        "report": ["report", str(case_root / "sw"), "--out", str(case_root / "report")],
        "sweep": [*env["sweep"], "--out", str(case_root / "sw")],
        "train --resume": resume,
        "train --resume (extend)": [*resume[:-1], "train.epochs=2"],
        "eval": ["eval", str(run)],
        "generate": ["generate", str(run), "--prompt", "the cat", "--max-new-tokens", "2"],
        "convert": ["convert", "--from", str(run), "--to", "canonical", "--out", str(case_root / "conv")],
        "train --init-from": ["train", "--preset", "tiny", "--out", str(case_root / "ft"), "--quiet", *ov,
                              "--init-from", str(run)],
    }


# Which commands read which file of a finished run: these must refuse a corrupted one.
READS = {
    "config.yaml": ("yaml", ["train --resume", "train --resume (extend)"]),
    "summary.json": ("json", ["report", "sweep", "train --resume"]),
    "arm.json": ("json", ["report"]),  # a sweep skips a finished run by its summary alone
    "metrics.jsonl": ("jsonl", ["report", "train --resume (extend)"]),
    "steps.jsonl": ("jsonl", ["report", "train --resume (extend)"]),
    "best.safetensors": ("safetensors", ["eval", "generate", "convert", "train --init-from"]),
    "last.safetensors": ("safetensors", ["train --resume (extend)"]),
}


# A config.yaml cut short that still parses can be harmless: resume compares each identity key with the
# command's own config and takes everything else from the command. Exit 0 is accepted there only when
# the run's results are exactly the intact run's.
HARMLESS_IF_SAME = {("config.yaml", "cut short")}


RESULT_KEYS = ("best_val_ppl", "best_epoch", "test_ppl", "epochs_run", "steps", "params")


def _result(case) -> dict:
    summary = json.loads((case / "sw" / RUN / "summary.json").read_text())
    return {k: summary[k] for k in RESULT_KEYS}


def _intact_result(env, command, tmp_path, capsys) -> dict:
    case = tmp_path / "intact"
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(env["run"].parent, case / "sw")
    assert _run(_commands(env, case)[command]) == 0
    capsys.readouterr()
    return _result(case)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(READS))
def test_garbage_in_a_run_file_is_one_line_from_every_command_that_reads_it(finished, name, tmp_path, capsys):
    kind, readers = READS[name]
    original = (finished["run"] / name).read_bytes()
    rng = random.Random(f"hostile:{name}")
    tried = 0
    for label, data in _garbage(original, kind, rng).items():
        for command in readers:
            case = tmp_path / f"{len(label)}-{tried}"
            shutil.copytree(finished["run"].parent, case / "sw")
            (case / "sw" / RUN / name).write_bytes(data)
            code = _run(_commands(finished, case)[command])
            if code == 0 and (name, label) in HARMLESS_IF_SAME:
                capsys.readouterr()
                intact = _intact_result(finished, command, tmp_path, capsys)
                assert _result(case) == intact, f"{name} ({label}) under {command}: another result"
            else:
                _one_line_naming(capsys, code, name, f"{name} ({label}) under {command}")
            assert not (case / "conv").exists() and not (case / "ft").exists()  # nothing half-made
            assert not (case / "report" / "report.md").exists()
            tried += 1
    assert tried >= 6 * len(readers)
    assert not os.path.exists("/tmp/pwned")


@pytest.mark.slow
def test_a_config_cut_inside_a_number_names_config_yaml_on_resume(finished, tmp_path, capsys):
    """A config.yaml cut short inside a value ('eval_batch_size: 64' -> '...: 6') still parses, as
    another config: resume refuses it with one line that names config.yaml (found by CI, where the
    fuzz's cut fell there for one temporary-path length)."""
    original = (finished["run"] / "config.yaml").read_text()
    numbers = list(re.finditer(r": (\d\d+)\n", original))
    assert numbers, "the fixture's config has no value of two digits or more"
    last = numbers[-1]
    shutil.copytree(finished["run"].parent, tmp_path / "sw")
    (tmp_path / "sw" / RUN / "config.yaml").write_text(original[:last.start(1) + 1])
    code = _run(_commands(finished, tmp_path)["train --resume"])
    line = _one_line_naming(capsys, code, "config.yaml", "config.yaml cut inside a number")
    assert "another config" in line


@pytest.mark.slow
def test_a_file_that_only_other_commands_read_does_not_stop_eval(finished, tmp_path, capsys):
    """The refusals above are the file's doing: eval reads only the weights, so garbage in the logs and
    the summary leaves it working (exit 0) with the intact run's number."""
    assert main(["eval", str(finished["run"]), "--json"]) == 0
    intact = json.loads(capsys.readouterr().out)
    shutil.copytree(finished["run"], tmp_path / "run")
    for name in ("summary.json", "metrics.jsonl", "steps.jsonl", "arm.json", "config.yaml"):
        (tmp_path / "run" / name).write_bytes(b"\xff garbage")
    assert main(["eval", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ppl"] == intact["ppl"]


# ------------------------------------------------------------------ crafted but parseable checkpoints, a full disk
def _craft(tensors: dict, meta: dict, case: str) -> None:
    if case == "model.dropout is a string":
        meta["config"]["model"]["dropout"] = "abc"
    elif case == "an extra state key":
        meta["state"]["bogus"] = 1
    elif case == "a state value of another type":
        meta["state"]["step"] = "23"
    elif case == "no optimizer entry":
        del meta["optimizer"]
    elif case == "param_groups not a list":
        meta["optimizer"]["param_groups"] = {"params": 3}
    elif case == "a tensor optim/notanint/...":
        tensors["optim/notanint/exp_avg"] = tensors.pop("optim/0/exp_avg")
    elif case == "an optimizer index beyond the parameters":
        tensors["optim/999/exp_avg"] = tensors.pop("optim/0/exp_avg")
    elif case == "rng/torch as float32":
        tensors["rng/torch"] = tensors["rng/torch"].float()
    elif case == "config a list":
        meta["config"] = [1, 2]
    elif case == "tokenizer not a string":
        meta["tokenizer"] = {"bpe": 300}
    else:
        raise AssertionError(case)


CRAFTED = ["model.dropout is a string", "an extra state key", "a state value of another type", "no optimizer entry",
           "param_groups not a list", "a tensor optim/notanint/...", "an optimizer index beyond the parameters",
           "rng/torch as float32", "config a list", "tokenizer not a string"]


@contextlib.contextmanager
def _small_disk(folder, free_bytes: int):
    """A 2 MB tmpfs mounted at `folder`, filled so that about `free_bytes` stay free; always unmounted."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs here ({e}); needs root (mount -t tmpfs)")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()[:80]}); needs root (mount -t tmpfs)")
    try:
        st = os.statvfs(folder)
        with open(folder / "filler", "wb") as f:
            f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - free_bytes))
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=60)


def _leftovers(folder) -> list[str]:
    """Temp files or folders, or half-written outputs, under folder."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.name.endswith((".tmp", ".conv")) or p.name.startswith(".") and p.name != ".lock")


@pytest.mark.slow
@pytest.mark.parametrize("case", CRAFTED)
def test_crafted_checkpoint_metadata_is_one_line(run, tmp_path, capsys, case):
    """The fuzz test (test_hostile_files.py) damages bytes; these files parse, with a wrong schema or type."""
    dst = tmp_path / "run"
    shutil.copytree(run["run"], dst)
    path = dst / "last.safetensors"
    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["iattention"])
    _craft(tensors, meta, case)
    save_file(tensors, str(path), metadata={"iattention": json.dumps(meta)})
    capsys.readouterr()
    rc = main(["train", "--preset", "tiny", "--quiet", *run["ov"], "train.epochs=2", "--out", str(dst), "--resume"])
    one_line_error(capsys, rc, str(path))
    if case in ("model.dropout is a string", "config a list", "tokenizer not a string"):  # read by eval too
        rc = main(["eval", str(path)])
        one_line_error(capsys, rc, str(path))


@pytest.mark.slow
def test_a_real_full_disk_is_one_line(run, tmp_path, capsys):
    """safetensors raises SafetensorError (not OSError) on ENOSPC, numpy's tofile an OSError without errno:
    train (checkpoint, token cache) and convert --to canonical|hf each say "disk full", and leave no
    half-written file behind."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    with _small_disk(mnt, free_bytes=64 * 1024):
        capsys.readouterr()
        # the checkpoint (weights + AdamW moments, ~260 kB) does not fit
        rc = main(["train", "--preset", "tiny", "--quiet", *run["ov"], "--out", str(mnt / "run")])
        one_line_error(capsys, rc, "disk full while writing", "free space and rerun")
        assert not list((mnt / "run").glob("*.safetensors")), _leftovers(mnt)
        # the token cache on the full disk (the train split is ~12 kB of uint16 ids)
        ov = [o if not o.startswith("data.cache_dir=") else f"data.cache_dir={mnt / 'cache'}" for o in run["ov"]]
        (mnt / "pad").write_bytes(b"\0" * (os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize - 4096))
        rc = main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(tmp_path / "run2")])
        one_line_error(capsys, rc, "disk full while writing", "free space and rerun")
        (mnt / "pad").unlink()
        for to in ("canonical", "hf"):
            rc = main(["convert", "--from", str(run["run"]), "--to", to, "--out", str(mnt / to)])
            one_line_error(capsys, rc, "disk full while writing", "free space and rerun")
            assert not (mnt / to).exists()
        assert _leftovers(mnt) == [], _leftovers(mnt)
        assert not list((mnt / "cache").rglob("*.bin")), "a half-written token cache was left"


# ------------------------------------------------------------------ headers that declare more than the file
@pytest.mark.slow
def test_a_header_declaring_gigabytes_over_a_sparse_file_is_refused_unread(run, tmp_path, capsys):
    path = tmp_path / "huge.safetensors"
    sparse_checkpoint(run["run"], path)
    assert path.stat().st_size > 16 * 2**30 and path.stat().st_blocks * 512 < 2**20  # sparse
    capsys.readouterr()
    rc = main(["eval", str(path), "--data-dir", str(run["root"])])
    one_line_error(capsys, rc, "declares 16 GiB of tensors", "sparse or crafted")


@pytest.mark.parametrize("path", ["file", "run folder"])
def test_a_16_gib_header_under_a_memory_limit_is_one_line(tmp_path, run_and_corpus, path):
    """`prlimit --as=6000000000 iattn eval run` whose checkpoint declares a 16 GiB tensor over a sparse file:
    safetensors mapped the whole file before the declared size was checked (MemoryError). The header is now
    read with plain reads first."""
    import resource

    from helpers import sparse_checkpoint

    folder = _copy_folder(run_and_corpus["run"], tmp_path / "run")
    for name in ("best.safetensors", "last.safetensors"):
        sparse_checkpoint(run_and_corpus["run"], folder / name)
    target = folder / "best.safetensors" if path == "file" else folder

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6_000_000_000, 6_000_000_000))

    proc = subprocess.run([sys.executable, "-m", "iattention", "eval", str(target), "--split", "test"],
                          capture_output=True, text=True, preexec_fn=limit, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("iattn: error:") and "declares 16 GiB" in lines[0], lines


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


# ------------------------------------------------------------------ weights: non-finite, all zero
@pytest.mark.slow
@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("command", ["eval", "convert", "generate", "inspect"])
def test_non_finite_weights_in_our_checkpoint_are_refused_naming_the_tensor(env, tmp_path, capsys, command, value):
    run = _copy(env["run"], tmp_path / "run")
    key = "transformer.h.0.mlp.c_fc.weight"
    _rewrite(run / "best.safetensors", _plant(value, f"model/{key}"))
    argv = {"eval": ["eval", run],
            "convert": ["convert", "--from", run, "--to", "standard", "--out", tmp_path / "out"],
            "generate": ["generate", run, "--prompt", "the cat", "--max-new-tokens", "5"],
            "inspect": ["inspect", run, "--prompt", "the cat", "--out", tmp_path / "insp"]}[command]
    _refused(capsys, argv, key, "non-finite")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("to", ["standard", "hf"])
def test_an_all_zero_model_is_one_line_not_a_division_by_zero(env, tmp_path, capsys, to):
    run = _copy(env["run"], tmp_path / "run")

    def zero(tensors):
        for k in tensors:
            if k.startswith("model/"):
                tensors[k] = torch.zeros_like(tensors[k])
    _rewrite(run / "best.safetensors", zero)
    _refused(capsys, ["convert", "--from", run, "--to", to, "--out", tmp_path / "out"], "all zero")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ summary.json against metrics.jsonl
EDITS = {"best_val_ppl": 1.23, "best_epoch": 5, "epochs_run": 3, "test_ppl": -4.0}


@pytest.mark.slow
@pytest.mark.parametrize("key", [*EDITS, "best_val_ppl=nan"])
def test_report_refuses_a_summary_that_disagrees_with_its_metrics(env, tmp_path, capsys, key):
    sw = _copy(env["run"].parent, tmp_path / "sw")
    assert _run(["report", sw, "--out", tmp_path / "intact"]) == 0  # the run as trained is reported
    capsys.readouterr()
    summary = json.loads((sw / RUN / "summary.json").read_text())
    name, value = ("best_val_ppl", math.nan) if key.endswith("nan") else (key, EDITS[key])
    summary[name] = value
    (sw / RUN / "summary.json").write_text(json.dumps(summary))
    _refused(capsys, ["report", sw, "--out", tmp_path / "rep"], RUN, name)
    assert not (tmp_path / "rep" / "report.md").exists()


@pytest.mark.slow
def test_sweep_refuses_a_summary_that_disagrees_with_its_metrics(env, tmp_path, capsys):
    sw = _copy(env["run"].parent, tmp_path / "sw")
    summary = json.loads((sw / RUN / "summary.json").read_text())
    summary["best_val_ppl"] = 1.23
    (sw / RUN / "summary.json").write_text(json.dumps(summary))
    _refused(capsys, [*env["sweep"], "--out", sw], RUN, "best_val_ppl")


@pytest.mark.slow
def test_report_refuses_a_negative_perplexity_in_the_log(env, tmp_path, capsys):
    sw = _copy(env["run"].parent, tmp_path / "sw")
    lines = (sw / RUN / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    recs[-1]["val_ppl"] = -recs[-1]["val_ppl"]
    (sw / RUN / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    _refused(capsys, ["report", sw, "--out", tmp_path / "rep"], "metrics.jsonl", "val_ppl")


# ------------------------------------------------------------------ resume and --init-from
def _extend(run, ov):
    return ["train", "--quiet", "--resume", "--out", run, *ov, "train.epochs=2"]


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_without_its_optimizer_tensors(env, tmp_path, capsys):
    run = _copy(env["run"], tmp_path / "run")

    def strip(tensors):
        for k in [k for k in tensors if k.startswith("optim/")]:
            del tensors[k]
    _rewrite(run / "last.safetensors", strip)
    _refused(capsys, _extend(run, env["ov"]), "last.safetensors", "optimizer")
    # one written before the names were recorded: refused all the same
    _rewrite(run / "last.safetensors", lambda t: None, _edit_meta(lambda m: m["optimizer"].pop("tensors")))
    _refused(capsys, _extend(run, env["ov"]), "last.safetensors", "optimizer")


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_missing_some_optimizer_tensors(env, tmp_path, capsys):
    run = _copy(env["run"], tmp_path / "run")

    def strip(tensors):
        for k in [k for k in tensors if k.endswith("/exp_avg_sq")]:
            del tensors[k]
    _rewrite(run / "last.safetensors", strip)
    _refused(capsys, _extend(run, env["ov"]), "last.safetensors", "exp_avg_sq")


@pytest.mark.slow
def test_eval_refuses_a_checkpoint_copied_in_from_another_run(env, tmp_path, capsys):
    run = _copy(env["run"], tmp_path / "run")
    shutil.copy(env["root"] / "canonical" / "model.safetensors", run / "best.safetensors")
    _refused(capsys, ["eval", run], "best.safetensors", "not this run's")
    _refused(capsys, ["eval", run / "best.safetensors"], "not this run's")


@pytest.mark.slow
def test_resume_refuses_changed_training_data(env, tmp_path, capsys):
    run = _copy(env["run"], tmp_path / "run")
    train = env["paths"]["train"]
    original = open(train).read()
    try:
        with open(train, "w") as f:
            f.write(original.replace("cat", "cow"))
        _refused(capsys, _extend(run, env["ov"]), "last.safetensors", "train data")
        assert "tb" not in os.listdir(run) and json.loads((run / "summary.json").read_text())["epochs_run"] == 1
    finally:
        with open(train, "w") as f:
            f.write(original)


@pytest.mark.slow
def test_resume_of_a_checkpoint_without_a_fingerprint_is_accepted_silently(env, tmp_path, capsys):
    run = _copy(env["run"], tmp_path / "run")
    _rewrite(run / "last.safetensors", lambda t: None, _edit_meta(lambda m: m.pop("data_fingerprint", None)))
    assert _run(_extend(run, env["ov"])) == 0
    assert "fingerprint" not in capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["epochs_run"] == 2


@pytest.mark.slow
def test_init_from_is_stored_resolved(env, tmp_path, monkeypatch):
    from iattention.config import load_config

    shutil.copytree(env["run"], tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    assert load_config("tiny", None, ["train.init_from=src"]).train.init_from == str(tmp_path / "src")
    # a saved run's own value is kept as it was (resume compares it with the run's config)
    assert load_config(None, None, [], base={"train": {"init_from": "src"}}).train.init_from == "src"
    assert _run(_train("r", env["ov"], "--init-from", "src")) == 0
    import yaml

    saved = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert saved["train"]["init_from"] == str(tmp_path / "src")
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["started_from"]["source"] == str(tmp_path / "src")
