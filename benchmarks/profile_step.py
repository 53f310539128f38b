"""Where a training step's time goes, standard vs canonical: `torch.profiler` self time per op over a few
steps (forward, backward, AdamW) of each variant at a preset's shape (issue 34 §1; on CUDA issue 52 §3: each
kernel's self device time of a compiled bf16 step).

Both variants are built from the same seed and timed in this one process, one after the other, after two
warm-up steps each (compiling, with --compile); the rows are the ops with the most self time in either, with
their call counts. On CUDA: bf16 autocast and the trainer's AdamW (fused), as training runs.

Usage: python benchmarks/profile_step.py [--preset cpu-study] [--heads 1] [--threads 1] [--steps 4]
       [--device cpu|cuda] [--compile none|model|blocks] [--json benchmarks/results/DEVICE-profile-PRESET-hH-DATE.json]
Run it on an idle machine: self CPU times include time the process waited for a core.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from iattention.bench.flops import executed_flops_per_token
from iattention.bench.runner import bench_device, bench_spec, iattention_model, sync
from iattention.config import GPTConfig, OptimConfig
from iattention.kernels import prepare
from iattention.train.optim import build_optimizer

VARIANTS = ("standard", "canonical")


def profile_variant(preset: str, attention: str, heads: int, steps: int, device: str = "cpu",
                    compile: str = "none") -> dict:
    spec = bench_spec(preset)
    cfg = GPTConfig(n_head=heads, **spec["model"]).replace(attention=attention)
    dev = bench_device(device)
    kernel = prepare(cfg.attn_kernel, dev.type, cfg.d_head, cfg.dropout, (spec["batch"], heads, cfg.block_size))
    torch.manual_seed(0)
    model, loss_fn = iattention_model(cfg, dev, compile=compile != "none", compile_scope=compile)
    opt = build_optimizer(model, OptimConfig(lr=1e-4), dev.type)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (spec["batch"], cfg.block_size + 1), generator=g).to(dev)
    cuda = dev.type == "cuda"

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = loss_fn(model, x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    sync(dev)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync(dev)
    self_us = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    ops = {e.key: dict(self_ms=self_us(e) / 1e3 / steps, calls=e.count // steps)
           for e in prof.key_averages() if self_us(e) > 0}
    return dict(attention=attention, attn_kernel=kernel, executed_flops_per_token=executed_flops_per_token(cfg),
                tokens_per_step=spec["batch"] * cfg.block_size,
                self_ms_per_step=sum(o["self_ms"] for o in ops.values()), ops=ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-study")
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--compile", default="none", choices=("none", "model", "blocks"),
                    help="torch.compile the model: whole, or its regions (train.compile_scope)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load = os.getloadavg()
    res = {v: profile_variant(a.preset, v, a.heads, a.steps, a.device, a.compile) for v in VARIANTS}
    std, can = res["standard"], res["canonical"]
    keys = sorted(set(std["ops"]) | set(can["ops"]),
                  key=lambda k: -max(std["ops"].get(k, {}).get("self_ms", 0), can["ops"].get(k, {}).get("self_ms", 0)))
    date = datetime.date.today().isoformat()
    out = dict(preset=a.preset, heads=a.heads, threads=a.threads, steps=a.steps, device=a.device,
               compile=a.compile, self_time="device" if a.device == "cuda" else "cpu", loadavg_before=load,
               loadavg_after=os.getloadavg(), torch=torch.__version__, date=date,
               command="python benchmarks/profile_step.py " + " ".join(sys.argv[1:]),
               variants=res, top=keys[:a.top])
    path = Path(a.json or f"benchmarks/results/{a.device}-profile-{a.preset}-h{a.heads}-{date}.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{a.preset}, {a.heads} head(s), {a.device}, compile {a.compile}: self "
          f"{'device' if a.device == 'cuda' else 'CPU'} time per step standard "
          f"{std['self_ms_per_step']:.0f} ms, canonical {can['self_ms_per_step']:.0f} ms "
          f"(standard / canonical {std['self_ms_per_step'] / can['self_ms_per_step']:.3f}; FLOP model "
          f"{std['executed_flops_per_token'] / can['executed_flops_per_token']:.3f})")
    print("| op | standard ms/step (calls) | canonical ms/step (calls) |")
    print("| --- | ---: | ---: |")
    for k in keys[:a.top]:
        s, c = std["ops"].get(k, dict(self_ms=0, calls=0)), can["ops"].get(k, dict(self_ms=0, calls=0))
        print(f"| `{k}` | {s['self_ms']:.1f} ({s['calls']}) | {c['self_ms']:.1f} ({c['calls']}) |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
