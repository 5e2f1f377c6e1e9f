"""Run the `posym` command line in-process from a test (importable from any test in tests/):
from cli_runner import run_posym, cli, one_line
"""

from __future__ import annotations

import sys


def run_posym(monkeypatch, *args) -> int:
    """`posym ARGS` through `posym.cli.main` with sys.argv patched; returns the exit code (0 on success)."""
    from posym.cli import main

    monkeypatch.setattr(sys, "argv", ["posym", *map(str, args)])
    try:
        main()
    except SystemExit as exc:
        return exc.code
    return 0


def cli(capsys, monkeypatch, *argv) -> tuple[int, str]:
    """`posym ARGV` in-process: (exit code, stderr)."""
    capsys.readouterr()
    code = run_posym(monkeypatch, *argv)
    return code, capsys.readouterr().err


def one_line(code: int, err: str, *needles: str) -> None:
    """The bad-input contract: exit 2, one `posym: error:` line on stderr naming every needle, no traceback."""
    assert code == 2, (code, err[-2000:])
    assert err.startswith("posym: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert len(err) < 600, err  # a bounded message, whatever the input held
    for needle in needles:
        assert needle in err, err
