"""The `iattn` command line: `app.py` builds the parser and runs a command; each command module
(train, model, experiments, interop, bench, lab, inspect) adds its sub-commands; `args.py` holds what they share.
The top layer: it may import any package, and no package imports it."""

from iattention.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
