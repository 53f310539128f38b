"""What every command module shares: argparse types, the parser class, the data flags, head checks."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from iattention.config import override
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
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:  # '0,0' or '2,02': the same run twice, and a table that contradicts itself
            raise argparse.ArgumentTypeError(f"{', '.join(map(str, repeated))} repeats in {text!r}; give each value "
                                             "once")
        return values

    return parse


ints = int_list(1)  # comma-separated integers >= 1


def int_at_least(minimum: int, maximum: int = 2**63 - 1):
    """argparse type: one integer in [minimum, maximum] (by default what a C int64 holds: seeds and counts
    end up in torch's C integers, where a larger value is an overflow traceback)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected an integer <= {maximum}, got {value}")
        return value

    return parse


def out_path(text: str) -> str:
    """argparse type: an output path; an empty one would silently mean the current folder. A path that is not
    UTF-8 (argv bytes arrive as lone surrogates: no library can write it) or holds a control character (a
    newline would split every message naming it) is refused before any work."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("expected a UTF-8 path; this one holds bytes that are not UTF-8") from None
    bad = next((c for c in text if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"expected a path without control characters, got {text!r}")
    return text


def out_file(text: str) -> str:
    """argparse type: an output file (out_path's checks) that is not a folder, refused before the work whose result
    it would hold (the error came after a whole benchmark or study)."""
    if Path(out_path(text)).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file path")
    return text


def check_out_folder(path, flag: str = "--out") -> None:
    """Before any work: refuse an output folder that is a file or lies under one (else the error would come
    only when the first result is written, after the work)."""
    path = Path(path).absolute()
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                where = "is a file" if p == path else f"lies under {p}, which is a file"
                raise UserError(f"{flag} {path} {where}, not a folder; choose another {flag}")
            return


def utf8_text(text: str) -> str:
    """argparse type: text that is valid UTF-8 (argv bytes that are not arrive as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("expected UTF-8 text; the value holds bytes that are not UTF-8") from None
    return text


def str_list(text: str) -> list[str]:
    """argparse type: comma-separated names; none at all (',' or '') is refused, not read as "the defaults"."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


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


def add_data_flags(p) -> None:
    p.add_argument("--data-dir", help="folder with WikiText-2 files (default: $IATTN_DATA_DIR, else the folder a run "
                                      "recorded, else the folder `iattn data remember` keeps (`iattn data where`), "
                                      "else download)")
    p.add_argument("--tokenizer-file", help="local r50k_base.tiktoken for the gpt2 tokenizer "
                                            "(default: $IATTN_TOKENIZER_FILE or DATA_DIR/tokenizers/)")


def with_flags(cfg, args):
    """The run config with what --data-dir, --tokenizer-file and --init-from say, set on a copy (the values as
    given, made absolute; no round trip through override strings)."""
    data = {k: os.path.abspath(v) for k in ("data_dir", "tokenizer_file") if (v := getattr(args, k, None))}
    train = {"init_from": os.path.abspath(args.init_from)} if getattr(args, "init_from", None) else {}
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **data),
                               train=dataclasses.replace(cfg.train, **train))


def data_overrides(args) -> list[str]:
    """--data-dir and --tokenizer-file as overrides, for a command that hands them to `iattn train` child
    processes (sweep, compare): quoted, so that each path arrives exactly as given (`config.override`)."""
    return [override(f"data.{k}", os.path.abspath(v)) for k in ("data_dir", "tokenizer_file")
            if (v := getattr(args, k, None))]


def own_kv_heads(model) -> int:
    """A preset model's own key/value heads (set, not derived from n_head), else 0."""
    return model.to_dict().get("n_kv_head", 0)


def heads_or_default(heads: list[int] | None, defaults, model) -> list[int]:
    """--heads as given, else those of `defaults` the model's own key/value heads divide (else its n_head)."""
    if heads is not None:
        return heads
    n_kv_head = own_kv_heads(model)
    return [h for h in defaults if not n_kv_head or h % n_kv_head == 0] or [model.n_head]


def check_heads(heads: list[int], n_embd: int, preset: str, n_kv_head: int = 0) -> None:
    """--heads of a command against a preset's width (and a Llama preset's key/value heads: n_kv_head), before
    anything runs (GPTConfig says the same per run)."""
    for h in heads:
        if n_kv_head and h % n_kv_head:
            raise UserError(f"--heads {h}: preset {preset} has n_kv_head={n_kv_head} key/value heads, each serving "
                            f"the same number of query heads; pick multiples of {n_kv_head}")
        if n_kv_head and h > n_embd:
            raise UserError(f"--heads {h}: more heads than preset {preset}'s n_embd={n_embd} leaves no head width; "
                            f"pick at most {n_embd}")
        if n_kv_head:
            continue  # a Llama-family head's width is model.d_head, not n_embd / n_head
        if n_embd % h:
            raise UserError(f"--heads {h}: n_embd={n_embd} of preset {preset} is not divisible by n_head={h}; "
                            f"pick head counts that divide {n_embd}")
