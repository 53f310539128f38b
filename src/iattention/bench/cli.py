"""`iattn bench`: every variant x head count in one process, as ratios to standard and to HF GPT-2."""

from __future__ import annotations

import datetime
import os
import re
import statistics
import sys
from pathlib import Path

import torch

from iattention.cli import _int_list, _str_list, int_at_least
from iattention.errors import UserError
from iattention.utils.hardware import device_name

# Micro-batch (windows) timed per step: the preset's batch, at most this many.
MAX_BENCH_BATCH = 16
# A ratio whose rounds spread by more than this (largest / smallest round ratio - 1) is flagged noisy.
NOISE_SPREAD = 0.15


def bench_ratio(a_rounds: list[float], b_rounds: list[float]) -> dict:
    """a / b for rates timed back to back in each round: the median over rounds of the within-round
    ratio (the one ratio definition of the benchmark), the per-round ratios, and `noisy` when the rounds
    disagree by more than NOISE_SPREAD, so one figure must not be read as a finding."""
    rounds = [a / b for a, b in zip(a_rounds, b_rounds)]
    ratio = statistics.median(rounds)
    noisy = len(rounds) > 1 and max(rounds) / min(rounds) - 1 > NOISE_SPREAD
    return dict(ratio=ratio, rounds=rounds, noisy=noisy)


def bench_spec(preset: str) -> dict:
    """Model shape (the preset's model, vocabulary from its tokenizer) and the timed micro-batch."""
    from iattention.train.config import load_config, preset_model

    model = preset_model(preset)
    shape = {k: getattr(model, k) for k in ("n_layer", "n_embd", "block_size", "vocab_size")}
    return dict(model=shape, batch=min(MAX_BENCH_BATCH, load_config(preset).train.batch_size))


def run_bench(preset: str, attentions: list[str], heads: list[int], device: str, compile: bool,
              windows: int, steps: int, reference: bool = True, rounds: int = 3, log=print) -> dict:
    from iattention.bench.flops import device_peak_tflops, executed_flops_per_token, nanogpt_flops_per_token
    from iattention.bench.runner import Timing, hf_reference, ours, time_model
    from iattention.config import GPTConfig

    spec = bench_spec(preset)
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is visible; run on a GPU machine or use --device cpu")
    dev = torch.device(device)
    amp = dev.type == "cuda"
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = device_name(dev)
    peak = device_peak_tflops(name) if amp else None
    load_before = os.getloadavg()
    rows = []

    def record(label, attention, h, cfg, timing, n_params):
        flops = executed_flops_per_token(cfg)
        row = dict(model=label, attention=attention, n_head=h, params=n_params,
                   train_tokens_per_s=timing.train_tokens_per_s, forward_tokens_per_s=timing.forward_tokens_per_s,
                   train_window_tokens_per_s=timing.train_window_tokens_per_s, peak_memory_mb=timing.peak_memory_mb,
                   executed_flops_per_token=flops, nanogpt_flops_per_token=nanogpt_flops_per_token(cfg),
                   achieved_tflops=flops * timing.train_tokens_per_s / 1e12)
        if peak:
            row["mfu_nanogpt"] = row["nanogpt_flops_per_token"] * timing.train_tokens_per_s / (peak * 1e12)
            row["mfu_executed"] = flops * timing.train_tokens_per_s / (peak * 1e12)
        rows.append(row)
        log(f"{label:<13} {attention:<11} h={h:<3} train {timing.train_tokens_per_s:>10,.0f} tok/s   "
            f"forward {timing.forward_tokens_per_s:>10,.0f} tok/s")

    entries = []  # (label, attention, heads, cfg, model, loss_fn, params)
    for h in heads:
        base = GPTConfig(n_head=h, **spec["model"])
        for attention in attentions:
            cfg = base.replace(attention=attention)
            torch.manual_seed(0)
            model, loss_fn = ours(cfg, dev, compile=compile)
            entries.append(("iattention", attention, h, cfg, model, loss_fn, model.num_params()))
        if reference:
            cfg = base.replace(attention="standard")
            model, loss_fn = hf_reference(cfg, dev, compile=compile)
            if model is not None:
                entries.append(("hf-gpt2", "standard", h, cfg, model, loss_fn,
                                sum(p.numel() for p in model.parameters())))
    # Rounds interleave the configurations so that drift of the machine hits all of them alike;
    # each configuration's figure is the median over all its timed windows.
    # Odd rounds run the list backwards, so no configuration always runs first (or right after another).
    timings: dict[int, list] = {i: [] for i in range(len(entries))}
    for rnd in range(rounds):
        order = list(enumerate(entries))
        for i, (_, _, _, cfg, model, loss_fn, _) in (order if rnd % 2 == 0 else order[::-1]):
            timings[i].append(time_model(model, loss_fn, cfg.vocab_size, spec["batch"], cfg.block_size, dev,
                                         windows, steps, amp=amp))
    for i, (label, attention, h, cfg, _, _, n_params) in enumerate(entries):
        ts = timings[i]
        train = [r for t in ts for r in t.train_window_tokens_per_s]
        merged = Timing(statistics.median(train), statistics.median([t.forward_tokens_per_s for t in ts]), train,
                        max((t.peak_memory_mb or 0) for t in ts) or None)
        record(label, attention, h, cfg, merged, n_params)
    # Ratios are paired: within each round every configuration was timed back to back, so the
    # ratio of two round medians cancels drift of the machine that is slower than a round. Every ratio
    # the table prints is this one definition: the median over rounds of the within-round ratio, with
    # the smallest and largest round's ratio (bench_ratio).
    round_rate = {i: {key: [getattr(t, key) for t in timings[i]]
                      for key in ("train_tokens_per_s", "forward_tokens_per_s")} for i in timings}
    for i, row in enumerate(rows):
        same = [j for j, r in enumerate(rows) if r["n_head"] == row["n_head"]]
        std = next((j for j in same if rows[j]["model"] == "iattention" and rows[j]["attention"] == "standard"), None)
        ref = next((j for j in same if rows[j]["model"] == "hf-gpt2"), None)
        for key in ("train_tokens_per_s", "forward_tokens_per_s"):
            for against, j in (("standard", std), ("hf", ref)):
                if j is None:
                    continue
                r = bench_ratio(round_rate[i][key], round_rate[j][key])
                row[f"{key}_vs_{against}"] = r["ratio"]
                row[f"{key}_vs_{against}_rounds"] = r["rounds"]
                row[f"{key}_vs_{against}_noisy"] = r["noisy"]
    load_after = os.getloadavg()
    return dict(preset=preset, shape=spec, device=device, device_name=name, compile=compile, amp_bf16=amp,
                loadavg_before=load_before, loadavg_after=load_after, noise_threshold=NOISE_SPREAD,
                torch=torch.__version__, python=sys.version.split()[0], threads=torch.get_num_threads(),
                peak_bf16_tflops=peak, windows=windows, steps_per_window=steps, rounds=rounds,
                date=datetime.date.today().isoformat(), command=" ".join(["iattn", *sys.argv[1:]]) if
                sys.argv[1:2] == ["bench"] else "iattn bench", rows=rows)


def _ratio(row: dict, key: str) -> str:
    """A ratio cell: median over rounds [min, max], and a flag when the rounds disagree."""
    value = row.get(key)
    if value is None:
        return "–"
    rounds = row.get(f"{key}_rounds") or []
    spread = f" [{min(rounds):.3f}, {max(rounds):.3f}]" if len(rounds) > 1 else ""
    return f"{value:.3f}{spread}" + (" **noisy**" if row.get(f"{key}_noisy") else "")


def table(result: dict) -> str:
    mfu = result["peak_bf16_tflops"] is not None
    head = ("| model | attention | heads | params | train tok/s | × standard [min, max over rounds] | × HF | "
            "forward tok/s | × standard | executed GFLOP/token" + (" | MFU (nanoGPT) |" if mfu else " |"))
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in result["rows"]:
        lines.append(
            f"| {r['model']} | {r['attention']} | {r['n_head']} | {r['params']:,} | {r['train_tokens_per_s']:,.0f} | "
            f"{_ratio(r, 'train_tokens_per_s_vs_standard')} | {_ratio(r, 'train_tokens_per_s_vs_hf')} | "
            f"{r['forward_tokens_per_s']:,.0f} | {_ratio(r, 'forward_tokens_per_s_vs_standard')} | "
            f"{r['executed_flops_per_token'] / 1e9:.4g}" + (f" | {r['mfu_nanogpt']:.1%} |" if mfu else " |"))
    noisy = sum(bool(r.get(f"{k}_noisy")) for r in result["rows"] for k in
                ("train_tokens_per_s_vs_standard", "train_tokens_per_s_vs_hf", "forward_tokens_per_s_vs_standard"))
    load = result.get("loadavg_before")
    lines += ["", "Every ratio is the median over rounds of the ratio within a round ([min, max] over rounds); "
              "tok/s columns are medians over all timed windows, so their quotient can differ from a ratio when "
              "rounds drift." + (f" Load average before the run: {load[0]:.2f} (1 min)." if load else "")]
    if noisy:
        threshold = result.get("noise_threshold", NOISE_SPREAD)
        lines.append(f"{noisy} ratio(s) marked **noisy**: their rounds disagree by more than {threshold:.0%}; "
                     "rerun on an idle machine before reading them.")
    return "\n".join(lines)


def update_benchmarks_md(path: Path, result: dict, json_path: Path) -> None:
    from iattention.utils.atomic import write_text

    marker = f"<!-- bench:{result['device']}:{result['preset']}:{'compiled' if result['compile'] else 'eager'} -->"
    section = (f"{marker}\n## {result['preset']} on {result['device_name']} ({result['device']}, "
               f"{'torch.compile' if result['compile'] else 'eager'}, {result['date']})\n\n"
               f"Command: `{result['command']}` — raw numbers: `{json_path.as_posix()}` "
               f"(tok/s: median of {result['rounds']} interleaved rounds × {result['windows']} windows × "
               f"{result['steps_per_window']} steps; ratios: median over rounds of the ratio within a round; torch "
               f"{result['torch']}, {result['threads']} threads).\n\n{table(result)}\n")
    text = path.read_text() if path.exists() else (
        "# Benchmarks\n\nProduced by `iattn bench`; each section is replaced when its benchmark is rerun. "
        "Ratios are measured in one process and one run. FLOPs per token count the matmuls actually executed "
        "(see `iattention/bench/flops.py`).\n\n")
    pattern = re.compile(re.escape(marker) + r".*?(?=\n<!-- bench:|\Z)", re.S)
    text = pattern.sub(lambda _: section.rstrip("\n"), text) if marker in text else text.rstrip("\n") + "\n\n" + section
    write_text(path, text.rstrip("\n") + "\n")


def generation_table(rows: list[dict]) -> str:
    lines = ["| model | attention | heads | KV cache | new tok/s | × no cache | × HF generate |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        same = [x for x in rows if x["n_head"] == r["n_head"]]
        nocache = next((x for x in same if x["model"] == r["model"] and x["attention"] == r["attention"]
                        and not x["kv_cache"]), None)
        hf = next((x for x in same if x["model"] == "hf-gpt2"), None)
        ratios = [f"{r['tokens_per_s'] / o['tokens_per_s']:.2f}" if o else "–" for o in (nocache, hf)]
        lines.append(f"| {r['model']} | {r['attention']} | {r['n_head']} | {'yes' if r['kv_cache'] else 'no'} | "
                     f"{r['tokens_per_s']:,.1f} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines)


def cmd_generation_bench(args) -> None:
    from iattention.bench.generation import generation_bench
    from iattention.utils.atomic import write_json, write_text

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = generation_bench(args.preset, args.attention, args.heads, args.generate, rounds=args.rounds,
                            reference=not args.no_reference)
    result = dict(kind="generation", preset=args.preset, device="cpu", device_name=device_name(torch.device("cpu")),
                  torch=torch.__version__, threads=torch.get_num_threads(), rounds=args.rounds,
                  date=datetime.date.today().isoformat(), command=" ".join(["iattn", *sys.argv[1:]]), rows=rows)
    out = Path(args.json) if args.json else Path("benchmarks/results") / (
        f"cpu-{args.preset}-generate-{datetime.datetime.now().strftime('%Y-%m-%dT%H%M%S')}.json")
    write_json(out, result)
    print()
    print(generation_table(rows))
    print(f"\nwrote {out}")
    if args.markdown:
        marker = f"<!-- bench:generate:{args.preset} -->"
        section = (f"{marker}\n## Generation on {result['device_name']} ({args.preset}, {result['date']})\n\n"
                   f"Command: `{result['command']}` — raw numbers: `{out}`. Greedy decoding, batch 1, a "
                   f"{rows[0]['prompt_tokens']}-token random prompt, {args.generate} new tokens, random-init "
                   f"weights; median over {args.rounds} interleaved rounds.\n\n{generation_table(rows)}\n")
        path = Path(args.markdown)
        text = path.read_text() if path.exists() else "# Benchmarks\n"
        pattern = re.compile(re.escape(marker) + r".*?(?=\n<!-- bench:|\Z)", re.S)
        text = pattern.sub(lambda _: section.rstrip("\n"), text) if marker in text else \
            text.rstrip("\n") + "\n\n" + section
        write_text(path, text.rstrip("\n") + "\n")
        print(f"updated {args.markdown}")


def cmd_bench(args) -> None:
    from iattention.config import ATTENTION_VARIANTS
    from iattention.utils.atomic import write_json

    bad = [a for a in args.attention if a not in ATTENTION_VARIANTS]
    if bad:
        raise UserError(f"unknown attention {bad[0]!r}; choose from {', '.join(ATTENTION_VARIANTS)}")
    if "standard" not in args.attention:
        args.attention = ["standard", *args.attention]
    if args.generate:
        return cmd_generation_bench(args)
    d = bench_spec(args.preset)["model"]["n_embd"]
    for h in args.heads:
        if d % h:
            raise UserError(f"--heads {h}: n_embd={d} of preset {args.preset} is not divisible by {h}; pick head "
                            f"counts that divide {d}")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_bench(args.preset, args.attention, args.heads, args.device, args.compile, args.windows, args.steps,
                       reference=not args.no_reference, rounds=args.rounds)
    out = Path(args.json) if args.json else Path("benchmarks/results") / (
        f"{args.device}-{args.preset}{'-compiled' if args.compile else ''}-"
        f"{datetime.datetime.now().strftime('%Y-%m-%dT%H%M%S')}.json")
    write_json(out, result)
    print()
    print(table(result))
    print(f"\nwrote {out}")
    if args.markdown:
        update_benchmarks_md(Path(args.markdown), result, out)
        print(f"updated {args.markdown}")


def register(sub) -> None:
    from iattention.train.config import preset_names

    p = sub.add_parser("bench", help="training/forward tokens/s, memory, FLOPs, MFU vs standard and HF GPT-2",
                       description="Benchmark every attention variant x head count in one process, with the "
                                   "Hugging Face GPT2LMHeadModel of the same shape as reference. Writes JSON to "
                                   "benchmarks/results/ (or --json) and optionally a section of BENCHMARKS.md.")
    p.add_argument("--preset", default="cpu-study", help=f"model shape of a preset: {', '.join(preset_names())}")
    p.add_argument("--attention", type=_str_list, default=["standard", "canonical", "identity_q", "identity_ko"])
    p.add_argument("--heads", type=_int_list, default=[1, 4, 8])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--compile", action="store_true", help="torch.compile every model (fullgraph for ours)")
    p.add_argument("--windows", type=int, default=5, help="timed windows (the median is reported)")
    p.add_argument("--steps", type=int, default=3, help="steps per timed window")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all configurations")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-reference", action="store_true", help="skip the HF transformers reference")
    p.add_argument("--generate", type=int_at_least(1), default=0, metavar="N",
                   help="instead: generation speed for N new tokens, with and without the KV cache, vs HF generate")
    p.add_argument("--json", help="result file (default benchmarks/results/<device>-<preset>-<date>.json)")
    p.add_argument("--markdown", help="update this markdown file's section for the run (e.g. BENCHMARKS.md)")
    p.set_defaults(func=cmd_bench)
