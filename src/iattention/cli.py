"""`iattn` command line. User mistakes print one line `iattn: error: ...` and exit with code 2."""

from __future__ import annotations

import argparse
import json
import sys

from iattention.errors import UserError


def int_list(minimum: int = 1):
    """argparse type: comma-separated integers, each >= minimum."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not values or any(v < minimum for v in values):
            raise argparse.ArgumentTypeError(f"expected integers >= {minimum}, got {text!r}")
        return values

    return parse


_int_list = int_list(1)


def int_at_least(minimum: int):
    """argparse type: one integer >= minimum."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def _str_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def cmd_params(args) -> None:
    from iattention.config import ATTENTION_VARIANTS
    from iattention.symmetry.counts import fully_reduced_count, param_count
    from iattention.train.config import default_heads, preset_model

    shape = preset_model(args.preset)
    rows = []
    for heads in args.heads or default_heads(shape):
        if shape.n_embd % heads:
            raise UserError(f"--heads {heads}: n_embd={shape.n_embd} of preset {args.preset} is not divisible by "
                            f"{heads}; pick head counts that divide {shape.n_embd}")
        base = shape.replace(n_head=heads)
        std = param_count(base)
        for attention in ATTENTION_VARIANTS:
            cfg = base.replace(attention=attention)
            n = param_count(cfg)
            rows.append(dict(attention=attention, n_head=heads, d_head=base.d_head, params=n, removed=std - n,
                             fully_reduced=fully_reduced_count(cfg)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"preset {args.preset}: learned parameters (true vocabulary, tied embeddings)")
    print(f"{'attention':<11} {'heads':>5} {'d_head':>6} {'params':>13} {'removed':>12} {'fully reduced':>14}")
    for r in rows:
        print(f"{r['attention']:<11} {r['n_head']:>5} {r['d_head']:>6} {r['params']:>13,} {r['removed']:>12,} "
              f"{r['fully_reduced']:>14,}")
    print("fully reduced: also without the redundant biases (b_K dropped, b_V folded into b_O; "
          "model.minimal_bias for canonical)")


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, unless it has none or its help already names it."""

    def _get_help_string(self, action):
        if any(action.default is x for x in (None, False, argparse.SUPPRESS)) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (not the usage block) and exit code 2."""

    def error(self, message):
        print(f"iattn: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    from iattention import __version__
    from iattention.train.config import preset_names

    p = Parser(prog="iattn", description=(
        "iattention: symmetry-reduced attention. Train and compare standard vs canonical "
        "(I-Attention) GPT models, convert checkpoints, benchmark, and run attention experiments."))
    p.add_argument("--version", action="version", version=f"iattn {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    sp = sub.add_parser("params", help="exact learned parameter counts per attention variant and head count",
                        description="Print the exact learned parameter count of each attention variant "
                                    "for each head count, and how many parameters it removes vs standard.")
    sp.add_argument("--preset", default="gpt2-small", help=f"model shape of a preset: {', '.join(preset_names())}")
    sp.add_argument("--heads", type=_int_list, default=None,
                    help="comma-separated head counts (default: 1, 2, 4, 8, 12 up to the preset's n_head)")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.set_defaults(func=cmd_params)

    for register in _subcommand_registrars():
        register(sub)
    return p


def _subcommand_registrars():
    """Each heavier subcommand lives with its own code and adds its parser here."""
    import importlib

    for module in ("iattention.train.cli", "iattention.model.cli", "iattention.experiments.cli",
                   "iattention.interop.cli", "iattention.bench.cli", "iattention.lab.cli", "iattention.lab.inspect"):
        yield importlib.import_module(module).register


def _is_override(token: str) -> bool:
    return not token.startswith("-") and "=" in token and "." in token.split("=", 1)[0]


def main(argv: list[str] | None = None) -> int:
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
        args.func(args)
    except UserError as e:
        print(f"iattn: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("iattn: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
