"""End-to-end tests: optim."""

import json

import pytest
import torch

from helpers import tiny_overrides, write_corpus
from iattention import GPT
from iattention.config import OptimConfig
from iattention.train import load_config, train


@pytest.mark.slow
def test_trainer_applies_the_group_lr_scale(tmp_path):
    paths = write_corpus(tmp_path)
    cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{
        "model.attention": "canonical", "model.init": "matched", "optim.attn_lr_by_init_rms": "true",
        "train.epochs": 1}))
    train(cfg, tmp_path / "run", quiet=True)
    from iattention.checkpoint.state import read_meta

    groups = read_meta(tmp_path / "run" / "last.safetensors")["optimizer"]["param_groups"]
    steps = [json.loads(line) for line in open(tmp_path / "run" / "steps.jsonl")]
    base = steps[-1]["lr"]
    assert len({round(g["lr_scale"], 6) for g in groups}) > 2
    for g in groups:
        assert g["lr"] == pytest.approx(base * g["lr_scale"])


@pytest.mark.slow
def test_trainer_runs_muon_and_refuses_an_unknown_optimizer(tmp_path):
    paths = write_corpus(tmp_path)
    cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{"optim.name": "muon",
                                                                                  "train.epochs": 1}))
    summary = train(cfg, tmp_path / "run", quiet=True)
    assert summary["best_val_ppl"] < 256  # learned something: below the byte vocabulary's uniform guess
    from iattention.errors import UserError

    with pytest.raises(UserError, match="optim.name must be one of adamw, muon, got 'sgd'"):
        OptimConfig(name="sgd")


@pytest.mark.slow
def test_the_logged_learning_rate_follows_the_configured_schedule(tmp_path):
    """Each step's logged lr is the schedule's value at that step (cosine and linear differ)."""
    from iattention.train.schedule import lr_at
    paths = write_corpus(tmp_path)
    seen = {}
    for schedule in ("cosine", "linear"):
        out = tmp_path / schedule
        cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{
            "train.epochs": 3, "optim.warmup_steps": 1, "optim.schedule": schedule}))
        train(cfg, out, quiet=True)
        steps = [json.loads(line) for line in open(out / "steps.jsonl")]
        total = len(steps)
        assert total > 4
        for i, rec in enumerate(steps):
            assert rec["lr"] == pytest.approx(lr_at(i, total, cfg.optim.lr, 1, cfg.optim.min_lr_ratio, schedule))
        seen[schedule] = [rec["lr"] for rec in steps]
    assert seen["cosine"] != seen["linear"]


@pytest.mark.slow
def test_steps_log_the_gradient_norm_and_metrics_start_at_step_zero(tmp_path):
    """steps.jsonl: a finite grad_norm per step; metrics.jsonl: the first record is the evaluation of the
    starting function at step 0, the same number as a fresh model of that seed gives."""
    from iattention.data import load_data
    from iattention.train.distributed import DistContext
    from iattention.train.evaluate import split_nll

    paths = write_corpus(tmp_path)
    cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1}))
    train(cfg, tmp_path / "run", quiet=True)
    steps = [json.loads(line) for line in open(tmp_path / "run" / "steps.jsonl")]
    assert all(s["grad_norm"] > 0 and s["grad_norm"] < 1e3 for s in steps)
    first = json.loads(open(tmp_path / "run" / "metrics.jsonl").readline())
    assert (first["kind"], first["step"], first["epoch"], first["train_loss"]) == ("start", 0, 0, None)
    torch.manual_seed(cfg.train.seed)
    data = load_data(cfg.data, splits=("valid",))
    fresh = GPT(cfg.model.replace(vocab_size=json.loads(open(tmp_path / "run" / "summary.json").read())
                                  ["config"]["model"]["vocab_size"]))
    nll, n = split_nll(fresh, data.splits["valid"][: cfg.data.valid_tokens or None], cfg.model.block_size,
                       cfg.train.eval_batch_size, DistContext())
    assert first["val_loss"] == pytest.approx(nll / n, rel=1e-5)
