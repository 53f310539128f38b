"""`iattn`: the parser, `iattn params`, and `main`. User mistakes print one line `iattn: error: ...` and exit 2."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from iattention import __version__
from iattention.attention.registry import ATTENTION_REGISTRY
from iattention.cli import bench, data, experiments, generate, inspect, interop, lab, train
from iattention.cli import eval as eval_command
from iattention.cli.args import Parser, check_heads, ints, own_kv_heads
from iattention.config import GPTConfig, default_heads, model_preset, preset_names
from iattention.config.families import FAMILIES
from iattention.config.shapes import published_count, shape_names, shape_preset
from iattention.errors import Stopped, UserError
from iattention.symmetry.counts import (
    fully_reduced_count,
    kv_cache_values_per_token,
    param_count,
    redundancy,
    removed_split,
)
from iattention.utils.faults import fault_spec
from iattention.utils.files import os_error_message

CACHE_BYTES = 2  # bytes per cached number in `iattn params`: bf16, the published checkpoints' dtype
# The two-family layout's `params --arch`: still read, with a note, as the family it meant
OLD_ARCH_FLAG = {"gpt": "gpt2", "llama": "llama", "gpt_neox": "gpt_neox"}


def _family_flag(args) -> str | None:
    """--family, or the old --arch read as its family (a note says so); both at once is one line."""
    if args.arch is None:
        return args.family
    if args.family is not None:
        raise UserError(f"--arch {args.arch} and --family {args.family}: --arch is the old name of --family; keep only "
                        "--family")
    print(f"iattn: note: --arch is now --family (read --arch {args.arch} as --family {OLD_ARCH_FLAG[args.arch]})",
          file=sys.stderr)
    return OLD_ARCH_FLAG[args.arch]


def _params_shape(args):
    """(the model shape, what to call it, its published total or None) for `--from`, `--preset` or `--family`."""
    family = _family_flag(args)
    if args.source:
        if args.preset or family:
            raise UserError("--from reads the model's own config.json; drop --preset and --family")
        return _shape_from(args.source), f"{args.source}/config.json", None
    preset = args.preset or FAMILIES[family or GPTConfig.family].default_shape
    if preset in shape_names():
        shape, name, pub = shape_preset(preset), f"published shape {preset}", published_count(preset)
    elif preset in preset_names():
        shape, name, pub = model_preset(preset), f"preset {preset}", None
    else:
        raise UserError(f"unknown preset {preset!r}; choose one of {', '.join(preset_names())} (runs), or a "
                        f"published shape: {', '.join(shape_names())}")
    # the old --arch llama named the whole Llama layout (llama, qwen2, mistral): it matches by the records' old_arch
    same = shape.family == family or args.arch is not None and FAMILIES[shape.family].old_arch == args.arch
    if family and not same:
        raise UserError(f"preset {preset} is a {FAMILIES[shape.family].label} model; use --family {shape.family} "
                        "(or leave out --family)")
    return shape, name, pub


def _shape_from(folder: str):
    """The shape an HF model folder's config.json describes (any family), or a converted folder's of ours (its
    config.json is our model config), no weights read."""
    from pathlib import Path

    from iattention.checkpoint.beside import OURS_MODEL_TYPE
    from iattention.checkpoint.run_folder import read_json_object
    from iattention.interop.folder import HFFolder

    path = Path(folder)
    if not (path / "config.json").is_file():
        raise UserError(f"--from {folder}: no config.json there; give a Hugging Face model folder")
    ours = read_json_object(path / "config.json", "a model config", "re-save the model (save_pretrained or iattn "
                            "convert)")
    if ours.get("model_type") == OURS_MODEL_TYPE:
        return GPTConfig.from_dict({k: v for k, v in ours.items() if k not in ("model_type", "note", "auto_map")})
    return HFFolder(path, ours).shape  # the config.json read above


def cmd_params(args) -> None:
    """`iattn params`: each variant's learned parameters for a model of any family, what it removes (canonical's
    split into query/key and value/output), the fully reduced count, the decoding cache per token; GPT-2 shapes at
    several head counts, other families at their own."""
    shape, name, pub = _params_shape(args)
    trainable = name.startswith("preset ")  # a run preset: other head counts as compare --heads trains them
    paper = FAMILIES[shape.family].paper  # the paper's model: its head counts at one width
    if not paper and args.heads and not trainable:
        raise UserError(f"--heads is for GPT-2 shapes and the run presets ({', '.join(preset_names())}); {name} "
                        "has its own head counts: drop --heads")
    n_kv_head = own_kv_heads(shape) if trainable else 0
    check_heads(args.heads or [], shape.n_embd, name.removeprefix("preset "), n_kv_head)  # says "preset NAME"
    rows = []
    for heads in args.heads or (default_heads(shape) if paper else [shape.n_head]):
        base = shape.replace(n_head=heads) if paper or args.heads else shape
        cache = {kind: kv_cache_values_per_token(base, kind) for kind in ("full", "k-only")}  # G r: by head count
        for attention, cls in ATTENTION_REGISTRY.items():
            if cls.unsupported(base) is not None:
                continue
            cfg = base.replace(attention=attention)
            removed = redundancy(cfg)
            # the query/key | value/output split of what canonical removes (the identity variants remove whole maps)
            split = removed_split(cfg) if attention == "canonical" else dict.fromkeys(
                ("query_key", "value_output"), 0 if not removed else None)
            rows.append(dict(attention=attention, family=cfg.family, n_head=heads, n_kv_head=cfg.n_kv_head,
                             d_head=cfg.d_head, rot=cfg.rot, params=param_count(cfg), removed=removed,
                             **{f"removed_{k}": v for k, v in split.items()}, fully_reduced=fully_reduced_count(cfg),
                             published=pub, kv_cache_bytes_per_token=cache["full"] * CACHE_BYTES,
                             k_only_cache_bytes_per_token=None if cache["k-only"] is None else
                             cache["k-only"] * CACHE_BYTES))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    s = shape
    print(f"{name} ({s.family}): {s.n_layer} layers, d={s.n_embd}, {s.mlp} MLP {s.d_mlp}, vocab {s.vocab_size}, "
          f"{'tied' if s.tie_embeddings else 'untied'} head{', q/k/v bias' if s.qkv_bias else ''}"
          + (f", rotary {s.rot} of d_head {s.d_head}" if s.pos == "rope" else "")
          + (f"; published total: {pub:,}" if pub else ""))
    print(f"{'attention':<11} {'heads':>5} {'kv':>3} {'d_head':>6} {'params':>15} {'removed':>13} {'query/key':>12} "
          f"{'value/out':>12} {'fully reduced':>15}")
    for r in rows:
        qk, vo = (f"{r[k]:,}" if r[k] is not None else "-" for k in ("removed_query_key", "removed_value_output"))
        print(f"{r['attention']:<11} {r['n_head']:>5} {r['n_kv_head']:>3} {r['d_head']:>6} {r['params']:>15,} "
              f"{r['removed']:>13,} {qk:>12} {vo:>12} {r['fully_reduced']:>15,}")
    caches = {r["n_head"]: (r["kv_cache_bytes_per_token"], r["k_only_cache_bytes_per_token"], r["n_kv_head"] *
                            r["d_head"]) for r in rows}  # by head count where the key/value heads are fixed
    several = len({c[:2] for c in caches.values()}) > 1
    for heads, (full, k_only, width) in list(caches.items())[: None if several else 1]:
        at = f" at {heads} heads" if several else ""
        why = "" if k_only is not None else (f" (none: n_kv_head x d_head = {width} < n_embd = {s.n_embd}, the keys "
                                             "do not determine the layer input)")
        print(f"decoding cache per token{at} (bf16, all layers): full {full:,} B; K-only "
              f"{'-' if k_only is None else f'{k_only:,} B'}{why}")
    print("fully reduced: also without the redundant biases (b_K on the pass dims dropped, b_V folded into b_O; "
          "model.minimal_bias realizes it for canonical with query/key/value and output biases)")


def build_parser() -> argparse.ArgumentParser:

    p = Parser(prog="iattn", description=(
        "iattention: symmetry-reduced attention. Train and compare standard vs canonical "
        "(I-Attention) GPT models, convert checkpoints, benchmark, and run attention experiments."))
    p.add_argument("--version", action="version", version=f"iattn {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    sp = sub.add_parser("params", help="exact learned parameter counts per attention variant and head count",
                        description="Print the exact learned parameter count of each attention variant "
                                    "for each head count, and how many parameters it removes vs standard.")
    sp.add_argument("--family", choices=tuple(FAMILIES), default=None,
                    help="the family's published shape without --preset (" + ", ".join(
                        f"{f.name}: {f.default_shape}" for f in FAMILIES.values()) + "); with --preset, checked "
                         "against the preset's family")
    sp.add_argument("--arch", choices=tuple(OLD_ARCH_FLAG), default=None, help=argparse.SUPPRESS)  # old --family
    sp.add_argument("--preset", default=None,
                    help=f"a run preset ({', '.join(preset_names())}) or a published shape "
                         f"({', '.join(shape_names())}; not trainable); default gpt2-small")
    sp.add_argument("--from", dest="source", default=None, metavar="DIR",
                    help=f"count the model a Hugging Face folder's config.json describes ({', '.join(FAMILIES)}; no "
                         "weights read) instead of a preset")
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
