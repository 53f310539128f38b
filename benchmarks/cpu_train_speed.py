"""CPU training speed at the study shapes: eager vs torch.compile vs bf16 autocast, 1 vs 2 threads,
two runs sharing the cores, evaluation cost per epoch, and achieved GFLOP/s against this CPU's fp32
GEMM peak (issue 22 §1).

Every configuration runs in its own process (torch.compile and the thread count are per process), one
after another, and the whole list is repeated `--rounds` times in alternating order, so that drift of
the machine hits every configuration alike; a ratio is taken within a round and the median over rounds
is reported with its [min, max]. Compile time (the first steps of a compiled model) is reported apart
from the steady-state step time. Steps are the trainer's own (forward, backward, clip, AdamW) on
random tokens of the preset's shape (the preset's batch of 32 windows, its vocabulary).

Usage: python benchmarks/cpu_train_speed.py [--rounds 2] [--json benchmarks/results/cpu-train-speed-DATE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

SHAPES = ("cpu-study", "cpu-regime")
MODES = ("eager", "compile", "bf16")  # bf16: autocast to bfloat16 on CPU (AMX here), eager


def _model(preset: str, heads: int):
    import torch

    from iattention.config import load_config, model_preset
    from iattention.model.gpt import GPT

    cfg = model_preset(preset, n_head=heads)
    batch = load_config(preset).train.batch_size
    torch.manual_seed(0)
    return GPT(cfg), cfg, batch


def child(preset: str, mode: str, threads: int, heads: int, windows: int, steps: int) -> dict:
    """One configuration, in this process: compile/warm-up time, then `windows` timed windows."""
    import torch
    import torch.nn.functional as F  # noqa: F401  (imported for the compiled graph's sake)

    from iattention.bench.flops import executed_flops_per_token
    from iattention.config import OptimConfig
    from iattention.train.optim import build_optimizer

    torch.set_num_threads(threads)
    model, cfg, batch = _model(preset, heads)
    opt = build_optimizer(model, OptimConfig(lr=1e-4), "cpu")
    fn = torch.compile(model) if mode == "compile" else model
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if mode == "bf16" else nullcontext
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size + 1), generator=g)

    def step():
        with amp():
            _, loss = fn(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t = time.perf_counter()
    step()
    step()
    warmup_s = time.perf_counter() - t
    times = []
    for _ in range(windows):
        t = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - t) / steps)
    step_s = statistics.median(times)
    tokens = batch * cfg.block_size
    flops = executed_flops_per_token(cfg) * tokens
    return dict(preset=preset, mode=mode, threads=threads, heads=heads, warmup_s=warmup_s, step_s=step_s,
                window_step_s=times, tokens_per_s=tokens / step_s, gflops=flops / step_s / 1e9)


def eval_cost(preset: str, heads: int, threads: int) -> dict:
    """Seconds for one epoch's validation (the preset's valid_tokens, eval batch) against one epoch's
    training steps, eager fp32, in this process."""
    import numpy as np
    import torch

    from iattention.config import load_config
    from iattention.train.distributed import setup
    from iattention.train.evaluate import split_nll

    torch.set_num_threads(threads)
    model, cfg, batch = _model(preset, heads)
    run = load_config(preset)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, run.data.valid_tokens, dtype=np.int64)
    ctx = setup("cpu")
    split_nll(model, tokens[: 20 * cfg.block_size], cfg.block_size, run.train.eval_batch_size, ctx)  # warm-up
    t = time.perf_counter()
    split_nll(model, tokens, cfg.block_size, run.train.eval_batch_size, ctx)
    eval_s = time.perf_counter() - t
    steps_per_epoch = (run.data.train_tokens // (cfg.block_size + 1)) // batch
    return dict(preset=preset, threads=threads, valid_tokens=run.data.valid_tokens, eval_s=eval_s,
                steps_per_epoch=steps_per_epoch)


def gemm_peak(threads: int, n: int = 2048) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    t = time.perf_counter()
    reps = 10
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def _spawn(args: list[str], threads: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, env=env)


def _run(args: list[str], threads: int) -> dict:
    p = _spawn(args, threads)
    out, _ = p.communicate()
    if p.returncode:
        raise SystemExit(f"child {args} failed ({p.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def shared_cores(preset: str, heads: int, windows: int, steps: int) -> dict:
    """Two training processes at once, each with 1 thread and each with 2 threads (oversubscribed),
    against one process with 2 threads alone: total tokens/s of the machine."""
    out = {}
    for threads in (1, 2):
        procs = [_spawn(["--child", preset, "eager", str(threads), str(heads), str(windows), str(steps)], threads)
                 for _ in range(2)]
        res = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        out[f"two_runs_{threads}_thread_each_tokens_per_s"] = sum(r["tokens_per_s"] for r in res)
    alone = _run(["--child", preset, "eager", "2", str(heads), str(windows), str(steps)], 2)
    out["one_run_2_threads_tokens_per_s"] = alone["tokens_per_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--heads", type=int, default=1, help="heads of the timed model (default 1, the paper's headline)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=6, metavar=("PRESET", "MODE", "THREADS", "HEADS", "WINDOWS", "STEPS"))
    ap.add_argument("--eval-child", nargs=3, metavar=("PRESET", "HEADS", "THREADS"))
    ap.add_argument("--gemm-child", type=int, metavar="THREADS")
    a = ap.parse_args()
    if a.child:
        p, m, th, h, w, s = a.child
        print(json.dumps(child(p, m, int(th), int(h), int(w), int(s))))
        return
    if a.eval_child:
        p, h, th = a.eval_child
        print(json.dumps(eval_cost(p, int(h), int(th))))
        return
    if a.gemm_child:
        print(json.dumps({"gflops": gemm_peak(a.gemm_child)}))
        return
    import torch

    from iattention.utils.hardware import cpu_name

    load = os.getloadavg()
    configs = [(p, m, th) for p in SHAPES for m in MODES for th in (1, 2)]
    rounds = []
    for r in range(a.rounds):
        order = configs if r % 2 == 0 else configs[::-1]
        res = {}
        for p, m, th in order:
            res[(p, m, th)] = _run(["--child", p, m, str(th), str(a.heads), str(a.windows), str(a.steps)], th)
            x = res[(p, m, th)]
            print(f"round {r}: {p:<10} {m:<8} {th} thr  step {x['step_s'] * 1e3:7.1f} ms  "
                  f"{x['tokens_per_s']:8,.0f} tok/s  {x['gflops']:6.1f} GFLOP/s  warm-up {x['warmup_s']:.1f} s",
                  flush=True)
        rounds.append(res)
    peak = {th: _run(["--gemm-child", str(th)], th)["gflops"] for th in (1, 2)}
    evals = {(p, th): _run(["--eval-child", p, str(a.heads), str(th)], th) for p in SHAPES for th in (1, 2)}
    shared = {p: shared_cores(p, a.heads, a.windows, a.steps) for p in SHAPES}
    rows = []
    for p, m, th in configs:
        per = [rd[(p, m, th)] for rd in rounds]
        ratio = [rd[(p, "eager", th)]["step_s"] / rd[(p, m, th)]["step_s"] for rd in rounds]
        thread_ratio = [rd[(p, m, 1)]["step_s"] / rd[(p, m, th)]["step_s"] for rd in rounds]
        rows.append(dict(preset=p, mode=m, threads=th, step_s=statistics.median(x["step_s"] for x in per),
                         tokens_per_s=statistics.median(x["tokens_per_s"] for x in per),
                         gflops=statistics.median(x["gflops"] for x in per),
                         warmup_s=statistics.median(x["warmup_s"] for x in per),
                         speedup_vs_eager=statistics.median(ratio), speedup_vs_eager_rounds=ratio,
                         speedup_vs_1_thread=statistics.median(thread_ratio),
                         fraction_of_fp32_gemm_peak=statistics.median(x["gflops"] for x in per) / peak[th]))
    result = dict(kind="cpu-train-speed", date=datetime.date.today().isoformat(), torch=torch.__version__,
                  cpu=cpu_name(), heads=a.heads, rounds=a.rounds, windows=a.windows, steps_per_window=a.steps,
                  loadavg_before=load, loadavg_after=os.getloadavg(), fp32_gemm_peak_gflops=peak,
                  eval={f"{p}/{th}": v for (p, th), v in evals.items()}, shared_cores=shared, rows=rows,
                  command=" ".join(["python", *sys.argv]))
    out = Path(a.json or f"benchmarks/results/cpu-train-speed-{datetime.date.today().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out)
    print(markdown(result))
    print(f"wrote {out}")


def markdown(r: dict) -> str:
    lines = ["| preset | mode | threads | step (ms) | tok/s | × eager [min, max] | × 1 thread | GFLOP/s | "
             "of fp32 GEMM peak | first 2 steps (s) |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for x in r["rows"]:
        rr = x["speedup_vs_eager_rounds"]
        lines.append(f"| {x['preset']} | {x['mode']} | {x['threads']} | {x['step_s'] * 1e3:.0f} | "
                     f"{x['tokens_per_s']:,.0f} | {x['speedup_vs_eager']:.2f} [{min(rr):.2f}, {max(rr):.2f}] | "
                     f"{x['speedup_vs_1_thread']:.2f} | {x['gflops']:.0f} | {x['fraction_of_fp32_gemm_peak']:.0%} | "
                     f"{x['warmup_s']:.1f} |")
    peak = r["fp32_gemm_peak_gflops"]
    lines += ["", f"fp32 GEMM peak (2048² matmul): {float(peak[1] if 1 in peak else peak['1']):.0f} GFLOP/s on 1 "
              f"thread, {float(peak[2] if 2 in peak else peak['2']):.0f} on 2.", "",
              "| preset | threads | one epoch's validation (s) | one epoch's training, eager (s) | validation share |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for key, e in r["eval"].items():
        p, th = key.split("/")
        row = next(x for x in r["rows"] if x["preset"] == p and x["mode"] == "eager" and x["threads"] == int(th))
        train_s = row["step_s"] * e["steps_per_epoch"]
        share = e["eval_s"] / (e["eval_s"] + train_s)
        lines.append(f"| {p} | {th} | {e['eval_s']:.1f} | {train_s:.1f} | {share:.0%} |")
    lines += ["", "| preset | two runs, 1 thread each (tok/s, both) | two runs, 2 threads each | one run, 2 threads |",
              "| --- | ---: | ---: | ---: |"]
    for p, s in r["shared_cores"].items():
        lines.append(f"| {p} | {s['two_runs_1_thread_each_tokens_per_s']:,.0f} | "
                     f"{s['two_runs_2_thread_each_tokens_per_s']:,.0f} | {s['one_run_2_threads_tokens_per_s']:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
