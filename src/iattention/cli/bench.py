"""`iattn bench`: every variant x head count in one process, as ratios to standard and to HF GPT-2
(the runner is bench/runner.py, the tables bench/tables.py)."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch

from iattention.attention.registry import ATTENTION_REGISTRY, variant_names
from iattention.bench.generation import generation_bench
from iattention.bench.runner import bench_model, run_bench
from iattention.bench.tables import bench_label, generation_table, replace_section, table, update_benchmarks_md
from iattention.cli.args import check_heads, heads_or_default, int_at_least, ints, out_file, own_kv_heads, str_list
from iattention.config import preset_names
from iattention.config.run import COMPILE_MODES, COMPILE_SCOPES, MAX_THREADS
from iattention.errors import UserError
from iattention.kernels import ATTN_KERNELS
from iattention.utils.atomic import write_json
from iattention.utils.hardware import device_name

HEADS = (1, 4, 8)  # --heads' default
DEFAULT_DIR = "runs/bench"  # where a result goes without --json: never the repository's tracked files


def cmd_generation_bench(args) -> None:

    if args.compile:
        raise UserError("--compile is not used by --generate (generation runs eager); leave out --compile")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = generation_bench(args.preset, args.attention, args.heads, args.generate, rounds=args.rounds,
                            reference=not args.no_reference, device=args.device, attn_kernel=args.attn_kernel,
                            overrides=args.overrides)
    result = dict(kind="generation", preset=args.preset, overrides=args.overrides, device=args.device,
                  device_name=device_name(torch.device(args.device)), attn_kernel_setting=args.attn_kernel,
                  torch=torch.__version__, threads=torch.get_num_threads(), rounds=args.rounds,
                  date=datetime.date.today().isoformat(), command=" ".join(["iattn", *sys.argv[1:]]), rows=rows)
    out = Path(args.json) if args.json else Path(DEFAULT_DIR) / (
        f"{args.device}-{args.preset}-generate{'' if args.attn_kernel == 'auto' else '-' + args.attn_kernel}-"
        f"{datetime.datetime.now().strftime('%Y-%m-%dT%H%M%S')}.json")
    write_json(out, result)
    print()
    print(generation_table(rows))
    print(f"\nwrote {out}")
    if args.markdown:
        name = bench_label(args.preset, args.overrides)
        marker = f"<!-- bench:generate:{name} -->"
        section = (f"{marker}\n## Generation on {result['device_name']} ({name}, {result['date']})\n\n"
                   f"Command: `{result['command']}` — raw numbers: `{out}`. Greedy decoding, batch 1, a "
                   f"{rows[0]['prompt_tokens']}-token random prompt, {args.generate} new tokens, random-init "
                   f"weights; median over {args.rounds} interleaved rounds.\n\n{generation_table(rows)}\n")
        replace_section(Path(args.markdown), marker, section)
        print(f"updated {args.markdown}")


def cmd_bench(args) -> None:

    shape = bench_model(args.preset, args.overrides)  # the preset's model with KEY=VALUE overrides
    if not args.attention:  # every variant this shape has a form for (identity_q needs G = H, ...)
        args.attention = [v for v in variant_names() if ATTENTION_REGISTRY[v].unsupported(shape) is None]
    bad = [a for a in args.attention if a not in variant_names()]
    if bad:
        raise UserError(f"unknown attention {bad[0]!r}; choose from {', '.join(variant_names())}")
    if "standard" not in args.attention:
        args.attention = ["standard", *args.attention]
    if not args.compile and (args.compile_scope != "model" or args.compile_mode != "default"):
        raise UserError("--compile-scope and --compile-mode say how --compile compiles; add --compile, or leave them "
                        "out")
    args.heads = heads_or_default(args.heads, HEADS, shape)
    check_heads(args.heads, shape.n_embd, args.preset, own_kv_heads(shape))
    if args.generate:
        return cmd_generation_bench(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_bench(args.preset, args.attention, args.heads, args.device, args.compile, args.windows, args.steps,
                       reference=not args.no_reference, rounds=args.rounds, attn_kernel=args.attn_kernel,
                       loss_chunk=args.loss_chunk, compile_scope=args.compile_scope,
                       compile_mode=args.compile_mode, overrides=args.overrides)
    out = Path(args.json) if args.json else Path(DEFAULT_DIR) / (
        f"{args.device}-{args.preset}{'-compiled' if args.compile else ''}"
        f"{'-blocks' if args.compile and args.compile_scope == 'blocks' else ''}"
        f"{'-' + args.compile_mode if args.compile and args.compile_mode != 'default' else ''}"
        f"{'' if args.attn_kernel == 'auto' else '-' + args.attn_kernel}"
        f"{f'-loss{args.loss_chunk}' if args.loss_chunk else ''}-"
        f"{datetime.datetime.now().strftime('%Y-%m-%dT%H%M%S')}.json")
    write_json(out, result)
    print()
    print(table(result))
    print(f"\nwrote {out}")
    if args.markdown:
        update_benchmarks_md(Path(args.markdown), result, out)
        print(f"updated {args.markdown}")


def register(sub) -> None:

    p = sub.add_parser("bench", help="training/forward tokens/s, memory, FLOPs, MFU vs standard and HF GPT-2",
                       description="Benchmark every attention variant x head count in one process, with the "
                                   "Hugging Face GPT2LMHeadModel of the same shape as reference. Writes JSON to "
                                   f"{DEFAULT_DIR}/ (or --json: the repository's record is benchmarks/results/) and "
                                   "optionally a section of BENCHMARKS.md.")
    p.add_argument("--preset", default="cpu-study", help=f"model shape of a preset: {', '.join(preset_names())}")
    p.add_argument("--attention", type=str_list, default=None,
                   help="comma-separated variants (default: every registered one)")
    p.add_argument("--heads", type=ints, default=None,
                   help=f"comma-separated head counts (default {','.join(map(str, HEADS))}; for a preset with its own "
                        "key/value heads, those of them its n_kv_head divides)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--compile", action="store_true", help="torch.compile every model (fullgraph for ours)")
    p.add_argument("--compile-scope", default="model", choices=COMPILE_SCOPES,
                   help="with --compile: the whole model, or each block and the head on their own (regional "
                        "compilation: a fraction of the compile time; train.compile_scope)")
    p.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                   help="with --compile: torch.compile's mode (reduce-overhead: CUDA graphs; train.compile_mode)")
    p.add_argument("--windows", type=int_at_least(1), default=5, help="timed windows (the median is reported)")
    p.add_argument("--steps", type=int_at_least(1), default=3, help="steps per timed window")
    p.add_argument("--rounds", type=int_at_least(1), default=3, help="interleaved rounds over all configurations")
    p.add_argument("--threads", type=int_at_least(0, MAX_THREADS), default=0,
                   help="torch CPU threads (default: torch's choice)")
    p.add_argument("--attn-kernel", default="auto", choices=ATTN_KERNELS,
                   help="attention kernel of our models (model.attn_kernel; each row records the one it ran)")
    p.add_argument("--no-reference", action="store_true", help="skip the HF transformers reference")
    p.add_argument("--loss-chunk", type=int_at_least(0), default=0, metavar="N",
                   help="our models' training loss N positions at a time, never all the logits (train.loss_chunk; "
                        "0: all at once)")
    p.add_argument("--generate", type=int_at_least(1), default=0, metavar="N",
                   help="instead: generation speed for N new tokens, with and without the KV cache, vs HF generate "
                        "(on --device, our models with --attn-kernel; --compile is refused)")
    p.add_argument("--json", type=out_file,
                   help=f"result file (default {DEFAULT_DIR}/<device>-<preset>-<date>.json: beside the runs, "
                        "not in the tracked benchmarks/results/)")
    p.add_argument("--markdown", type=out_file,
                   help="update this markdown file's section for the run (e.g. BENCHMARKS.md)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="config overrides of the preset's model, as iattn train takes them (e.g. model.family=gpt_neox "
                        "model.rot=4 to bench another family at the preset's size)")
    p.set_defaults(func=cmd_bench)
