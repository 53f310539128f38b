"""End-to-end tests: bad_inputs."""

import os
import shutil
import subprocess

import pytest
import torch

from helpers import tiny_overrides, write_corpus
from iattention.cli import main
from iattention.train import load_config, train


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    paths = write_corpus(root)
    # CPU behaviours: the runs here train on the CPU on a GPU machine too (a case may set its own device)
    ov = tiny_overrides(paths, root / "cache", **{"train.epochs": 1, "train.device": "cpu"})
    train(load_config("tiny", None, ov), root / "done", quiet=True)
    (root / "empty.txt").write_text("")
    (root / "binary.txt").write_bytes(b"\x00\x01\x02binary\x00" * 50)
    (root / "bad.tiktoken").write_text("aGVsbG8= 0\n")
    (root / "a_file").write_text("not a folder")
    data = open(root / "done" / "best.safetensors", "rb").read()
    (root / "torn.safetensors").write_bytes(data[: len(data) // 2])
    (root / "bad.yaml").write_text("model: [unclosed\n")
    other = root / "other"  # a run folder whose checkpoint comes from a different config
    shutil.copytree(root / "done", other)
    shutil.copy(root / "done" / "last.safetensors", other / "last.safetensors")
    cfg_text = (other / "config.yaml").read_text().replace("n_embd: 32", "n_embd: 16")
    (other / "config.yaml").write_text(cfg_text)
    (other / "summary.json").unlink()
    (root / "a_folder").mkdir()
    (root / "binary.yaml").write_bytes(b"\x00\x01\xff\xfe")
    (root / "latin1.yaml").write_bytes(b"train:\n  epochs: 1  # caf\xe9\n")
    (root / "twice_key.yaml").write_text("train:\n  epochs: 1\n  epochs: 2\n")
    (root / "twice_section.yaml").write_text("train:\n  epochs: 1\ntrain:\n  seed: 2\n")
    (root / "int_keys.yaml").write_text("1: 2\n")
    (root / "twice_arm.yaml").write_text("a: [model.attention=standard]\na: [model.attention=canonical]\n")
    os.mkfifo(root / "fifo")
    lock_dir = root / "lock_dir"  # an unfinished run whose .lock is a folder
    shutil.copytree(root / "done", lock_dir)
    (lock_dir / "summary.json").unlink()
    (lock_dir / ".lock").unlink(missing_ok=True)
    (lock_dir / ".lock").mkdir()
    locked = root / "locked"
    locked.mkdir()
    immutable = subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode == 0
    if not immutable and os.geteuid() != 0:
        os.chmod(locked, 0o500)
        immutable = True
    yield dict(root=root, ov=ov, paths=paths, locked=immutable)
    subprocess.run(["chattr", "-i", str(locked)], capture_output=True)


def _train(env, *extra, out="run", resume=False):
    """A tiny training on the CPU (env's overrides pin it: on a GPU machine `auto` would pick CUDA), unless the
    case sets its own device (a later override wins)."""
    return ["train", "--preset", "tiny", "--out", str(env["root"] / out), "--quiet",
            *(["--resume"] if resume else []), *env["ov"], *extra]


CASES = {
    "unknown config key": (lambda e: _train(e, "model.n_heads=4"), "unknown config key model.n_heads"),
    "unknown section": (lambda e: _train(e, "optimizer.lr=1"), "unknown config section"),
    "wrong type": (lambda e: _train(e, "train.epochs=many"), "train.epochs expects int"),
    "n_embd not divisible by n_head": (lambda e: _train(e, "model.n_head=5"), "not divisible by n_head=5"),
    "unknown attention": (lambda e: _train(e, "model.attention=linear"), "unknown attention 'linear'"),
    "unknown preset": (lambda e: ["train", "--preset", "nope", "--out", str(e["root"] / "x")], "unknown preset"),
    "config file not YAML": (lambda e: ["train", "--config", str(e["root"] / "bad.yaml"), "--out",
                                        str(e["root"] / "x")], "not valid YAML"),
    "block size larger than the model's": (
        lambda e: ["eval", str(e["root"] / "done" / "best.safetensors"), "--block-size", "999"],
        "larger than the model's block_size"),
    "missing data folder": (lambda e: ["train", "--preset", "tiny", "--out", str(e["root"] / "x"), "--data-dir",
                                       str(e["root"] / "nowhere")], "does not exist"),
    "missing train file": (lambda e: _train(e, f"data.train={e['root'] / 'nope.txt'}"), "does not exist"),
    "empty training file": (lambda e: _train(e, f"data.train={e['root'] / 'empty.txt'}"), "is empty"),
    "binary training file": (lambda e: _train(e, f"data.train={e['root'] / 'binary.txt'}"), "looks binary"),
    "unknown tokenizer": (lambda e: _train(e, "data.tokenizer=wordpiece"), "unknown tokenizer"),
    "bad bpe size": (lambda e: _train(e, "data.tokenizer=bpe:12"), "N must be an integer in [257, 65535]"),
    "tokenizer file with the wrong hash": (
        lambda e: _train(e, "data.tokenizer=gpt2", f"data.tokenizer_file={e['root'] / 'bad.tiktoken'}"),
        "not the GPT-2 r50k_base ranks"),
    "vocabulary larger than the model's": (lambda e: _train(e, "model.vocab_size=100"),
                                           "has 256 tokens but model.vocab_size is 100"),
    "corrupt checkpoint": (lambda e: ["eval", str(e["root"] / "torn.safetensors")], "corrupt or truncated"),
    "checkpoint from a different config": (lambda e: _train(e, "model.n_embd=16", out="other", resume=True),
                                           "comes from a different config"),
    "resuming into a folder of another run": (lambda e: _train(e, "model.n_layer=2", out="done", resume=True),
                                              "holds a run with another config"),
    "existing run without --resume": (lambda e: _train(e, out="done"), "pass --resume"),
    "output folder that is a file": (lambda e: _train(e, out="a_file"), "is a file"),
    "a --heads value the model cannot take": (
        lambda e: ["sweep", "--preset", "tiny", "--heads", "3", "--out", str(e["root"] / "sw"), *e["ov"]],
        "not divisible by n_head=3"),
    "bad --heads syntax": (lambda e: ["params", "--heads", "four"], "expected comma-separated integers"),
    "batch too large for the data": (lambda e: _train(e, "train.batch_size=4096"), "fewer than one batch"),
    "negative learning rate": (lambda e: _train(e, "optim.lr=-1"), "optim.lr must be > 0"),
    "beta2 outside [0, 1)": (lambda e: _train(e, "optim.beta2=1.5"), "optim.beta2 must be in [0, 1)"),
    "negative thread count": (lambda e: _train(e, "train.threads=-1"), "train.threads must be >= 0"),
    "unknown device": (lambda e: _train(e, "train.device=tpu"), "train.device must be one of auto, cpu, cuda"),
    "cuda on a torch without CUDA": (lambda e: _train(e, "train.device=cuda"), "sees no CUDA device"),
    "negative eval block size": (
        lambda e: ["eval", str(e["root"] / "done" / "best.safetensors"), "--block-size", "-5"],
        "expected an integer >= 1, got -5"),
    "zero eval batch size": (
        lambda e: ["eval", str(e["root"] / "done" / "best.safetensors"), "--batch-size", "0"],
        "expected an integer >= 1, got 0"),
    "zero sweep jobs": (lambda e: ["sweep", "--preset", "tiny", "--jobs", "0", "--out", str(e["root"] / "sw"),
                                   *e["ov"]], "expected an integer >= 1, got 0"),
    "canonical halves on standard attention": (lambda e: _train(e, "model.canonical_halves=qk"),
                                               "only applies to attention=canonical"),
    "matched init of a smaller class": (lambda e: _train(e, "model.attention=identity_ko", "model.init=matched"),
                                        "model.init=matched is impossible for attention=identity_ko"),
    "override that sets a grid axis": (
        lambda e: ["compare", "--preset", "tiny", "--heads", "1", "--out", str(e["root"] / "sw"), *e["ov"],
                   "model.n_head=2"], "an axis of the grid; use --heads"),
    "override that collides with an arm": (
        lambda e: ["compare", "--preset", "tiny", "--heads", "1", "--out", str(e["root"] / "sw"), *e["ov"],
                   "model.attention=identity_q"], "collides with arm 'standard'"),
    "unknown arm": (lambda e: ["sweep", "--preset", "tiny", "--arms", "fancy", "--out", str(e["root"] / "sw"),
                               *e["ov"]], "unknown arm 'fancy'"),
    "params of a preset with heads it cannot take": (lambda e: ["params", "--preset", "tiny", "--heads", "3"],
                                                     "n_embd=32 of preset tiny is not divisible by n_head=3"),
    "unrecognized argument": (lambda e: _train(e, "--fast"), "unrecognized arguments: --fast"),
    # Issue 23: values too large for torch's C integers, or for memory.
    "seed beyond a 64-bit integer": (lambda e: _train(e, f"train.seed={10**23}"), "train.seed must be < 2^63"),
    "thread count beyond a C int": (lambda e: _train(e, f"train.threads={10**20}"), "train.threads must be <= 4096"),
    "generate --seed beyond a 64-bit integer": (
        lambda e: ["generate", str(e["root"] / "done"), "--prompt", "the", "--seed", str(10**23)],
        "argument --seed: expected an integer <= 9223372036854775807"),
    "scales --seed beyond a 64-bit integer": (
        lambda e: ["scales", "--preset", "tiny", *e["ov"], "--seed", str(10**23)],
        "argument --seed: expected an integer <="),
    "a vocabulary larger than memory": (lambda e: _train(e, "model.vocab_size=100000000000"),
                                        "needs an estimated"),
    # Issue 23: paths that are not what they should be.
    "train --out under a file": (lambda e: _train(e, out="a_file/run"), "a part of that path is a file"),
    "report --out under a file": (
        lambda e: ["report", str(e["root"] / "done"), "--out", str(e["root"] / "a_file" / "r")], "lies under"),
    "lab --out under a file": (lambda e: ["lab", "copy", "--out", str(e["root"] / "a_file" / "lab")], "lies under"),
    "convert --out under a file": (
        lambda e: ["convert", "--from", str(e["root"] / "done"), "--to", "canonical", "--out",
                   str(e["root"] / "a_file" / "c")], "which is a file, not a folder"),
    "scales --out a folder": (lambda e: ["scales", "--preset", "tiny", *e["ov"], "--out", str(e["root"] / "a_folder")],
                              "is a folder; give a file path"),
    "an empty --out": (lambda e: ["train", "--preset", "tiny", "--out", "", *e["ov"]], "expected a path, got an empty"),
    "config file that is a folder": (lambda e: ["train", "--config", str(e["root"] / "a_folder"), "--out",
                                                str(e["root"] / "x")], "is a folder, not a file"),
    "config file that is binary": (lambda e: ["train", "--config", str(e["root"] / "binary.yaml"), "--out",
                                              str(e["root"] / "x")], "is not UTF-8 text"),
    "config file that is not UTF-8": (lambda e: ["train", "--config", str(e["root"] / "latin1.yaml"), "--out",
                                                 str(e["root"] / "x")], "is not UTF-8 text (byte 25)"),
    "config file with non-string keys": (lambda e: ["train", "--config", str(e["root"] / "int_keys.yaml"), "--out",
                                                    str(e["root"] / "x")], "unknown config section(s) [1]"),
    "config key given twice": (lambda e: _train(e, "--config", str(e["root"] / "twice_key.yaml")),
                               "key 'epochs' appears twice in one mapping at line 3"),
    "config section given twice": (lambda e: _train(e, "--config", str(e["root"] / "twice_section.yaml")),
                                   "key 'train' appears twice in one mapping at line 3"),
    "arms file that is a folder": (
        lambda e: ["sweep", "--preset", "tiny", "--arms", "a", "--arms-file", str(e["root"] / "a_folder"), "--out",
                   str(e["root"] / "sw"), *e["ov"]], "arms file"),
    "arm defined twice in an arms file": (
        lambda e: ["sweep", "--preset", "tiny", "--arms", "a", "--arms-file", str(e["root"] / "twice_arm.yaml"),
                   "--out", str(e["root"] / "sw"), *e["ov"]], "key 'a' appears twice"),
    "arm named twice": (lambda e: ["sweep", "--preset", "tiny", "--arms", "standard,standard", "--out",
                                   str(e["root"] / "sw"), *e["ov"]], "arm names repeat"),
    "no arm at all": (lambda e: ["sweep", "--preset", "tiny", "--arms", ",", "--out", str(e["root"] / "sw"), *e["ov"]],
                      "expected comma-separated names, got ','"),
    "a FIFO as the train file": (lambda e: _train(e, f"data.train={e['root'] / 'fifo'}"), "is not a regular file"),
    "data.cache_dir that is a file": (lambda e: _train(e, f"data.cache_dir={e['root'] / 'a_file'}"),
                                      "is a file, not a folder; point data.cache_dir"),
    "a run's .lock that is a folder": (lambda e: _train(e, out="lock_dir", resume=True), "is a folder; remove it"),
    "a prompt that is not UTF-8": (
        lambda e: ["generate", str(e["root"] / "done"), "--prompt", b"\xff\xfe".decode("utf-8", "surrogateescape")],
        "argument --prompt: expected UTF-8 text"),
    "a top-p of 0": (lambda e: ["generate", str(e["root"] / "done"), "--prompt", "a", "--top-p", "0"],
                     "expected a probability in (0, 1]"),
    "bench --windows 0": (lambda e: ["bench", "--preset", "tiny", "--windows", "0"], "expected an integer >= 1, got 0"),
    "bench --rounds 0": (lambda e: ["bench", "--preset", "tiny", "--rounds", "0"], "expected an integer >= 1, got 0"),
    "bench --threads -1": (lambda e: ["bench", "--preset", "tiny", "--threads", "-1"], "expected an integer >= 0"),
    "convert to an existing folder": (
        lambda e: ["convert", "--from", str(e["root"] / "done"), "--to", "canonical", "--out", str(e["root"] / "done")],
        "already exists"),
}


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(env, name, capsys):
    if name == "cuda on a torch without CUDA" and torch.cuda.is_available():
        pytest.skip("this torch sees a CUDA device")
    make_args, expected = CASES[name]
    before = sorted(os.listdir(env["root"]))
    try:
        code = main(make_args(env))
    except SystemExit as e:  # argparse usage errors
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, name
    assert len(err) == 1, err
    assert err[0].startswith("iattn") and "error:" in err[0] and expected in err[0], err[0]
    assert "Traceback" not in err[0]
    assert sorted(os.listdir(env["root"])) == before  # no partial output


@pytest.mark.slow
def test_unwritable_output_folder(env, capsys):
    if not env["locked"]:
        pytest.skip("cannot make a folder unwritable here (no chattr, running as root)")
    code = main(_train(env, out="locked/run"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not writable" in err[0]


@pytest.mark.slow
def test_disk_full_during_checkpoint_write_keeps_old_checkpoint(env, monkeypatch, capsys):
    import errno

    from iattention.checkpoint import state as checkpoint
    from iattention.checkpoint.writer import ShardWriter

    real_finish, calls = ShardWriter.finish, []

    def fills_the_disk(writer, *args):
        calls.append(writer.names[0])
        real_finish(writer, *args)
        if len(calls) == 2:  # the second checkpoint write runs out of space part-way
            with open(writer.folder / writer.names[0], "r+b") as f:
                f.truncate(100)
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ShardWriter, "finish", fills_the_disk)
    out = env["root"] / "diskfull"
    code = main(_train(env, "train.ckpt_every_steps=2", out="diskfull"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "disk full" in err[0], err
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    meta = checkpoint.read_meta(out / "last.safetensors")  # the first checkpoint, intact
    assert meta["state"]["step"] == 2
    shutil.rmtree(out)


@pytest.mark.slow
def test_disk_full_while_writing_the_lock_is_one_line_and_no_folder(env, monkeypatch, capsys):
    import errno

    from iattention.utils import lock

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lock.os, "pwrite", full)
    code = main(_train(env, out="lockfull"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "cannot take the lock" in err[0] and "disk full" in err[0], err
    assert not (env["root"] / "lockfull").exists()


@pytest.mark.slow
def test_the_lock_is_held_while_the_data_loads(env, monkeypatch, tmp_path):
    """A second sweep must see a run that is still loading its data as in use (and skip it), so the
    trainer takes the lock before loading: checked from inside the data loading."""
    from iattention.train import corpus
    from iattention.utils.lock import holder

    out, seen = tmp_path / "run", []
    real = corpus.load_data

    def load_and_look(cfg, *args, **kw):
        seen.append(holder(out))
        return real(cfg, *args, **kw)

    monkeypatch.setattr(corpus, "load_data", load_and_look)
    assert main(["train", "--preset", "tiny", "--out", str(out), "--quiet", *env["ov"]]) == 0
    assert seen == [str(os.getpid())]


@pytest.mark.slow
def test_temps_of_a_killed_writer_are_removed_at_the_next_write_and_a_live_one_is_kept(env, tmp_path, capsys):
    """A SIGKILLed `report` leaves `.NAME.iattn-PID.xxxx.tmp` figures, a killed `convert` a `.NAME.iattn-PID.xxxx.conv`
    folder: the next report / convert of the same target removes them when PID is gone, keeps them if not."""
    out = tmp_path / "report"
    out.mkdir()
    dead, alive = _dead_pid(), os.getppid()
    stale = out / f".perplexity_vs_epoch.png.iattn-{dead}.abcd1234.tmp"
    live = out / f".perplexity_vs_epoch.png.iattn-{alive}.efgh5678.tmp"
    stale.write_bytes(b"half a png")
    live.write_bytes(b"another writer's png")
    assert main(["report", str(env["root"] / "done"), "--out", str(out)]) == 0
    assert not stale.exists() and live.exists()
    conv_stale = tmp_path / f".conv.iattn-{dead}.abcd1234.conv"
    conv_stale.mkdir()
    (conv_stale / "model.safetensors").write_bytes(b"half")
    assert main(["convert", "--from", str(env["root"] / "done"), "--to", "canonical", "--out",
                 str(tmp_path / "conv")]) == 0
    assert not conv_stale.exists() and (tmp_path / "conv" / "model.safetensors").exists()
    capsys.readouterr()
