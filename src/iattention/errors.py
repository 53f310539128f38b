"""User-facing errors: the CLI prints them as one line and exits with code 2."""

import signal


class UserError(Exception):
    """A mistake in the user's input: message names the problem and the fix."""


def first_words(e: BaseException, limit: int = 100) -> str:
    """The first line of an exception's message for a one-line error, cut at a word boundary to at most about
    `limit` characters (" ..." where cut): never mid-word."""
    return shown((str(e).splitlines() or [""])[0] or type(e).__name__, limit)


def shown(text, limit: int = 100) -> str:
    """`text` (a str, else its repr) cut at a word boundary to at most about `limit` characters (" ..." where cut)."""
    text = text if isinstance(text, str) else repr(text)
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(" ,;:") + " ..."


class SingularBlockError(UserError):
    """A head's fixed r x r block cannot be inverted, so canonicalization is impossible."""


class Stopped(BaseException):
    """The process was told to stop by a signal (SIGTERM, SIGHUP) after it stopped its children: the CLI
    prints one line and exits 128 + signum. A BaseException, like KeyboardInterrupt: no `except Exception`
    swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name
