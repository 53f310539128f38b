"""The optimizer (`train/optim.py`): which parameters decay and at what rate, the settings handed to torch's
AdamW and Muon, Muon's per-head blocks and its state round trip, and the one step tail (clip, step, drop
the gradients)."""

import copy

import pytest
import torch

from iattention import GPT, GPTConfig
from iattention.attention.registry import variant_names
from iattention.config import OptimConfig
from iattention.train.optim import (
    GPT2_INIT_STD,
    MuonWithAdamW,
    apply_step,
    build_optimizer,
    is_matrix,
    param_groups,
    set_lr,
)


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


def _small_model(attention="canonical", heads=2, init="gpt2", seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=1, n_head=heads, n_embd=16, vocab_size=40, block_size=8, attention=attention,
                         init=init))


def _small_backward(model, seed=1):
    x = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(seed))
    model(x[:, :-1], x[:, 1:])[1].backward()


def test_is_matrix_by_name_and_shape():
    m, v = torch.zeros(3, 4), torch.zeros(4)
    assert is_matrix("h.0.mlp.c_fc.weight", m) and is_matrix("W_Q", torch.zeros(2, 3, 4))
    assert not is_matrix("h.0.mlp.c_fc.bias", m)  # a 2-d "bias" is still a bias
    assert not is_matrix("h.0.attn.b_Q", m) and not is_matrix("b_V", m)
    assert not is_matrix("ln_1.weight", v)
    assert is_matrix("h.0.attn.bias_free_W", m)  # only the leaf name counts, and only a leaf starting b_
    assert is_matrix("h.0.b_attn.W_Q", m)


def test_groups_skip_frozen_parameters_and_key_by_decay_and_scale():
    model = _small_model("standard")
    model.transformer.wte.weight.requires_grad_(False)
    groups = param_groups(model, OptimConfig(weight_decay=0.3))
    grouped = [p for g in groups for p in g["params"]]
    assert not any(p is model.transformer.wte.weight for p in grouped)
    assert len(grouped) == sum(1 for p in model.parameters() if p.requires_grad)
    assert sorted((g["weight_decay"], g["lr_scale"]) for g in groups) == [(0.0, 1.0), (0.3, 1.0)]
    assert set(groups[0]) == {"params", "weight_decay", "lr_scale"}


def test_init_rms_scale_by_hand_and_empty_blocks_keep_scale_one():
    assert GPT2_INIT_STD == 0.02
    model = _small_model("canonical", heads=1)  # at one head canonical's W_K_free / W_O_free are empty
    groups = param_groups(model, OptimConfig(attn_lr_by_init_rms=True))
    for name, p in model.named_parameters():
        g = next(g for g in groups if any(q is p for q in g["params"]))
        if ".attn." in name and p.dim() >= 2 and not name.rsplit(".", 1)[-1].startswith("b_") and p.numel():
            rms = (sum(float(x) ** 2 for x in p.detach().flatten()) / p.numel()) ** 0.5
            assert g["lr_scale"] == pytest.approx(rms / 0.02, rel=1e-6), name
        else:
            assert g["lr_scale"] == 1.0, name
    assert any(p.numel() == 0 for p in model.parameters())


def test_adamw_gets_the_configured_rate_betas_and_fused_only_on_cuda():
    cfg = OptimConfig(lr=3e-3, beta1=0.8, beta2=0.9)
    opt = build_optimizer(_small_model(), cfg, "cpu")
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["lr"] == 3e-3 and opt.defaults["betas"] == (0.8, 0.9) and not opt.defaults["fused"]
    fused = build_optimizer(_small_model(), cfg, "cuda")  # fused AdamW also exists for CPU tensors
    assert fused.defaults["fused"] is True and fused.defaults["betas"] == (0.8, 0.9)


def test_muon_settings_and_decay_of_its_blocks():
    cfg = OptimConfig(name="muon", lr=2e-3, beta1=0.7, beta2=0.85, weight_decay=0.2, decay_attention=False)
    opt = build_optimizer(_small_model("standard"), cfg, "cpu")
    assert isinstance(opt, MuonWithAdamW)
    assert opt.adamw.defaults["lr"] == 2e-3 and opt.adamw.defaults["betas"] == (0.7, 0.85)
    assert not opt.adamw.defaults["fused"]
    assert opt.muon.defaults["lr"] == 2e-3 and opt.muon.defaults["adjust_lr_fn"] == "match_rms_adamw"
    assert build_optimizer(_small_model("standard"), cfg, "cuda").adamw.defaults["fused"] is True
    # attention blocks: no decay (decay_attention off); MLP matrices: decayed
    model = opt.muon_params
    assert {g["weight_decay"] for g in opt.muon.param_groups} == {0.0, 0.2}
    assert all("lr_scale" in g for g in opt.muon.param_groups)
    decayed = opt.muon.param_groups[[g["weight_decay"] for g in opt.muon.param_groups].index(0.2)]["params"]
    assert len(decayed) == 2 and len(model) == 4  # c_fc and c_proj whole; c_attn and attn.c_proj per head
    on = build_optimizer(_small_model("standard"), OptimConfig(name="muon", weight_decay=0.2), "cpu")
    assert {g["weight_decay"] for g in on.muon.param_groups} == {0.2}
    assert opt.param_groups == opt.adamw.param_groups + opt.muon.param_groups
    # AdamW's groups keep their decay and lr scale: embeddings decayed, biases and LayerNorms not
    assert sorted((g["weight_decay"], g["lr_scale"], len(g["params"])) for g in opt.adamw.param_groups) == [
        (0.0, 1.0, 10), (0.2, 1.0, 2)]


def test_muon_skips_empty_blocks():
    opt = build_optimizer(_small_model("canonical", heads=1), OptimConfig(name="muon"), "cpu")
    assert all(v.numel() for v in opt.views) and len(opt.views) == len(opt.sources)
    assert all(v.dim() == 2 for v in opt.views)


def test_muon_refuses_a_matrix_without_2d_blocks():
    model = _small_model("canonical", heads=2)
    attn = model.transformer.h[0].attn
    attn.head_blocks = lambda: {"W_Q": [(0, 0)]}  # a 1-D row: not a block Muon can orthogonalise
    with pytest.raises(ValueError, match=r"Muon needs 2-D blocks; transformer\.h\.0\.attn\.W_Q \(2, 16, 8\) "
                                         r"does not split into them \(override head_blocks\)"):
        build_optimizer(model, OptimConfig(name="muon"), "cpu")


def test_muon_step_zero_grad_and_state_round_trip():
    cfg = OptimConfig(name="muon", lr=1e-2, weight_decay=0.0)
    model = _small_model("standard", heads=2)
    opt = build_optimizer(model, cfg, "cpu")
    _small_backward(model, 1)
    frozen = model.transformer.h[0].mlp.c_fc.weight
    frozen.grad = None  # a matrix without gradient: its blocks get none and do not move
    before = frozen.detach().clone()
    attn_before = model.transformer.h[0].attn.c_attn.weight.detach().clone()
    opt.step()
    assert torch.equal(frozen, before)
    assert not torch.equal(model.transformer.h[0].attn.c_attn.weight, attn_before)  # the views wrote the parameter
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters()) and all(v.grad is None for v in opt.views)
    _small_backward(model, 2)
    opt.step()
    sd = opt.state_dict()
    n_adamw = sum(len(g["params"]) for g in opt.adamw.param_groups)
    assert sorted(sd["state"]) == list(range(len(sd["state"])))
    assert min(i for g in sd["param_groups"][len(opt.adamw.param_groups):] for i in g["params"]) == n_adamw
    twin = _small_model("standard", heads=2, seed=5)
    twin.load_state_dict(model.state_dict())
    twin_opt = build_optimizer(twin, cfg, "cpu")
    twin_opt.load_state_dict(copy.deepcopy(sd))  # torch keeps the given tensors: no sharing with opt
    assert set(twin_opt.adamw.state_dict()["state"]) == set(opt.adamw.state_dict()["state"])  # no stray entries
    assert set(twin_opt.muon.state_dict()["state"]) == set(opt.muon.state_dict()["state"])
    for a, b in zip(opt.muon.state.values(), twin_opt.muon.state.values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    for a, b in zip(opt.adamw.state.values(), twin_opt.adamw.state.values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    for m, o in ((model, opt), (twin, twin_opt)):
        o.zero_grad()
        _small_backward(m, 3)
        o.step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), name


def test_set_lr_multiplies_by_the_group_scale_default_one():
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": [p], "lr_scale": 0.5}, {"params": [q]}], lr=1.0)
    set_lr(opt, 0.3)
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(0.15), 0.3]


def test_apply_step_clips_steps_and_drops_gradients():
    p = torch.nn.Parameter(torch.zeros(2))
    model = torch.nn.Module()
    model.p = p
    opt = torch.optim.SGD([p], lr=1.0)
    p.grad = torch.tensor([3.0, 4.0])  # norm 5
    assert apply_step(model, opt, 1.0) == pytest.approx(5.0)
    assert p.grad is None and torch.allclose(p.detach(), torch.tensor([-0.6, -0.8]))
    p.grad = torch.tensor([3.0, 4.0])
    assert apply_step(model, opt, 0.0) == pytest.approx(5.0)  # no clip: the whole step
    assert torch.allclose(p.detach(), torch.tensor([-3.6, -4.8]))
    p.grad = torch.tensor([0.3, 0.4])
    assert apply_step(model, opt, 1.0) == pytest.approx(0.5)  # under the clip: unchanged
    assert torch.allclose(p.detach(), torch.tensor([-3.9, -5.2]))
    assert isinstance(apply_step(model, opt, 0.0), float)  # no gradient at all: norm 0


@pytest.mark.parametrize("attention", ["standard", "canonical"])
def test_the_attention_knobs_find_a_llama_model_s_attention_matrices(attention):
    """decay_attention=false and attn_lr_by_init_rms act on a Llama-family model's attention layers too, and only
    on them (the MLP, embeddings and norms keep the default)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(family="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, mlp_hidden=48, vocab_size=64,
                          attention=attention))
    opt = build_optimizer(model, OptimConfig(weight_decay=0.1, decay_attention=False, attn_lr_by_init_rms=True), "cpu")
    seen = 0
    for name, p in model.named_parameters():
        attn = ".attn." in name
        group = _group_of(opt, p)
        assert group["weight_decay"] == (0.1 if p.dim() >= 2 and not attn else 0.0), name
        if attn and p.dim() >= 2:
            seen += 1
            assert group["lr_scale"] == pytest.approx(p.detach().pow(2).mean().sqrt().item() / 0.02, rel=1e-5), name
        else:
            assert group["lr_scale"] == 1.0, name
    assert seen >= 8  # at least the four maps of each of the two layers


@pytest.mark.parametrize("attention", ["standard", "canonical"])
def test_muon_splits_a_llama_model_s_attention_per_head_and_its_first_step_is_orthogonal_per_block(attention):
    """The Llama family's head_blocks reach Muon: every attention and MLP matrix entry in exactly one block,
    AdamW holds the rest, and with no weight decay each block's first update is near-orthogonal (its own
    Newton-Schulz, not the fused projection's)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(family="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, mlp_hidden=48, vocab_size=50,
                          block_size=16, attention=attention))
    opt = build_optimizer(model, OptimConfig(name="muon", weight_decay=0.0, lr=1e-3), "cpu")
    cover = {id(p): torch.zeros_like(p) for p, _ in opt.sources}
    for p, idx in opt.sources:
        cover[id(p)][idx] += 1
    adamw = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        hidden = (".attn." in name or ".mlp." in name) and is_matrix(name, p)
        assert (id(p) in adamw) != hidden, name
        if hidden:
            assert torch.equal(cover[id(p)], torch.ones_like(p)), name
    before = [view.clone() for view in opt.views]
    _muon_step(model, opt)
    attn = {id(p) for p in model.transformer.h[0].attn.parameters()}
    checked = 0
    for i, (p, _) in enumerate(opt.sources):
        view = opt.views[i]
        if id(p) in attn:  # one head's side (d_head = 8), or one rotary pair's 2 columns of canonical's key map
            assert min(view.shape) in (8, 2), tuple(view.shape)
        if id(p) not in attn or min(view.shape) < 8:  # canonical's (d - 1) x 2 rotary pair blocks: too thin to judge
            continue
        step = (before[i] - view) / (1e-3 * 0.2 * max(view.shape) ** 0.5)  # torch's match_rms_adamw adjustment
        s = torch.linalg.svdvals(step)
        assert 0.7 < s.median() < 1.3 and s.max() < 1.5, (tuple(view.shape), s)
        checked += 1
    assert checked >= 8  # 4 query heads, 2 key/value heads of V, and the output blocks
