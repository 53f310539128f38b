"""Peak memory and time of one training step (forward + backward) of the paper preset's model with the whole
loss and with train.loss_chunk (issue 52 §3), each in a fresh process so its peak RSS is its own.

    python benchmarks/loss_chunk_memory.py --out benchmarks/results/loss-chunk-cpu-<date>.json
        [--batch 2] [--chunks 0,1024,256] [--heads 12]

CPU, float32 (on CPU the logits are fp32 already, so the whole loss holds them and their gradient: B x T x V x 8
bytes). The GPU figures (bf16 logits, fp32 softmax) are for `iattn bench --loss-chunk N` on the device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def one(batch: int, chunk: int, heads: int) -> dict:
    import torch

    from iattention import GPT
    from iattention.config import load_config

    cfg = load_config("paper", None, [f"model.n_head={heads}"]).model.replace(vocab_size=50257)
    torch.manual_seed(0)
    model = GPT(cfg)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size + 1), generator=torch.Generator().manual_seed(0))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    loss = model(x[:, :-1], x[:, 1:], loss_chunk=chunk)[1]
    loss.backward()
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(loss_chunk=chunk, batch=batch, T=cfg.block_size, vocab=cfg.vocab_size, n_head=heads,
                loss=loss.item(), step_s=round(seconds, 2), peak_rss_mb=round(peak / 1024),
                step_rss_growth_mb=round((peak - before) / 1024),
                logits_fp32_mb=round(batch * cfg.block_size * cfg.vocab_size * 4 / 2**20))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--chunks", default="0,1024,256")
    p.add_argument("--out", default=None)
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # the child process
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.batch, a.one, a.heads)))
        return
    rows = []
    for chunk in (int(c) for c in a.chunks.split(",")):
        out = subprocess.run([sys.executable, __file__, "--one", str(chunk), "--batch", str(a.batch), "--heads",
                              str(a.heads)], capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    import torch

    result = dict(date=datetime.date.today().isoformat(), torch=torch.__version__, device="cpu",
                  command=" ".join(["python", *sys.argv]), rows=rows)
    if a.out:
        out = Path(a.out)
        if out.exists():
            sys.exit(f"{out} exists: give --out a new file")
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
