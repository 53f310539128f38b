"""model.attn_kernel: which kernel a full-sequence pass runs (kernels/__init__.py), its config checks, and a GPT
through the Triton kernel (interpreted) against the same GPT through SDPA."""

from __future__ import annotations

import pytest
import torch

import iattention.kernels as kernels
from iattention import GPT, GPTConfig
from iattention.config.identity import config_mismatch
from iattention.errors import UserError


@pytest.mark.parametrize("device, d, dropout, installed, expected", [
    ("cpu", 768, 0.0, True, "sdpa"),  # CPU numbers never change
    ("cuda", 768, 0.0, True, "triton"),
    ("cuda", 1024, 0.0, True, "triton"),
    ("cuda", 256, 0.0, True, "sdpa"),  # SDPA's flash kernel covers it
    ("cuda", 64, 0.0, True, "sdpa"),
    ("cuda", 768, 0.1, True, "sdpa"),  # the kernel has no dropout
    ("cuda", 768, 0.0, False, "sdpa"),  # no triton installed
])
def test_auto_takes_the_kernel_only_for_wide_heads_on_cuda(monkeypatch, device, d, dropout, installed, expected):
    monkeypatch.setattr(kernels, "TRITON_INSTALLED", installed)
    assert kernels.kernel_for("auto", device, d, dropout) == expected
    assert kernels.kernel_for("sdpa", device, d, dropout) == "sdpa"


def test_forced_triton_where_it_cannot_run_is_one_line(monkeypatch):
    monkeypatch.setattr(kernels, "TRITON_INSTALLED", True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UserError, match="runs on CUDA") as e:
        kernels.kernel_for("triton", "cpu", 768)
    assert "\n" not in str(e.value)
    assert kernels.kernel_for("triton", "cuda", 64) == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.kernel_for("triton", "cpu", 768) == "triton"
    with pytest.raises(UserError, match="no dropout"):
        kernels.kernel_for("triton", "cuda", 768, dropout=0.1)
    monkeypatch.setattr(kernels, "TRITON_INSTALLED", False)
    with pytest.raises(UserError, match="not installed"):
        kernels.kernel_for("triton", "cuda", 768)


def test_the_config_key_is_checked_and_is_not_part_of_a_runs_identity():
    for bad, match in ((dict(attn_kernel="flash"), "unknown model.attn_kernel 'flash'; choose one of auto, sdpa, "
                                                   "math, triton"),
                       (dict(attn_kernel="triton", dropout=0.1), "has no dropout")):
        with pytest.raises(UserError, match=match) as e:
            GPTConfig(n_layer=1, n_head=1, n_embd=16, vocab_size=8, **bad)
        assert "\n" not in str(e.value)
    a = {"model": {"n_head": 1, "attn_kernel": "triton"}}
    assert config_mismatch(a, {"model": {"n_head": 1}}) is None  # where it runs, not what it computes


def test_the_default_on_cpu_never_reaches_triton(monkeypatch):
    """auto on CPU is SDPA: the same numbers as before the switch existed, triton never imported."""
    def refuse(*_):
        raise AssertionError("the Triton kernel ran on CPU under attn_kernel=auto")

    monkeypatch.setattr("iattention.kernels.triton_causal_attention", refuse)
    cfg = GPTConfig(n_layer=1, n_head=1, n_embd=288, vocab_size=16, block_size=8)  # head dim 288 > 256
    x = torch.randint(0, 16, (1, 8), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    loss = GPT(cfg)(x, x)[1]
    torch.manual_seed(0)
    assert torch.equal(loss, GPT(cfg.replace(attn_kernel="sdpa"))(x, x)[1])


def _spy_on_math_path(monkeypatch) -> list:
    calls = []
    real = kernels.math_causal_attention
    monkeypatch.setattr(kernels, "math_causal_attention", lambda *a: calls.append(a[0].shape) or real(*a))
    return calls


@pytest.mark.parametrize("attention, dropout", [("standard", 0.0), ("canonical", 0.0), ("standard", 0.2)])
def test_a_gpt_through_the_math_path_equals_the_gpt_through_sdpa(monkeypatch, attention, dropout):
    """model.attn_kernel=math: loss and every gradient of a 2-layer GPT as through SDPA (dropout included: the
    math path draws SDPA's mask from the same seed on CPU); it runs once per layer in training and never in
    cached generation."""
    calls = _spy_on_math_path(monkeypatch)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=16, block_size=12, attention=attention,
                    dropout=dropout)
    x = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(1))
    results = []
    for kernel in ("sdpa", "math"):
        torch.manual_seed(0)
        model = GPT(cfg.replace(attn_kernel=kernel))
        loss = model(x, x)[1]
        loss.backward()
        results.append((loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    assert len(calls) == 2
    (l0, g0), (l1, g1) = results
    assert abs(l0 - l1) <= 1e-5 * abs(l0)
    assert max((g0[n] - g1[n]).abs().max().item() for n in g0) <= 1e-5
    from iattention.model.generate import generate

    with torch.no_grad():
        generate(model.eval(), x[:1, :3], 4, temperature=0.0, use_cache=True)
    assert len(calls) == 2  # the cached passes ran SDPA


def test_the_llama_family_dispatches_through_the_same_point(monkeypatch):
    """A Llama-family layer (grouped-query attention: 4 query heads, 2 key/value heads) calls kernels.attend:
    with its attn_kernel set to math the math path runs, with the same loss and gradients as SDPA."""
    calls = _spy_on_math_path(monkeypatch)
    cfg = GPTConfig(family="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, vocab_size=16, block_size=12)
    x = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(1))
    results = []
    for kernel in ("sdpa", "math"):
        torch.manual_seed(0)
        model = GPT(cfg)
        for block in model.transformer.h:
            block.attn.attn_kernel = kernel
        loss = model(x, x)[1]
        loss.backward()
        results.append((loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    assert calls == [torch.Size([2, 4, 12, 8])] * 2
    (l0, g0), (l1, g1) = results
    assert abs(l0 - l1) <= 1e-5 * abs(l0)
    assert max((g0[n] - g1[n]).abs().max().item() for n in g0) <= 1e-5


@pytest.mark.parametrize("attention, n_head, amp", [
    pytest.param("standard", 2, False, marks=pytest.mark.slow),  # ~3 s under the interpreter
    ("canonical", 1, False), ("canonical", 1, True)])
def test_a_gpt_through_the_kernel_equals_the_gpt_through_sdpa(interpreted, attention, n_head, amp):
    """Dispatch end to end (forced triton on CPU under the interpreter): loss and every parameter's gradient
    of a 2-layer GPT as through SDPA; canonical at one head passes the input itself as keys, and under bf16
    autocast those are float32 while q, v are bf16."""
    r = interpreted("model", attention=attention, n_head=n_head, n_embd=64, T=20, amp=amp)
    assert r["kernel_calls"] == {"sdpa": 0, "triton": 2}  # once per layer, and only when forced
    assert r["same_names"]
    tol = 2e-2 if amp else 1e-5
    assert abs(r["loss_triton"] - r["loss_sdpa"]) <= tol * abs(r["loss_sdpa"]), r
    assert r["grad_max_abs"] <= tol * r["grad_scale"], r


@pytest.mark.slow
def test_grouped_query_attention_through_the_kernel_equals_sdpa(interpreted):
    """The Llama family's shapes through kernels.attend with the Triton kernel (interpreted): 4 query heads
    on 2 and on 1 key/value heads, output and every gradient as SDPA's enable_gqa."""
    for G in (2, 1):
        assert interpreted("grouped", H=4, G=G)["max_abs"] <= 1e-5
