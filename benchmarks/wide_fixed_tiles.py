"""The wide-head kernel at fixed single-stage tiles (`SAFE_TILES`, no autotune) against the fp64 math path,
one JSON line per case as it ends (compile seconds, warm ms, max error). Written for the 2026-11-27 second GPU
window (issue 52): the full check's autotuned kernel cases ran past their step limits while compiling, so this
asks the narrower question first: does the kernel compile and agree at head dims 768 and 1024 on the device?

    python benchmarks/wide_fixed_tiles.py --out FILE.jsonl            # on CUDA
    TRITON_INTERPRET=1 python benchmarks/wide_fixed_tiles.py --dry    # CPU dry run, tiny shapes
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--dry", action="store_true")
    a = p.parse_args()
    from iattention.kernels.wide_attention import SAFE_TILES, Blocks, wide_attention
    (fm, fn, fc), (bm, bn, bc) = SAFE_TILES["fwd"], SAFE_TILES["dkdv"]
    assert SAFE_TILES["dq"] == SAFE_TILES["dkdv"]
    blocks = Blocks(BM=fm, BN=fn, BK=64, BDV=fc, bwd_BM=bm, bwd_BN=bn, BDC=bc, num_warps=4, num_stages=1)
    dev = "cpu" if a.dry else "cuda"
    cases = [(32, 20, torch.float32)] if a.dry else [
        (D, T, dt) for D in (768, 1024) for dt in (torch.float32, torch.bfloat16) for T in (70, 1027)]
    out = open(a.out, "w") if a.out else None
    for D, T, dt in cases:
        row = dict(D=D, T=T, dtype=str(dt).removeprefix("torch."), blocks=blocks.__dict__)
        try:
            g = torch.Generator(device=dev).manual_seed(0)
            q, k, v = (torch.randn(2, T, 2, D, device=dev, generator=g).transpose(1, 2).to(dt).requires_grad_()
                       for _ in range(3))
            do = torch.randn(2, 2, T, D, device=dev, generator=g).to(dt)
            t0 = time.perf_counter()
            o = wide_attention(q, k, v, blocks)
            grads = torch.autograd.grad(o, (q, k, v), do)
            if dev == "cuda":
                torch.cuda.synchronize()
            row["first_call_s"] = round(time.perf_counter() - t0, 2)
            ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
            s = (ref_in[0] @ ref_in[1].transpose(-1, -2) / math.sqrt(D)).masked_fill(
                ~torch.ones(T, T, dtype=torch.bool, device=dev).tril(), float("-inf"))
            ref = s.softmax(-1) @ ref_in[2]
            ref_grads = torch.autograd.grad(ref, ref_in, do.double())
            for name, x, y in zip(("out", "dq", "dk", "dv"), (o, *grads), (ref, *ref_grads)):
                row[f"rel_err_{name}"] = float((x.detach().double() - y).norm() / max(y.norm().item(), 1.0))
                row[f"max_err_{name}"] = float((x.detach().double() - y).abs().max())
            if dev == "cuda":
                for _ in range(2):
                    wide_attention(q, k, v, blocks)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(10):
                    o = wide_attention(q, k, v, blocks)
                    torch.autograd.grad(o, (q, k, v), do)
                torch.cuda.synchronize()
                row["fwd_bwd_ms"] = round((time.perf_counter() - t0) * 100, 3)
            row["ok"] = True
        except Exception as e:  # noqa: BLE001 - a device benchmark records the compiler's message and goes on
            row["ok"] = False
            row["error"] = f"{type(e).__name__}: {str(e)[:800]}"
        line = json.dumps(row)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
