"""`iattn eval`: perplexity of a model on a split or a text file (per token, per word, per byte)."""

from __future__ import annotations

import json

from iattention.cli.args import add_data_flags, int_at_least
from iattention.data import load_data
from iattention.data.dataset import check_eval_split, scored_text, tokenizer_of
from iattention.data.sources import data_dir_told, read_text_file
from iattention.errors import UserError
from iattention.interop.load import check_tokenizer, check_vocab, data_config_for, kept_tokenizer, load_any
from iattention.train.distributed import DistContext
from iattention.train.evaluate import per_unit, perplexity, split_nll, strided_nll


def cmd_eval(args) -> None:

    model, run_data, meta = load_any(args.checkpoint)
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
        raw = read_text_file(args.text, "--text")
        tok = kept or tokenizer_of(data_cfg)
        tokens, cut_key, cut = tok.encode(raw), None, 0
        if len(tokens) < 2:  # a BOS the tokenizer puts before the text is not the text's
            n = len(tokens) - (tok.bos is not None and len(tokens) > 0 and int(tokens[0]) == tok.bos)
            raise UserError(f"--text {args.text} is {n} token{'s' if n != 1 else ''} long; give a text of at least "
                            "2 tokens")
        tokenizer = tok
    else:
        cut_key = {"train": "train_tokens", "valid": "valid_tokens"}.get(args.split)
        cut = getattr(data_cfg, cut_key) if cut_key else 0
        if args.full and cut_key:
            setattr(data_cfg, cut_key, 0)
            cut = 0
        data = load_data(data_cfg, splits=(args.split,), tokenizer=kept)
        tokens, tokenizer = data.splits[args.split], data.tokenizer
    check_tokenizer(tokenizer, meta, run_data, args.checkpoint, args.tokenizer)
    check_vocab(tokenizer, model, "--tokenizer")
    what = "text" if args.text else args.split
    check_eval_split(tokens, what, block, "give a longer text file or pass a smaller --block-size" if args.text else
                     "evaluate a longer split (--full for the whole of a cut one) or pass a smaller --block-size")
    if args.stride:
        nll, n = strided_nll(model, tokens, block, args.stride, args.batch_size,
                             progress=f"eval {what} (stride {args.stride})")
        protocol = f"sliding windows of {block} tokens every {args.stride} (transformers' strided perplexity)"
    else:
        nll, n = split_nll(model, tokens, block, args.batch_size, DistContext(), progress=f"eval {what}")
        protocol = f"non-overlapping windows of {block} tokens"
    part = (f"the first {cut:,} tokens of the {args.split} split (the run's data.{cut_key}; --full for all of it)"
            if cut else f"the whole {args.split} split ({len(tokens):,} tokens)")
    if args.text:
        part = f"the text file {args.text} ({len(tokens):,} tokens)"
    # Per word and per byte (lm-eval's tokenizer-free metrics) of the text the tokens predict: tokens[1:].
    # Only when every one of them was scored (not with --stride equal to the window, which skips some).
    text = scored_text(tokenizer, tokens, raw if args.text else None)
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
           f" (no per-word or per-byte figures: the {tokenizer.name} tokenizer does not give back the exact bytes of "
           "this text)" if text.tokens and not text.bytes else
           f" (no per-word or per-byte figures: this protocol scores {n:,} of the {text.tokens:,} tokens after the "
           "first)")
    print(json.dumps(result) if args.json else
          f"{what} perplexity {result['ppl']:.3f} over {n:,} predicted tokens{per}: {part}, "
          f"{data_cfg.tokenizer} tokenizer, {protocol}")


def register(sub) -> None:
    e = sub.add_parser("eval", help="perplexity of a checkpoint or Hugging Face model folder on a split or text",
                       description="Evaluate a model (a run folder, a .safetensors checkpoint, a converted folder or "
                                   "a Hugging Face model folder) on a data split or a text file with the tokenizer it "
                                   "was trained with (an HF folder's own tokenizer.json): non-overlapping windows by "
                                   "default, or --stride S sliding windows.")
    e.add_argument("checkpoint", help="run folder, .safetensors checkpoint, converted folder or HF model folder "
                                      "(GPT-2, Llama, Qwen2, Mistral, GPT-NeoX)")
    e.add_argument("--stride", type=int_at_least(1), default=None,
                   help="sliding-window perplexity (the transformers guide's protocol): windows every S tokens")
    e.add_argument("--tokenizer", help="override the model's tokenizer spec (gpt2, byte, bpe:N, hf:FOLDER)")
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
