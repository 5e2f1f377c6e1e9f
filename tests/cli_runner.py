"""Run the `posym` command line in-process from a test (importable from any test in tests/):
    from cli_runner import run_posym
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
