"""Generation speed: new tokens/s with the full KV cache, the K-only cache (keys alone, half the bytes), without
a cache, and Hugging Face `generate`.

Greedy decoding of batch 1 from a random prompt; prompt + new tokens stay within block_size so the
cache is used throughout. The HF reference is the same model exported with `to_hf` (same weights,
same shape), decoded by `GPT2LMHeadModel.generate(do_sample=False, use_cache=True)`. Every
configuration is timed once per round, rounds interleave them, and the median is reported.
"""

from __future__ import annotations

import statistics
import time

import torch

from iattention.bench.runner import bench_device, bench_model, sync
from iattention.errors import UserError
from iattention.interop.hf import to_hf
from iattention.kernels import prepare as prepare_kernel
from iattention.model.gpt import GPT


def _time(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


@torch.no_grad()
def _cache_bytes(model, kind: str | None, prompt: torch.Tensor) -> int | None:
    """Bytes per token a cache of this kind holds (batch 1, all layers), read off one filled with the prompt."""
    if kind is None:
        return None
    cache = model.make_cache(kind)
    model(prompt, cache=cache)
    return cache.nbytes() // cache.length


@torch.no_grad()
def generation_bench(preset: str, attentions: list[str], heads: list[int], new_tokens: int, prompt_len: int = 16,
                     rounds: int = 3, reference: bool = True, log=print, device: str = "cpu",
                     attn_kernel: str = "auto", overrides: list[str] = ()) -> list[dict]:
    """Rows of new tokens/s on `device`; our models run `attn_kernel` (model.attn_kernel) in their
    full-sequence passes (the prompt, and every step without a cache; cached steps run SDPA), and each row
    records the kernel that choice gave (HF: sdpa)."""
    shape = bench_model(preset, overrides)
    if prompt_len + new_tokens > shape.block_size:
        raise UserError(f"prompt {prompt_len} + {new_tokens} new tokens exceed block_size {shape.block_size}; "
                        f"ask for at most {shape.block_size - prompt_len} with --generate")
    dev = bench_device(device)
    shape = shape.replace(dropout=0.0, attn_kernel=attn_kernel)  # decoding is in eval mode: no dropout
    kernels = {h: prepare_kernel(attn_kernel, dev.type, shape.replace(n_head=h).d_head) for h in heads}
    prompt = torch.randint(0, shape.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0)).to(dev)
    jobs = []  # (row, callable)
    for h in heads:
        for attention in attentions:
            torch.manual_seed(0)
            model = GPT(shape.replace(n_head=h, attention=attention)).to(dev).eval()
            c = shape.replace(n_head=h)
            square = c.n_kv_head * c.d_head == c.n_embd  # where a K-only cache exists
            for kind in ("full", "k-only", None) if square else ("full", None):  # None: no cache; k-only: keys alone
                jobs.append((dict(model="iattention", attention=attention, n_head=h, attn_kernel=kernels[h],
                                  kv_cache=kind is not None, cache=kind or "none",
                                  cache_bytes_per_token=_cache_bytes(model, kind, prompt)),
                             lambda m=model, k=kind: m.generate(prompt, new_tokens, temperature=0,
                                                                use_cache=k is not None, cache_kind=k or "full")))
            if reference and attention == "standard":
                hf = to_hf(model).to(dev).eval()
                jobs.append((dict(model=f"hf-{shape.family}", attention="standard", n_head=h, attn_kernel="sdpa",
                                  kv_cache=True, cache="full"),
                             lambda hf=hf: hf.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                                       do_sample=False, use_cache=True, pad_token_id=0)))
    for _, fn in jobs:  # warm-up
        fn()
    times: list[list[float]] = [[] for _ in jobs]
    for _ in range(rounds):
        for i, (_, fn) in enumerate(jobs):
            times[i].append(_time(fn, dev))
    rows = []
    for (row, _), ts in zip(jobs, times):
        row = row | dict(new_tokens=new_tokens, prompt_tokens=prompt_len,
                         tokens_per_s=new_tokens / statistics.median(ts),
                         rounds_tokens_per_s=[new_tokens / t for t in ts])
        rows.append(row)
        log(f"{row['model']:<11} {row['attention']:<12} h={row['n_head']:<3} cache={row['cache']:<6} "
            f"{row['tokens_per_s']:8.1f} new tok/s")
    return rows
