"""Every worked example in posym's docstrings (minGPT style, `>>> `) runs and prints what it says.

An example nobody runs drifts from the code it documents (two had, when this test was written:
`posym.prompts`' answer token and `llm_bench.key_spellings`' escaped backslashes), so each module whose
source holds an example is one test case here, run by the standard library's doctest.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import posym

SRC = Path(posym.__file__).parent


def modules_with_examples() -> list[str]:
    """Dotted names of the posym modules whose source holds a `>>> ` line, sorted."""
    names = []
    for path in sorted(SRC.rglob("*.py")):
        if ">>> " not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = modules_with_examples()


def test_the_scan_finds_the_examples():
    # A scan that found nothing would leave every case below vacuous.
    assert len(MODULES) >= 15
    assert {"posym", "posym.core.stats", "posym.prompts", "posym.commands.llm_bench"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
    assert tests, f"{name}'s source has a '>>> ' line but doctest finds no example in it"
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
