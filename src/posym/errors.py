"""The one exception type that means "the user's input is wrong".

The CLI turns a `PosymError` into one line on stderr and exit code 2 (no traceback); any other
exception is a bug in posym and keeps its traceback.
"""


class PosymError(Exception):
    """Bad input (path, config, prompt, model) explained in one sentence for the user."""


class Interrupted(Exception):
    """Ctrl-C during a command; the message says what was kept and how re-running continues (exit 130)."""
