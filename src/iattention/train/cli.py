"""`iattn train` and `iattn eval`."""

from __future__ import annotations

import json
import os

from iattention.cli import int_at_least
from iattention.errors import UserError


def add_data_flags(p) -> None:
    p.add_argument("--data-dir", help="folder with WikiText-2 files (default: $IATTN_DATA_DIR, else download)")
    p.add_argument("--tokenizer-file", help="local r50k_base.tiktoken for the gpt2 tokenizer "
                                            "(default: $IATTN_TOKENIZER_FILE or DATA_DIR/tokenizers/)")


def data_overrides(args) -> list[str]:
    out = []
    if getattr(args, "data_dir", None):
        out.append(f"data.data_dir={os.path.abspath(args.data_dir)}")
    if getattr(args, "tokenizer_file", None):
        out.append(f"data.tokenizer_file={os.path.abspath(args.tokenizer_file)}")
    return out


def cmd_train(args) -> None:
    from iattention.train import load_config, train

    if not args.preset and not args.config:
        raise UserError("give --preset NAME or --config FILE.yaml (see `iattn train --help` for presets)")
    cfg = load_config(args.preset, args.config, list(args.overrides) + data_overrides(args))
    summary = train(cfg, args.out, resume=args.resume, quiet=args.quiet)
    print(f"{summary['attention']} h={summary['n_head']}: params {summary['params']:,}  best val ppl "
          f"{summary['best_val_ppl']:.2f} (epoch {summary['best_epoch']})  test ppl {summary['test_ppl']:.2f}  "
          f"{summary['train_tokens_per_s']:.0f} tok/s  -> {args.out}/summary.json")


def cmd_eval(args) -> None:
    from iattention.data import DataConfig, load_data
    from iattention.interop.load import load_model
    from iattention.train.distributed import DistContext
    from iattention.train.evaluate import perplexity, split_nll

    model, meta = load_model(args.checkpoint)
    block = args.block_size or model.config.block_size
    if block > model.config.block_size:
        raise UserError(f"--block-size {block} is larger than the model's block_size {model.config.block_size}; "
                        f"use at most {model.config.block_size}")
    run_data = dict(meta.get("config", {}).get("data") or {})
    cut_key = {"train": "train_tokens", "valid": "valid_tokens"}.get(args.split)
    cut = int(run_data.get(cut_key) or 0) if cut_key else 0
    if args.full and cut_key:
        run_data[cut_key] = 0
    data_cfg = DataConfig(**{**run_data,
                             **({"data_dir": os.path.abspath(args.data_dir)} if args.data_dir else {}),
                             **({"tokenizer_file": args.tokenizer_file} if args.tokenizer_file else {})})
    data = load_data(data_cfg, splits=(args.split,))
    if data.vocab_size > model.config.vocab_size:
        raise UserError(f"tokenizer has {data.vocab_size} tokens, more than the model's {model.config.vocab_size}; "
                        "use the tokenizer the model was trained with")
    nll, n = split_nll(model, data.splits[args.split], block, args.batch_size, DistContext())
    part = (f"the first {cut:,} tokens of the {args.split} split (the run's data.{cut_key}; --full for all of it)"
            if cut and not args.full else f"the whole {args.split} split")
    result = dict(checkpoint=args.checkpoint, split=args.split, portion="prefix" if cut and not args.full else "whole",
                  tokens=n, block_size=block, protocol="non-overlapping windows", loss=nll / n, ppl=perplexity(nll, n))
    print(json.dumps(result) if args.json else
          f"{args.split} perplexity {result['ppl']:.3f} over {n:,} predicted tokens: {part}, non-overlapping "
          f"windows of {block}")


def register(sub) -> None:
    from iattention.train.config import preset_names

    p = sub.add_parser("train", help="train one model (a run folder with metrics, checkpoints, summary)",
                       description="Train a GPT with the chosen attention variant. Configuration: a preset, then "
                                   "an optional YAML file, then SECTION.KEY=VALUE overrides (sections: model, "
                                   "data, optim, train). Example: iattn train --preset cpu-quick "
                                   "model.attention=canonical model.n_head=1 --out runs/c1")
    p.add_argument("--preset", help=f"one of: {', '.join(preset_names())}")
    p.add_argument("--config", help="YAML file with sections model/data/optim/train")
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")
    add_data_flags(p)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. optim.lr=1e-3 model.n_head=4")
    p.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="perplexity of a checkpoint on a split",
                       description="Evaluate a checkpoint (run folder's best.safetensors/last.safetensors) on a "
                                   "data split, in non-overlapping windows.")
    e.add_argument("checkpoint", help="an iattention .safetensors checkpoint")
    e.add_argument("--split", default="test", choices=("train", "valid", "test"))
    e.add_argument("--block-size", type=int_at_least(1), default=None,
                   help="window length (default: the model's block_size)")
    e.add_argument("--batch-size", type=int_at_least(1), default=16)
    e.add_argument("--full", action="store_true",
                   help="evaluate the whole split even if the run trained on a prefix (data.train_tokens / "
                        "data.valid_tokens); the test split is always whole")
    e.add_argument("--json", action="store_true")
    add_data_flags(e)
    e.set_defaults(func=cmd_eval)
