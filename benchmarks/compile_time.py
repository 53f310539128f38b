"""What torch.compile costs before the first step, and what it gives after: train.compile_scope=model (the whole
model, one graph) against train.compile_scope=blocks (regional compilation, GPT.compile_regions), and eager for
reference. Each case in a fresh process with inductor's caches off (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1), as
on a machine that never compiled this model, which is what a GPU window is.

    python benchmarks/compile_time.py --out benchmarks/results/compile-time-cpu-<date>.json
        [--device cpu] [--preset paper] [--heads 12] [--attention standard,canonical] [--batch 1] [--tokens 64]
        [--scopes eager,model,blocks] [--mode default]

Per case: the first forward and backward's seconds (compiling included) and its loss (the same weights and
batch in every case of one variant, so the scopes can be compared), then the median training tokens/s (forward,
backward, AdamW; bench's time_model: warm-up, then timed windows), peak memory on CUDA. On CUDA the steps run
under bf16 autocast, as training does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def one(a) -> dict:
    import torch

    from iattention.bench.runner import bench_device, iattention_model, time_model
    from iattention.config import load_config
    from iattention.kernels import prepare

    dev = bench_device(a.device)
    cfg = load_config(a.preset, None, [f"model.n_head={a.heads}", f"model.attention={a.one}",
                                       f"model.block_size={a.tokens}", "model.dropout=0.0"]).model
    cfg = cfg.replace(vocab_size=cfg.vocab_size or 50257)  # GPT-2's where the preset's tokenizer leaves it open
    kernel = prepare(cfg.attn_kernel, dev.type, cfg.d_head, cfg.dropout, (a.batch, a.heads, a.tokens))
    torch.manual_seed(0)
    model, loss_fn = iattention_model(cfg, dev, compile=a.scope != "eager", compile_scope=a.scope,
                                      compile_mode=a.mode)
    x = torch.randint(0, cfg.vocab_size, (a.batch, a.tokens + 1), generator=torch.Generator().manual_seed(1)).to(dev)
    amp = dev.type == "cuda"
    # the first forward and backward: compiling included; its loss is of the same weights and batch in every case
    # of one variant, so the scopes can be compared
    t = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        loss = loss_fn(model, x[:, :-1], x[:, 1:])
    loss.backward()
    loss = loss.item()
    first = time.perf_counter() - t
    model.zero_grad(set_to_none=True)
    timing = time_model(model, loss_fn, cfg.vocab_size, a.batch, a.tokens, dev, windows=a.windows,
                        steps_per_window=a.steps, amp=amp)
    return dict(scope=a.scope, mode=a.mode if a.scope != "eager" else None, attention=a.one, n_head=a.heads,
                attn_kernel=kernel, batch=a.batch, T=a.tokens, first_forward_backward_s=round(first, 3),
                first_loss=loss, train_tokens_per_s=round(timing.train_tokens_per_s, 1),
                train_window_tokens_per_s=[round(r, 1) for r in timing.train_window_tokens_per_s],
                peak_memory_mb=timing.peak_memory_mb)


def _ours(path: Path) -> bool:
    """Whether `path` is a result this script wrote (safe to replace)."""
    from iattention.checkpoint.run_folder import read_json_object
    from iattention.errors import UserError

    try:
        return read_json_object(path, "a result", "", schema={"kind": (str,)})["kind"] == "compile-time"
    except UserError:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--preset", default="paper")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--attention", default="standard,canonical")
    p.add_argument("--scopes", default="eager,model,blocks")
    p.add_argument("--mode", default="default")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process: this variant
    p.add_argument("--scope", default="model", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one(a)))
        return
    if a.out and Path(a.out).exists() and not _ours(Path(a.out)):
        sys.exit(f"compile_time.py: {a.out} exists and is not this script's result; name another --out")
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    common = ["--device", a.device, "--preset", a.preset, "--heads", str(a.heads), "--mode", a.mode, "--batch",
              str(a.batch), "--tokens", str(a.tokens), "--windows", str(a.windows), "--steps", str(a.steps)]
    import torch

    from iattention.utils.atomic import write_json

    rows = []
    result = dict(kind="compile-time", date=datetime.date.today().isoformat(), torch=torch.__version__,
                  command=" ".join(["python", *sys.argv]), inductor_caches="off", cpu_threads=torch.get_num_threads(),
                  loadavg_before=os.getloadavg(), rows=rows)
    for attention in a.attention.split(","):
        for scope in a.scopes.split(","):
            done = subprocess.run([sys.executable, __file__, "--one", attention, "--scope", scope, *common],
                                  capture_output=True, text=True, env=env)
            if done.returncode:
                rows.append(dict(scope=scope, attention=attention, error=done.stderr.strip().splitlines()[-1:]))
            else:
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
            if a.out:  # after every case, so a run cut short keeps the cases it finished
                result["loadavg_after"] = os.getloadavg()
                Path(a.out).parent.mkdir(parents=True, exist_ok=True)
                write_json(a.out, result)
    if a.out:
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
