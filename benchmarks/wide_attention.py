"""Tokens/s of one compiled GPT-2-small training step at 1 head (head dim 768) with each attention kernel:
SDPA (and which SDPA backend takes head dim 768), the Triton wide-head kernel, and the 12-head SDPA figure for
the issue-45 target (1 head >= 80% of 12 heads). Run on a GPU; writes benchmarks/results/<name>.json.

    python benchmarks/wide_attention.py --out benchmarks/results/cuda-wide-attention-<date>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

import torch
import torch.nn.functional as F

from iattention import GPT, GPTConfig
from iattention.kernels import prepare


def sdpa_backends(D: int) -> dict:
    """Which SDPA backends accept a bf16 causal call at head dim D (the others raise)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 1, 256, D, device="cuda", dtype=torch.bfloat16)
    out = {}
    for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
        try:
            with sdpa_kernel(b):
                F.scaled_dot_product_attention(q, q, q, is_causal=True)
            out[b.name] = True
        except RuntimeError as e:
            out[b.name] = str(e).splitlines()[0][:200]
    return out


def time_step(n_head: int, kernel: str, attention: str, batch: int, steps: int, rounds: int) -> dict:
    cfg = GPTConfig(n_head=n_head, attention=attention, attn_kernel=kernel, dropout=0.0)
    used = prepare(kernel, "cuda", cfg.d_head)
    torch.manual_seed(0)
    model = GPT(cfg).cuda()
    fn = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size + 1), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(x[:, :-1], x[:, 1:])[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    rates = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        rates.append(batch * cfg.block_size * steps / (time.perf_counter() - t))
    return dict(n_head=n_head, attention=attention, attn_kernel_setting=kernel, attn_kernel=used,
                train_tokens_per_s=statistics.median(rates), rounds=rates)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=f"benchmarks/results/cuda-wide-attention-{datetime.date.today()}.json")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = [time_step(h, k, att, a.batch, a.steps, a.rounds)
            for h, k, att in ((12, "sdpa", "standard"), (1, "sdpa", "standard"), (1, "triton", "standard"),
                              (1, "sdpa", "canonical"), (1, "triton", "canonical"))]
    for r in rows:
        print(f"{r['attention']:<10} h={r['n_head']:<3} {r['attn_kernel']:<6} {r['train_tokens_per_s']:>12,.0f} tok/s")
    twelve = rows[0]["train_tokens_per_s"]
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, batch=a.batch,
                  sdpa_backends_at_768=sdpa_backends(768), rows=rows,
                  one_head_triton_vs_12_heads=rows[2]["train_tokens_per_s"] / twelve,
                  one_head_sdpa_vs_12_heads=rows[1]["train_tokens_per_s"] / twelve)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
