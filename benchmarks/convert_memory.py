"""Peak memory and time of `iattn convert` on real-sized random Llama-family checkpoints (issue 50 §3).

For each shape: build a random model with transformers in its own process (freed before anything is measured),
save it in bf16 with save_pretrained (sharded as asked), then run each conversion under `/usr/bin/time -v` and read
its "Maximum resident set size" and wall time, with the load average beside it. The round trip is checked in
transformers: the source and the back-converted folder loaded in float32, logits on a short probe, relative.

    python benchmarks/convert_memory.py --shape qwen2.5-0.5b --work /tmp/convbench [--old-src /work/main/src]
    python benchmarks/convert_memory.py --shape llama-3.2-1b --work /tmp/convbench
    python benchmarks/convert_memory.py --table benchmarks/results/convert-2026-11-26.json

Results are appended to --results (JSON, one record per measured command); --table prints the markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SHAPES = {  # transformers config of each published model's shape (random weights)
    "qwen2.5-0.5b": ("Qwen2", dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                   num_key_value_heads=2, head_dim=64, intermediate_size=4864, vocab_size=151936,
                                   tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1000000.0,
                                   rms_norm_eps=1e-6), 1),
    "llama-3.2-1b": ("Llama", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
                                   tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-5,
                                   rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                                                        low_freq_factor=1.0, high_freq_factor=4.0,
                                                        original_max_position_embeddings=8192)), 4),
    # SmolLM3-3B (issue 64): no RoPE on every 4th layer (transformers' default no_rope_layer_interval)
    "smollm3-3b": ("SmolLM3", dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
                                   num_key_value_heads=4, intermediate_size=11008, vocab_size=128256,
                                   tie_word_embeddings=True, max_position_embeddings=65536, rms_norm_eps=1e-6,
                                   rope_theta=5000000.0, no_rope_layer_interval=4), 3),
    # Phi-3-mini-4k-instruct (issue 64): fused qkv_proj and gate_up_proj, 32 KV heads, a 2047-token window on every
    # layer, 2 shards as published
    "phi-3-mini-4k": ("Phi3", dict(hidden_size=3072, num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=32, intermediate_size=8192, vocab_size=32064,
                                   tie_word_embeddings=False, max_position_embeddings=4096,
                                   original_max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                                   sliding_window=2047, bos_token_id=1, eos_token_id=32000, pad_token_id=32000), 2),
    # Qwen3-0.6B (issue 64): q_norm / k_norm on each head, head_dim 128 (16 x 128 query dims > hidden 1024)
    "qwen3-0.6b": ("Qwen3", dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                 head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True,
                                 max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0), 2),
    # OLMo-2-0425-1B (issue 64): q_norm / k_norm over the whole projections, norms after attention and MLP, untied
    "olmo-2-0425-1b": ("Olmo2", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                                     num_key_value_heads=16, intermediate_size=8192, vocab_size=100352,
                                     tie_word_embeddings=False, max_position_embeddings=4096, rms_norm_eps=1e-6,
                                     rope_theta=500000.0), 3),
    # One layer's cost at the big published shapes, for the paper estimate (all layers of a shape are alike):
    # Llama-3-8B's layer shape with 2 layers, Llama-3-70B's with 1, their full vocabulary and untied head.
    "llama-3-8b-2layers": ("Llama", dict(hidden_size=4096, num_hidden_layers=2, num_attention_heads=32,
                                         num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                                         vocab_size=128256, tie_word_embeddings=False, max_position_embeddings=8192,
                                         rms_norm_eps=1e-5, rope_theta=500000.0), 1),
    "llama-3-70b-1layer": ("Llama", dict(hidden_size=8192, num_hidden_layers=1, num_attention_heads=64,
                                         num_key_value_heads=8, head_dim=128, intermediate_size=28672,
                                         vocab_size=128256, tie_word_embeddings=False, max_position_embeddings=8192,
                                         rms_norm_eps=1e-5, rope_theta=500000.0), 1),
}
GIB = 2**30


def build(shape: str, folder: Path) -> None:
    """The random bf16 model, saved (in a child process: its few GB are gone when it exits)."""
    import torch
    import transformers as tf
    kind, kw, shards = SHAPES[shape]
    torch.manual_seed(0)
    cfg = getattr(tf, f"{kind}Config")(**kw)
    torch.set_default_dtype(torch.bfloat16)
    model = getattr(tf, f"{kind}ForCausalLM")(cfg).eval()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    # save_pretrained packs whole tensors greedily: a limit of size / (shards - 1/2) gives `shards` files here
    extra = {"max_shard_size": math.ceil(size / (shards - 0.5) / 1e6) * 10**6} if shards > 1 else {}
    model.save_pretrained(str(folder), **extra)


def load() -> float:
    return os.getloadavg()[0]


def timed(cmd: list[str], env: dict, limit_kib: int | None = None) -> dict:
    """Run cmd under /usr/bin/time -v; peak RSS (GiB), wall seconds, exit code, load average before and after."""
    before = load()
    wrapped = ["/usr/bin/time", "-v", *cmd]
    if limit_kib:
        wrapped = ["bash", "-c", f"ulimit -v {limit_kib} && exec \"$@\"", "bash", *wrapped]
    r = subprocess.run(wrapped, env=env, capture_output=True, text=True)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", r.stderr)
    seconds = sum(float(x) * 60**i for i, x in enumerate(reversed(wall.group(1).split(":")))) if wall else None
    tail = [x for x in r.stdout.splitlines() + r.stderr.splitlines() if "worst layer" in x or "error" in x
            or "conversion (" in x or "whole-model" in x]
    return {"command": " ".join(cmd), "rc": r.returncode, "peak_rss_gib": int(rss.group(1)) * 1024 / GIB if rss
            else None, "seconds": seconds, "load_before": before, "load_after": load(), "report": tail[-4:]}


def round_trip(src: Path, back: Path) -> float:
    """Relative max difference of transformers' float32 logits, back-converted folder against the source."""
    code = ("import sys, torch, transformers as tf\n"
            "x = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(0))\n"
            "out = []\n"
            "for p in sys.argv[1:]:\n"
            "    m = tf.AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval()\n"
            "    with torch.no_grad(): out.append(m(x).logits.double())\n"
            "    del m\n"
            "print(((out[1] - out[0]).abs().max() / out[0].abs().max()).item())\n")
    r = subprocess.run([sys.executable, "-c", code, str(src), str(back)], capture_output=True, text=True, check=True)
    return float(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES)
    ap.add_argument("--work", type=Path, default=Path("/tmp/convbench"))
    ap.add_argument("--results", type=Path,
                    default=Path(f"benchmarks/results/convert-{datetime.date.today().isoformat()}.json"))
    ap.add_argument("--old-src", help="also time the whole-model converter of this source tree (PYTHONPATH), "
                                      "under ulimit -v --old-limit-gib")
    ap.add_argument("--old-limit-gib", type=float, default=14)
    ap.add_argument("--only", default="canonical,hf,f32", help="which runs: canonical, hf, f32 (comma-separated)")
    ap.add_argument("--no-round-trip", action="store_true",
                    help="skip transformers' float32 round-trip check (one float32 model at a time: 15 GB at 3.8B "
                         "parameters, more than a shared 24 GiB machine spares); the converter's per-layer check stays")
    ap.add_argument("--table", type=Path, help="print the markdown table of a results file and exit")
    ap.add_argument("--build", action="store_true", help=argparse.SUPPRESS)  # the child that builds the model
    args = ap.parse_args()
    if args.build:
        build(args.shape, args.work / args.shape / "src")
        return
    if args.table:
        records = json.loads(args.table.read_text())
        print(table(records) + "\n\nPaper estimate for the full models (`estimate()`):\n\n" + estimate(records))
        return
    work = args.work / args.shape
    src = work / "src"
    if not (src / "config.json").exists():
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run([sys.executable, __file__, "--build", "--shape", args.shape, "--work", str(args.work)],
                       check=True)
    src_bytes = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    env = dict(os.environ)
    iattn = [sys.executable, "-m", "iattention", "convert"]
    records = json.loads(args.results.read_text()) if args.results.exists() else []
    only = args.only.split(",")

    def run(name, cmd, out, limit=None, tree=None):
        shutil.rmtree(out, ignore_errors=True)
        e = dict(env, PYTHONPATH=tree) if tree else env
        rec = {"shape": args.shape, "run": name, "source_gb": src_bytes / 1e9,
               "source_files": len(list(src.glob("*.safetensors"))), **timed(cmd, e, limit)}
        rec["output_gb"] = sum(f.stat().st_size for f in out.glob("*.safetensors")) / 1e9 if out.exists() else None
        records.append(rec)
        args.results.write_text(json.dumps(records, indent=2) + "\n")
        print(json.dumps(rec), flush=True)
        return rec

    canon, back = work / "canonical", work / "back"
    if "canonical" in only:
        run("to canonical (bf16)", [*iattn, "--from", str(src), "--to", "canonical", "--out", str(canon)], canon)
    if "hf" in only:
        run("canonical -> hf (bf16)", [*iattn, "--from", str(canon), "--to", "hf", "--out", str(back)], back)
        if not args.no_round_trip:
            records[-1]["round_trip_rel_f32_logits"] = round_trip(src, back)
            args.results.write_text(json.dumps(records, indent=2) + "\n")
    if "f32" in only:
        c32, b32 = work / "canonical32", work / "back32"
        run("to canonical (--dtype float32)", [*iattn, "--from", str(src), "--to", "canonical", "--dtype", "float32",
                                               "--out", str(c32)], c32)
        shutil.rmtree(canon, ignore_errors=True)
        shutil.rmtree(back, ignore_errors=True)
        run("canonical f32 -> hf (--dtype float32)", [*iattn, "--from", str(c32), "--to", "hf", "--out", str(b32)],
            b32)
        records[-1]["round_trip_rel_f32_logits"] = round_trip(src, b32)
        args.results.write_text(json.dumps(records, indent=2) + "\n")
        shutil.rmtree(c32, ignore_errors=True)
    if args.old_src:
        old = work / "old"
        run(f"whole-model converter ({args.old_src}, ulimit -v {args.old_limit_gib:g} GiB)",
            [*iattn, "--from", str(src), "--to", "canonical", "--out", str(old)], old,
            limit=int(args.old_limit_gib * 2**20), tree=args.old_src)


# The full models a one-layer shape stands for: (layers, published parameter count).
FULL = {"llama-3-8b-2layers": ("Llama-3-8B", 32, 8_030_261_248), "llama-3-70b-1layer": ("Llama-3-70B", 80,
                                                                                        70_553_706_496)}


def estimate(records: list[dict]) -> str:
    """The paper estimate for the full models, from the last bf16 `to canonical` run of each one-layer shape:
    every layer of a shape has the same tensors, and the embedding and head are the full model's, so the peak is
    the measured one; the time is at most the measured time x (layers / layers measured), which counts the fixed
    part (start, embedding and head) that many times over; bytes read are the published parameters in bf16,
    bytes written add the measured per-layer growth (canonical's int64 block permutations)."""
    rows = ["| model | bytes read | bytes written | peak RSS | time (upper bound) | from |",
            "| --- | ---: | ---: | ---: | ---: | --- |"]
    for shape, (name, layers, params) in FULL.items():
        runs = [r for r in records if r["shape"] == shape and r["run"] == "to canonical (bf16)" and r["rc"] == 0]
        if not runs:
            continue
        r = runs[-1]
        measured = SHAPES[shape][1]["num_hidden_layers"]
        growth = (r["output_gb"] - r["source_gb"]) / measured
        read = params * 2 / 1e9
        seconds = r["seconds"] * layers / measured
        rows.append(f"| {name} | {read:.1f} GB | {read + growth * layers:.1f} GB | {r['peak_rss_gib']:.2f} GiB | "
                    f"{seconds / 60:.0f} min | {shape}: {r['seconds']:.1f} s at load {r['load_before']:.1f}, "
                    f"{growth * 1e3:.1f} MB/layer more written |")
    return "\n".join(rows)


def table(records: list[dict]) -> str:
    rows = ["| shape | run | source | peak RSS (GiB) | time (s) | load avg before / after | output | worst layer "
            "(attention output, rel.) | round trip (f32 logits, rel.) |",
            "| --- | --- | --- | ---: | ---: | --- | --- | --- | ---: |"]
    for r in records:
        rt = r.get("round_trip_rel_f32_logits")
        worst = next((re.search(r"worst layer: (\d+) \(([^ ]+) relative", x) for x in r["report"]
                      if x.startswith("worst layer")), None)
        rep = f"layer {worst.group(1)}: {worst.group(2)}" if worst else ""
        run = r["run"] if r["rc"] == 0 else f"{r['run']} (exit {r['rc']})"
        out = "" if r["output_gb"] is None else f"{r['output_gb']:.3g} GB"
        rss = "" if r["peak_rss_gib"] is None else f"{r['peak_rss_gib']:.2f}"
        rows.append(f"| {r['shape']} | {run} | {r['source_gb']:.3g} GB, {r['source_files']} file(s) | {rss} | "
                    f"{r['seconds']:.0f} | {r['load_before']:.2f} / {r['load_after']:.2f} | {out} | {rep} | "
                    f"{'' if rt is None else f'{rt:.2e}'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
