"""Perplexity parity: `iattn eval` vs computing it with transformers directly.

A random-init GPT2LMHeadModel (seed 0; 2 layers, d=64, 4 heads, 64 positions, byte vocabulary) is
saved to disk; the WikiText-2 test split (byte tokens, first 20,000) is scored by
  (a) transformers itself, following its perplexity guide (exact count of scored tokens),
  (b) `iattn eval` on the HF folder, and (c) on the same model converted to canonical,
for stride = block size and stride = block size / 2. Prints the relative differences.
Usage: IATTN_DATA_DIR=../shared/data python benchmarks/eval_vs_transformers.py
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers as tf


def hf_ppl(hf, ids, block, stride):
    ids = torch.tensor(ids)[None]
    n, nll, count, prev = ids.shape[1], 0.0, 0, 0
    for begin in range(0, n, stride):
        end = min(begin + block, n)
        tgt = ids[:, begin:end].clone()
        tgt[:, : -(end - prev)] = -100
        scored = int((tgt[:, 1:] != -100).sum())
        with torch.no_grad():
            loss = hf(ids[:, begin:end], labels=tgt).loss.item()
        if scored:
            nll, count = nll + loss * scored, count + scored
        prev = end
        if end == n:
            break
    return float(torch.exp(torch.tensor(nll / count, dtype=torch.float64))), count


def main():
    data_dir = os.environ.get("IATTN_DATA_DIR", "../shared/data")
    text = Path(data_dir, "wikitext-2-v1", "wiki.test.tokens").read_bytes()[:20000]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "t.txt").write_bytes(text)
        torch.manual_seed(0)
        hf = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                              bos_token_id=None, eos_token_id=None)).eval()
        hf.save_pretrained(tmp / "hf")
        spec = dict(dataset="text", tokenizer="byte", train=str(tmp / "t.txt"), valid=str(tmp / "t.txt"),
                    test=str(tmp / "t.txt"), cache_dir=str(tmp / "cache"))
        (tmp / "hf" / "iattention-data.json").write_text(json.dumps(spec))
        cli = [sys.executable, "-m", "iattention"]
        subprocess.run([*cli, "convert", "--from", str(tmp / "hf"), "--to", "canonical", "--out", str(tmp / "c")],
                       check=True, capture_output=True)
        ids = list(text.decode("utf-8", errors="strict").encode("utf-8"))
        print("| stride | transformers ppl | scored tokens | iattn eval (HF folder) | rel. diff | "
              "iattn eval (canonical) | rel. diff |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for stride in (64, 32):
            ref, count = hf_ppl(hf, ids, 64, stride)
            got = []
            for folder in ("hf", "c"):
                out = subprocess.run([*cli, "eval", str(tmp / folder), "--stride", str(stride), "--json"],
                                     check=True, capture_output=True, text=True).stdout
                got.append(json.loads(out))
            assert all(g["tokens"] == count for g in got)
            print(f"| {stride} | {ref:.4f} | {count:,} | {got[0]['ppl']:.4f} | {abs(got[0]['ppl'] - ref) / ref:.1e} | "
                  f"{got[1]['ppl']:.4f} | {abs(got[1]['ppl'] - ref) / ref:.1e} |")


if __name__ == "__main__":
    main()
