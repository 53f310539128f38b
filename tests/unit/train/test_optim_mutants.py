"""Survivors of `make mutation` in train/optim.py turned into checks (tests/mutation/SCORES.md): the group
rules, the settings handed to torch's optimizers, Muon's state round trip and the step tail."""

import copy

import pytest
import torch

from iattention import GPT, GPTConfig
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


def _model(attention="canonical", heads=2, init="gpt2", seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=1, n_head=heads, n_embd=16, vocab_size=40, block_size=8, attention=attention,
                         init=init))


def _backward(model, seed=1):
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
    model = _model("standard")
    model.transformer.wte.weight.requires_grad_(False)
    groups = param_groups(model, OptimConfig(weight_decay=0.3))
    grouped = [p for g in groups for p in g["params"]]
    assert not any(p is model.transformer.wte.weight for p in grouped)
    assert len(grouped) == sum(1 for p in model.parameters() if p.requires_grad)
    assert sorted((g["weight_decay"], g["lr_scale"]) for g in groups) == [(0.0, 1.0), (0.3, 1.0)]
    assert set(groups[0]) == {"params", "weight_decay", "lr_scale"}


def test_init_rms_scale_by_hand_and_empty_blocks_keep_scale_one():
    assert GPT2_INIT_STD == 0.02
    model = _model("canonical", heads=1)  # at one head canonical's W_K_free / W_O_free are empty
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
    opt = build_optimizer(_model(), cfg, "cpu")
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["lr"] == 3e-3 and opt.defaults["betas"] == (0.8, 0.9) and not opt.defaults["fused"]
    fused = build_optimizer(_model(), cfg, "cuda")  # fused AdamW also exists for CPU tensors
    assert fused.defaults["fused"] is True and fused.defaults["betas"] == (0.8, 0.9)


def test_muon_settings_and_decay_of_its_blocks():
    cfg = OptimConfig(name="muon", lr=2e-3, beta1=0.7, beta2=0.85, weight_decay=0.2, decay_attention=False)
    opt = build_optimizer(_model("standard"), cfg, "cpu")
    assert isinstance(opt, MuonWithAdamW)
    assert opt.adamw.defaults["lr"] == 2e-3 and opt.adamw.defaults["betas"] == (0.7, 0.85)
    assert not opt.adamw.defaults["fused"]
    assert opt.muon.defaults["lr"] == 2e-3 and opt.muon.defaults["adjust_lr_fn"] == "match_rms_adamw"
    assert build_optimizer(_model("standard"), cfg, "cuda").adamw.defaults["fused"] is True
    # attention blocks: no decay (decay_attention off); MLP matrices: decayed
    model = opt.muon_params
    assert {g["weight_decay"] for g in opt.muon.param_groups} == {0.0, 0.2}
    assert all("lr_scale" in g for g in opt.muon.param_groups)
    decayed = opt.muon.param_groups[[g["weight_decay"] for g in opt.muon.param_groups].index(0.2)]["params"]
    assert len(decayed) == 2 and len(model) == 4  # c_fc and c_proj whole; c_attn and attn.c_proj per head
    on = build_optimizer(_model("standard"), OptimConfig(name="muon", weight_decay=0.2), "cpu")
    assert {g["weight_decay"] for g in on.muon.param_groups} == {0.2}
    assert opt.param_groups == opt.adamw.param_groups + opt.muon.param_groups
    # AdamW's groups keep their decay and lr scale: embeddings decayed, biases and LayerNorms not
    assert sorted((g["weight_decay"], g["lr_scale"], len(g["params"])) for g in opt.adamw.param_groups) == [
        (0.0, 1.0, 10), (0.2, 1.0, 2)]


def test_muon_skips_empty_blocks():
    opt = build_optimizer(_model("canonical", heads=1), OptimConfig(name="muon"), "cpu")
    assert all(v.numel() for v in opt.views) and len(opt.views) == len(opt.sources)
    assert all(v.dim() == 2 for v in opt.views)


def test_muon_refuses_a_matrix_without_2d_blocks():
    model = _model("canonical", heads=2)
    attn = model.transformer.h[0].attn
    attn.head_blocks = lambda: {"W_Q": [(0, 0)]}  # a 1-D row: not a block Muon can orthogonalise
    with pytest.raises(ValueError, match=r"Muon needs 2-D blocks; transformer\.h\.0\.attn\.W_Q \(2, 16, 8\) "
                                         r"does not split into them \(override head_blocks\)"):
        build_optimizer(model, OptimConfig(name="muon"), "cpu")


def test_muon_step_zero_grad_and_state_round_trip():
    cfg = OptimConfig(name="muon", lr=1e-2, weight_decay=0.0)
    model = _model("standard", heads=2)
    opt = build_optimizer(model, cfg, "cpu")
    _backward(model, 1)
    frozen = model.transformer.h[0].mlp.c_fc.weight
    frozen.grad = None  # a matrix without gradient: its blocks get none and do not move
    before = frozen.detach().clone()
    attn_before = model.transformer.h[0].attn.c_attn.weight.detach().clone()
    opt.step()
    assert torch.equal(frozen, before)
    assert not torch.equal(model.transformer.h[0].attn.c_attn.weight, attn_before)  # the views wrote the parameter
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters()) and all(v.grad is None for v in opt.views)
    _backward(model, 2)
    opt.step()
    sd = opt.state_dict()
    n_adamw = sum(len(g["params"]) for g in opt.adamw.param_groups)
    assert sorted(sd["state"]) == list(range(len(sd["state"])))
    assert min(i for g in sd["param_groups"][len(opt.adamw.param_groups):] for i in g["params"]) == n_adamw
    twin = _model("standard", heads=2, seed=5)
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
        _backward(m, 3)
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
