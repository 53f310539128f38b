"""Unit tests of iattention.train.runtime."""

from __future__ import annotations

import pytest
import torch

from iattention.config import LoopConfig
from iattention.train.runtime import Runtime


@pytest.mark.parametrize("amp, amp_cpu, bf16", [(True, False, False), (False, True, True), (True, True, True)])
def test_runtime_autocast_on_cpu_only_with_amp_cpu(amp, amp_cpu, bf16):
    """train.amp is CUDA's: on CPU only train.amp_cpu turns bf16 autocast on."""
    rt = Runtime(LoopConfig(device="cpu", amp=amp, amp_cpu=amp_cpu))
    assert rt.device.type == "cpu" and rt.is_main and rt.world == 1
    a = torch.ones(4, 4)
    with rt.autocast():
        out = a @ a
    assert out.dtype == (torch.bfloat16 if bf16 else torch.float32)
    model = torch.nn.Linear(4, 4)
    assert rt.wrap(model) is model and rt.eval_model(model, model) is model  # one process, not compiled
    rt.close()


def _validator(amp_cpu: bool, eval_amp: bool):
    import numpy as np

    from iattention.train.validate import Validator
    rt = Runtime(LoopConfig(device="cpu", amp_cpu=amp_cpu, eval_amp=eval_amp))
    tokens = np.random.default_rng(0).integers(0, 64, 200)
    return rt, Validator({"valid": tokens}, {}, 16, 4, rt)


@pytest.mark.parametrize("amp_cpu, eval_amp, dtype", [(True, False, "float32"), (False, True, "float32"),
                                                      (True, True, "bfloat16")])
def test_evaluation_runs_in_float32_unless_eval_amp_asks_for_training_autocast(amp_cpu, eval_amp, dtype):
    """Training under bf16 autocast evaluates in float32 by default (the loss is the float32 split_nll's,
    bit for bit); only train.eval_amp, with autocast on, evaluates under it, and the record says which."""
    from contextlib import nullcontext

    from iattention import GPT, GPTConfig
    from iattention.train.evaluate import split_nll
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=64, block_size=16))
    rt, v = _validator(amp_cpu, eval_amp)
    loss, _ = v.loss(rt.eval_model(model, model), "valid")
    nll32, n = split_nll(model, v.splits["valid"], 16, 4, rt.ctx, nullcontext)
    nll16, _ = split_nll(model, v.splits["valid"], 16, 4, rt.ctx, lambda: torch.autocast("cpu", torch.bfloat16))
    assert rt.eval_dtype == dtype and nll16 != nll32  # bf16 and float32 do differ here
    assert loss == (nll16 if dtype == "bfloat16" else nll32) / n
    rt.close()


def test_float32_exact_turns_tf32_off_inside_and_restores_it():
    from iattention.train.runtime import float32_exact
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        with pytest.raises(KeyError), float32_exact():
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
            raise KeyError  # restored on the way out of an error too
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_compile_scope_blocks_compiles_the_model_s_regions_in_place_and_model_the_whole():
    """train.compile_scope=blocks: the steps run the model itself, its regions compiled (before DDP would wrap
    it); model: a compiled wrapper, the model untouched."""
    from iattention import GPT, GPTConfig
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=32, block_size=8)
    blocks, whole = GPT(cfg), GPT(cfg)
    rt = Runtime(LoopConfig(device="cpu", compile=True, compile_scope="blocks"))
    assert rt.wrap(blocks) is blocks and blocks._regions is not None
    rt.step_begin()  # CUDA graphs only: nothing to do on CPU
    rt.close()
    rt = Runtime(LoopConfig(device="cpu", compile=True))
    wrapped = rt.wrap(whole)
    assert wrapped is not whole and whole._regions is None and wrapped._orig_mod is whole
    rt.close()


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_train_compile_mode_reaches_torch_compile_in_either_scope(monkeypatch, scope):
    from iattention import GPT, GPTConfig
    modes = []
    real = torch.compile

    def spy(*args, **kwargs):  # records the mode, compiles as torch.compile does
        modes.append(kwargs.get("mode"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", spy)
    rt = Runtime(LoopConfig(device="cpu", compile=True, compile_scope=scope, compile_mode="max-autotune"))
    rt.wrap(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=32, block_size=8)))
    rt.close()
    assert modes == ["max-autotune"] * (2 if scope == "blocks" else 1)
