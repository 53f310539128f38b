"""The `iattn` command line: `app.py` builds the parser and runs a command; each command module
(train, model, experiments, interop, bench, lab, inspect) adds its sub-commands; `args.py` holds what they share.
The top layer: it may import any package, and no package imports it.

`main` here is the entry point: it imports the command line (and with it torch, seconds) only once it can
answer a Ctrl-C, so an interrupt at any moment of start-up is `iattn: interrupted`, exit 130, never a
KeyboardInterrupt traceback from inside an import. The package's first statement installed the same handler
already in the command line's process (iattention/__init__.py), before this module's own imports."""

import signal
import sys
import threading

from iattention import _interrupted_while_starting


def main(argv: list[str] | None = None) -> int:
    # A process of its own, in charge of its SIGINT; one started with SIGINT ignored (`iattn train ... &` in a
    # script, a launcher) keeps it ignored, as Python leaves it.
    process = (argv is None and threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)
    try:
        if process:
            signal.signal(signal.SIGINT, _interrupted_while_starting)
        from iattention.cli.app import main as run

        if process:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        code = run(argv)
    except KeyboardInterrupt:
        if process:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # exiting now: a second Ctrl-C cannot print a traceback
        print("iattn: interrupted", file=sys.stderr)
        code = 130
    if process and code == 130:
        # CPython ends a `python -m iattention` process (sweeps' children) by killing it with SIGINT, status -2
        # instead of our 130, when a KeyboardInterrupt once escaped a string run by exec(), even one caught later
        # (Py_RunMain's unhandled-KeyboardInterrupt flag), e.g. a Ctrl-C while a dataclass is being built (it
        # uses exec): seen under load in 1 run of 16 (which exec it hit was not traced). An exec() of a string
        # clears the flag (run_eval_code_obj resets it before it runs), so the process exits with the 130 it
        # printed.
        exec("")
    return code


def __getattr__(name: str):
    if name == "build_parser":
        from iattention.cli.app import build_parser

        return build_parser
    raise AttributeError(f"module 'iattention.cli' has no attribute {name!r}")


__all__ = ["build_parser", "main"]
