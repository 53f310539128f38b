"""`iattn train`."""

from __future__ import annotations

from iattention.checkpoint.run_folder import RunFolder
from iattention.cli.args import add_data_flags, out_path, with_flags
from iattention.config import BUDGET_KEYS, preset_names
from iattention.errors import UserError
from iattention.train import load_config, train
from iattention.train.init_from import with_init_tokenizer


def cmd_train(args) -> None:

    overrides = list(args.overrides)
    _one_budget(overrides)
    saved = RunFolder(args.out).read_config() if args.resume else None
    if not args.preset and not args.config and saved is None:
        raise UserError("give --preset NAME or --config FILE.yaml (see `iattn train --help` for presets)" +
                        (f"; {args.out} holds no run to resume" if args.resume else ""))
    if saved is not None:
        # --resume continues the run's own schedule: a preset's epochs never extend it; train.epochs=N, or a
        # budget (train.max_steps=N, train.max_tokens=N), does, and the budget given is then the one that holds.
        given = {o.split("=", 1)[0].strip() for o in overrides} & {f"train.{k}" for k in BUDGET_KEYS}
        run = saved.get("train") or {}
        for key in BUDGET_KEYS:
            if f"train.{key}" not in given:
                keep = key == "epochs" or not given
                overrides.append(f"train.{key}={run.get(key, 1 if key == 'epochs' else 0) if keep else 0}")
    cfg = with_flags(load_config(args.preset, args.config, overrides, base=saved), args)
    # an HF folder's own tokenizer, recorded in the run's config as hf:FOLDER; derived again on --resume, where a
    # preset given again would otherwise put its default tokenizer back
    cfg = with_init_tokenizer(cfg, args.config, overrides)
    summary = train(cfg, args.out, resume=args.resume, quiet=args.quiet)
    test = ("no test (train.final_test=false)" if summary["test_ppl"] is None else
            f"test ppl {summary['test_ppl']:.2f}")
    print(f"{summary['attention']} h={summary['n_head']}: params {summary['params']:,}  best val ppl "
          f"{summary['best_val_ppl']:.2f} (epoch {summary['best_epoch']})  {test}  "
          f"{summary['train_tokens_per_s']:.0f} tok/s  -> {args.out}/summary.json")


def _one_budget(overrides: list[str]) -> None:
    """train.epochs given together with a step or token budget on one command line: refused, since one of them
    would be ignored. (A preset's or YAML file's train.epochs is replaced by a budget given, docs/training.md.)"""
    given = {}
    for o in overrides:
        key, _, value = o.partition("=")
        if key.strip() in {f"train.{k}" for k in BUDGET_KEYS}:
            given[key.strip()] = value.strip()
    budgets = [f"{k}={v}" for k, v in given.items() if k != "train.epochs" and v not in ("0", "")]
    if "train.epochs" in given and budgets:
        raise UserError(f"train.epochs={given['train.epochs']} and {budgets[0]} are two lengths for one run (a budget "
                        f"in steps or tokens replaces train.epochs); give one")


def register(sub) -> None:

    p = sub.add_parser("train", help="train one model (a run folder with metrics, checkpoints, summary)",
                       description="Train a GPT with the chosen attention variant. Configuration: a preset, then "
                                   "an optional YAML file, then SECTION.KEY=VALUE overrides (sections: model, "
                                   "data, optim, train). Example: iattn train --preset cpu-quick "
                                   "model.attention=canonical model.n_head=1 --out runs/c1")
    p.add_argument("--preset", help=f"one of: {', '.join(preset_names())}")
    p.add_argument("--config", help="YAML file with sections model/data/optim/train")
    p.add_argument("--out", type=out_path, required=True, help="run folder")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last checkpoint, with the run's saved config (--preset "
                        "is then optional; a preset's train.epochs never extends the run); an explicit larger "
                        "train.epochs=N, train.max_steps=N or train.max_tokens=N extends a finished run (the "
                        "schedule is recomputed over the new total)")
    p.add_argument("--init-from", metavar="PATH",
                   help="start from these weights (run folder, checkpoint, converted or HF GPT-2 folder; for "
                        "another model.family a run of that family, a folder iattn convert made from an HF model "
                        "of it, or the HF folder itself, whose own tokenizer.json then tokenizes the run's data "
                        "unless data.tokenizer= is given); with model.attention=canonical they are canonicalized "
                        "exactly (pivoted blocks)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")
    add_data_flags(p)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. optim.lr=1e-3 model.n_head=4")
    p.set_defaults(func=cmd_train)
