"""How training cost grows with the block size and with the number of heads, standard vs canonical, at
the cpu-regime width (4 layers, d = 256, vocabulary 4,096), beside the FLOP model's prediction
(issue 34 §2).

Every configuration runs in its own process (so its peak memory is its own), one after another; the
whole list is repeated `--rounds` times in alternating order so that drift of the machine hits every
configuration alike, and each figure is the median over rounds. A step is `iattn bench`'s
(`bench.runner.time_model`: forward, backward, AdamW) on random tokens; every configuration sees the same
4,096 tokens per step (batch = 4096 / block size), so tokens/s compare per token.

Peak memory on CPU: PyTorch keeps no allocator statistics for the CPU, so the figure is the process's
peak resident set (`ru_maxrss`) after the timed steps minus its resident set once the model, optimizer
and batch exist: what training adds (gradients, AdamW's two moments, activations kept for backward,
temporaries), not the interpreter and the weights.

Prediction: the FLOP model (`bench/flops.py: executed_flops_per_token`, training = 3 × forward, full
T × T attention) calibrated at one point, standard at 1 head and block 128: predicted tokens/s of a
configuration = that point's measured tokens/s × its FLOPs per token / the configuration's.

Usage: python benchmarks/cost_growth.py [--rounds 2] [--threads 1] [--json benchmarks/results/cpu-cost-growth-DATE.json]
       [--figure benchmarks/results/cpu-cost-growth-DATE.png]
Run it on an idle machine (it reads the load average before and after and stores them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

WIDTH = dict(n_layer=4, n_embd=256, vocab_size=4096, dropout=0.0)  # cpu-regime's model (presets/cpu-regime.yaml)
TOKENS_PER_STEP = 4096  # cpu-regime's 32 x 128
VARIANTS = ("standard", "canonical")
BLOCKS = (128, 256, 512, 1024)
BLOCK_HEADS = (1, 4)  # the block-size sweep at these head counts
HEADS = (1, 2, 4, 8)  # the head sweep at block 128
REFERENCE = ("standard", 1, 128)


def configs() -> list[tuple[str, int, int]]:
    """(variant, heads, block) of every point, each once."""
    points = {(v, h, t) for v in VARIANTS for h in BLOCK_HEADS for t in BLOCKS}
    points |= {(v, h, 128) for v in VARIANTS for h in HEADS}
    return sorted(points, key=lambda p: (p[2], p[1], VARIANTS.index(p[0])))


def child(variant: str, heads: int, block: int, threads: int, windows: int, steps: int) -> dict:
    import torch

    from iattention.bench.flops import executed_flops_per_token
    from iattention.bench.runner import time_model
    from iattention.config import GPTConfig
    from iattention.model.gpt import GPT

    torch.set_num_threads(threads)
    cfg = GPTConfig(attention=variant, n_head=heads, block_size=block, **WIDTH)
    torch.manual_seed(0)
    model = GPT(cfg)
    batch = TOKENS_PER_STEP // block

    def loss_fn(m, x, y):
        return m(x, y)[1]

    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    timing = time_model(model, loss_fn, cfg.vocab_size, batch, block, torch.device("cpu"), windows, steps)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(variant=variant, heads=heads, block=block, batch=batch, threads=threads,
                train_tokens_per_s=timing.train_tokens_per_s, forward_tokens_per_s=timing.forward_tokens_per_s,
                train_window_tokens_per_s=timing.train_window_tokens_per_s,
                peak_train_memory_mb=(peak_kb - base_kb) / 1024, baseline_rss_mb=base_kb / 1024,
                executed_flops_per_token=executed_flops_per_token(cfg), params=model.num_params())


def _run(args: list[str], threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    if p.returncode:
        raise SystemExit(f"child {args} failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def summarize(rounds: list[dict]) -> list[dict]:
    """Median over rounds per point, with the FLOP model's prediction calibrated at REFERENCE."""
    rows = []
    for key in rounds[0]:
        per = [rd[key] for rd in rounds]
        row = dict(per[0])
        for k in ("train_tokens_per_s", "forward_tokens_per_s", "peak_train_memory_mb"):
            row[k] = statistics.median(x[k] for x in per)
            row[k + "_rounds"] = [x[k] for x in per]
        row.pop("train_window_tokens_per_s", None)
        rows.append(row)
    ref = next(r for r in rows if (r["variant"], r["heads"], r["block"]) == REFERENCE)
    for r in rows:
        flops = r["executed_flops_per_token"]
        r["predicted_tokens_per_s"] = ref["train_tokens_per_s"] * ref["executed_flops_per_token"] / flops
        r["measured_over_predicted"] = r["train_tokens_per_s"] / r["predicted_tokens_per_s"]
        same = next(s for s in rows
                    if s["variant"] == "standard" and (s["heads"], s["block"]) == (r["heads"], r["block"]))
        r["vs_standard"] = statistics.median(
            a / b for a, b in zip(r["train_tokens_per_s_rounds"], same["train_tokens_per_s_rounds"]))
        r["vs_standard_predicted"] = same["executed_flops_per_token"] / r["executed_flops_per_token"]
    return rows


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib  # heavy: only when a figure is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    colors = {"standard": "tab:blue", "canonical": "tab:orange"}
    for col, (xkey, fixed, xs, label) in enumerate(
            [("block", [("heads", h) for h in BLOCK_HEADS], BLOCKS, "block size T (tokens)"),
             ("heads", [("block", 128)], HEADS, "heads (block 128)")]):
        for fkey, fval in fixed:
            style = "-" if (fkey, fval) in (("heads", 1), ("block", 128)) else "--"
            for v in VARIANTS:
                pts = sorted((r for r in rows if r["variant"] == v and r[fkey] == fval and r[xkey] in xs),
                             key=lambda r: r[xkey])
                x = [r[xkey] for r in pts]
                tag = f"{v}" + (f", {fval} head{'s' if fval > 1 else ''}" if fkey == "heads" else "")
                axes[0, col].plot(x, [r["train_tokens_per_s"] for r in pts], style, marker="o", color=colors[v],
                                  label=f"{tag}: measured")
                axes[0, col].plot(x, [r["predicted_tokens_per_s"] for r in pts], style, marker="x", alpha=0.45,
                                  color=colors[v], label=f"{tag}: FLOP model")
                axes[1, col].plot(x, [r["peak_train_memory_mb"] for r in pts], style, marker="o", color=colors[v],
                                  label=tag)
        for row in (0, 1):
            axes[row, col].set_xscale("log", base=2)
            axes[row, col].set_xticks(list(xs), [str(x) for x in xs])
            axes[row, col].set_xlabel(label)
            axes[row, col].grid(alpha=0.3)
            axes[row, col].set_ylim(bottom=0)
        axes[0, col].set_ylabel("training tokens/s")
        axes[1, col].set_ylabel("peak memory added by training (MB)")
        axes[0, col].legend(fontsize=7)
        axes[1, col].legend(fontsize=7)
    fig.suptitle("cpu-regime width (4 layers, d = 256), 4,096 tokens per step: cost as T and heads grow")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(res: dict) -> str:
    lines = [
        "| variant | heads | block | batch | train tok/s | FLOP model tok/s | measured / model | × standard "
        "(model) | peak MB added |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in res["rows"]:
        lines.append(
            f"| {r['variant']} | {r['heads']} | {r['block']} | {r['batch']} | {r['train_tokens_per_s']:,.0f} | "
            f"{r['predicted_tokens_per_s']:,.0f} | {r['measured_over_predicted']:.2f} | "
            f"{r['vs_standard']:.3f} ({r['vs_standard_predicted']:.3f}) | {r['peak_train_memory_mb']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--figure", default=None)
    ap.add_argument("--child", nargs=6, metavar=("VARIANT", "HEADS", "BLOCK", "THREADS", "WINDOWS", "STEPS"))
    a = ap.parse_args()
    if a.child:
        v, h, t, th, w, s = a.child
        print(json.dumps(child(v, int(h), int(t), int(th), int(w), int(s))))
        return
    from iattention.utils.hardware import cpu_name

    load = os.getloadavg()
    points = configs()
    rounds = []
    for rnd in range(a.rounds):
        res = {}
        for v, h, t in (points if rnd % 2 == 0 else points[::-1]):
            x = _run(["--child", v, str(h), str(t), str(a.threads), str(a.windows), str(a.steps)], a.threads)
            res[f"{v}-h{h}-T{t}"] = x
            print(f"round {rnd + 1}/{a.rounds}: {v:<10} h={h} T={t:<5} {x['train_tokens_per_s']:8,.0f} tok/s  "
                  f"+{x['peak_train_memory_mb']:6.0f} MB", flush=True)
        rounds.append(res)
    date = datetime.date.today().isoformat()
    out = dict(width=WIDTH, tokens_per_step=TOKENS_PER_STEP, threads=a.threads, windows=a.windows,
               steps_per_window=a.steps, rounds=a.rounds, cpu=cpu_name(), loadavg_before=load,
               loadavg_after=os.getloadavg(), reference=dict(zip(("variant", "heads", "block"), REFERENCE)),
               date=date, command="python benchmarks/cost_growth.py " + " ".join(sys.argv[1:]),
               rows=summarize(rounds))
    path = Path(a.json or f"benchmarks/results/cpu-cost-growth-{date}.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    if a.figure:
        figure(out["rows"], Path(a.figure))
    print(markdown(out))
    print(f"wrote {path}" + (f" and {a.figure}" if a.figure else ""))


if __name__ == "__main__":
    main()
