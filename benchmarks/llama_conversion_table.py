"""The conversion table of docs/conversion.md's "Llama family": random-init tiny transformers models (d = 64,
2 layers; norm gains and biases randomized), converted HF -> canonical -> HF (pivoted blocks): max |logit
difference| against the float64 source in float64 and float32 (relative), parameters removed, and the fixed
blocks' conditioning with pivoting and with aligned blocks.

Usage: nice -n 10 python benchmarks/llama_conversion_table.py [--json benchmarks/results/llama-conversion-DATE.json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import transformers as tf

from iattention.interop.convert import convert
from iattention.interop.hf import from_hf_model, to_hf
from iattention.utils.atomic import write_text

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64)
CASES = [("Llama MHA", "Llama", dict(num_key_value_heads=4)),
         ("Llama GQA", "Llama", dict(num_key_value_heads=2)),
         ("Llama MQA", "Llama", dict(num_key_value_heads=1)),
         ("Llama GQA head_dim 24, attention_bias", "Llama", dict(num_key_value_heads=2, head_dim=24,
                                                                 attention_bias=True)),
         ("Qwen2 GQA (q/k/v bias), tied", "Qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
         ("Mistral GQA", "Mistral", dict(num_key_value_heads=2, sliding_window=None))]


def hf_model(kind, **kw):
    torch.manual_seed(0)
    model = getattr(tf, f"{kind}ForCausalLM")(getattr(tf, f"{kind}Config")(**{**BASE, **kw})).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    x = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    for name, kind, kw in CASES:
        hf = hf_model(kind, **kw)
        src = from_hf_model(hf, kind.lower())
        c = src.config
        with torch.no_grad():
            ref = hf(x).logits
            row = {"model": name, "H/G/r/rot": f"{c.n_head}/{c.n_kv_head}/{c.d_head}/{c.rot}"}
            for dtype in ("float64", "float32"):
                canon, rep = convert(src, "canonical", dtype=dtype)
                back = to_hf(canon)
                diff = (back(x).logits.double() - ref).abs().max().item()
                row[f"max dlogit {dtype}"] = diff
                row[f"rel {dtype}"] = diff / ref.abs().max().item()
            row["removed"] = rep.params_before - rep.params_after
            cond = {k: [layer[k] for layer in rep.layers] for k in rep.layers[0]}  # per layer and KV group
            row["output cond pivoted median/max"] = [float(np.median(cond["pivoted output"])),
                                                     float(np.max(cond["pivoted output"]))]
            row["output cond aligned max"] = float(np.max(cond["aligned output"]))
            row["rotary pivot ratio min pivoted/aligned"] = [float(np.min(cond["pivoted rotary"])),
                                                             float(np.min(cond["aligned rotary"]))]
        rows.append(row)
        print(f"| {name} | {row['H/G/r/rot']} | {row['removed']:,} | {row['max dlogit float64']:.1e} | "
              f"{row['max dlogit float32']:.1e} ({row['rel float32']:.1e}) | "
              f"{row['output cond pivoted median/max'][0]:.1f} / {row['output cond pivoted median/max'][1]:.1f} | "
              f"{row['output cond aligned max']:.3g} | {row['rotary pivot ratio min pivoted/aligned'][0]:.2f} / "
              f"{row['rotary pivot ratio min pivoted/aligned'][1]:.3f} |")
    if args.json:  # whole or not at all, as every result file the package writes
        write_text(args.json, json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
