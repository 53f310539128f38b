"""The training loop (`train/trainer.py`) on a run small enough for the fast layer: what it writes agrees with
itself (summary, metrics.jsonl, steps.jsonl, checkpoints), its learning rates are the schedule's, its test
perplexity is that of the best-validation weights, and a finished run is not trained again."""

import copy
import json
import random
import subprocess
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

import iattention
from helpers import tiny_overrides, write_corpus
from iattention.checkpoint import state as ckpt
from iattention.config import load_config
from iattention.data.dataset import n_train_windows
from iattention.model.gpt import GPT
from iattention.train.distributed import DistContext
from iattention.train.evaluate import split_nll
from iattention.train.schedule import lr_at
from iattention.train.trainer import load_run_config, train

EPOCHS, BATCH, BLOCK = 3, 4, 8


def json_lines(path):
    return [json.loads(x) for x in open(path)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer")
    paths = write_corpus(root, n_train=700, n_eval=200)
    rng = random.Random(0)  # validation on random letters: the more it learns the corpus, the worse it scores
    with open(paths["valid"], "w") as f:
        f.write("".join(rng.choice("abcdefghijklmnopqrstuvwxyz .") for _ in range(200)))
    ov = tiny_overrides(paths, root / "cache", **{
        "model.n_embd": 16, "model.n_head": 2, "model.block_size": BLOCK, "train.epochs": EPOCHS,
        "train.batch_size": BATCH, "train.threads": 1, "train.eval_batch_size": 16, "optim.warmup_steps": 3})
    cfg = load_config("tiny", None, ov)
    before = cfg.to_dict()
    out = root / "run"
    began = datetime.now().astimezone()
    summary = train(cfg, out, quiet=True)
    ended = datetime.now().astimezone()
    assert cfg.to_dict() == before  # the caller's config is left as it was
    return dict(cfg=cfg, out=out, summary=summary, paths=paths, began=began, ended=ended,
                metrics=[json.loads(x) for x in open(out / "metrics.jsonl")],
                steps=[json.loads(x) for x in open(out / "steps.jsonl")])


def test_the_run_takes_every_whole_batch_of_every_epoch_and_logs_each_step(run):
    s, cfg = run["summary"], run["cfg"]
    n_tokens = len(open(run["paths"]["train"], "rb").read())  # the byte tokenizer: one token a byte
    per_epoch = n_train_windows(np.arange(n_tokens), BLOCK) // BATCH
    assert s["epochs_run"] == EPOCHS and s["steps"] == per_epoch * EPOCHS
    assert [r["step"] for r in run["steps"]] == list(range(1, s["steps"] + 1))
    assert s["tokens_seen"] == s["steps"] * BATCH * BLOCK
    kinds = [(r["kind"], r["epoch"], r["step"]) for r in run["metrics"]]
    assert kinds == [("start", 0, 0)] + [("epoch", e, e * per_epoch) for e in range(1, EPOCHS + 1)]
    assert cfg.model.vocab_size == 0 and s["config"]["model"]["vocab_size"] == 256  # resolved in the record


def test_the_run_s_files_say_when_it_ran_and_on_which_commit(run):
    """The start record and the summary: UTC start (and end) times inside the run's own, and the commit of the
    checkout the package runs from (None outside one), so a study's runs can be put in order (issue 65)."""
    s, start = run["summary"], run["metrics"][0]
    package = Path(iattention.__file__).resolve().parent  # the checkout the package runs from, if it is in one
    head = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True)
    want = head.stdout.strip() if head.returncode == 0 else None
    assert start["kind"] == "start" and start["commit"] == s["commit"] == want
    assert isinstance(s["commit_dirty"], bool) if want else s["commit_dirty"] is None
    when = [datetime.strptime(t, "%Y-%m-%dT%H:%M:%S%z") for t in (start["started_at"], s["started_at"],
                                                                  s["finished_at"])]
    assert start["started_at"] == s["started_at"] and all(t.tzinfo is not None for t in when)
    assert run["began"].replace(microsecond=0) <= when[0] <= when[2] <= run["ended"]


def test_each_step_s_learning_rate_is_the_schedule_s(run):
    o, total = run["cfg"].optim, run["summary"]["steps"]
    want = [lr_at(r["step"] - 1, total, o.lr, o.warmup_steps, o.min_lr_ratio, o.schedule) for r in run["steps"]]
    assert [r["lr"] for r in run["steps"]] == pytest.approx(want, rel=1e-12)


def test_the_summary_s_best_is_the_lowest_validation_and_its_test_perplexity_that_of_the_best_weights(run):
    s, epochs = run["summary"], [r for r in run["metrics"] if r["kind"] == "epoch"]
    best = min(epochs, key=lambda r: r["val_ppl"])
    assert best["epoch"] < EPOCHS  # the best weights are not the last ones
    assert (s["best_epoch"], s["best_val_ppl"]) == (best["epoch"], pytest.approx(best["val_ppl"], rel=1e-12))
    meta = ckpt.read_meta(run["out"] / "best.safetensors")
    model = GPT(load_run_config(run["out"]).model)
    ckpt.load_model_state(model, ckpt.load_tensors(run["out"] / "best.safetensors"), "best")
    test = np.frombuffer(open(run["paths"]["test"], "rb").read(), dtype=np.uint8).astype(np.int64)
    nll, count = split_nll(model, test, BLOCK, 16, DistContext())
    assert s["test_ppl"] == pytest.approx(float(np.exp(nll / count)), rel=1e-6)
    assert meta["state"]["epoch"] == best["epoch"]


def test_a_finished_run_resumed_returns_its_summary_and_trains_nothing(run):
    def written():  # the lock file is the process's, rewritten by whoever holds the folder
        return {p.name: p.stat().st_mtime_ns for p in run["out"].iterdir() if p.is_file() and p.name != ".lock"}

    files = written()
    again = train(run["cfg"], run["out"], resume=True, quiet=True)
    assert again["steps"] == run["summary"]["steps"] and again["test_ppl"] == run["summary"]["test_ppl"]
    assert written() == files


def test_a_budget_ending_mid_epoch_stops_at_it_and_extending_it_goes_on_with_that_epoch(run, tmp_path):
    """train.max_steps=7 (an epoch is 19 steps) makes 7 steps and closes epoch 1 there; --resume to 12 steps,
    then to train.epochs=2, goes on with epoch 1 from its 8th batch (never a new epoch): with a flat learning
    rate the steps are those of an uninterrupted 2-epoch run, loss for loss, the epochs run are 2 (not 4), and
    the evaluation at each budget's end stays as kind "budget", the summary's best agreeing with the log."""
    from iattention.checkpoint.run_folder import RunFolder

    flat = {"optim.warmup_steps": 0, "optim.min_lr_ratio": 1.0}  # the same lr whatever the budget
    ov = tiny_overrides(run["paths"], tmp_path / "cache", **{
        "model.n_embd": 16, "model.n_head": 2, "model.block_size": BLOCK, "train.batch_size": BATCH,
        "train.threads": 1, "train.eval_batch_size": 16, **flat})
    ref = train(load_config("tiny", None, [*ov, "train.epochs=2"]), tmp_path / "ref", quiet=True)
    spe = ref["steps"] // 2
    out = tmp_path / "run"
    first = train(load_config("tiny", None, [*ov, "train.max_steps=7"]), out, quiet=True)
    assert 7 < spe and first["steps"] == 7 and first["epochs_run"] == 1
    assert [r["step"] for r in RunFolder(out).read_records("steps.jsonl")] == list(range(1, 8))
    train(load_config("tiny", None, [*ov, "train.max_steps=12"]), out, resume=True, quiet=True)
    done = train(load_config("tiny", None, [*ov, "train.epochs=2"]), out, resume=True, quiet=True)
    assert (done["steps"], done["epochs_run"]) == (ref["steps"], 2)
    loss = {p: [r["loss"] for r in RunFolder(p).read_records("steps.jsonl")] for p in (out, tmp_path / "ref")}
    assert loss[out] == loss[tmp_path / "ref"]
    summary, records = RunFolder(out).read_results()  # the summary checked against the log
    assert [(r["kind"], r["epoch"], r["step"]) for r in records] == [
        ("start", 0, 0), ("budget", 1, 7), ("budget", 1, 12), ("epoch", 1, spe), ("epoch", 2, 2 * spe)]
    epoch1 = [r for r in json_lines(tmp_path / "ref" / "metrics.jsonl") if r["kind"] == "epoch"][0]
    assert records[3]["train_loss"] == epoch1["train_loss"]  # the whole epoch's mean, not its second part's


def test_eval_tokens_caps_training_s_validation_final_test_false_skips_test_and_a_warmup_past_the_budget_warns(
        run, tmp_path, capsys):
    """train.eval_tokens=60: every validation of the run scores the first 60 validation tokens (its loss that of
    the weights there over those tokens), the summary's validation counts say so; train.final_test=false: no
    test pass (test_ppl null, final_test false); optim.warmup_steps leaving no step to decay in: one warning line."""
    from iattention.checkpoint.run_folder import RunFolder

    ov = tiny_overrides(run["paths"], tmp_path / "cache", **{
        "model.n_embd": 16, "model.n_head": 2, "model.block_size": BLOCK, "train.batch_size": BATCH,
        "train.threads": 1, "train.eval_batch_size": 16, "optim.warmup_steps": 4, "train.max_steps": 4,
        "train.eval_tokens": 60, "train.final_test": "false"})
    out = tmp_path / "run"
    s = train(load_config("tiny", None, ov), out, quiet=True)
    err = capsys.readouterr().err
    assert err.count("warning: optim.warmup_steps=4 with a run of 4 steps") == 1, err
    assert (s["test_ppl"], s["test_loss"], s["final_test"], s["test_word_ppl"]) == (None, None, False, None)
    assert s["val_tokens_scored"] == 59
    model = GPT(load_run_config(out).model)
    ckpt.load_model_state(model, ckpt.load_tensors(out / "last.safetensors"), "last")
    valid = np.frombuffer(open(run["paths"]["valid"], "rb").read(), dtype=np.uint8).astype(np.int64)
    nll, count = split_nll(model, valid[:60], BLOCK, 16, DistContext())
    last = RunFolder(out).read_results()[1][-1]
    assert (last["step"], count) == (4, 59) and last["val_loss"] == pytest.approx(nll / count, rel=1e-6)
    train(load_config("tiny", None, [*ov, "train.max_steps=5"]), out, resume=True, quiet=True)
    assert "warning: optim.warmup_steps" in capsys.readouterr().err  # step 5's lr is still the peak
    train(load_config("tiny", None, [*ov, "train.max_steps=7"]), out, resume=True, quiet=True)
    assert "warning" not in capsys.readouterr().err


def test_a_run_with_the_loss_in_chunks_trains_as_the_whole_loss_does(run, tmp_path, monkeypatch):
    """train.loss_chunk=5 (not a divisor of a batch's 4 x 8 positions): every training step's loss goes through
    the chunked loss (counted, the real function called), and the steps' losses are the whole loss's run's to
    float32 rounding, as the loss is the same function computed in pieces."""
    from iattention.model import gpt

    calls = []
    real = gpt.chunked_cross_entropy
    monkeypatch.setattr(gpt, "chunked_cross_entropy", lambda *a, **k: calls.append(a[-1]) or real(*a, **k))
    cfg = copy.deepcopy(run["cfg"])
    cfg.train.loss_chunk = 5
    summary = train(cfg, tmp_path / "run", quiet=True)
    assert calls == [5] * summary["steps"]
    steps = json_lines(tmp_path / "run" / "steps.jsonl")
    assert summary["steps"] == run["summary"]["steps"]
    for a, b in zip(steps, run["steps"]):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * b["loss"], (a["step"], a["loss"], b["loss"])
    assert summary["config"]["train"]["loss_chunk"] == 5
