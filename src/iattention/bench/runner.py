"""Timing one configuration: training step and forward-only tokens/s, peak memory."""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from iattention.config import GPTConfig
from iattention.model.gpt import GPT
from iattention.train.config import OptimConfig
from iattention.train.optim import build_optimizer


@dataclass
class Timing:
    train_tokens_per_s: float
    forward_tokens_per_s: float
    train_window_tokens_per_s: list[float]
    peak_memory_mb: float | None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_model(model: torch.nn.Module, loss_fn, vocab: int, batch: int, T: int, device: torch.device,
               windows: int = 5, steps_per_window: int = 3, warmup: int = 2, amp: bool = False) -> Timing:
    """Median tokens/s over `windows` timed windows of `steps_per_window` steps each, after warm-up."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, T + 1), generator=g).to(device)
    inp, tgt = x[:, :-1], x[:, 1:]
    opt = build_optimizer(model, OptimConfig(lr=1e-4), device.type)
    ctx = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if amp else nullcontext
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step():
        with ctx():
            loss = loss_fn(model, inp, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    model.train()
    for _ in range(warmup):
        step()
    rates = []
    for _ in range(windows):
        _sync(device)
        t = time.perf_counter()
        for _ in range(steps_per_window):
            step()
        _sync(device)
        rates.append(batch * T * steps_per_window / (time.perf_counter() - t))
    model.eval()
    fwd_rates = []
    with torch.no_grad():
        for i in range(warmup + windows):
            _sync(device)
            t = time.perf_counter()
            for _ in range(steps_per_window):
                with ctx():
                    loss_fn(model, inp, tgt)
            _sync(device)
            if i >= warmup:
                fwd_rates.append(batch * T * steps_per_window / (time.perf_counter() - t))
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return Timing(statistics.median(rates), statistics.median(fwd_rates), rates, peak)


def ours(cfg: GPTConfig, device, dtype=torch.float32, compile: bool = False):
    model = GPT(cfg).to(device=device, dtype=dtype)
    fn = torch.compile(model, fullgraph=True) if compile else model

    def loss_fn(_, x, y):
        return fn(x, y)[1]

    return model, loss_fn


def hf_reference(cfg: GPTConfig, device, dtype=torch.float32, compile: bool = False):
    """transformers GPT2LMHeadModel of the same shape (SDPA attention), or None if not installed."""
    try:
        import transformers
    except ImportError:
        return None, None
    from iattention.interop.hf import hf_config

    transformers.utils.logging.set_verbosity_error()
    hc = hf_config(cfg)
    hc._attn_implementation = "sdpa"
    model = transformers.GPT2LMHeadModel(hc).to(device=device, dtype=dtype)
    fn = torch.compile(model) if compile else model

    def loss_fn(_, x, y):  # the same loss expression as iattention.GPT's
        logits = fn(input_ids=x).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))

    return model, loss_fn
