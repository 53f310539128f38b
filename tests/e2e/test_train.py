"""End-to-end tests: train."""

import json
import math
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from helpers import lines_of, shared_data_dir, tiny_overrides, wait_until, write_corpus
from iattention.attention.registry import variant_names
from iattention.errors import UserError
from iattention.interop.load import load_model
from iattention.train import load_config, train


def _steps(folder):
    return [json.loads(line) for line in open(os.path.join(folder, "steps.jsonl"))]


def _cfg(tmp_path, **extra):
    paths = write_corpus(tmp_path)
    return load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **extra)), paths


def _cli(*args, env=None):
    return [sys.executable, "-m", "iattention", *args]


@pytest.mark.slow
def test_loss_decreases_and_logs_are_complete(tmp_path):
    cfg, _ = _cfg(tmp_path, **{"train.epochs": 3})
    summary = train(cfg, tmp_path / "run", quiet=True)
    steps = _steps(tmp_path / "run")
    assert len(steps) == summary["steps"] > 10
    assert np.mean([s["loss"] for s in steps[-5:]]) < 0.7 * np.mean([s["loss"] for s in steps[:5]])
    metrics = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [(m["kind"], m["epoch"]) for m in metrics] == [("start", 0), ("epoch", 1), ("epoch", 2), ("epoch", 3)]
    for key in ("step", "epoch", "lr", "train_loss", "val_loss", "val_ppl", "train_ppl", "tokens_per_s", "wall_time"):
        assert key in metrics[0]
    for key in ("params", "best_val_ppl", "best_epoch", "test_ppl", "wall_time_s", "train_tokens_per_s", "config",
                "hardware"):
        assert key in summary
    assert summary["best_val_ppl"] == min(m["val_ppl"] for m in metrics)
    assert (tmp_path / "run" / "tb").is_dir() or not cfg.train.tensorboard


@pytest.mark.slow
def test_test_perplexity_is_exp_mean_nll(tmp_path):
    cfg, paths = _cfg(tmp_path)
    summary = train(cfg, tmp_path / "run", quiet=True)
    model, _ = load_model(tmp_path / "run" / "best.safetensors")
    ids = torch.tensor(list(open(paths["test"], "rb").read()))
    T = model.config.block_size
    nll, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, T):  # independent loop: one window at a time, log_softmax by hand
            x = ids[s: s + T + 1]
            logp = F.log_softmax(model(x[None, :-1])[0][0].double(), dim=-1)
            nll -= logp.gather(1, x[1:, None]).sum().item()
            n += len(x) - 1
    assert n == len(ids) - 1
    assert math.isclose(summary["test_ppl"], math.exp(nll / n), rel_tol=1e-5)


@pytest.mark.slow
def test_resume_after_kill_equals_uninterrupted(tmp_path):
    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 3, "train.ckpt_every_steps": 4,
                                                      "train.threads": 1})
    ref = train(load_config("tiny", None, ov), tmp_path / "ref", quiet=True)
    out = tmp_path / "run"
    proc = subprocess.Popen(_cli("train", "--preset", "tiny", "--out", str(out), "--quiet", *ov))
    wait_until((out / "last.safetensors").exists, proc, "its first checkpoint")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = subprocess.run(_cli("train", "--preset", "tiny", "--out", str(out), "--resume", "--quiet", *ov),
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    got = json.loads((out / "summary.json").read_text())
    assert [s["loss"] for s in _steps(out)] == [s["loss"] for s in _steps(tmp_path / "ref")]
    for key in ("best_val_ppl", "best_epoch", "test_ppl", "steps", "tokens_seen"):
        assert got[key] == ref[key], key


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["model.arch=llama", "model.n_kv_head=1"],
                                   ["train.compile=true", "train.compile_scope=blocks"]],
                         ids=["gpt2", "llama", "gpt2-compiled-by-blocks"])
def test_ddp_two_processes_match_one(tmp_path, extra):
    """Two processes (DDP, gloo) train as one eager process does; also with the blocks compiled in place before
    DDP wraps the model (train.compile_scope=blocks)."""
    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1, "train.threads": 1})
    compiled = [o for o in extra if o.startswith("train.compile")]
    ov += [o for o in extra if o not in compiled]
    one = train(load_config("tiny", None, ov), tmp_path / "one", quiet=True)
    # each rank's output in its own file (--redirects 3), so that a failure shows what the failing rank said,
    # not only the launcher's traceback that ends torchrun's stderr
    logs = tmp_path / "ddp-logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--log-dir", str(logs), "--redirects", "3",
           "-m", "iattention", "train", "--preset", "tiny", "--out", str(tmp_path / "two"), "--quiet", *ov, *compiled]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    ranks = "".join(f"\n--- {f.relative_to(logs)}:\n{f.read_text()[-1500:]}"
                    for f in sorted(logs.rglob("*.log")) if f.stat().st_size)
    assert res.returncode == 0, res.stderr[-1500:] + ranks
    two = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert two["world_size"] == 2
    a, b = [s["loss"] for s in _steps(tmp_path / "one")], [s["loss"] for s in _steps(tmp_path / "two")]
    assert len(a) == len(b)
    assert np.allclose(a, b, rtol=1e-4, atol=1e-5)
    assert math.isclose(one["best_val_ppl"], two["best_val_ppl"], rel_tol=1e-4)


@pytest.mark.slow
def test_eval_says_what_it_evaluated_and_full_takes_the_whole_split(tmp_path, capsys):
    from iattention.cli import main

    paths = write_corpus(tmp_path, n_eval=3000)
    cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{
        "train.epochs": 1, "data.valid_tokens": 700}))
    train(cfg, tmp_path / "run", quiet=True)
    ckpt = str(tmp_path / "run" / "best.safetensors")
    assert main(["eval", ckpt, "--split", "valid", "--json"]) == 0
    prefix = json.loads(capsys.readouterr().out)
    assert main(["eval", ckpt, "--split", "valid", "--json", "--full"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert prefix["portion"] == "prefix" and full["portion"] == "whole"
    assert prefix["tokens"] < 700 < full["tokens"]
    assert main(["eval", ckpt, "--split", "valid"]) == 0
    line = capsys.readouterr().out
    assert "the first 700 tokens of the valid split (the run's data.valid_tokens; --full for all of it)" in line


@pytest.mark.slow
def test_overrides_may_follow_options(tmp_path):
    """`iattn train --preset tiny model.attention=canonical --out X train.threads=1` takes both overrides."""
    from iattention.cli import main

    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1})
    assert main(["train", "--preset", "tiny", "model.attention=canonical", "--out", str(tmp_path / "r"), "--quiet",
                 *ov, "train.threads=1"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["attention"] == "canonical" and summary["config"]["train"]["threads"] == 1


def test_every_command_takes_every_preset(capsys):
    """One set of preset names: params and bench take the training presets (and gpt2-small), with
    default heads from the preset; bench takes a Llama-family preset too (its own family's keys in the spec)."""
    from iattention.bench.runner import bench_spec
    from iattention.cli import main
    from iattention.config import model_preset, preset_names

    for name in preset_names():
        assert main(["params", "--preset", name, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        model = model_preset(name)
        assert max(r["n_head"] for r in rows) == model.n_head
        spec = bench_spec(name)["model"]
        assert spec["n_embd"] == model.n_embd and spec.get("family", "gpt2") == model.family
        load_config(name)
    assert model_preset("gpt2-small").n_embd == 768 and model_preset("cpu-study").vocab_size == 4096


def test_version(capsys):
    import pytest

    from iattention import __version__
    from iattention.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"iattn {__version__}"


@pytest.mark.slow
def test_init_from_a_checkpoint_starts_at_its_validation_loss(tmp_path):
    """Fine-tuning a trained standard model as canonical: step-0 validation loss equals the source's."""
    from iattention.data import load_data
    from iattention.train.distributed import DistContext
    from iattention.train.evaluate import split_nll

    cfg, _ = _cfg(tmp_path, **{"train.epochs": 2, "model.n_head": 2})
    train(cfg, tmp_path / "src", quiet=True)
    source, _ = load_model(tmp_path / "src" / "best.safetensors")
    data = load_data(cfg.data, splits=("valid",))
    nll, n = split_nll(source, data.splits["valid"], cfg.model.block_size, 64, DistContext())
    for attention in ("canonical", "standard"):
        ft, _ = _cfg(tmp_path, **{"train.epochs": 1, "model.n_head": 2, "model.attention": attention,
                                  "train.init_from": str(tmp_path / "src")})
        summary = train(ft, tmp_path / f"ft-{attention}", quiet=True)
        first = [json.loads(x) for x in open(tmp_path / f"ft-{attention}" / "metrics.jsonl")][0]
        assert first["kind"] == "start" and first["step"] == 0 and first["train_loss"] is None
        assert math.isclose(first["val_loss"], nll / n, rel_tol=1e-5), (attention, first["val_loss"], nll / n)
        assert summary["config"]["train"]["init_from"] == str(tmp_path / "src")
    bad, _ = _cfg(tmp_path, **{"train.epochs": 1, "model.n_head": 2, "model.n_embd": 64, "model.n_layer": 3,
                               "train.init_from": str(tmp_path / "src")})
    import pytest

    from iattention.errors import UserError

    # every difference in one line (they came one per try, ~20 s each), with one fix for all
    with pytest.raises(UserError, match=r"differs from the run in model.n_layer \(source \d, run 3\), model.n_embd "
                                        r"\(source 32, run 64\): set model.n_layer=\d model.n_embd=32 ") as e:
        train(bad, tmp_path / "bad", quiet=True)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_resume_with_more_epochs_extends_a_finished_run(tmp_path):
    cfg, _ = _cfg(tmp_path, **{"train.epochs": 2})
    short = train(cfg, tmp_path / "run", quiet=True)
    longer, _ = _cfg(tmp_path, **{"train.epochs": 3})
    ext = train(longer, tmp_path / "run", resume=True, quiet=True)
    assert (short["epochs_run"], ext["epochs_run"]) == (2, 3)
    assert ext["steps"] == short["steps"] * 3 // 2
    metrics = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [m["epoch"] for m in metrics] == [0, 1, 2, 3]  # the start (step 0), then one record per epoch
    assert "epochs: 3" in (tmp_path / "run" / "config.yaml").read_text()
    # fewer epochs, or any other change, is still another run
    import pytest

    from iattention.errors import UserError

    fewer, _ = _cfg(tmp_path, **{"train.epochs": 1})
    with pytest.raises(UserError, match="holds a run with another config"):
        train(fewer, tmp_path / "run", resume=True, quiet=True)


@pytest.mark.slow
def test_a_run_compiled_by_blocks_trains_as_the_eager_run_and_evaluates_eagerly(tmp_path):
    """train.compile_scope=blocks (regional compilation): the same losses as the eager run up to float32 rounding,
    the same checkpoint names, and exact float32 evaluations that are the eager model's."""
    from torch._dynamo.utils import counters

    paths = write_corpus(tmp_path)
    runs = {}
    for name, extra in (("eager", {}), ("blocks", {"train.compile": "true", "train.compile_scope": "blocks"})):
        cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1,
                                                                                      "model.n_layer": 2, **extra}))
        torch._dynamo.reset()
        counters.clear()
        runs[name] = train(cfg, tmp_path / name, quiet=True)
        runs[name]["graphs"] = counters["stats"]["unique_graphs"]
    eager, blocks = _steps(tmp_path / "eager"), _steps(tmp_path / "blocks")
    assert len(eager) == len(blocks) > 1
    assert all(math.isclose(a["loss"], b["loss"], rel_tol=1e-4) for a, b in zip(eager, blocks))
    assert runs["eager"]["graphs"] == 0 and runs["blocks"]["graphs"] == 2  # one block graph, one head graph
    assert math.isclose(runs["eager"]["best_val_ppl"], runs["blocks"]["best_val_ppl"], rel_tol=1e-4)
    a, _ = load_model(tmp_path / "eager" / "last.safetensors")
    b, _ = load_model(tmp_path / "blocks" / "last.safetensors")
    assert list(a.state_dict()) == list(b.state_dict())


@pytest.mark.slow
@pytest.mark.parametrize("attention", variant_names())
def test_paper_preset_model_trains_compiled_in_bf16_on_cpu_and_its_checkpoint_reloads(tmp_path, attention):
    """The GPU path (paper preset: 12 layers, d=768, GPT-2 vocabulary; torch.compile, bf16 autocast)
    exercised on CPU: two optimizer steps on a tiny batch and block, for every variant."""
    from iattention.train.trainer import Trainer

    # 76 bytes of train text: 4 windows of 17 = 2 steps of 2; 33 of valid and test: 2 whole windows of 16
    # (one evaluation shape, so torch.compile builds one eval graph)
    paths = write_corpus(tmp_path, n_train=75, n_eval=32)
    overrides = tiny_overrides(paths, tmp_path / "cache", **{
        "model.attention": attention, "model.block_size": 16, "train.batch_size": 2, "train.eval_batch_size": 2,
        "train.epochs": 1, "train.device": "cpu", "train.compile": "true", "train.amp_cpu": "true",
        "train.tensorboard": "false"})
    cfg = load_config("paper", None, overrides)
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.model.vocab_size) == (12, 768, 50257)
    trainer = Trainer(cfg, tmp_path / "run", quiet=True)
    summary = trainer.run()
    losses = [s["loss"] for s in _steps(tmp_path / "run")]
    assert summary["steps"] == len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert math.isfinite(summary["best_val_ppl"]) and math.isfinite(summary["test_ppl"])
    reloaded, _ = load_model(tmp_path / "run" / "last.safetensors")
    trained = trainer.model.state_dict()
    assert reloaded.config.attention == attention
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, trained[name]), name


@pytest.mark.slow
@pytest.mark.skipif(shared_data_dir() is None, reason="../shared/data not present")
def test_a_run_remembers_its_data_folder_for_later_commands(tmp_path, monkeypatch, capsys):
    """Trained with the data folder in $IATTN_DATA_DIR only (as `make demo` does), the run records the
    resolved folder, so `iattn eval RUN` works later in a shell without the variable."""
    from iattention.cli import main

    monkeypatch.setenv("IATTN_DATA_DIR", os.path.relpath(shared_data_dir()))
    cfg = load_config("tiny", None, ["train.epochs=1", f"data.cache_dir={tmp_path / 'cache'}"])
    assert cfg.data.data_dir == ""
    train(cfg, tmp_path / "run", quiet=True)
    assert cfg.data.data_dir == ""  # the caller's config is left as it was
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["data_dir"]
    assert recorded == os.path.realpath(shared_data_dir())
    monkeypatch.delenv("IATTN_DATA_DIR")
    assert main(["eval", str(tmp_path / "run"), "--split", "valid"]) == 0
    assert "valid perplexity" in capsys.readouterr().out
    monkeypatch.setenv("IATTN_DATA_DIR", str(tmp_path / "nowhere"))  # told otherwise: that folder is used
    assert main(["eval", str(tmp_path / "run"), "--split", "valid"]) == 2


@pytest.mark.slow
def test_resume_keeps_the_runs_own_epochs_and_says_when_it_extends_or_starts_fresh(tmp_path, capsys):
    """`--resume --preset P` on a run trained for fewer epochs than P's does not extend it (the run's own
    config wins); an explicit train.epochs=N does, and says so; a folder with no checkpoint says it starts
    fresh. Without --preset, --resume continues the saved config."""
    from iattention.cli import main

    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache")
    run = str(tmp_path / "run")
    assert main(["train", "--preset", "tiny", "--out", run, "--quiet", *ov, "train.epochs=1"]) == 0
    first = json.loads(open(os.path.join(run, "summary.json")).read())
    capsys.readouterr()
    assert main(["train", "--preset", "tiny", "--out", run, "--resume", "--quiet", *ov]) == 0  # tiny: 2 epochs
    assert json.loads(open(os.path.join(run, "summary.json")).read()) == first  # not extended, not rewritten
    assert main(["train", "--out", run, "--resume", "--quiet"]) == 0  # no preset: the saved config
    assert "extending" not in capsys.readouterr().err
    assert main(["train", "--preset", "tiny", "--out", run, "--resume", "--quiet", *ov, "train.epochs=2"]) == 0
    assert f"iattn: extending {run} from 1 to 2 epochs" in capsys.readouterr().err
    assert json.loads(open(os.path.join(run, "summary.json")).read())["epochs_run"] == 2
    fresh = str(tmp_path / "fresh")
    assert main(["train", "--preset", "tiny", "--out", fresh, "--resume", "--quiet", *ov, "train.epochs=1"]) == 0
    assert "holds no checkpoint to resume; starting a fresh run there" in capsys.readouterr().err


@pytest.mark.slow
def test_an_extension_that_died_before_replacing_the_summary_is_finished_on_resume(tmp_path):
    """Extending to 2 epochs rewrites config.yaml, then drops the old summary; a crash between the two
    leaves a 1-epoch summary beside a 2-epoch config. The next identical --resume must train epoch 2,
    not return the old summary as finished."""
    cfg, _ = _cfg(tmp_path, **{"train.epochs": 1})
    first = train(cfg, tmp_path / "run", quiet=True)
    longer, _ = _cfg(tmp_path, **{"train.epochs": 2})
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    saved["train"]["epochs"] = 2  # the state the crash leaves: new config, old summary, last checkpoint
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    again = train(longer, tmp_path / "run", resume=True, quiet=True)
    assert (first["epochs_run"], again["epochs_run"]) == (1, 2)
    assert again["steps"] == 2 * first["steps"]


@pytest.mark.slow
def test_an_extension_cut_before_its_first_checkpoint_goes_on_with_the_same_command(tmp_path, capsys):
    """Extending rewrites config.yaml and drops the summary before training; a kill before the first new
    checkpoint leaves the new config beside a last.safetensors of the old one. The same --resume again was
    refused ("comes from a different config (train.max_steps: 2 there vs 5 here)", found by a reviewer): it is
    the extension, and goes on to its budget as an uninterrupted extension does."""
    cfg, _ = _cfg(tmp_path, **{"train.max_steps": 2})
    train(cfg, tmp_path / "run", quiet=True)
    longer, _ = _cfg(tmp_path, **{"train.max_steps": 5})
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    saved["train"]["max_steps"] = 5  # the state the kill leaves: new config, no summary, the old last checkpoint
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    (tmp_path / "run" / "summary.json").unlink()
    again = train(longer, tmp_path / "run", resume=True, quiet=True)
    assert again["steps"] == 5
    assert "extending" in capsys.readouterr().err
    other, _ = _cfg(tmp_path, **{"train.max_steps": 7, "model.n_layer": 3})  # not an extension: refused
    with pytest.raises(UserError, match="another config"):
        train(other, tmp_path / "run", resume=True, quiet=True)


@pytest.mark.slow
def test_wandb_gets_every_step_and_evaluation_and_is_not_imported_when_off(tmp_path, monkeypatch):
    """train.wandb=PROJECT logs what metrics.jsonl and steps.jsonl hold (a stand-in module records the
    calls: the test is of our wiring, not of wandb); off, wandb is never imported; absent, one line."""
    import sys
    import types

    from iattention.errors import UserError

    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1, "train.tensorboard": "false"})
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    train(load_config("tiny", None, ov), tmp_path / "off", quiet=True)
    assert "wandb" not in sys.modules

    calls = []
    fake = types.ModuleType("wandb")
    run = types.SimpleNamespace(log=lambda values, step: calls.append((step, values)),
                                finish=lambda: calls.append("finish"))
    fake.init = lambda **kw: calls.append(("init", kw)) or run
    monkeypatch.setitem(sys.modules, "wandb", fake)
    train(load_config("tiny", None, [*ov, "train.wandb=proj"]), tmp_path / "on", quiet=True)
    init = calls[0][1]
    assert init["project"] == "proj" and init["config"]["model"]["attention"] == "standard"
    steps = [json.loads(line) for line in open(tmp_path / "on" / "steps.jsonl")]
    logged = {}
    for step, v in calls[1:-1]:
        logged.setdefault(step, {}).update(v)
    for s in steps:
        assert logged[s["step"]]["train/loss_step"] == s["loss"] and logged[s["step"]]["train/lr_step"] == s["lr"]
    metrics = [json.loads(line) for line in open(tmp_path / "on" / "metrics.jsonl")]
    epoch = next(m for m in metrics if m["kind"] == "epoch")
    assert any(v.get("epoch/val_ppl") == epoch["val_ppl"] for _, v in calls[1:-1])
    assert calls[-1] == "finish"

    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    with pytest.raises(UserError, match="needs the wandb package: pip install wandb"):
        train(load_config("tiny", None, [*ov, "train.wandb=proj"]), tmp_path / "absent", quiet=True)


@pytest.mark.slow
def test_a_step_or_token_budget_ends_the_run_and_its_schedule_and_resume_extends_by_either(tmp_path, capsys):
    """train.max_steps=N: N steps (the last epoch partial), every step's lr the schedule's over N (so it
    ends at the budget, not at the epochs' total), an epoch record at step N; --resume with a larger
    train.max_steps or a train.max_tokens budget extends it; a budget at or before the run's step is one line
    and changes nothing; both budgets at once, or a budget with train.epochs, are one line."""
    from iattention.cli import main
    from iattention.train.schedule import lr_at

    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache")
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--out", str(run), "--quiet", *ov, "train.max_steps=30"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    cfg = load_config("tiny", None, [*ov, "train.max_steps=30"])
    o = cfg.optim
    steps = _steps(run)
    assert [s["step"] for s in steps] == list(range(1, 31)) and summary["steps"] == 30
    assert [s["lr"] for s in steps] == [lr_at(i, 30, o.lr, o.warmup_steps, o.min_lr_ratio, o.schedule)
                                        for i in range(30)]
    metrics = [json.loads(x) for x in open(run / "metrics.jsonl")]
    epochs = [(m["epoch"], m["step"]) for m in metrics if m["kind"] == "epoch"]
    spe = epochs[0][1]
    assert spe < 30 < 2 * spe and epochs == [(1, spe), (2, 30)] and summary["epochs_run"] == 2
    assert summary["tokens_seen"] == 30 * 8 * 32
    capsys.readouterr()

    assert main(["train", "--out", str(run), "--resume", "--quiet", "train.max_steps=40"]) == 0
    assert f"extending {run} from step 30 to 40 steps (train.max_steps=40" in capsys.readouterr().err
    assert [s["step"] for s in _steps(run)] == list(range(1, 41))
    assert _steps(run)[-1]["lr"] == lr_at(39, 40, o.lr, o.warmup_steps, o.min_lr_ratio, o.schedule)
    tokens = 8 * 32 * 45 + 100  # 45 whole steps
    assert main(["train", "--out", str(run), "--resume", "--quiet", f"train.max_tokens={tokens}"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 45
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]  # the budget given is the one that holds
    assert (saved["max_steps"], saved["max_tokens"]) == (0, tokens)
    assert "from step 40 to 45 steps (train.max_tokens=" in capsys.readouterr().err
    assert main(["train", "--out", str(run), "--resume", "--quiet"]) == 0  # the saved budget: finished
    assert "extending" not in capsys.readouterr().err

    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert main(["train", "--out", str(run), "--resume", "--quiet", "train.max_steps=45"]) == 2
    err = capsys.readouterr().err
    assert err.count("iattn: error:") == 1 and "cannot shorten" in err and "Traceback" not in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == \
        {k: v for k, v in before.items() if k != ".lock"}
    assert main(["train", "--preset", "tiny", "--out", str(tmp_path / "two"), *ov, "train.max_steps=3",
                 "train.max_tokens=1000"]) == 2
    assert "are two budgets; give one" in capsys.readouterr().err
    # train.epochs with a budget on one command line: one of them would be ignored, so neither is taken
    for args in (["--preset", "tiny", *ov], ["--resume"]):
        out = str(tmp_path / "pair") if args[0] == "--preset" else str(run)
        assert main(["train", *args, "--out", out, "--quiet", "train.epochs=3", "train.max_steps=50"]) == 2
        err = capsys.readouterr().err
        assert err.count("iattn: error:") == 1 and "train.epochs=3 and train.max_steps=50" in err, err
    assert not (tmp_path / "pair").exists()


@pytest.mark.slow
def test_steps_reach_disk_as_they_go_and_a_killed_run_keeps_them_once_each_after_resume(tmp_path):
    """steps.jsonl is appended step by step: SIGKILLed right after its 11th step (IATTN_FAULT, no sleeps), a
    run holds steps 1-10 (the same numbers an uninterrupted run logs) though its last checkpoint is at step 8;
    --resume from that checkpoint leaves every step exactly once, as the uninterrupted run has them."""
    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache",
                        **{"train.epochs": 2, "train.ckpt_every_steps": 4, "train.threads": 1})
    train(load_config("tiny", None, ov), tmp_path / "ref", quiet=True)
    ref = _steps(tmp_path / "ref")
    out = tmp_path / "run"
    proc = subprocess.run(_cli("train", "--preset", "tiny", "--out", str(out), "--quiet", *ov),
                          env={**os.environ, "IATTN_FAULT": "step:11"}, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert _steps(out) == ref[:10]
    from iattention.checkpoint.state import read_meta

    assert read_meta(out / "last.safetensors")["state"]["step"] == 8
    res = subprocess.run(_cli("train", "--preset", "tiny", "--out", str(out), "--resume", "--quiet", *ov),
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert _steps(out) == ref


@pytest.mark.slow
def test_ctrl_c_mid_epoch_keeps_the_steps_and_says_how_to_keep_mid_epoch_progress(tmp_path):
    """A run followed as `tail -f` would (steps.jsonl read while it trains) and stopped with SIGINT once its
    log holds 3 steps: exit 130, its steps kept, and the message names the step, the checkpoint --resume
    goes on from and train.ckpt_every_steps."""
    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache", **{"train.epochs": 50, "train.threads": 1})
    out = tmp_path / "run"
    proc = subprocess.Popen(_cli("train", "--preset", "tiny", "--out", str(out), "--quiet", *ov),
                            stderr=subprocess.PIPE, text=True)
    wait_until(lambda: lines_of(out / "steps.jsonl") >= 3, proc, "its log held 3 steps")
    seen = _steps(out)
    assert len(seen) >= 3 and proc.poll() is None
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    kept = _steps(out)
    assert kept[:len(seen)] == seen and [s["step"] for s in kept] == list(range(1, len(kept) + 1))
    # the signal may land between a step's count and its log line: the step named is the last logged or the next
    said = re.search(r"iattn: interrupted at step (\d+) \(epoch (\d+), batch (\d+)/(\d+)\)", err)
    assert said, err
    step, epoch, batch, per_epoch = map(int, said.groups())
    assert step in (len(kept), len(kept) + 1) and (epoch - 1) * per_epoch + batch == step, err
    assert "Traceback" not in err and "train.ckpt_every_steps=N" in err, err
    if epoch == 1:  # still in the first epoch: no checkpoint yet
        assert "no checkpoint was written yet; --resume starts the run over" in err, err


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_every_attention_kernel_on_cpu_trains_alike_or_is_one_line(tmp_path, arch):
    """model.attn_kernel = auto, sdpa, math or triton, with and without Triton's interpreter, for either model family:
    a run whose validation loss equals SDPA's (the kernels compute one function), or one line saying why not (triton
    on a CPU without the interpreter). The Llama family had no attn_kernel key (an unknown-key error)."""
    from iattention.kernels import TRITON_INSTALLED

    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"model.arch": arch, "model.dropout": 0, "train.max_steps": 2,
                                                      "optim.warmup_steps": 0,
                                                      "train.eval_tokens": 500, "train.final_test": "false"})
    losses = {}
    for interpret in ("0", "1"):
        for kernel in ("auto", "sdpa", "math", "triton"):
            out = tmp_path / f"{kernel}-{interpret}"
            res = subprocess.run([sys.executable, "-m", "iattention", "train", "--preset", "tiny", "--out", str(out),
                                  "--quiet", *ov, f"model.attn_kernel={kernel}"], capture_output=True, text=True,
                                 env={**os.environ, "TRITON_INTERPRET": interpret})
            if kernel == "triton" and (interpret == "0" or not TRITON_INSTALLED):
                assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
                assert res.stderr.startswith("iattn: error: model.attn_kernel=triton") and not out.exists()
                continue
            assert res.returncode == 0, res.stderr
            losses[kernel, interpret] = json.loads((out / "summary.json").read_text())["best_val_loss"]
    ref = losses["sdpa", "0"]
    assert len(losses) == (8 if TRITON_INSTALLED else 6) - 1
    for key, loss in losses.items():
        assert abs(loss - ref) <= 1e-4 * abs(ref), (key, loss, ref)
