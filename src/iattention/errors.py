"""User-facing errors: the CLI prints them as one line and exits with code 2."""

import signal


class UserError(Exception):
    """A mistake in the user's input: message names the problem and the fix."""


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
