"""GPTConfig.fused_gate_up: a SwiGLU storing its gate and up maps as one `gate_up_proj` with [gate | up] outputs
(Phi-3's layout) is the same function, trained by Muon the same way, as the separate gate_proj / up_proj, with the
same weights."""

import pytest
import torch

from iattention.config import OptimConfig
from iattention.config.model import GPTConfig
from iattention.errors import UserError
from iattention.interop.convert import check_exportable
from iattention.model.gpt import GPT
from iattention.symmetry.counts import standard_param_count
from iattention.train.optim import MuonWithAdamW

X = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))


def _pair(**kw):
    """(fused, separate): two Llama-family models with the same weights, the gate and up maps stored both ways."""
    cfg = GPTConfig(family="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, mlp_hidden=40, vocab_size=50,
                    block_size=12, **kw)
    torch.manual_seed(0)
    fused = GPT(cfg.replace(fused_gate_up=True)).double()
    with torch.no_grad():
        for p in fused.parameters():
            p.normal_(0.0, 0.3)
    separate = GPT(cfg).double()
    state = {}
    for k, v in fused.state_dict().items():
        if ".gate_up_proj." in k:
            gate, up = v.chunk(2, dim=0)
            state[k.replace("gate_up_proj", "gate_proj")], state[k.replace("gate_up_proj", "up_proj")] = gate, up
        else:
            state[k] = v
    separate.load_state_dict(state, strict=True)
    return fused, separate


@pytest.mark.parametrize("bias", [False, True])
def test_a_fused_gate_up_is_the_separate_maps_bit_for_bit(bias):
    fused, separate = _pair(bias=bias)
    assert fused.transformer.h[0].mlp.gate_up_proj.weight.shape == (80, 32)
    assert not hasattr(fused.transformer.h[0].mlp, "gate_proj")
    with torch.no_grad():
        assert torch.equal(fused(X)[0], separate(X)[0])
    assert fused.num_params() == separate.num_params() == standard_param_count(fused.config)


def test_muon_updates_the_gate_and_up_halves_as_the_separate_maps():
    fused, separate = _pair()
    for model in (fused, separate):
        opt = MuonWithAdamW(model, OptimConfig(name="muon", lr=0.02), "cpu")
        model(X, targets=X)[1].backward()
        opt.step()
    gate_up = fused.transformer.h[1].mlp.gate_up_proj.weight
    mlp = separate.transformer.h[1].mlp
    assert torch.allclose(gate_up, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), rtol=0, atol=1e-12)


def test_the_key_is_left_out_where_it_is_the_family_s_and_refused_without_a_swiglu():
    cfg = GPTConfig(family="llama", n_layer=1, n_head=2, n_embd=16, vocab_size=50, block_size=8)
    assert cfg.fused_gate_up is False and "fused_gate_up" not in cfg.to_dict()  # a saved run reads as before
    fused = cfg.replace(fused_gate_up=True)
    assert fused.to_dict()["fused_gate_up"] is True and GPTConfig.from_dict(fused.to_dict()) == fused
    with pytest.raises(UserError, match=r"model.fused_gate_up=true .* model.mlp=gelu_tanh has neither"):
        GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=50, block_size=8, fused_gate_up=True)
    with pytest.raises(UserError, match=r"model.fused_gate_up must be true or false"):
        GPTConfig.from_dict({**cfg.to_dict(), "fused_gate_up": "yes"})


def test_an_export_whose_class_stores_the_maps_apart_is_refused_in_one_line():
    cfg = GPTConfig(family="llama", n_layer=1, n_head=2, n_embd=16, vocab_size=50, block_size=8, fused_gate_up=True)
    with pytest.raises(UserError, match=r"cannot hold this model's model.fused_gate_up=True .*fused_gate_up=False"):
        check_exportable(cfg)
