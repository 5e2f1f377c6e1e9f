"""The `posym` command line: a thin Typer layer over the library modules.

Every command turns user mistakes (`PosymError`) into one line on stderr and exit code 2.
Heavy imports happen inside the commands so that `posym --help` stays fast. The commands live in
`training` (data, train, eval), `analysis` (score, dynamics, geometry, theory, lengthgen,
discrepancy), `models` (llm-scores, llm-bench, convert) and `runs` (run, report, sweep, ablate, finetune);
importing them registers them on `app`, in that order (the order of `posym --help`).
"""

from __future__ import annotations

import importlib
import re
import sys

import typer

from posym import io
from posym.errors import STOP_SIGNALS, Interrupted, PosymError

NOTHING_KEPT = (
    "every file written so far is whole and nothing half-written is left; the output is written only "
    "when complete, so re-running the same command starts it again"
)
"""The Ctrl-C line of commands that keep no partial results (each resumable command says what it kept)."""

from typer.core import TyperCommand

app = typer.Typer(
    name="posym",
    help="Positional versus symbolic attention heads in RoPE transformers (arXiv 2605.31558). "
    "Conventions of every command: docs/cli.md.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain Click help: choices as <a|b>, no type label on --help
)


class PosymCommand(TyperCommand):
    """A Typer command whose usage line reads as Click's: PATH for a required argument, not {PATH}."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [piece.replace("{", "").replace("}", "") for piece in super().collect_usage_pieces(ctx)]


def _version(value: bool) -> None:
    if value:
        import posym

        print(f"posym {posym.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the posym version and exit."
    ),
) -> None:
    """Positional versus symbolic attention heads in RoPE transformers (arXiv 2605.31558)."""


def progress_bar(total: int, what: str):
    """A rich progress bar over `total` steps; returns (context manager, advance callback)."""
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task(what, total=total)
    return bar, lambda k=1: bar.advance(task, k)


def checkpoint_step(path, text: str | None, device: str = "cpu") -> int | None:
    """A --step value for the run or checkpoint at `path`: None, an integer step, or "best", the run's
    best step by validation accuracy (`posym.models.resolve_step`, evaluating on `device` the
    checkpoints that recorded none)."""
    from posym import models

    return models.resolve_step(path, models.parse_step(text), device=device)


def parse_list(text: str, kind: type) -> list:
    """'a,b,c' -> [kind(a), kind(b), kind(c)]; a bad item is a PosymError."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    try:
        values = [kind(item) for item in items]
    except ValueError:
        raise PosymError(f"cannot read {text!r} as a comma-separated list of {kind.__name__} values") from None
    if not values:
        raise PosymError("an empty list was given")
    return values


def parse_head_pairs(text: str | None) -> list[tuple[int, int]]:
    """'0.1,5.3' -> [(0, 1), (5, 3)] (layer.head pairs)."""
    if not text:
        return []
    heads = []
    for item in parse_list(text, str):
        layer, dot, head = item.partition(".")
        if not (dot and layer.isdigit() and head.isdigit()):
            raise PosymError(f"--heads wants LAYER.HEAD items like 3.1, got {item!r}")
        heads.append((int(layer), int(head)))
    return heads


def _interrupted(message: str, signum: int) -> None:
    """The one line of a Ctrl-C (SIGINT), a kill (SIGTERM) or a hang-up (SIGHUP), and exit 128 + the signal."""
    io.answered()
    print(f"posym: {STOP_SIGNALS.get(signum, 'stopped')}: {message}", file=sys.stderr)
    sys.exit(128 + signum)


def main() -> None:
    """Console-script entry point: run the app, answering bad input with one line and exit 2."""
    io.handle_signals()
    for stream in (sys.stdout, sys.stderr):  # a path of non-UTF-8 bytes is shown escaped, never a traceback
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        code = app(standalone_mode=False)
    except PosymError as exc:
        print(f"posym: error: {_one_line(str(exc))}", file=sys.stderr)
        sys.exit(2)
    except Interrupted as exc:
        _interrupted(str(exc), exc.signum)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt) as exc:
        _interrupted(NOTHING_KEPT, io.signal_number(exc))
    except Exception as exc:
        if io.signal_received() is not None:  # the signal cut a C call short, which raised its own error
            _interrupted(NOTHING_KEPT, io.signal_received())
        # Click usage errors (bad option values, missing arguments) are user errors too. Typer
        # bundles its own copy of click, so recognise them by shape rather than by class.
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `posym`: the help as help, then one error line
            print(exc.ctx.get_help() if getattr(exc, "ctx", None) else "", file=sys.stdout)
            print("posym: error: give a command (listed above; posym COMMAND --help says more)", file=sys.stderr)
            sys.exit(2)
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            print(f"posym: error: {_one_line(exc.format_message())}", file=sys.stderr)
            sys.exit(2)
        raise
    if code == 130:  # Typer's answer to a Ctrl-C (or SIGTERM) that no command turned into Interrupted
        _interrupted(NOTHING_KEPT, io.signal_number())
    if code:
        sys.exit(code)


def _one_line(message: str) -> str:
    """An error message as one line: a newline inside it (a path holding one, a library's multi-line
    text) is shown escaped, as \\n, so the line stays one and still says what the input held; a path a
    library wrote as `PosixPath('x')` is shown as `'x'`."""
    message = re.sub(r"\b(?:Posix|Windows|Pure)?Path\(('[^']*'|\"[^\"]*\")\)", r"\1", message)  # no Python reprs
    return message.replace("\r", "\\r").replace("\n", "\\n")


for _module in ("training", "analysis", "models", "runs"):
    importlib.import_module(f"posym.cli.{_module}")
for _info in app.registered_commands:
    if _info.cls in (None, TyperCommand):
        _info.cls = PosymCommand
