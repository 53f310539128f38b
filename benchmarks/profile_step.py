"""Where a training step's time goes, standard vs canonical: `torch.profiler` self CPU time per op over a
few steps (forward, backward, AdamW) of each variant at a preset's shape (issue 34 §1).

Both variants are built from the same seed and timed in this one process, one after the other, after two
warm-up steps each; the rows are the ops with the most self time in either, with their call counts.

Usage: python benchmarks/profile_step.py [--preset cpu-study] [--heads 1] [--threads 1] [--steps 4]
       [--json benchmarks/results/cpu-profile-PRESET-hH-DATE.json]
Run it on an idle machine: self times include time the process waited for a core.
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
from iattention.bench.runner import bench_spec
from iattention.config import GPTConfig
from iattention.model.gpt import GPT

VARIANTS = ("standard", "canonical")


def profile_variant(preset: str, attention: str, heads: int, steps: int) -> dict:
    spec = bench_spec(preset)
    cfg = GPTConfig(n_head=heads, **spec["model"]).replace(attention=attention)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (spec["batch"], cfg.block_size + 1), generator=g)

    def step():
        loss = model(x[:, :-1], x[:, 1:])[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    ops = {e.key: dict(self_ms=e.self_cpu_time_total / 1e3 / steps, calls=e.count // steps)
           for e in prof.key_averages()}
    return dict(attention=attention, executed_flops_per_token=executed_flops_per_token(cfg),
                tokens_per_step=spec["batch"] * cfg.block_size,
                self_ms_per_step=sum(o["self_ms"] for o in ops.values()), ops=ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-study")
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load = os.getloadavg()
    res = {v: profile_variant(a.preset, v, a.heads, a.steps) for v in VARIANTS}
    std, can = res["standard"], res["canonical"]
    keys = sorted(set(std["ops"]) | set(can["ops"]),
                  key=lambda k: -max(std["ops"].get(k, {}).get("self_ms", 0), can["ops"].get(k, {}).get("self_ms", 0)))
    date = datetime.date.today().isoformat()
    out = dict(preset=a.preset, heads=a.heads, threads=a.threads, steps=a.steps, loadavg_before=load,
               loadavg_after=os.getloadavg(), torch=torch.__version__, date=date,
               command="python benchmarks/profile_step.py " + " ".join(sys.argv[1:]),
               variants=res, top=keys[:a.top])
    path = Path(a.json or f"benchmarks/results/cpu-profile-{a.preset}-h{a.heads}-{date}.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{a.preset}, {a.heads} head(s), {a.threads} thread(s): self CPU per step standard "
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
