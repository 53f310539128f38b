"""Timing: one configuration (training step and forward-only tokens/s, peak memory), and `run_bench`, every
variant x head count in one process with paired ratios to standard and to HF GPT-2."""

from __future__ import annotations

import datetime
import os
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from iattention.bench.flops import device_peak_tflops, executed_flops_per_token, nanogpt_flops_per_token
from iattention.config import GPTConfig, OptimConfig, load_config, resolve_vocab
from iattention.config.families import FAMILIES
from iattention.errors import UserError
from iattention.interop.hf import hf_config_of
from iattention.kernels import prepare as prepare_kernel
from iattention.model.gpt import GPT
from iattention.train.optim import build_optimizer
from iattention.utils.hardware import allow_tf32, device_name


@dataclass
class Timing:
    train_tokens_per_s: float
    forward_tokens_per_s: float
    train_window_tokens_per_s: list[float]
    peak_memory_mb: float | None
    first_step_s: float | None = None  # the first training step's seconds: torch.compile's work included


def bench_device(device: str) -> torch.device:
    """--device as a torch device; a UserError for cuda where none is visible."""
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is visible; run on a GPU machine or use --device cpu")
    return torch.device(device)


def sync(device: torch.device) -> None:
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
        torch.compiler.cudagraph_mark_step_begin()  # a new step for CUDA graphs (--compile-mode reduce-overhead)
        with ctx():
            loss = loss_fn(model, inp, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    model.train()
    sync(device)
    t = time.perf_counter()
    step()
    sync(device)
    first = time.perf_counter() - t
    for _ in range(warmup - 1):
        step()
    rates = []
    for _ in range(windows):
        sync(device)
        t = time.perf_counter()
        for _ in range(steps_per_window):
            step()
        sync(device)
        rates.append(batch * T * steps_per_window / (time.perf_counter() - t))
    model.eval()
    fwd_rates = []
    with torch.no_grad():
        for i in range(warmup + windows):
            sync(device)
            t = time.perf_counter()
            for _ in range(steps_per_window):
                torch.compiler.cudagraph_mark_step_begin()
                with ctx():
                    loss_fn(model, inp, tgt)
            sync(device)
            if i >= warmup:
                fwd_rates.append(batch * T * steps_per_window / (time.perf_counter() - t))
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return Timing(statistics.median(rates), statistics.median(fwd_rates), rates, peak, first)


def iattention_model(cfg: GPTConfig, device, dtype=torch.float32, compile: bool = False, loss_chunk: int = 0,
                     compile_scope: str = "model", compile_mode: str = "default"):
    """An iattention GPT of this shape and its loss function (x, y) -> loss, as `hf_reference` for transformers'
    (loss_chunk: train.loss_chunk, the loss that many positions at a time; compile_scope and compile_mode:
    train.compile_scope and train.compile_mode)."""
    model = GPT(cfg).to(device=device, dtype=dtype)
    fn = model
    if compile and compile_scope == "blocks":
        model.compile_regions(compile_mode)
    elif compile:
        fn = torch.compile(model, fullgraph=True, mode=compile_mode)

    def loss_fn(_, x, y):
        return fn(x, y, loss_chunk=loss_chunk)[1]

    return model, loss_fn


def hf_reference(cfg: GPTConfig, device, dtype=torch.float32, compile: bool = False, compile_mode: str = "default"):
    """transformers' model of the same shape and family (GPT2LMHeadModel, LlamaForCausalLM, ...; SDPA attention), or
    None if not installed."""
    try:
        import transformers  # lazy: heavy, optional, and only the HF reference needs it
    except ImportError:
        return None, None

    transformers.utils.logging.set_verbosity_error()
    # the family's own transformers class, of the config an export of this model writes
    hc, cls = hf_config_of(cfg), getattr(transformers, FAMILIES[cfg.family].hf_class)
    hc._attn_implementation = "sdpa"
    model = cls(hc).to(device=device, dtype=dtype)
    fn = torch.compile(model, mode=compile_mode) if compile else model

    def loss_fn(_, x, y):  # the same loss expression as iattention.GPT's
        logits = fn(input_ids=x).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))

    return model, loss_fn


# Micro-batch (windows) timed per step: the preset's batch, at most this many.
MAX_BENCH_BATCH = 16
# A ratio whose rounds spread by more than this (largest / smallest round ratio - 1) is flagged noisy.
NOISE_SPREAD = 0.15


def bench_ratio(a_rounds: list[float], b_rounds: list[float]) -> dict:
    """a / b for rates timed back to back in each round: the median over rounds of the within-round
    ratio (the one ratio definition of the benchmark), the per-round ratios, and `noisy` when the rounds
    disagree by more than NOISE_SPREAD, so one figure must not be read as a finding."""
    rounds = [a / b for a, b in zip(a_rounds, b_rounds)]
    ratio = statistics.median(rounds)
    noisy = len(rounds) > 1 and max(rounds) / min(rounds) - 1 > NOISE_SPREAD
    return dict(ratio=ratio, rounds=rounds, noisy=noisy)


def bench_model(preset: str, overrides: list[str] = ()) -> GPTConfig:
    """The preset's model with `overrides` (KEY=VALUE, as iattn train takes them), vocabulary from its tokenizer."""
    cfg = load_config(preset, None, list(overrides))
    return resolve_vocab(cfg.model, cfg.data.tokenizer)


def bench_spec(preset: str, overrides: list[str] = ()) -> dict:
    """Model config (bench_model's, every key it sets but the ones each configuration sets: n_head, attention and
    the kernel) and the timed micro-batch."""
    cfg = load_config(preset, None, list(overrides))
    shape = {k: v for k, v in resolve_vocab(cfg.model, cfg.data.tokenizer).to_dict().items()
             if k not in ("n_head", "attention", "attn_kernel")}
    return dict(model=shape, batch=min(MAX_BENCH_BATCH, cfg.train.batch_size))


def _row(label, attention, h, cfg, timing, n_params, peak, kernel="sdpa", compile_scope=None) -> dict:
    flops = executed_flops_per_token(cfg)
    row = dict(model=label, attention=attention, n_head=h, params=n_params, attn_kernel=kernel,
               compile_scope=compile_scope, first_step_s=timing.first_step_s,
               train_tokens_per_s=timing.train_tokens_per_s, forward_tokens_per_s=timing.forward_tokens_per_s,
               train_window_tokens_per_s=timing.train_window_tokens_per_s, peak_memory_mb=timing.peak_memory_mb,
               executed_flops_per_token=flops, nanogpt_flops_per_token=nanogpt_flops_per_token(cfg),
               achieved_tflops=flops * timing.train_tokens_per_s / 1e12)
    if peak:
        row["mfu_nanogpt"] = row["nanogpt_flops_per_token"] * timing.train_tokens_per_s / (peak * 1e12)
        row["mfu_executed"] = flops * timing.train_tokens_per_s / (peak * 1e12)
    return row


def _entries(spec: dict, attentions: list[str], heads: list[int], dev, compile: bool, reference: bool,
             attn_kernel: str = "auto", loss_chunk: int = 0, compile_scope: str = "model",
             compile_mode: str = "default") -> list:
    """(label, attention, heads, cfg, model, loss_fn, params, attention kernel) of every configuration to time."""
    entries = []
    for h in heads:
        base = GPTConfig(n_head=h, attn_kernel=attn_kernel, **spec["model"])
        for attention in attentions:
            cfg = base.replace(attention=attention)
            kernel = prepare_kernel(attn_kernel, dev.type, cfg.d_head, cfg.dropout,  # what its training steps run
                                    (spec["batch"], h, cfg.block_size))
            torch.manual_seed(0)
            model, loss_fn = iattention_model(cfg, dev, compile=compile, loss_chunk=loss_chunk,
                                              compile_scope=compile_scope, compile_mode=compile_mode)
            entries.append(("iattention", attention, h, cfg, model, loss_fn, model.num_params(), kernel))
        if reference:
            cfg = base.replace(attention="standard")
            model, loss_fn = hf_reference(cfg, dev, compile=compile, compile_mode=compile_mode)
            if model is not None:
                entries.append((f"hf-{cfg.family}", "standard", h, cfg, model, loss_fn,
                                sum(p.numel() for p in model.parameters()), "sdpa"))
    return entries


def _add_ratios(rows: list[dict], timings: dict[int, list]) -> None:
    """Ratios are paired: within each round every configuration was timed back to back, so the
    ratio of two round medians cancels drift of the machine that is slower than a round. Every ratio
    the table prints is this one definition: the median over rounds of the within-round ratio, with
    the smallest and largest round's ratio (bench_ratio)."""
    round_rate = {i: {key: [getattr(t, key) for t in timings[i]]
                      for key in ("train_tokens_per_s", "forward_tokens_per_s")} for i in timings}
    for i, row in enumerate(rows):
        same = [j for j, r in enumerate(rows) if r["n_head"] == row["n_head"]]
        std = next((j for j in same if rows[j]["model"] == "iattention" and rows[j]["attention"] == "standard"), None)
        ref = next((j for j in same if rows[j]["model"].startswith("hf-")), None)
        for key in ("train_tokens_per_s", "forward_tokens_per_s"):
            for against, j in (("standard", std), ("hf", ref)):
                if j is None:
                    continue
                r = bench_ratio(round_rate[i][key], round_rate[j][key])
                row[f"{key}_vs_{against}"] = r["ratio"]
                row[f"{key}_vs_{against}_rounds"] = r["rounds"]
                row[f"{key}_vs_{against}_noisy"] = r["noisy"]


def run_bench(preset: str, attentions: list[str], heads: list[int], device: str, compile: bool,
              windows: int, steps: int, reference: bool = True, rounds: int = 3, log=print,
              show_progress: bool | None = None, attn_kernel: str = "auto", loss_chunk: int = 0,
              compile_scope: str = "model", compile_mode: str = "default", overrides: list[str] = ()) -> dict:
    """Every configuration timed `rounds` times, interleaved (the preset's model with `overrides`). `log` gets the
    plan and the result lines; a progress bar with an ETA goes to stderr when it is a terminal (`show_progress`:
    force it on/off)."""
    if show_progress is None:
        show_progress = sys.stderr.isatty()

    spec = bench_spec(preset, overrides)
    dev = bench_device(device)
    amp = dev.type == "cuda"
    allow_tf32(dev)
    name = device_name(dev)
    peak = device_peak_tflops(name) if amp else None
    load_before = os.getloadavg()
    torch._dynamo.reset()  # every compiled configuration from a cold start, none counted against the cache below
    entries = _entries(spec, attentions, heads, dev, compile, reference, attn_kernel, loss_chunk, compile_scope,
                       compile_mode)
    # Rounds interleave the configurations so that drift of the machine hits all of them alike;
    # each configuration's figure is the median over all its timed windows.
    # Odd rounds run the list backwards, so no configuration always runs first (or right after another).
    timings: dict[int, list] = {i: [] for i in range(len(entries))}
    per_config = 2 * (2 + windows) * steps  # training and forward-only: warm-up and timed windows
    log(f"plan: {len(entries)} configurations × {rounds} rounds = {len(entries) * rounds} timings of "
        f"{per_config} steps each (batch {spec['batch']} × {spec['model']['block_size']} tokens), interleaved")
    progress = tqdm(total=len(entries) * rounds, desc="bench", unit="timing", disable=not show_progress,
                    file=sys.stderr, dynamic_ncols=True)
    # Every model of one code (GPT.forward, or Block.forward and GPT._head with --compile-scope blocks) adds its
    # training and its no_grad graph to that code's one cache, whose limit (8) is 4 configurations: fullgraph
    # fails past it. Room for all of them, for this benchmark only.
    with torch._dynamo.config.patch(recompile_limit=max(8, 2 * len(entries) + 2)):
        for rnd in range(rounds):
            order = list(enumerate(entries))
            for i, (label, attention, h, cfg, model, loss_fn, _, _) in (order if rnd % 2 == 0 else order[::-1]):
                progress.set_postfix_str(f"round {rnd + 1}/{rounds}: "
                                         f"{attention if label == 'iattention' else label} h={h}")
                timings[i].append(time_model(model, loss_fn, cfg.vocab_size, spec["batch"], cfg.block_size, dev,
                                             windows, steps, amp=amp))
                progress.update()
    progress.close()
    rows = []
    for i, (label, attention, h, cfg, _, _, n_params, kernel) in enumerate(entries):
        ts = timings[i]
        train = [r for t in ts for r in t.train_window_tokens_per_s]
        merged = Timing(statistics.median(train), statistics.median([t.forward_tokens_per_s for t in ts]), train,
                        max((t.peak_memory_mb or 0) for t in ts) or None, ts[0].first_step_s)
        scope = None if not compile else compile_scope if label == "iattention" else "model"  # HF's: whole
        rows.append(_row(label, attention, h, cfg, merged, n_params, peak, kernel, scope))
        log(f"{label:<13} {attention:<11} h={h:<3} {kernel:<6} train {merged.train_tokens_per_s:>10,.0f} tok/s   "
            f"forward {merged.forward_tokens_per_s:>10,.0f} tok/s   first step {merged.first_step_s:.1f} s")
    _add_ratios(rows, timings)
    return dict(preset=preset, overrides=list(overrides), shape=spec, attn_kernel_setting=attn_kernel,
                loss_chunk=loss_chunk, device=device, device_name=name, compile=compile, amp_bf16=amp,
                compile_scope=compile_scope if compile else None, compile_mode=compile_mode if compile else None,
                loadavg_before=load_before, loadavg_after=os.getloadavg(), noise_threshold=NOISE_SPREAD,
                torch=torch.__version__, python=sys.version.split()[0], threads=torch.get_num_threads(),
                peak_bf16_tflops=peak, windows=windows, steps_per_window=steps, rounds=rounds,
                date=datetime.date.today().isoformat(), command=" ".join(["iattn", *sys.argv[1:]]) if
                sys.argv[1:2] == ["bench"] else "iattn bench", rows=rows)
