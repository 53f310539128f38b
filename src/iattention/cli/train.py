"""`iattn train` and `iattn eval`."""

from __future__ import annotations

import json

from iattention.cli.args import add_data_flags, int_at_least, out_path, with_flags
from iattention.errors import UserError


def cmd_train(args) -> None:
    from iattention.checkpoint.run_folder import RunFolder
    from iattention.train import load_config, train

    overrides = list(args.overrides)
    saved = RunFolder(args.out).read_config() if args.resume else None
    if not args.preset and not args.config and saved is None:
        raise UserError("give --preset NAME or --config FILE.yaml (see `iattn train --help` for presets)" +
                        (f"; {args.out} holds no run to resume" if args.resume else ""))
    if saved is not None and "train.epochs" not in {o.split("=", 1)[0].strip() for o in overrides}:
        # --resume continues the run's own schedule: a preset's epochs never extend it; train.epochs=N does.
        overrides.append(f"train.epochs={(saved.get('train') or {}).get('epochs', 1)}")
    cfg = with_flags(load_config(args.preset, args.config, overrides, base=saved), args)
    summary = train(cfg, args.out, resume=args.resume, quiet=args.quiet)
    print(f"{summary['attention']} h={summary['n_head']}: params {summary['params']:,}  best val ppl "
          f"{summary['best_val_ppl']:.2f} (epoch {summary['best_epoch']})  test ppl {summary['test_ppl']:.2f}  "
          f"{summary['train_tokens_per_s']:.0f} tok/s  -> {args.out}/summary.json")


def cmd_eval(args) -> None:
    from iattention.data import load_data
    from iattention.data.dataset import check_eval_split, scored_text, tokenizer_of
    from iattention.data.sources import data_dir_told, read_text_file
    from iattention.interop.load import data_config_for, kept_tokenizer, load_any
    from iattention.train.distributed import DistContext
    from iattention.train.evaluate import per_unit, perplexity, split_nll, strided_nll

    model, run_data, _ = load_any(args.checkpoint)
    block = args.block_size or model.config.block_size
    if block > model.config.block_size:
        raise UserError(f"--block-size {block} is larger than the model's block_size {model.config.block_size}; "
                        f"use at most {model.config.block_size}")
    if args.stride and args.stride > block:
        raise UserError(f"--stride {args.stride} is larger than the window ({block}); use at most {block}")
    data_cfg = data_config_for(run_data, args.checkpoint, args.tokenizer, data_dir=data_dir_told(args.data_dir),
                               tokenizer_file=args.tokenizer_file)
    kept = kept_tokenizer(args.checkpoint, run_data, args.tokenizer)  # then only the split evaluated is read
    if args.text:  # any text file, with the model's tokenizer, through the same evaluation below
        text = read_text_file(args.text, "--text")
        tok = kept or tokenizer_of(data_cfg)
        tokens, cut_key, cut = tok.encode(text), None, 0
        if len(tokens) < 2:
            raise UserError(f"--text {args.text} is {len(tokens)} token long; give a text of at least 2 tokens")
        vocab, tokenizer = tok.vocab_size, tok
    else:
        cut_key = {"train": "train_tokens", "valid": "valid_tokens"}.get(args.split)
        cut = getattr(data_cfg, cut_key) if cut_key else 0
        if args.full and cut_key:
            setattr(data_cfg, cut_key, 0)
            cut = 0
        data = load_data(data_cfg, splits=(args.split,), tokenizer=kept)
        tokens, vocab, tokenizer = data.splits[args.split], data.vocab_size, data.tokenizer
    if vocab > model.config.vocab_size:
        raise UserError(f"tokenizer {data_cfg.tokenizer} has {vocab} tokens, more than the model's "
                        f"{model.config.vocab_size}; use the tokenizer the model was trained with (--tokenizer)")
    what = "text" if args.text else args.split
    check_eval_split(tokens, what, block, "give a longer text file or pass a smaller --block-size" if args.text else
                     "evaluate a longer split (--full for the whole of a cut one) or pass a smaller --block-size")
    if args.stride:
        nll, n = strided_nll(model, tokens, block, args.stride, args.batch_size)
        protocol = f"sliding windows of {block} tokens every {args.stride} (transformers' strided perplexity)"
    else:
        nll, n = split_nll(model, tokens, block, args.batch_size, DistContext())
        protocol = f"non-overlapping windows of {block} tokens"
    part = (f"the first {cut:,} tokens of the {args.split} split (the run's data.{cut_key}; --full for all of it)"
            if cut else f"the whole {args.split} split ({len(tokens):,} tokens)")
    if args.text:
        part = f"the text file {args.text} ({len(tokens):,} tokens)"
    # Per word and per byte (lm-eval's tokenizer-free metrics) of the text the tokens predict: tokens[1:].
    # Only when every one of them was scored (not with --stride equal to the window, which skips some).
    text = scored_text(tokenizer, tokens)
    units = per_unit(nll, text, scored=n)
    result = dict(checkpoint=args.checkpoint, split=what, **({"text": args.text} if args.text else {}),
                  portion="prefix" if cut else "whole",
                  tokenizer=data_cfg.tokenizer, tokens=n, words=text.words if units else None,
                  bytes=text.bytes if units else None, block_size=block, stride=args.stride or None,
                  protocol=protocol, loss=nll / n, ppl=perplexity(nll, n),
                  word_perplexity=units and units["word_ppl"], byte_perplexity=units and units["byte_ppl"],
                  bits_per_byte=units and units["bits_per_byte"])
    per = (f"; per word {units['word_ppl']:.3f} ({text.words:,} words), per byte {units['byte_ppl']:.4f}, "
           f"{units['bits_per_byte']:.4f} bits per byte ({text.bytes:,} bytes)" if units else
           f" (no per-word or per-byte figures: this protocol scores {n:,} of the {text.tokens:,} tokens after the "
           "first)")
    print(json.dumps(result) if args.json else
          f"{what} perplexity {result['ppl']:.3f} over {n:,} predicted tokens{per}: {part}, "
          f"{data_cfg.tokenizer} tokenizer, {protocol}")


def register(sub) -> None:
    from iattention.config import preset_names

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
                        "train.epochs=N extends a finished run (the cosine schedule is recomputed over the new total)")
    p.add_argument("--init-from", metavar="PATH",
                   help="start from these weights (run folder, checkpoint, converted or HF GPT-2 folder); with "
                        "model.attention=canonical they are canonicalized exactly (pivoted blocks)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")
    add_data_flags(p)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. optim.lr=1e-3 model.n_head=4")
    p.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="perplexity of a checkpoint or Hugging Face GPT-2 folder on a split",
                       description="Evaluate a model (a run folder, a .safetensors checkpoint, a converted folder or "
                                   "a Hugging Face GPT-2 folder) on a data split with the tokenizer it was trained "
                                   "with: non-overlapping windows by default, or --stride S sliding windows.")
    e.add_argument("checkpoint", help="run folder, .safetensors checkpoint, converted folder or HF GPT-2 folder")
    e.add_argument("--stride", type=int_at_least(1), default=None,
                   help="sliding-window perplexity (the transformers guide's protocol): windows every S tokens")
    e.add_argument("--tokenizer", help="override the model's tokenizer spec (gpt2, byte, bpe:N)")
    e.add_argument("--split", default="test", choices=("train", "valid", "test"))
    e.add_argument("--text", metavar="FILE",
                   help="score this UTF-8 text file instead of a split (per-token perplexity, the model's tokenizer)")
    e.add_argument("--block-size", type=int_at_least(1), default=None,
                   help="window length (default: the model's block_size)")
    e.add_argument("--batch-size", type=int_at_least(1), default=16)
    e.add_argument("--full", action="store_true",
                   help="evaluate the whole split even if the run trained on a prefix (data.train_tokens / "
                        "data.valid_tokens); the test split is always whole")
    e.add_argument("--json", action="store_true")
    add_data_flags(e)
    e.set_defaults(func=cmd_eval)
