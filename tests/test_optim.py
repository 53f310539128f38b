"""Optimizer groups: weight decay on matrices, the decay_attention and attn_lr_by_init_rms knobs."""

import json

import pytest
import torch

from helpers import tiny_overrides, write_corpus
from iattention import GPT, GPTConfig
from iattention.attention.registry import variant_names
from iattention.config import OptimConfig
from iattention.train import load_config, train
from iattention.train.optim import build_optimizer


def _model(attention="canonical", heads=2, init="gpt2"):
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=heads, n_embd=32, vocab_size=50, block_size=16, attention=attention,
                         init=init))


def _group_of(opt, param):
    return next(g for g in opt.param_groups if any(p is param for p in g["params"]))


@pytest.mark.parametrize("attention", variant_names())
def test_default_groups_decay_weight_matrices_only(attention):
    """Biases are never decayed, also canonical's per-head (H, r) biases, which are 2-d tensors."""
    model = _model(attention)
    opt = build_optimizer(model, OptimConfig(weight_decay=0.1), "cpu")
    decayed = set()
    for name, p in model.named_parameters():
        if _group_of(opt, p)["weight_decay"]:
            decayed.add(name)
        assert _group_of(opt, p)["lr_scale"] == 1.0
    assert decayed and all(name.endswith("weight") or name.split(".")[-1].startswith("W_") for name in decayed)
    assert not any("ln_" in name for name in decayed)
    if attention == "canonical":
        assert {"transformer.h.0.attn.b_Q", "transformer.h.0.attn.b_K"}.isdisjoint(decayed)


@pytest.mark.parametrize("attention", ["standard", "canonical"])
def test_decay_attention_off_spares_attention_matrices_only(attention):
    model = _model(attention)
    opt = build_optimizer(model, OptimConfig(weight_decay=0.1, decay_attention=False), "cpu")
    for name, p in model.named_parameters():
        want = 0.1 if p.dim() >= 2 and ".attn." not in name and "ln_" not in name else 0.0
        assert _group_of(opt, p)["weight_decay"] == want, name


def test_lr_by_init_rms_scales_attention_matrices_by_their_step0_rms():
    model = _model(init="matched")
    opt = build_optimizer(model, OptimConfig(attn_lr_by_init_rms=True), "cpu")
    for name, p in model.named_parameters():
        scale = _group_of(opt, p)["lr_scale"]
        if ".attn." in name and name.split(".")[-1].startswith("W_") and p.numel():
            assert scale == pytest.approx(p.detach().pow(2).mean().sqrt().item() / 0.02, rel=1e-5), name
        else:
            assert scale == 1.0, name
    scales = sorted({g["lr_scale"] for g in opt.param_groups})
    assert scales[0] < 0.5 and scales[-1] > 5  # matched canonical: W_Q, W_V tiny, free rows large


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


def test_scales_reports_sizes_steps_and_the_decay_each_group_really_gets(tmp_path):
    """`iattn scales`' numbers: step-0 RMS of each attention map, one AdamW step's change relative to it,
    and the weight decay / lr multiplier the optimizer applies (standard: decayed; nowd: none)."""
    from iattention.experiments.scales import measure

    paths = write_corpus(tmp_path)

    def run(**over):
        cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **over))
        return measure(cfg, steps=3)

    std = run(**{"model.attention": "standard"})
    assert set(std) == {"W_Q", "W_K", "W_V", "W_O"}
    assert std["W_Q"]["rms0"] == pytest.approx(0.02, rel=0.1)
    for m in std.values():
        assert m["weight_decay"] == 0.1 and m["lr_scale"] == 1.0
        assert m["relative"] == pytest.approx(m["update"] / m["rms0"]) and 0 < m["relative"] < 0.2
    matched = run(**{"model.attention": "canonical", "model.init": "matched", "model.n_head": "2",
                     "model.n_layer": "2", "optim.decay_attention": "false", "optim.attn_lr_by_init_rms": "true"})
    assert {"W_Q", "W_V", "W_K_free", "W_O_free"} <= set(matched)
    assert matched["W_K_free"]["rms0"] > 5 * matched["W_Q"]["rms0"]  # canonicalization moved the scale
    for kind, m in matched.items():
        assert m["weight_decay"] == 0.0, kind
        assert m["lr_scale"] == pytest.approx(m["rms0"] / 0.02, rel=0.1), kind  # per layer; mean vs pooled


def _muon_step(model, opt, seed=1):
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(seed))
    model(x, x)[1].backward()
    from iattention.train.optim import apply_step

    apply_step(model, opt, 0.0)


@pytest.mark.parametrize("attention", variant_names())
@pytest.mark.parametrize("heads", [1, 4])
def test_muon_takes_each_hidden_matrix_in_per_head_blocks_and_adamw_the_rest(attention, heads):
    """Every attention and MLP matrix entry lies in exactly one Muon block, a block of an attention matrix
    spans one head (a side of d_head, or d at one head), and AdamW holds exactly the other parameters."""
    model = _model(attention, heads)
    opt = build_optimizer(model, OptimConfig(name="muon"), "cpu")
    cover = {id(p): torch.zeros_like(p) for p, _ in opt.sources}
    for p, idx in opt.sources:
        cover[id(p)][idx] += 1
        if ".mlp." not in next(n for n, q in model.named_parameters() if q is p):
            assert min(p[idx].shape) == 32 // heads
    adamw = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        hidden = (".attn." in name or ".mlp." in name) and p.dim() >= 2 and not name.split(".")[-1].startswith("b_")
        assert (id(p) in adamw) != hidden, name
        if hidden and p.numel():
            assert torch.equal(cover[id(p)], torch.ones_like(p)), name


@pytest.mark.parametrize("attention", ["standard", "canonical"])
def test_muon_first_step_is_orthogonal_per_head_block(attention):
    """With no weight decay, Muon's first update of each block is lr' times a near-orthogonal matrix (the
    Newton-Schulz iteration puts singular values near 1): per head, not per fused matrix."""
    model = _model(attention, heads=4)
    opt = build_optimizer(model, OptimConfig(name="muon", weight_decay=0.0, lr=1e-3), "cpu")
    before = [view.clone() for view in opt.views]
    _muon_step(model, opt)
    layer0 = list(model.transformer.h[0].attn.parameters())
    attention = [i for i, (p, _) in enumerate(opt.sources) if any(p is q for q in layer0)]
    assert len(attention) == 16  # 4 heads x (W_Q, W_K, W_V, W_O) or (W_Q, W_V, W_K_free, W_O_free)
    for i in attention:
        view, old = opt.views[i], before[i]
        a, b = view.shape
        step = (old - view) / (1e-3 * 0.2 * max(a, b) ** 0.5)  # torch's match_rms_adamw lr adjustment
        s = torch.linalg.svdvals(step)
        # orthogonalising the fused (96, 32) matrix instead leaves an 8-row block at 0.31-0.74 (random gradient)
        assert 0.7 < s.median() < 1.3 and s.max() < 1.5, (tuple(view.shape), s)


def test_muon_state_survives_a_checkpoint(tmp_path):
    """Save after two steps, load into a fresh model and optimizer: the next step is identical."""
    from iattention.checkpoint.state import load_optimizer_state, load_tensors, read_meta, save_checkpoint

    cfg = OptimConfig(name="muon", lr=1e-2)
    model = _model("canonical", heads=2)
    opt = build_optimizer(model, cfg, "cpu")
    for seed in (1, 2):
        _muon_step(model, opt, seed)
    save_checkpoint(tmp_path / "c.safetensors", model, {"state": {}}, opt)
    twin = _model("canonical", heads=2)
    twin.load_state_dict(model.state_dict())
    twin_opt = build_optimizer(twin, cfg, "cpu")
    load_optimizer_state(twin_opt, load_tensors(tmp_path / "c.safetensors"), read_meta(tmp_path / "c.safetensors"))
    assert all(s["momentum_buffer"].abs().sum() > 0 for s in twin_opt.muon.state.values())
    _muon_step(model, opt, 3)
    _muon_step(twin, twin_opt, 3)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), name


def test_trainer_runs_muon_and_refuses_an_unknown_optimizer(tmp_path):
    paths = write_corpus(tmp_path)
    cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{"optim.name": "muon",
                                                                                  "train.epochs": 1}))
    summary = train(cfg, tmp_path / "run", quiet=True)
    assert summary["best_val_ppl"] < 256  # learned something: below the byte vocabulary's uniform guess
    from iattention.errors import UserError

    with pytest.raises(UserError, match="optim.name must be one of adamw, muon, got 'sgd'"):
        OptimConfig(name="sgd")


def test_scales_reads_muons_groups_through_its_blocks():
    """`iattn scales` with optim.name=muon: each attention matrix takes the group of its per-head blocks."""
    from iattention.experiments.scales import optimizer_settings

    model = _model("canonical", heads=2)
    opt = build_optimizer(model, OptimConfig(name="muon", decay_attention=False), "cpu")
    settings = optimizer_settings(model, opt)
    assert set(settings) == {"W_Q", "W_V", "W_K_free", "W_O_free"}
    assert all(s["weight_decay"] == 0.0 and s["lr_scale"] == 1.0 for s in settings.values())


def test_schedule_warmup_then_cosine_linear_or_flat():
    """The three schedules of results/paper-regime: cosine to the floor, linear to the floor, flat."""
    from iattention.train.schedule import lr_at
    T, lr = 960, 1e-3
    # warmup: linear from lr/warmup to lr
    assert lr_at(0, T, lr, 100, 0.1) == pytest.approx(lr / 100)
    assert lr_at(99, T, lr, 100, 0.1) == pytest.approx(lr)
    # cosine: half-way through the decay it is the mean of peak and floor, at the end the floor
    mid = 100 + (T - 100) // 2
    assert lr_at(mid, T, lr, 100, 0.1) == pytest.approx(0.55 * lr)
    assert lr_at(T, T, lr, 100, 0.1) == pytest.approx(0.1 * lr)
    assert lr_at(100 + (T - 100) // 4, T, lr, 100, 0.1) > 0.55 * lr + 0.2 * lr  # concave start, not linear
    # linear (Hugging Face Trainer's default: no warmup, to 0)
    assert lr_at(0, T, lr, 0, 0.0, "linear") == pytest.approx(lr)
    assert lr_at(T // 4, T, lr, 0, 0.0, "linear") == pytest.approx(0.75 * lr)
    assert lr_at(T - 1, T, lr, 0, 0.0, "linear") == pytest.approx(lr / T)
    # flat after warmup (min_lr_ratio 1: nanoGPT's defaults at a short run)
    assert {lr_at(s, T, lr, 649, 1.0) for s in range(649, T)} == {lr}
    with pytest.raises(ValueError):
        lr_at(0, T, lr, 0, 0.0, "step")


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


def test_an_unknown_schedule_is_a_one_line_error():
    from iattention.errors import UserError
    with pytest.raises(UserError, match="optim.schedule must be one of cosine, linear"):
        OptimConfig(schedule="step")


def test_apply_step_returns_the_gradient_norm_before_clipping():
    """The logged grad_norm is the total 2-norm of every gradient before clipping, with and without a clip."""
    from iattention.train.optim import apply_step
    for clip in (0.0, 1e-3):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=50, block_size=8))
        opt = build_optimizer(model, OptimConfig(lr=1e-3), "cpu")
        x = torch.randint(0, 50, (2, 9))
        model(x[:, :-1], x[:, 1:])[1].backward()
        by_hand = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None) ** 0.5
        assert apply_step(model, opt, clip) == pytest.approx(by_hand, rel=1e-5)
        assert by_hand > 1e-2  # so the clipped case really clipped


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
