"""The one exception type that means "the user's input is wrong".

The CLI turns a `PosymError` into one line on stderr and exit code 2 (no traceback); any other
exception is a bug in posym and keeps its traceback.
"""

import signal

STOP_SIGNALS: dict[int, str] = {
    signal.SIGINT: "interrupted",
    signal.SIGTERM: "terminated",
    signal.SIGHUP: "hung up",
}
"""The signals posym answers alike (`posym.io.handle_signals`): Ctrl-C, a `kill` (what job schedulers and
`timeout` send first) and a closed terminal or ssh session; each with the word of its one line
(`posym: terminated: ...`) and exit 128 + the signal (130, 143, 129)."""


class PosymError(Exception):
    """Bad input (path, config, prompt, model) explained in one sentence for the user."""


class Interrupted(Exception):
    """Ctrl-C (or another of `STOP_SIGNALS`) during a command; the message says what was kept and how
    re-running continues (exit 128 + `signum`: 130, 143, 129)."""

    def __init__(self, message: str, signum: int = 2):
        super().__init__(message)
        self.signum = signum
