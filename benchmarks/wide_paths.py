"""Milliseconds of one causal attention forward + backward (bf16) on three paths, per head dim, heads and T
(issue 52 §1): SDPA (and which of its backends torch picks for the shape), the math path compiled
(kernels/math_path.py under torch.compile), and the Triton wide-head kernel (kernels/wide_attention.py, its
torch op). A step's tokens stay fixed (--tokens, default 16 x 1024: B = tokens / T). Each path's output is
checked against SDPA's (relative error recorded) and a path that fails (out of memory, out of shared memory,
a compile error) is recorded with its error and a null time, never dropped.

    python benchmarks/wide_paths.py                              # on a GPU: every row, writes
                                                                 # benchmarks/results/cuda-wide-paths-<date>.json
    python benchmarks/wide_paths.py --T 1024 --out DIR/x.json    # the T = 1024 rows (benchmarks/gpu_check.sh)
    python benchmarks/wide_paths.py --dry --out /tmp/x.json      # on CPU: tiny shapes, float32, proves it runs
    python benchmarks/wide_paths.py --table benchmarks/results/cuda-wide-paths-<date>.json [MORE.json ...]
        # copies those committed results' rows into model.attn_kernel=auto's table
        # (src/iattention/kernels/auto_table.json), under the device's name; each file a whole run (one GPU
        # window can measure a head dim's 9 rows: --dims 768), all from one device

Timing: CUDA events around `--reps` calls after `--warmup` calls, the median of `--rounds` such windows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from iattention.checkpoint.run_folder import read_json_object
from iattention.errors import UserError
from iattention.kernels import TRITON_INSTALLED, interpreter_on, load_kernel
from iattention.kernels.auto import PATHS, TABLE_PATH, load_table
from iattention.kernels.math_path import math_causal_attention


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_choice(q) -> str:
    """The backend SDPA dispatches a causal call of q's shape and dtype to."""
    from torch.nn.attention import SDPBackend

    try:
        return SDPBackend(torch._fused_sdp_choice(q, q, q, is_causal=True)).name
    except Exception as e:  # noqa: BLE001 -- recorded, not fatal
        return f"unknown ({type(e).__name__}: {str(e).splitlines()[0][:120]})"


def path_functions(device: str, compile: bool) -> dict:
    """The paths of one row. The math path is compiled afresh for each row's shape (static shapes, as a model's
    training step compiles): one compiled function across rows would turn dynamic after the second shape and
    fall back to eager past dynamo's recompile limit."""
    if compile:
        torch._dynamo.reset()
    fns = {"sdpa": sdpa,
           "math": torch.compile(math_causal_attention, dynamic=False) if compile else math_causal_attention}
    if TRITON_INSTALLED and (device == "cuda" or interpreter_on()):
        fns["triton"] = lambda q, k, v: load_kernel().wide_attention(q, k, v)
    return fns


def timed(fn, q, k, v, grad, warmup: int, reps: int, rounds: int, device: str) -> list[float]:
    """Milliseconds per forward + backward, one figure per round."""
    def step():
        out = fn(q, k, v)
        torch.autograd.grad(out, (q, k, v), grad)

    for _ in range(warmup):
        step()
    figures = []
    for _ in range(rounds):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                step()
            end.record()
            torch.cuda.synchronize()
            figures.append(start.elapsed_time(end) / reps)
        else:
            t = time.perf_counter()
            for _ in range(reps):
                step()
            figures.append((time.perf_counter() - t) * 1e3 / reps)
    return figures


def measure_row(fns: dict, d: int, H: int, T: int, B: int, dtype, device: str, a) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, T, H, d, device=device, dtype=dtype, generator=g).transpose(1, 2).requires_grad_()
               for _ in range(3))  # the model's layout: (B, T, H, d) memory seen as (B, H, T, d)
    grad = torch.randn(B, H, T, d, device=device, dtype=dtype, generator=g)
    row = dict(d=d, H=H, T=T, B=B, sdpa_backend=sdpa_choice(q), ms={}, rounds_ms={}, rel_err_vs_sdpa={},
               peak_mb={}, errors={})
    with torch.no_grad():
        ref = sdpa(q, k, v).float()
    for name, fn in fns.items():
        try:
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                out = fn(q, k, v).float()
            row["rel_err_vs_sdpa"][name] = ((out - ref).norm() / ref.norm()).item()
            figures = timed(fn, q, k, v, grad, a.warmup, a.reps, a.rounds, device)
            row["ms"][name], row["rounds_ms"][name] = statistics.median(figures), figures
            if device == "cuda":
                row["peak_mb"][name] = torch.cuda.max_memory_allocated() / 2**20
        except Exception as e:  # noqa: BLE001 -- a failing path is a result (OOM, shared memory, compile)
            row["ms"][name] = None
            row["errors"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}" if str(e) else type(e).__name__
    return row


def write_table(result_paths: list[str]) -> None:
    """Copy committed results' rows into auto's table under their device's name: each a whole CUDA run, all from
    one device; a file's row replaces the table's (or an earlier file's) row of the same shape, and the device's
    other rows stay (one GPU window measures one head dim: `--table d768.json`, later `--table d512.json`)."""
    results = [json.loads(Path(path).read_text()) for path in result_paths]
    for path, result in zip(result_paths, results):
        if result.get("dry") or result.get("device_type") != "cuda":
            sys.exit(f"{path} is not a CUDA measurement (dry run or CPU): auto's table takes GPU rows only")
        if not result.get("complete", True):
            sys.exit(f"{path} was cut after {len(result['rows'])} of its {result['rows_planned']} rows: auto's "
                     "table takes whole runs only (run wide_paths.py again in a longer window, or fewer --dims)")
    devices = sorted({r["device"] for r in results})
    if len(devices) != 1:
        sys.exit(f"the results are from {len(devices)} devices ({', '.join(devices)}): give one device's files")
    table = load_table(TABLE_PATH)
    rows = {(r["d"], r["H"], r["T"]): r for r in table["devices"].get(devices[0], [])}
    rows.update({(r["d"], r["H"], r["T"]): dict(d=r["d"], H=r["H"], T=r["T"], B=r["B"],
                                                ms={p: r["ms"].get(p) for p in PATHS})
                 for result in results for r in result["rows"]})
    table["devices"][devices[0]] = [rows[key] for key in sorted(rows)]
    table["source"] = sorted({*([table["source"]] if isinstance(table["source"], str) else table["source"] or []),
                              *map(str, result_paths)})
    TABLE_PATH.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE_PATH}: {len(rows)} rows for {devices[0]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=ints, default=[256, 512, 768])
    p.add_argument("--heads", type=ints, default=[1, 2, 3])
    p.add_argument("--T", type=ints, default=[1024, 2048, 4096])
    p.add_argument("--tokens", type=int, default=16 * 1024, help="tokens per step: B = tokens / T")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-compile", action="store_true", help="the math path eager (default: torch.compile)")
    p.add_argument("--dry", action="store_true", help="CPU, float32, tiny shapes: proves the script runs")
    p.add_argument("--out", default=None)
    p.add_argument("--table", metavar="RESULT.json", nargs="+",
                   help="write auto's table from committed results (whole runs, one device) and exit")
    a = p.parse_args()
    if a.table:
        return write_table(a.table)
    if a.dry:
        device, dtype = "cpu", torch.float32
        a.dims, a.heads, a.T, a.tokens, a.warmup, a.reps, a.rounds = [32, 64], [1, 2], [16], 32, 1, 2, 1
    elif torch.cuda.is_available():
        device, dtype = "cuda", torch.bfloat16
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        sys.exit("no CUDA device: these timings are for a GPU (use --dry to check the script on CPU)")
    out = Path(a.out or f"benchmarks/results/{device}-wide-paths-{datetime.date.today()}.json")
    if out.exists() and not _ours(out, "rows_planned"):
        sys.exit(f"{out} exists and is not a wide_paths.py result: give --out a new file")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    result = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", device_type=device,
                  dtype=str(dtype).removeprefix("torch."), dry=a.dry, compile_math=not a.no_compile,
                  torch=torch.__version__, triton=_triton_version(), date=datetime.date.today().isoformat(),
                  command=" ".join(["python", *sys.argv]), tokens=a.tokens, warmup=a.warmup, reps=a.reps,
                  rounds=a.rounds, rows_planned=len(a.dims) * len(a.heads) * len(a.T), complete=False, rows=rows)
    for d in a.dims:
        for H in a.heads:
            for T in a.T:
                fns = path_functions(device, not a.no_compile)
                row = measure_row(fns, d, H, T, max(1, a.tokens // T), dtype, device, a)
                rows.append(row)
                times = "  ".join(f"{n} {'failed' if ms is None else f'{ms:8.3f} ms'}" for n, ms in row["ms"].items())
                print(f"d={d:<4} H={H} T={T:<5} B={row['B']:<3} sdpa->{row['sdpa_backend']:<20} {times}", flush=True)
                _write(out, result)  # after every row: a GPU window that ends mid-run keeps the rows it measured
    result["complete"] = True
    _write(out, result)
    print(f"wrote {out}")


def _ours(path: Path, key: str) -> bool:
    """Whether `path` is a JSON object holding `key` (a file this script wrote, safe to replace)."""
    try:
        return bool(read_json_object(path, "a result", "", schema={key: (int,)}))
    except UserError:
        return False


def _write(out: Path, result: dict) -> None:
    """Whole or not at all: a temporary file beside `out`, renamed over it."""
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out)


def _triton_version() -> str | None:
    if not TRITON_INSTALLED:
        return None
    import triton

    return triton.__version__


if __name__ == "__main__":
    main()
