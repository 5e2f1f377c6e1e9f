"""The `posym` command line: a thin Typer layer over the library modules.

Every command turns user mistakes (`PosymError`) into one line on stderr and exit code 2.
Heavy imports happen inside the commands so that `posym --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posym.errors import PosymError

app = typer.Typer(
    name="posym",
    help="Positional versus symbolic attention heads in RoPE transformers (arXiv 2605.31558).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


# ---- commands: data (tasks) -------------------------------------------------------------------

# ---- commands: train / eval (model, train) ------------------------------------------------------

# ---- commands: score (scores) -------------------------------------------------------------------

# ---- commands: dynamics / geometry --------------------------------------------------------------

# ---- commands: theory / lengthgen ---------------------------------------------------------------

# ---- commands: llm-scores / llm-bench -----------------------------------------------------------

# ---- commands: run / report / sweep -------------------------------------------------------------


def main() -> None:
    """Console-script entry point: run the app, answering bad input with one line and exit 2."""
    try:
        app(standalone_mode=False)
    except PosymError as exc:
        print(f"posym: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("posym: aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # click usage errors (bad option values) are user errors too
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
