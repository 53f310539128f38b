"""Conditioning study: how well-conditioned are the fixed blocks, and what does canonicalizing cost
in float32 and bfloat16?  iattn conditioning --checkpoint RUN/best.safetensors
(`python -m iattention.experiments.conditioning` takes the same flags)

For (a) a model trained by our pipeline (--checkpoint) and (b) a GPT-2-small-shaped model initialized
the way `transformers` initializes GPT-2 (--gpt2; done whenever no checkpoint is given), for blocks
`aligned` and `pivoted`: the distribution of condition numbers over heads (KV groups) of the fixed key and
output blocks, and the test perplexity of the original and of the canonical model, each cast to float32 and
bfloat16 (canonicalization itself is computed in float64). Any family: with rotary dims the key's block is its
pass dims' (none when RoPE rotates the whole head), and the rotary pairs' smallest pivot ratio is given beside.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import torch

from iattention.data import DataConfig, load_data
from iattention.errors import UserError
from iattention.interop.hf import from_hf
from iattention.interop.load import data_config_for, load_model
from iattention.symmetry.conditioning import block_conditioning
from iattention.symmetry.transforms import canonicalize
from iattention.train.distributed import DistContext
from iattention.train.evaluate import perplexity, split_nll
from iattention.utils.atomic import write_json


def _ppl(model, tokens, block, dtype) -> float:
    m = copy.deepcopy(model).to(dtype)  # never round the float64 source itself
    nll, n = split_nll(m, tokens, block, 8, DistContext())
    return perplexity(nll, n)


def study(model, tokens, label: str, block_size: int) -> dict:
    model = copy.deepcopy(model).double().eval()  # never change the caller's model
    out = {"model": label, "tokens": int(len(tokens) - 1), "blocks": {}}
    base = {dt: _ppl(model, tokens, block_size, getattr(torch, dt))
            for dt in ("float32", "bfloat16")}
    out["original_ppl"] = base
    cond = block_conditioning(model)  # per layer and head (KV group), both blocks
    for block in ("aligned", "pivoted"):
        canon = canonicalize(model, block=block)
        ppl = {dt: _ppl(canon, tokens, block_size, getattr(torch, dt)) for dt in ("float32", "bfloat16")}
        key, output = (np.array(cond.get(f"{block} {what}", [])).ravel() for what in ("pass", "output"))
        allc = np.concatenate([key, output])
        out["blocks"][block] = {
            "cond_median": float(np.median(allc)), "cond_p90": float(np.percentile(allc, 90)),
            "cond_max": float(allc.max()),
            **({"key_max": float(key.max())} if key.size else {}),  # none where RoPE rotates the whole head
            "output_max": float(output.max()),
            **({"rotary_pivot_min": float(np.min(cond[f"{block} rotary"]))} if f"{block} rotary" in cond else {}),
            "canonical_ppl": ppl,
            "ppl_change": {dt: ppl[dt] - base[dt] for dt in ppl},
        }
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `iattn conditioning` (and of `python -m iattention.experiments.conditioning`)."""
    p.add_argument("--checkpoint", help="an iattention checkpoint trained by our pipeline")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--gpt2", action="store_true",
                   help="also study a GPT-2-small-shaped model (always done when no --checkpoint is given)")
    p.add_argument("--gpt2-tokens", type=int, default=8192, help="WikiText-2 test tokens for the GPT-2-small model")
    p.add_argument("--json", help="write the results here")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    run(p.parse_args(argv))


def run(args) -> None:
    """The study, printed (and written to --json)."""
    try:
        import transformers  # lazy: heavy, and only this study needs transformers' own GPT-2 init
    except ImportError:
        raise UserError("iattn conditioning needs transformers: pip install transformers") from None

    transformers.utils.logging.set_verbosity_error()
    if args.json and Path(args.json).is_dir():  # before the study (`iattn conditioning` refuses it in argparse)
        raise UserError(f"--json {args.json} is a folder; give a file path")
    results = []
    if args.checkpoint:  # read first: an unreadable one is refused before the minutes of GPT-2
        model, meta = load_model(args.checkpoint)
        if not isinstance(meta["config"].get("data"), dict):  # a converted model: no test split to study it on
            raise UserError(f"{args.checkpoint} records no training data (a converted model, not a run's); iattn "
                            "conditioning reads the test split of the run's own data: give a training run's "
                            "checkpoint (RUN/best.safetensors)")
    if args.gpt2 or not args.checkpoint:  # the reference model: minutes on a CPU
        torch.manual_seed(0)
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config())  # transformers' own GPT-2 init
        data = load_data(DataConfig(dataset="wikitext-2-v1", tokenizer="gpt2", data_dir=args.data_dir or ""),
                         splits=("test",))
        results.append(study(from_hf(hf), data.splits["test"][: args.gpt2_tokens + 1],
                             "GPT-2 small shape, transformers init (seed 0)", 1024))
    if args.checkpoint:
        dcfg = data_config_for(meta["config"]["data"], args.checkpoint, data_dir=args.data_dir)
        tokens = load_data(dcfg, splits=("test",)).splits["test"]
        results.append(study(model, tokens, f"trained by iattention: {args.checkpoint}", model.config.block_size))
    for r in results:
        print(f"\n{r['model']} — test tokens {r['tokens']:,}; original ppl fp32 {r['original_ppl']['float32']:.3f}, "
              f"bf16 {r['original_ppl']['bfloat16']:.3f}")
        for block, b in r["blocks"].items():
            rotary = f"  rotary pivot min {b['rotary_pivot_min']:.3g}" if "rotary_pivot_min" in b else ""
            print(f"  {block:<8} cond median {b['cond_median']:.3g}  p90 {b['cond_p90']:.3g}  max {b['cond_max']:.3g}"
                  f"{rotary}"
                  f" | canonical ppl fp32 {b['canonical_ppl']['float32']:.3f} ({b['ppl_change']['float32']:+.4f})"
                  f"  bf16 {b['canonical_ppl']['bfloat16']:.3f} ({b['ppl_change']['bfloat16']:+.4f})")
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
