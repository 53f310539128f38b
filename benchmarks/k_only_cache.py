"""K-only cache vs the full key/value cache on CPU: cache memory and greedy decoding speed of an MHA
Llama-family model (n_kv_head x d_head = n_embd, the case where keys determine the layer input), standard and
canonical attention, float32, batch 1.

Each arm generates the same tokens (checked); the time is the median over `--rounds` of a whole generate()
call (prompt + new tokens), the rounds alternating the arms so drift hits each alike. Cache bytes are read off
the cache after the last step (keys, and values for the full cache).

Usage: nice -n 10 python benchmarks/k_only_cache.py [--rounds 3] [--json benchmarks/results/k-only-cache-DATE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time

import torch

from iattention.config.llama import LlamaConfig
from iattention.model.llama import Llama
from iattention.symmetry.grouped import canonicalize
from iattention.utils.atomic import write_text

SHAPE = dict(n_layer=4, n_head=8, n_kv_head=8, n_embd=512, d_ff=1376, vocab_size=2048, block_size=1024)


def run(rounds: int, prompt_len: int, new: int) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    std = Llama(LlamaConfig(**SHAPE)).eval()
    models = {"standard": std, "canonical": canonicalize(std)}
    prompt = torch.randint(0, SHAPE["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(1))
    out = {"shape": SHAPE, "prompt": prompt_len, "new_tokens": new, "rounds": rounds, "threads": 1,
           "torch": torch.__version__, "machine": platform.processor() or platform.machine(), "arms": {}}
    tokens = {}
    times = {}
    for r in range(rounds):
        arms = [(a, c) for a in models for c in ("full", "k-only")]
        for attention, cache in arms if r % 2 == 0 else arms[::-1]:
            model = models[attention]
            t0 = time.perf_counter()
            ids = model.generate(prompt, new, temperature=0, cache_kind=cache)
            times.setdefault((attention, cache), []).append(time.perf_counter() - t0)
            tokens.setdefault(attention, ids) if cache == "full" else None
            assert torch.equal(ids, tokens.setdefault(attention, ids)), (attention, cache)
    for (attention, cache), ts in times.items():
        c = models[attention].make_cache(cache)
        with torch.no_grad():
            models[attention](tokens[attention][:, :-1], cache=c)  # what the cache holds after the last step
        out["arms"][f"{attention} {cache}"] = {
            "cache_bytes": c.nbytes(), "cache_bytes_per_token": c.nbytes() // c.length,
            "seconds_median": statistics.median(ts), "seconds": ts,
            "new_tokens_per_s": new / statistics.median(ts)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new", type=int, default=192)
    p.add_argument("--json")
    args = p.parse_args()
    res = run(args.rounds, args.prompt, args.new)
    res["date"] = datetime.date.today().isoformat()
    res["command"] = "nice -n 10 python benchmarks/k_only_cache.py " + " ".join(
        f"--{k} {v}" for k, v in (("rounds", args.rounds), ("prompt", args.prompt), ("new", args.new)))
    for name, arm in res["arms"].items():
        print(f"{name:20s} cache {arm['cache_bytes'] / 2**20:7.2f} MiB ({arm['cache_bytes_per_token']} B/token)  "
              f"{arm['new_tokens_per_s']:7.1f} new tokens/s (median of {args.rounds})")
    if args.json:  # whole or not at all, as every result file the package writes
        write_text(args.json, json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
