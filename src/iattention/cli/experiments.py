"""`iattn compare`, `iattn sweep` and `iattn report`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from iattention.attention.registry import variant_names
from iattention.cli.args import (
    add_data_flags,
    check_heads,
    check_out_folder,
    data_overrides,
    heads_or_default,
    int_at_least,
    int_list,
    ints,
    out_file,
    out_path,
    own_kv_heads,
    str_list,
    with_flags,
)
from iattention.config import preset_names, read_yaml_mapping
from iattention.config.run import MAX_THREADS
from iattention.errors import UserError
from iattention.experiments.arms import BUILTIN_ARMS, check_overrides, resolve_arms
from iattention.experiments.conditioning import run
from iattention.experiments.scales import measure
from iattention.experiments.sweep import grid, run_sweep
from iattention.train import load_config
from iattention.utils.atomic import write_text


def _specs(args):
    """The grid: --arms (built-in or --arms-file names) or, the older form, --attention variants."""

    if args.arms and args.attention:
        raise UserError("give --arms or --attention, not both (an attention variant is also a built-in arm)")
    if args.arms_file and not args.arms:
        raise UserError("--arms-file defines arms; also say which to run with --arms NAME,NAME")
    if args.attention:
        bad = [a for a in args.attention if a not in variant_names()]
        if bad:
            raise UserError(f"unknown attention {bad[0]!r}; choose from {', '.join(variant_names())}")
    arms = resolve_arms(args.arms or args.attention or ["standard", "canonical"], args.arms_file)
    check_overrides(list(args.overrides), arms)
    return grid(arms, args.heads, args.seeds)


def _check_heads(args):

    model = load_config(args.preset, None, list(args.overrides)).model
    args.heads = heads_or_default(args.heads, args.heads_default, model)
    check_heads(args.heads, model.n_embd, args.preset, own_kv_heads(model))


def cmd_compare(args) -> None:

    _check_heads(args)
    summaries = run_sweep(args.preset, _specs(args), args.out, list(args.overrides) + data_overrides(args),
                          jobs=args.jobs, quiet=True, threads=args.threads)
    print_summary_table(summaries, args.out)


def print_summary_table(summaries: list[dict], out) -> None:
    """The table `compare` and `sweep` end with: one line per run of the grid."""
    print()
    running = [s for s in summaries if "params" not in s]
    summaries = [s for s in summaries if "params" in s]
    for s in running:
        print(f"{s['_arm']}: {s['_status']}; not in the table")
    if not summaries:
        return
    width = max(11, *(len(s["_arm"]) for s in summaries))
    print(f"{'arm':<{width}} {'heads':>5} {'seed':>4} {'params':>11} {'best val ppl':>12} {'epoch of best':>13} "
          f"{'test ppl':>9} {'tok/s':>7}")
    for s in summaries:
        test = "not run" if s.get("test_ppl") is None else f"{s['test_ppl']:.2f}"  # train.final_test=false
        print(f"{s['_arm']:<{width}} {s['n_head']:>5} {s['seed']:>4} {s['params']:>11,} {s['best_val_ppl']:>12.2f} "
              f"{s['best_epoch']:>13} {test:>9} {s['train_tokens_per_s']:>7.0f}")
    tb = ", tb/" if any(s["config"]["train"].get("tensorboard") for s in summaries) else ""
    print(f"\nrun folders: {out}/<arm>-h<heads>-s<seed>/ (metrics.jsonl, summary.json{tb})")


def cmd_report(args) -> None:

    check_out_folder(args.out)
    added = read_added_seeds(args.added) if args.added else {}
    if args.declared and not os.path.isfile(args.declared):
        raise UserError(f"--declared {args.declared}: no such file; name the plan (e.g. results/STUDY/PLAN.md) that "
                        "declared the margin and family before the runs, or leave --declared out")
    from iattention.experiments.report import write_report  # lazy: matplotlib, only for reports
    path = write_report(args.dirs, args.out, title=args.title, reference=args.reference, margin_pct=args.margin,
                        added=added, family=args.family, declared=args.declared, select=args.arms)
    print(f"wrote {path}")


def read_added_seeds(path: str) -> dict:
    """A YAML mapping `arm: {heads: [seeds]}` of seeds added after a result (comments say which)."""

    raw = read_yaml_mapping(path, "added-seeds file", "map arm names to {heads: [seeds]}, e.g. standard: {1: [3, 4]}")
    for arm, by_heads in raw.items():
        ok = isinstance(by_heads, dict) and all(
            isinstance(h, int) and isinstance(seeds, list) and all(isinstance(x, int) for x in seeds)
            for h, seeds in by_heads.items())
        if not ok:
            raise UserError(f"added-seeds file {path}: arm {arm!r} must map head counts to lists of seeds, "
                            "e.g. standard: {1: [3, 4]}")
    return raw


def _grid_flags(p, heads_default, seeds_default) -> None:
    """The flags compare and sweep share: the grid (arms x heads x seeds), where it goes, data."""
    p.add_argument("--preset", default="cpu-quick", help=f"one of: {', '.join(preset_names())}")
    p.add_argument("--arms", type=str_list, default=None,
                   help=f"comma-separated arms: built-in ({', '.join(BUILTIN_ARMS)}) or defined in "
                        "--arms-file (default: standard,canonical)")
    p.add_argument("--arms-file", help="YAML file: arm name -> list of KEY=VALUE overrides")
    p.add_argument("--attention", type=str_list, default=None,
                   help="older form of --arms: comma-separated attention variants")
    p.add_argument("--heads", type=ints, default=None,
                   help=f"comma-separated head counts (default: {','.join(map(str, heads_default))}; for a Llama "
                        "preset those its n_kv_head divides)")
    p.set_defaults(heads_default=heads_default)
    p.add_argument("--seeds", type=int_list(0), default=seeds_default,
                   help="comma-separated seeds")
    p.add_argument("--out", type=out_path, required=True,
                   help="folder that receives one run folder per combination")
    p.add_argument("--jobs", type=int_at_least(1), default=1, help="runs in parallel (each then uses 1 CPU thread)")
    p.add_argument("--threads", type=int_at_least(0, MAX_THREADS), default=0,
                   help="CPU threads per run (default: torch's choice)")
    add_data_flags(p)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for every run")


def _add_compare(sub) -> None:
    c = sub.add_parser("compare", help="quick standard vs canonical comparison with a table",
                       description="Train each attention variant once (same seed, same data) and print a table "
                                   "of parameters, best validation perplexity and epoch of best.")
    _grid_flags(c, [4], [0])
    c.set_defaults(func=cmd_compare)


def _add_sweep(sub) -> None:
    s = sub.add_parser("sweep", help="run an experiment grid (resumable)",
                       description="Run every arm x heads x seeds combination as its own run folder "
                                   "<arm>-h<heads>-s<seed>. "
                                   "Finished runs are skipped, interrupted ones resume; run subsets anywhere and "
                                   "merge them with `iattn report`.")
    _grid_flags(s, [1, 2, 4, 8], [0, 1, 2])
    s.add_argument("--launcher", choices=("local", "submitit"), default="local",
                   help="local: runs train in child processes here (default); submitit: each run is a job through "
                        "submitit (SLURM where sbatch exists, else its local executor), logs in <out>/submitit/")
    s.add_argument("--slurm-partition", default=None, help="with --launcher submitit: the SLURM partition")
    s.add_argument("--slurm-time", type=int_at_least(1), default=24 * 60, metavar="MIN",
                   help="with --launcher submitit: a job's time limit in minutes (default 1440)")
    s.add_argument("--gpus-per-run", type=int_at_least(0), default=0,
                   help="with --launcher submitit: GPUs each run's job asks for (default 0)")
    s.set_defaults(func=cmd_sweep)


def _add_scales(sub) -> None:
    sc = sub.add_parser("scales", help="attention weight RMS at step 0 and AdamW update sizes, per arm",
                        description="Train each arm for a few steps (the trainer's data order, schedule and optimizer "
                                    "groups) and print, per attention weight kind, the RMS of its entries at step 0 "
                                    "and the RMS of one step's change.")
    sc.add_argument("--preset", default="cpu-study", help=f"one of: {', '.join(preset_names())}")
    sc.add_argument("--arms", type=str_list, default=["standard", "canonical", "canonical-matched"])
    sc.add_argument("--arms-file", help="YAML file: arm name -> list of KEY=VALUE overrides")
    sc.add_argument("--heads", type=ints, default=None,
                    help="comma-separated head counts to measure (default: the preset's n_head)")
    sc.add_argument("--seed", type=int_at_least(0), default=0,
                    help="seed of the initialisation and batches (default 0)")
    sc.add_argument("--steps", type=int_at_least(1), default=20,
                    help="AdamW steps whose update sizes are averaged (default 20)")
    sc.add_argument("--out", type=out_file, help="write a markdown table here (and the numbers as .json beside it)")
    add_data_flags(sc)
    sc.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    sc.set_defaults(func=cmd_scales)


def _add_report(sub) -> None:
    r = sub.add_parser("report", help="report.md and figures from sweep folders",
                       description="Write report.md and PNG figures from run folders (metrics.jsonl, "
                                   "summary.json); several sweep folders are merged.")
    r.add_argument("dirs", nargs="+", help="sweep folders (or run folders)")
    r.add_argument("--out", type=out_path, required=True, help="folder for report.md and figures")
    r.add_argument("--title", default="I-Attention study")
    r.add_argument("--reference", default="standard", help="arm every other arm is compared with (default: standard)")
    r.add_argument("--margin", type=float, default=None, metavar="PCT",
                   help="equivalence margin, %% of the reference's mean best validation perplexity (default: 2); "
                        "declare it before the runs")
    r.add_argument("--declared", metavar="PLAN",
                   help="the plan file (e.g. results/STUDY/PLAN.md) that declared the margin and family before the "
                        "runs; without it the report does not call them declared")
    r.add_argument("--arms", type=str_list, default=None, metavar="A,B,...",
                   help="report only these arms (and the reference, always): tables and figures; default: every arm "
                        "found")
    r.add_argument("--family", type=str_list, default=None, metavar="ARMS",
                   help="arms whose comparisons form the Holm-corrected verdict family (default: every arm); "
                        "the others are reported unadjusted, as exploratory")
    r.add_argument("--added", metavar="FILE",
                   help="YAML {arm: {heads: [seeds]}}: seeds added after a result; their comparisons are also given "
                        "on the pre-declared seeds alone")
    r.set_defaults(func=cmd_report)


def _add_conditioning(sub) -> None:
    k = sub.add_parser("conditioning", help="condition numbers of the fixed blocks and what canonicalizing costs "
                                            "in float32/bfloat16",
                       description="Conditioning study (docs/conversion.md): for a model trained here "
                                   "(--checkpoint) and/or (--gpt2, the default without --checkpoint) a "
                                   "GPT-2-small-shaped model with transformers' init, the condition "
                                   "numbers of every head's (KV group's) key and output blocks, aligned and "
                                   "pivoted (with rotary dims: the key's pass block and the rotary pairs' smallest "
                                   "pivot ratio), and the test perplexity before and after canonicalizing, in "
                                   "float32 and bfloat16. Needs transformers and WikiText-2.")
    k.add_argument("--checkpoint", help="an iattention checkpoint trained by our pipeline")
    k.add_argument("--data-dir", default=None, help="folder holding wikitext-2-v1 (default: the hub)")
    k.add_argument("--gpt2", action="store_true",
                   help="also study a GPT-2-small-shaped model at transformers' init (minutes on a CPU; "
                        "always done when no --checkpoint is given)")
    k.add_argument("--gpt2-tokens", type=int_at_least(1), default=8192,
                   help="WikiText-2 test tokens for the GPT-2-small model")
    k.add_argument("--json", type=out_file, help="write the results here")
    k.set_defaults(func=cmd_conditioning)


def register(sub) -> None:
    _add_compare(sub)
    _add_sweep(sub)
    _add_scales(sub)
    _add_report(sub)
    _add_conditioning(sub)


def cmd_conditioning(args) -> None:

    run(args)


def cmd_scales(args) -> None:
    if args.out:  # a markdown file (a folder is refused by out_file): refused now if it lies under a file
        check_out_folder(Path(args.out).absolute().parent)
    arms = resolve_arms(args.arms, args.arms_file)
    check_overrides(list(args.overrides), arms)
    rows = []
    model = load_config(args.preset, None, list(args.overrides)).model
    heads = args.heads or [model.n_head]
    for h in heads:
        for arm in arms:
            cfg = with_flags(load_config(args.preset, None, [*arm.overrides, f"model.n_head={h}",
                                                             f"train.seed={args.seed}", *args.overrides]), args)
            for kind, m in measure(cfg, args.steps).items():
                rows.append(dict(arm=arm.name, n_head=h, kind=kind, **m))
                print(f"{arm.name:<22} h={h:<2} {kind:<9} rms0 {m['rms0']:.4f}  update {m['update']:.2e}  "
                      f"update/rms0 {m['relative']:.2e}  decay {m['weight_decay']:g}  lr x{m['lr_scale']:.3g}",
                      flush=True)
    if args.out:
        lines = [f"Attention weight scales, `iattn scales --preset {args.preset} --steps {args.steps} --seed "
                 f"{args.seed}` (arms {', '.join(a.name for a in arms)}): RMS of the entries at step 0, RMS of one "
                 f"AdamW step's change averaged over the first {args.steps} steps, and their ratio (layers pooled); "
                 "the weight decay and learning-rate multiplier the optimizer applies to each.",
                 "",
                 "| arm | heads | weights | RMS at step 0 | update RMS | update / RMS | weight decay | lr × |",
                 "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['arm']} | {r['n_head']} | {r['kind']} | {r['rms0']:.4f} | {r['update']:.2e} | "
                  f"{r['relative']:.2e} | {r['weight_decay']:g} | {r['lr_scale']:.3g} |" for r in rows]
        write_text(args.out, "\n".join(lines) + "\n")
        write_text(json_beside(args.out), json.dumps(rows, indent=1))
        print(f"wrote {args.out}")


def json_beside(markdown) -> Path:
    """The JSON file beside a markdown table: its name with the suffix .json (`results.v2/table` ->
    `results.v2/table.json`, `table.md` -> `table.json`); never the table itself (`t.json` -> `t.json.json`)."""
    md = Path(markdown)
    out = md.with_suffix(".json") if md.suffix else md.with_name(md.name + ".json")
    return md.with_name(md.name + ".json") if out == md else out


def cmd_sweep(args) -> None:

    _check_heads(args)
    specs = _specs(args)
    launcher = None
    if args.launcher == "submitit":
        launcher = dict(slurm_partition=args.slurm_partition, slurm_time_min=args.slurm_time,
                        gpus_per_run=args.gpus_per_run)
    elif args.slurm_partition or args.gpus_per_run or args.slurm_time != 24 * 60:
        raise UserError("--slurm-partition, --slurm-time and --gpus-per-run go with --launcher submitit; add it")
    # with submitit, every run is queued at once unless --jobs says otherwise (the cluster schedules them)
    jobs = args.jobs if args.launcher == "local" or args.jobs > 1 else len(specs)
    summaries = run_sweep(args.preset, specs, args.out, list(args.overrides) + data_overrides(args), jobs=jobs,
                          threads=args.threads, launcher=launcher)
    print_summary_table(summaries, args.out)
    print(f"make the report with: iattn report {args.out} --out {args.out}/report")
