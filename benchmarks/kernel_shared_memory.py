"""Shared memory the wide-head Triton kernels need, as the compiler reports it, without a GPU (issue 52 §2).

Triton compiles for a named GPU target on any machine (`triton.compile(..., target=GPUTarget("cuda", 90, 32))`
runs its whole pipeline to PTX and cubin with the ptxas it ships); the compiled kernel's `metadata.shared` is
the figure a launch checks against the device's limit ("out of resource: shared memory, Required: ..."). This
script compiles each kernel of `iattention.kernels.wide_attention` for the listed configs, head dims, dtypes and
targets and writes one JSON file: per row, the compiler's bytes and `shared_memory_need`'s model. The unit tests
(tests/unit/kernels/test_wide_op.py) read the committed file: the model is a lower bound of every row (so
pruning by it never drops a config that fits), the single-stage safe config of each kernel fits an A100 at head
dim 1024, and the file was made from today's kernel source (else: run this again).

    python benchmarks/kernel_shared_memory.py                   # writes benchmarks/results/kernel-shared-memory.json
    python benchmarks/kernel_shared_memory.py --remodel          # only the rows' `model` again, from today's
                                                                 # shared_memory_need (same kernel source only)
    PYTHONPATH=/path/to/triton-3.6 python benchmarks/kernel_shared_memory.py   # the GPU image's Triton version

Minutes per row on a CPU at head dim 1024 (the kernels unroll the head dim in 64-column chunks); --jobs runs
rows in parallel processes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "kernel-shared-memory.json"
TARGETS = {"sm_90": 90, "sm_80": 80}


def compile_row(row: dict) -> dict:
    """Compile one kernel for one config, head dim, dtype and target; the row with `shared` (bytes) or `error`."""
    import triton
    from triton.backends.compiler import GPUTarget

    from iattention.kernels import load_kernel

    src = load_kernel().ast_source(row["kind"], row["dtype"], dict(D=row["D"], **row["tiles"]))
    t = time.perf_counter()
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", TARGETS[row["target"]], 32),
                                  options=dict(num_warps=row["num_warps"], num_stages=row["num_stages"]))
        row["shared"] = int(compiled.metadata.shared)
    except Exception as e:  # noqa: BLE001 -- a config the compiler refuses is a result
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    row["seconds"] = round(time.perf_counter() - t, 1)
    return row


def _ours(path: Path) -> bool:
    """Whether `path` is a result this script wrote (safe to replace)."""
    from iattention.checkpoint.run_folder import read_json_object
    from iattention.errors import UserError

    try:
        return bool(read_json_object(path, "a result", "", schema={"kernel_source_sha256": (str,)}))
    except UserError:
        return False


def planned_rows(dims: list[int], dtypes: list[str], targets: list[str], safe_only: bool) -> list[dict]:
    from iattention.kernels import load_kernel

    wa = load_kernel()
    rows = []
    for kind in wa.KINDS:
        configs = wa._configs(kind)
        for i, c in enumerate(configs):
            safe = i == len(configs) - 1
            if safe_only and not safe:
                continue
            for target in targets:
                for D in dims:
                    for dtype in dtypes:
                        row = dict(kind=kind, target=target, D=D, dtype=dtype, tiles=dict(c.kwargs),
                                   num_warps=c.num_warps, num_stages=c.num_stages, safe=safe)
                        rows.append(row | dict(model=model_of(wa, row)))
    return rows


def model_of(wa, row: dict) -> int:
    """shared_memory_need's figure for a row of this file."""
    return wa.shared_memory_need(row["kind"], row["D"], 4 if row["dtype"] == "fp32" else 2, row["tiles"],
                                 row["num_stages"])


def remodel(out: Path) -> None:
    """Each row's `model` from today's shared_memory_need; the compiled figures are kept, so only for the kernel
    source they were compiled from."""
    from iattention.kernels import load_kernel

    wa = load_kernel()
    result = json.loads(out.read_text())
    if result["kernel_source_sha256"] != wa.kernel_source_hash():
        sys.exit(f"{out} was compiled from other kernel source: run this script without --remodel")
    for row in result["rows"]:
        row["model"] = model_of(wa, row)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out)
    print(f"{out}: the model of {len(result['rows'])} rows recomputed")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--remodel", action="store_true",
                   help="recompute each row's model in --out (the compiler's figures kept) and exit")
    a = p.parse_args()
    import triton

    from iattention.kernels import load_kernel

    out = Path(a.out)
    if out.exists() and not _ours(out):
        sys.exit(f"{out} exists and is not a kernel_shared_memory.py result: give --out a new file")
    if a.remodel:
        return remodel(out)

    # The safe config at the widest head dim, both dtypes, on an A100; every config at head dims 768 and 1024, fp32
    # and bf16, on Hopper (the first GPU window failed at fp32 and 768), to test the model as a lower bound across
    # tile shapes, stages and dtypes.
    rows = (planned_rows([1024], ["fp32", "bf16"], ["sm_80"], safe_only=True)
            + planned_rows([768, 1024], ["fp32", "bf16"], ["sm_90"], safe_only=False))
    done = []
    with concurrent.futures.ProcessPoolExecutor(a.jobs) as pool:
        for row in pool.map(compile_row, rows):
            done.append(row)
            print(f"{row['kind']:<5} {row['target']} D={row['D']:<5} {row['dtype']} {row['tiles']} "
                  f"stages={row['num_stages']} warps={row['num_warps']}: model {row['model']:>7,} compiler "
                  f"{row.get('shared', row.get('error'))!s:>9} ({row['seconds']} s)", flush=True)
    result = dict(date=datetime.date.today().isoformat(), triton=triton.__version__,
                  kernel_source_sha256=load_kernel().kernel_source_hash(), command=" ".join(["python", *sys.argv]),
                  rows=done)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
