"""`iattn`: the parser, `iattn params`, and `main`. User mistakes print one line `iattn: error: ...` and exit 2."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from iattention import __version__
from iattention.attention.registry import ATTENTION_REGISTRY, variant_names
from iattention.cli import bench, data, experiments, generate, inspect, interop, lab, train
from iattention.cli import eval as eval_command
from iattention.cli.args import Parser, check_heads, ints
from iattention.config import default_heads, model_preset, preset_names
from iattention.config.shapes import published_count, shape_names, shape_preset
from iattention.errors import Stopped, UserError
from iattention.symmetry.counts import (
    fully_reduced_count,
    kv_cache_values_per_token,
    param_count,
    removed_split,
    standard_param_count,
)
from iattention.utils.faults import fault_spec
from iattention.utils.files import os_error_message

CACHE_BYTES = 2  # bytes per cached number in `params --arch llama`: bf16, the published checkpoints' dtype


def cmd_llama_params(args) -> None:
    """`iattn params --arch llama`: a shape-only preset's totals, what canonical removes (query/key and
    value/output), and the decoding cache per token."""
    if args.heads:
        raise UserError("--heads is for GPT presets; a Llama preset has its own head counts (the published ones, "
                        "or llama-cpu's n_head; runs at other counts: iattn compare --preset llama-cpu --heads N)")
    preset = args.preset or "llama-3-8b"
    shape = args.shape or _shape_preset(preset)
    std = standard_param_count(shape)
    full, k_only = (kv_cache_values_per_token(shape, kind) for kind in ("full", "k-only"))
    pub = published_count(preset) if preset in shape_names() and not args.shape else None
    rows = []
    for attention, cls in ATTENTION_REGISTRY.items():
        if cls.unsupported(shape) is not None:
            continue
        removed = cls.removed_params(shape)
        # the query/key | value/output split of what canonical removes (the identity variants remove whole maps)
        split = removed_split(shape) if attention == "canonical" else \
            {"query_key": 0, "value_output": 0} if not removed else {"query_key": None, "value_output": None}
        rows.append(dict(attention=attention, n_head=shape.n_head, n_kv_head=shape.n_kv_head, d_head=shape.d_head,
                         rot=shape.rot, params=std - removed, removed=removed, **{f"removed_{k}": v
                                                                                  for k, v in split.items()},
                         published=pub, kv_cache_bytes_per_token=full * CACHE_BYTES,
                         k_only_cache_bytes_per_token=None if k_only is None else k_only * CACHE_BYTES))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    only = " (shape only)" if preset in shape_names() else ""
    name = f"{args.source}/config.json ({shape.family})" if args.shape else f"preset {preset}{only}"
    print(f"{name}: {shape.n_layer} layers, d={shape.n_embd}, {shape.n_head} query / "
          f"{shape.n_kv_head} KV heads of {shape.d_head} (rotary {shape.rot}), {shape.mlp} MLP {shape.d_mlp}, vocab "
          f"{shape.vocab_size}, {'tied' if shape.tie_embeddings else 'untied'} head"
          f"{', q/k/v bias' if shape.qkv_bias else ''}; published total: {f'{pub:,}' if pub else 'not stated'}")
    print(f"{'attention':<10} {'params':>15} {'removed':>11} {'query/key':>10} {'value/out':>11}")
    for r in rows:
        qk, vo = (f"{r[k]:,}" if r[k] is not None else "-" for k in ("removed_query_key", "removed_value_output"))
        print(f"{r['attention']:<10} {r['params']:>15,} {r['removed']:>11,} {qk:>10} {vo:>11}")
    why = ("" if k_only is not None else f" (none: n_kv_head x d_head = {shape.n_kv_head * shape.d_head} < n_embd = "
           f"{shape.n_embd}, the keys do not determine the layer input)")
    print(f"decoding cache per token (bf16, all layers): full {full * CACHE_BYTES:,} B; K-only "
          f"{'-' if k_only is None else f'{k_only * CACHE_BYTES:,} B'}{why}")


def _shape_preset(preset: str):
    """A shape-only Llama preset, or a run preset whose model is a Llama (llama-cpu), vocabulary resolved."""
    if preset in shape_names() or preset not in preset_names():
        return shape_preset(preset)  # the shape, or the one-line refusal that lists them
    shape = model_preset(preset)
    if shape.family == "gpt2":
        raise UserError(f"preset {preset} is a GPT-2 model; drop --arch llama, or name a Llama preset: "
                        f"{', '.join(shape_names())} or a run preset with another model.family than gpt2")
    return shape


def _preset_family(preset: str | None) -> str | None:
    """"gpt" or "llama": the family a preset's name says (a Llama shape, or a run preset and its
    model.family); None without a preset; a UserError naming both families' presets for an unknown name."""
    if preset is None:
        return None
    if preset in shape_names():
        return "gpt_neox" if shape_preset(preset).family == "gpt_neox" else "llama"
    if preset not in preset_names():
        raise UserError(f"unknown preset {preset!r}; choose one of {', '.join(preset_names())} (runs), or a "
                        f"Llama-family shape: {', '.join(shape_names())}")
    return "gpt" if model_preset(preset).family == "gpt2" else "llama"


def _shape_from(folder: str):
    """("gpt" or "llama", the shape) that an HF model folder's config.json describes, no weights read."""
    from pathlib import Path

    from iattention.checkpoint.run_folder import read_json_object
    from iattention.config import GPTConfig
    from iattention.interop.hf import read_hf_config
    from iattention.interop.hf_rotary import shape_from_folder

    path = Path(folder)
    if not (path / "config.json").is_file():
        raise UserError(f"--from {folder}: no config.json there; give a Hugging Face model folder")
    kind = read_json_object(path / "config.json", "a Hugging Face config", "re-save the model with save_pretrained",
                            schema={"model_type": (str,)})["model_type"]
    if kind != "gpt2":
        return ("gpt_neox" if kind == "gpt_neox" else "llama"), shape_from_folder(path)
    c = read_hf_config(path)
    n_inner = c.get("n_inner")
    mlp_hidden = 0 if n_inner in (None, 4 * c["n_embd"]) else n_inner
    return "gpt", GPTConfig(n_layer=c["n_layer"], n_head=c["n_head"], n_embd=c["n_embd"], vocab_size=c["vocab_size"],
                            block_size=c["n_positions"], mlp_hidden=mlp_hidden)


def cmd_params(args) -> None:

    args.shape = None
    if args.source:
        if args.preset or args.arch:
            raise UserError("--from reads the model's own config.json; drop --preset and --arch")
        args.arch, args.shape = _shape_from(args.source)
    family = _preset_family(args.preset)
    if args.arch == "gpt" and family not in (None, "gpt"):
        named = {"llama": "Llama-family", "gpt_neox": "GPT-NeoX"}.get(family, family)
        raise UserError(f"preset {args.preset} is a {named} model; use --arch {family} (or leave out --arch)")
    if args.arch is None:
        args.arch = family or "gpt"  # the preset's name says its family; no preset: gpt2-small
    if args.arch in ("llama", "gpt_neox"):
        return cmd_llama_params(args)
    args.preset = args.preset or "gpt2-small"
    shape = args.shape or model_preset(args.preset)
    rows = []
    check_heads(args.heads or [], shape.n_embd, args.preset)
    for heads in args.heads or default_heads(shape):
        base = shape.replace(n_head=heads)
        std = param_count(base)
        for attention in variant_names():
            cfg = base.replace(attention=attention)
            n = param_count(cfg)
            rows.append(dict(attention=attention, n_head=heads, d_head=base.d_head, params=n, removed=std - n,
                             fully_reduced=fully_reduced_count(cfg)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    name = f"{args.source}/config.json (gpt2)" if args.shape else f"preset {args.preset}"
    print(f"{name}: learned parameters (true vocabulary, tied embeddings)")
    print(f"{'attention':<11} {'heads':>5} {'d_head':>6} {'params':>13} {'removed':>12} {'fully reduced':>14}")
    for r in rows:
        print(f"{r['attention']:<11} {r['n_head']:>5} {r['d_head']:>6} {r['params']:>13,} {r['removed']:>12,} "
              f"{r['fully_reduced']:>14,}")
    print("fully reduced: also without the redundant biases (b_K dropped, b_V folded into b_O; "
          "model.minimal_bias for canonical)")


def build_parser() -> argparse.ArgumentParser:

    p = Parser(prog="iattn", description=(
        "iattention: symmetry-reduced attention. Train and compare standard vs canonical "
        "(I-Attention) GPT models, convert checkpoints, benchmark, and run attention experiments."))
    p.add_argument("--version", action="version", version=f"iattn {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    sp = sub.add_parser("params", help="exact learned parameter counts per attention variant and head count",
                        description="Print the exact learned parameter count of each attention variant "
                                    "for each head count, and how many parameters it removes vs standard.")
    sp.add_argument("--arch", choices=("gpt", "llama", "gpt_neox"), default=None,
                    help="gpt: GPT-2 presets, per variant and head count; llama, gpt_neox: a shape-only preset "
                         "(query/key and value/output split, cache bytes per token); default: the preset's family "
                         "(gpt without --preset)")
    sp.add_argument("--preset", default=None,
                    help=f"model shape: with --arch gpt a preset ({', '.join(preset_names())}; default gpt2-small), "
                         f"with --arch llama one of {', '.join(shape_names())} (default llama-3-8b) or a Llama run "
                         "preset (llama-cpu)")
    sp.add_argument("--from", dest="source", default=None, metavar="DIR",
                    help="count the model a Hugging Face folder's config.json describes (gpt2, llama, qwen2, "
                         "mistral, gpt_neox; no weights read) instead of a preset")
    sp.add_argument("--heads", type=ints, default=None,
                    help="comma-separated head counts (default: 1, 2, 4, 8, 12 up to the preset's n_head)")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.set_defaults(func=cmd_params)

    for register in _subcommand_registrars():
        register(sub)
    return p


def _subcommand_registrars():
    """Each command module of this package adds its parsers here (imported when the parser is built)."""

    for module in (train, eval_command, generate, experiments, interop, bench, lab, inspect, data):
        yield module.register


def _is_override(token: str) -> bool:
    return not token.startswith("-") and "=" in token and "." in token.split("=", 1)[0]


def _one_line(message: str) -> str:
    """An error is one line whatever it names (a path with a newline in it too)."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def main(argv: list[str] | None = None) -> int:
    """The `iattn` command. As the program itself (argv None), a closed stdout pipe ends it quietly (exit 141,
    as `yes | head` does) and a second Ctrl-C while it exits cannot interrupt clean-up or atexit handlers."""
    as_program = argv is None
    try:
        code = _main(argv)
        if as_program:
            sys.stdout.flush()  # a pipe closed early fails here, inside the handler below, not at exit
        return code
    except BrokenPipeError:
        if not as_program:
            raise
        # The Python docs' recipe (signal module, "Note on SIGPIPE"): nothing more can reach the reader, so
        # point stdout at devnull, where the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        if as_program and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # exiting now: atexit handlers run to their end


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    # KEY=VALUE overrides may stand anywhere, also after options (`--out X train.threads=1`): argparse
    # takes the positional ones before the first option and leaves the rest over, which are collected here.
    args, rest = parser.parse_known_args(argv)
    if rest:
        if hasattr(args, "overrides") and all(_is_override(t) for t in rest):
            args.overrides = [*(args.overrides or []), *rest]
        else:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        fault_spec()
        args.func(args)
    except UserError as e:
        print(f"iattn: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise
    except OSError as e:  # the machine or a path (disk full, read-only, a file where a folder is needed)
        message = os_error_message(e)
        if message is None:  # anything else is a bug: keep its traceback
            raise
        print(f"iattn: error: {_one_line(message)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if argv is None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot break the clean-up now
        print("iattn: interrupted", file=sys.stderr)
        return 130
    except Stopped as e:
        print(f"iattn: stopped by {e.name}", file=sys.stderr)
        return 128 + e.signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
