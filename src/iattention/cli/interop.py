"""`iattn convert`."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from iattention.checkpoint.run_folder import RunFolder
from iattention.checkpoint.state import TOKEN_IDS
from iattention.cli.args import add_data_flags, check_out_folder, out_path
from iattention.config.families import FAMILIES
from iattention.data.dataset import tokenizer_of
from iattention.data.sources import data_dir_told
from iattention.data.tokenizers import HF_SPEC, tokenizer_identity
from iattention.errors import UserError
from iattention.interop.card import card_command, source_name
from iattention.interop.convert import DTYPES, TARGETS, convert, judge, probe_batch, save_converted
from iattention.interop.folder import GENERATION, companions, generation_settings, hf_folder
from iattention.interop.hf import hf_logits
from iattention.interop.load import (
    check_tokenizer,
    data_config_for,
    kept_tokenizer,
    load_any,
    own_tokenizer_spec,
)
from iattention.interop.stream import hf_to_ours, is_streamed_source, ours_to_hf
from iattention.symmetry.blocks import BLOCKS

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """'2GB', '500MB', '1GiB' or a number of bytes -> bytes (decimal units, as save_pretrained's max_shard_size)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) * _UNITS[unit] < 1:
        raise UserError(f"--shard-size {text!r} is not a size; give e.g. 500MB or 2GB")
    return int(float(m.group(1)) * _UNITS[unit])


def cmd_convert(args) -> None:
    if Path(args.out).exists():  # before the minutes of loading and converting, not after them
        raise UserError(f"output {args.out} already exists; choose a new --out (nothing is overwritten)")
    check_out_folder(args.out)
    src_path = Path(args.src)
    shard = parse_size(args.shard_size or "2GB")
    hf_src = hf_folder(src_path)  # an HF folder's config.json, read once here and passed down
    # every family whose record says so streams (a model_type that is no family: hf_to_ours refuses it in one line)
    if args.to != "hf" and hf_src is not None and getattr(FAMILIES.get(hf_src.model_type), "streamed", True):
        hf_to_ours(hf_src, args.out, args.to, block=args.block, dtype=args.dtype, shard_bytes=shard,
                   force=args.force, per_head=args.per_head)
        return
    if args.to == "hf" and hf_src is None and is_streamed_source(src_path):
        ours_to_hf(src_path, args.out, dtype=args.dtype, shard_bytes=shard, force=args.force, per_head=args.per_head)
        return
    if args.shard_size is not None and args.to != "hf":  # never ignored without a word
        raise UserError(f"--shard-size: converting {args.src} to {args.to} is whole-model and writes one "
                        "model.safetensors (only --to hf outputs and streamed conversions of a rotary family's HF "
                        "folder are sharded); drop --shard-size")
    # an HF folder's sampling defaults travel with it: read (one line if broken) before transformers reads it too
    generation = hf_src.generation if hf_src is not None else None
    src, data, meta = load_any(hf_src or args.src)
    tokenizer = None
    spec = (data or {}).get("tokenizer")
    folder = src_path if src_path.is_dir() else src_path.parent
    reads_own = data is not None and data == own_tokenizer_spec(folder)  # read with the tokenizer.json it keeps
    # the exported folder carries its tokenizer in transformers' form; a checkpoint of a run on hf:FOLDER keeps a
    # copy of FOLDER's tokenizer files as the run does (hf-tokenizer/), so that it is read without FOLDER
    if data and (args.to == "hf" or isinstance(spec, str) and spec.startswith(HF_SPEC) and not reads_own):

        try:  # the run's own tokenizer.json when it keeps one (never one rebuilt from other data)
            tokenizer = kept_tokenizer(args.src, data) or tokenizer_of(
                data_config_for(data, args.src, data_dir=data_dir_told(args.data_dir),
                                tokenizer_file=args.tokenizer_file))
        except UserError as e:  # the weights convert anyway; say what the folder lacks and how to add it
            fix = ("pass --data-dir / --tokenizer-file and convert again to include it" if args.to == "hf" else
                   f"it reads {spec}")
            print(f"iattn: warning: {args.out} gets no tokenizer ({e}); {fix}", file=sys.stderr)
    if tokenizer is not None and args.to == "hf":
        check_tokenizer(tokenizer, meta, data, args.src)
    elif tokenizer is not None:  # only to keep a copy: one that is not the run's is not kept, the weights convert
        try:
            check_tokenizer(tokenizer, meta, data, args.src)
        except UserError:
            print(f"iattn: warning: {args.out} keeps no copy of its tokenizer ({spec} is not the tokenizer "
                  f"{args.src} was trained with any more); it reads {spec}", file=sys.stderr)
            tokenizer = None
    if tokenizer is not None and tokenizer.vocab_size > src.config.vocab_size:  # e.g. a random HF GPT-2 of 211 tokens
        print(f"iattn: warning: {args.out} gets no tokenizer (tokenizer {tokenizer.name} has {tokenizer.vocab_size} "
              f"tokens, more than the model's {src.config.vocab_size})", file=sys.stderr)
        tokenizer = None
    if generation is None and "conversion" in meta:  # a converted checkpoint's (a training run has none of its own)
        generation = generation_settings(folder)
    own = None  # a folder read with the tokenizer.json it keeps: a checkpoint gets a copy of it, as a streamed one
    if args.to != "hf" and reads_own:
        own, data = folder, None  # and no spec naming the source folder, which may move (it reads its own)
    if data:  # the tokenizer spec travels with the model; local paths do not
        data = {k: v for k, v in data.items() if k not in ("data_dir", "tokenizer_file", "cache_dir")}
    dtype = args.dtype or str(next(src.parameters()).dtype).removeprefix("torch.")
    reference = None  # an HF folder's own transformers class in float64
    if hf_src is not None:
        reference = hf_logits(hf_src, probe_batch(src))
    # the source's bos/eos/pad: an HF folder's config's (checked where it was read), or as converted
    token_ids = hf_src.token_ids if hf_src is not None else meta.get("token_ids")
    model, rep = convert(src, args.to, block=args.block, dtype=dtype, reference=reference, token_ids=token_ids)
    rep.source, rep.out, rep.copied = str(args.src), str(args.out), companions(own) if own else []
    keep = tokenizer if args.to != "hf" else None  # an hf:FOLDER run's, kept as hf-tokenizer/ by save_converted
    if keep is not None and "state" in meta:  # a run's: its tokenizer's ids where it records none, for an export
        ids = {k: getattr(keep._impl.tok, k) for k in TOKEN_IDS if getattr(keep._impl.tok, k, None) is not None}
        token_ids = {**ids, **(token_ids or {})} or None
    if generation is not None and args.to != "hf" and GENERATION not in rep.copied:
        rep.copied.append(GENERATION)
    judge(rep, args.force, per_head=args.per_head)
    card = None
    if args.to == "hf":
        run = Path(args.src) if Path(args.src).is_dir() else Path(args.src).parent
        argv = sys.argv[1:] if sys.argv[1:2] == ["convert"] else [
            "convert", "--from", str(args.src), "--to", "hf", "--out", str(args.out)]
        card = dict(source=source_name(args.src), config=src.config.to_dict(), summary=RunFolder(run).read_summary(),
                    command=card_command(["iattn", *argv], args.src, args.out),
                    trained="state" in meta)  # a training run's checkpoint (its loop state), not a conversion
    tokenizer_id = meta.get("tokenizer") or (tokenizer_identity(tokenizer) if tokenizer is not None else None)
    save_converted(model, args.out, args.to, rep, source=str(args.src), data=data, tokenizer=tokenizer, card=card,
                   tokenizer_id=tokenizer_id, token_ids=token_ids, companions_of=own, generation=generation,
                   keep=keep, shard_bytes=shard)
    print(f"written to {args.out}")


def register(sub) -> None:

    p = sub.add_parser("convert",
                       help="exact conversion: HF GPT-2 / Llama / Qwen2 / Mistral / GPT-NeoX, standard <-> canonical",
                       description="Read an HF GPT-2, Llama, Qwen2, Mistral or GPT-NeoX folder or an iattention "
                                   "checkpoint and write it as a canonical (I-Attention) or standard iattention model, "
                                   "or as an HF folder. A rotary-family folder (one file or sharded) streams one layer "
                                   "at a time "
                                   "through bounded memory, and back (--to hf of such a converted folder). Prints "
                                   "block condition numbers, parameter counts and two checks on float64 logits: "
                                   "source load (ours vs the folder's transformers class) and conversion (converted "
                                   "vs source; per layer for a model too big to hold). A check over its tolerance "
                                   "writes nothing and exits 2 unless --force (docs/conversion.md).")
    p.add_argument("--from", dest="src", required=True, help="HF folder (config.json) or iattention checkpoint")
    p.add_argument("--to", required=True, choices=TARGETS)
    p.add_argument("--block", default="pivoted", choices=BLOCKS,
                   help="which r rows/columns become the identity (default pivoted: the best-conditioned ones, "
                        "see docs/conversion.md)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                   help="the output's dtype (default: the source's)")
    p.add_argument("--shard-size", default=None, metavar="SIZE",
                   help="largest safetensors file of the output, as save_pretrained's max_shard_size (e.g. 500MB, "
                        "2GB; default 2GB): more is written as shards with an index. For every --to hf output and "
                        "every streamed conversion (a rotary family's HF folder); a whole-model conversion to "
                        "canonical or standard (GPT-2, a training run, a folder of ours) writes one model.safetensors "
                        "and refuses it")
    p.add_argument("--force", action="store_true",
                   help="write the output even when a conversion check exceeds its tolerance")
    p.add_argument("--per-head", action="store_true", help="print every head's (KV group's) condition numbers")
    p.add_argument("--out", type=out_path, required=True, help="output folder (must not exist)")
    add_data_flags(p)
    p.set_defaults(func=cmd_convert)
