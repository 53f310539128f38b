"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """A mistake in the user's input: message names the problem and the fix."""


class SingularBlockError(UserError):
    """A head's fixed r x r block cannot be inverted, so canonicalization is impossible."""
