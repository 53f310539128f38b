"""Unit tests of iattention.train.optim (moved from tests/test_optim.py)."""

import pytest
import torch

from iattention import GPT, GPTConfig
from iattention.attention.registry import variant_names
from iattention.config import OptimConfig
from iattention.train.optim import build_optimizer


def _model(attention="canonical", heads=2, init="gpt2"):
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=heads, n_embd=32, vocab_size=50, block_size=16, attention=attention,
                         init=init))


def _group_of(opt, param):
    return next(g for g in opt.param_groups if any(p is param for p in g["params"]))


def _muon_step(model, opt, seed=1):
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(seed))
    model(x, x)[1].backward()
    from iattention.train.optim import apply_step

    apply_step(model, opt, 0.0)


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


@pytest.mark.slow
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


@pytest.mark.slow
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
