"""The one exception type that means "the user's input is wrong".

The CLI turns a `PosymError` into one line on stderr and exit code 2 (no traceback); any other
exception is a bug in posym and keeps its traceback.
"""


class PosymError(Exception):
    """Bad input (path, config, prompt, model) explained in one sentence for the user."""


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) during a command; the message says what was kept and how re-running continues
    (exit 128 + `signum`: 130, 143)."""

    def __init__(self, message: str, signum: int = 2):
        super().__init__(message)
        self.signum = signum
