"""iattention: symmetry-reduced attention (I-Attention) for GPT-style language models.

The public names are imported on first use (PEP 562), so that `import iattention` (and the `iattn` command
starting) does not import torch before the command line can handle a Ctrl-C (cli/__init__.py). In the command
line's own process (the `iattn` script, `python -m iattention`) the package's first statement installs its
start-up Ctrl-C handler, before any other import: a Ctrl-C from then on is `iattn: interrupted`, exit 130, at
every moment (one while `iattention.cli` was still importing `signal` was a KeyboardInterrupt traceback, issue 67).
A library import (`import iattention` from Python, a notebook) changes no signal handler."""

import _signal  # builtin and loaded already, as os and sys are: nothing to import before the handler exists
import os as _os
import sys as _sys


def _interrupted_while_starting(signum, frame) -> None:
    """SIGINT while the command line is still being imported: nothing has been done yet, so leave at once.
    A KeyboardInterrupt raised inside numpy's or scipy's import can leave them half-initialised, and the
    next attribute lookup then recurses until RecursionError (seen under load at 0.25 and 0.5 s)."""
    _sys.stderr.write("iattn: interrupted\n")
    _sys.stderr.flush()
    _os._exit(130)


def _is_command_line() -> bool:
    """Is this process the command line: the `iattn` script, or `python -m iattention` (its argv[0] is "-m" while
    the package is imported, sys.orig_argv names the module)? One started with SIGINT ignored (`iattn train ... &`
    in a script, a launcher) keeps it ignored, as Python leaves it."""
    argv0 = _os.path.basename(_sys.argv[0]) if _sys.argv else ""
    orig = list(getattr(_sys, "orig_argv", []))
    as_module = argv0 == "-m" and any(a == "-m" and b == "iattention" for a, b in zip(orig, orig[1:]))
    return (argv0 == "iattn" or as_module) and _signal.getsignal(_signal.SIGINT) != _signal.SIG_IGN


if _is_command_line():
    try:
        _signal.signal(_signal.SIGINT, _interrupted_while_starting)
    except ValueError:  # not the main thread: main() leaves the signal alone there too
        pass

__version__ = "0.1.0"
__all__ = ["GPT", "GPTConfig", "load_run", "model_preset", "__version__"]


def __getattr__(name: str):
    if name == "GPT":
        from iattention.model import GPT

        return GPT
    if name in ("GPTConfig", "model_preset"):
        from iattention import config

        return getattr(config, name)
    raise AttributeError(f"module 'iattention' has no attribute {name!r}")


def load_run(path, data_dir=None, tokenizer=None):
    """(model, tokenizer) of a run folder, checkpoint, converted or HF model folder (`tokenizer`: another spec
    to use, gpt2, byte, bpe:N or hf:FOLDER): see `iattention.interop.load.load_run`."""
    from iattention.interop.load import load_run as _load_run

    return _load_run(path, data_dir, tokenizer)
