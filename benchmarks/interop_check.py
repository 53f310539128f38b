"""Do our Hugging Face exports load in other tools, and score as we do? (issues 49 and 50)

For each model family (gpt2, llama, gpt_neox, phi3, qwen3, olmo2, smollm3) and variant (standard, canonical), and a Llama at rope_theta 500000: a
tiny run (the `tiny` preset, 20 steps, byte tokenizer, so the export gets the added end-of-text row) and its
`iattn convert --to hf` export (`--only phi3`: only the runs whose names start so). Then,
with whatever of these the running Python has installed:

- transformers: `AutoTokenizer` + `AutoModelForCausalLM` from the folder, offline; token ids equal ours, logits on
  a probe (the real vocabulary's columns) against `iattention.load_run(RUN)`'s: max relative difference (max abs
  difference / max abs logit of ours);
- TransformerLens 4.x (`TransformerBridge.boot_transformers(FOLDER)`, `run_with_cache`): the same, and its attention
  patterns against `iattention.model.activations.run_with_cache`'s (max abs), or the error;
- lm-eval (`lm_eval.models.huggingface.HFLM`): `loglikelihood(first token, rest)` of short texts (shorter than the
  block) against `iattn eval RUN --text FILE`'s total NLL (the same predictions: exact but for the added token's
  share of probability), and `loglikelihood_rolling` (which also scores the first token, after `<|endoftext|>`).

Run it in three environments (none of these tools is a dependency of the project or its CI):

  # 1. make the runs and exports (the project's own venv, transformers 5):
  IATTN_DATA_DIR=/work/shared/data PYTHONPATH=src .venv/bin/python benchmarks/interop_check.py --make /tmp/interop
  # 2. check them in each client's venv, e.g. transformers 5 + transformer-lens>=4 + lm-eval[hf]:
  #    python3 -m venv V && V/bin/pip install torch==2.13.0 && V/bin/pip install -c <(echo torch==2.13.0) \
  #        "transformer-lens>=4" "lm-eval[hf]" numpy pyyaml tiktoken scipy tqdm matplotlib
  #    and transformers 4.40: V2/bin/pip install -c <(echo torch==2.13.0) torch==2.13.0 transformers==4.40.2 ...
  IATTN_DATA_DIR=/work/shared/data PYTHONPATH=src V/bin/python benchmarks/interop_check.py /tmp/interop --json r.json

Prints one markdown table row per export and tool. The results of 2026-11-26: benchmarks/results/interop-2026-11-26.md;
rerun after the canonical init fix: interop-2026-11-27.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

FAMILIES = ("gpt2", "llama", "gpt_neox", "phi3", "qwen3", "olmo2", "smollm3")
VARIANTS = ("standard", "canonical")
# name -> overrides of the tiny preset: every family and variant, and a Llama at Llama 3's rope_theta (transformers
# 4.x reads rope_theta, not transformers 5's rope_parameters: the export must say both)
RUNS = {f"{fam}-{v}": [f"model.family={fam}", f"model.attention={v}"] for fam in FAMILIES for v in VARIANTS}
RUNS["llama-theta500k"] = ["model.family=llama", "model.attention=canonical", "model.rope_theta=500000"]
RUNS["smollm3-nope2"] = ["model.family=smollm3", "model.attention=canonical", "model.n_layer=2",
                      "model.nope_every=2"]  # its second layer without RoPE
PROBE = "The war began in 1914 and ended."  # 32 bytes: a whole window of the tiny preset
# shorter than the block (32 byte tokens), so every tool scores them in one window; none starts with a space (lm-eval
# moves a context's trailing spaces into the continuation, and an empty context fails its assertion)
TEXTS = ("The war began in 1914", "Valkyria Chronicles III", "He was born in London .", "= Robert Boulter =")


def iattn(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "iattention", *args], check=True, capture_output=True,
                          text=True).stdout


def make(root: Path, names) -> None:
    """Train the tiny runs `names` and export each (skipping what exists)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        overrides = RUNS[name]
        run, out = root / f"R-{name}", root / f"E-{name}"
        if not run.exists():
            iattn("train", "--preset", "tiny", *overrides, "train.max_steps=20", "train.eval_tokens=2000",
                  "train.final_test=false", "--out", str(run))
        if not out.exists():
            iattn("convert", "--from", str(run), "--to", "hf", "--out", str(out))
        print(f"{run} -> {out}")


def version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def rel(theirs: torch.Tensor, ours: torch.Tensor) -> float:
    return ((theirs.double() - ours.double()).abs().max() / ours.double().abs().max()).item()


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"


def our_side(run: Path, tmp: Path) -> dict:
    """Our logits on the probe and `iattn eval --text`'s total NLL of each text."""
    from iattention import load_run
    from iattention.model.activations import run_with_cache

    model, tok = load_run(run)
    ids = [int(i) for i in tok.encode(PROBE)]
    with torch.no_grad():
        logits, cache = run_with_cache(model, torch.tensor([ids]))  # TransformerLens's hook names
        logits = logits[0, :, : tok.vocab_size].clone()
    nll = []
    for i, text in enumerate(TEXTS):
        f = tmp / f"text{i}.txt"
        f.write_text(text)
        # one window of all the text's predictions (`iattn eval` needs a window's predictions plus one token)
        window = str(len(tok.encode(text)) - 1)
        r = json.loads(iattn("eval", str(run), "--text", str(f), "--block-size", window, "--json"))
        nll.append(r["loss"] * r["tokens"])
    return {"ids": ids, "logits": logits, "cache": cache, "vocab": tok.vocab_size, "nll": nll,
            "text_ids": [[int(i) for i in tok.encode(t)] for t in TEXTS]}


def check_transformers(export: Path, ours: dict) -> dict:
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(str(export), local_files_only=True)
    hf = tf.AutoModelForCausalLM.from_pretrained(str(export), local_files_only=True).eval()
    ids = tok(PROBE, add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, :, : ours["vocab"]]
    return {"class": type(hf).__name__, "ids_equal": ids == ours["ids"], "rel": rel(logits, ours["logits"])}


def check_bridge(export: Path, ours: dict) -> dict:
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(export), device="cpu")
    # to_tokens puts <|endoftext|> (bos) in front unless told not to; it cuts to the block with it counted, so a
    # whole block of text is given as ids
    short = bridge.to_tokens(TEXTS[0], prepend_bos=False)[0].tolist()
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(torch.tensor([ours["ids"]]))
    patterns = sorted(k for k in cache.keys() if k.endswith("hook_pattern"))
    return {"ids_equal": short == ours["text_ids"][0], "bos_prepended": bridge.to_tokens(TEXTS[0])[0, 0].item(),
            "rel": rel(logits[0, :, : ours["vocab"]], ours["logits"]), "cached": len(cache),
            "pattern_max_abs": max((cache[k][0] - ours["cache"][k][0]).abs().max().item() for k in patterns)}


def check_lm_eval(export: Path, ours: dict) -> dict:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=str(export), dtype="float32", device="cpu", batch_size=1)
    pairs = [Instance("loglikelihood", {}, (t[:1], t[1:]), i) for i, t in enumerate(TEXTS)]
    rolling = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(TEXTS)]
    ll = [-r[0] for r in lm.loglikelihood(pairs, disable_tqdm=True)]
    roll = [-r for r in lm.loglikelihood_rolling(rolling, disable_tqdm=True)]
    return {"max_length": lm.max_length, "nll_pairs": ll, "nll_rolling": roll, "nll_ours": ours["nll"],
            "rel_pairs": max(abs(a - b) / b for a, b in zip(ll, ours["nll"])),
            "rolling_minus_ours": [a - b for a, b in zip(roll, ours["nll"])]}


CHECKS = {"transformers": ("transformers", check_transformers), "transformer_lens": ("transformer-lens", check_bridge),
          "lm_eval": ("lm_eval", check_lm_eval)}


def check(root: Path, names) -> dict:
    versions = {p: version(p) for p in ("torch", "transformers", "tokenizers", "transformer-lens", "lm_eval")}
    print("versions:", ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    results = {"versions": versions, "exports": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for run_name in names:
            run, export = root / f"R-{run_name}", root / f"E-{run_name}"
            ours = our_side(run, Path(tmp))
            row = results["exports"][run_name] = {}
            for name, (pkg, fn) in CHECKS.items():
                if versions[pkg] is None:
                    continue
                try:
                    row[name] = fn(export, ours)
                except Exception as e:  # a client's failure is a finding, reported as one line
                    row[name] = {"error": first_line(e)}
                print(f"| {run_name} | {name} {versions[pkg]} | {json.dumps(row[name])} |", flush=True)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="folder with the runs R-<name> and exports E-<name> (names: RUNS)")
    p.add_argument("--make", action="store_true", help="train the runs and export them (needs transformers 5)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--only", help="only the runs whose names start with these (comma-separated, e.g. qwen3,olmo2)")
    a = p.parse_args()
    names = [n for n in RUNS if not a.only or n.startswith(tuple(a.only.split(",")))]
    if a.make:
        make(a.root, names)
        return
    results = check(a.root, names)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
