"""Every worked example in posym's and scripts/' docstrings (minGPT style, `>>> `) runs and prints what it says.

An example nobody runs drifts from the code it documents (three had, when this test was written:
`posym.prompts`' answer token, `llm_bench.key_spellings`' escaped backslashes, and
`paper_variants.gap_closed`, which returned a NumPy scalar for its `float`), so each module or script
whose source holds an example is one test case here, run by the standard library's doctest.
"""

from __future__ import annotations

import doctest
import importlib
import sys
from pathlib import Path

import pytest

import posym

SRC = Path(posym.__file__).parent
SCRIPTS = SRC.parents[1] / "scripts"


def modules_with_examples() -> list[str]:
    """Dotted names of the posym modules whose source holds a `>>> ` line, sorted."""
    names = []
    for path in sorted(SRC.rglob("*.py")):
        if ">>> " not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def scripts_with_examples() -> list[str]:
    """File names of the scripts/ files whose source holds a `>>> ` line, sorted."""
    return [path.name for path in sorted(SCRIPTS.glob("*.py")) if ">>> " in path.read_text(encoding="utf-8")]


def load_script(name: str):
    """Import scripts/NAME by its stem, as the tests that use a script do (scripts/ on sys.path)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module(Path(name).stem)


MODULES = modules_with_examples()
SCRIPT_FILES = scripts_with_examples()


def test_the_scan_finds_the_examples():
    # A scan that found nothing would leave every case below vacuous.
    assert len(MODULES) >= 15
    assert {"posym", "posym.core.stats", "posym.prompts", "posym.commands.llm_bench"} <= set(MODULES)
    assert "paper_variants.py" in SCRIPT_FILES


@pytest.mark.parametrize("name", MODULES + SCRIPT_FILES)
def test_docstring_examples_hold(name):
    module = load_script(name) if name.endswith(".py") else importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
    assert tests, f"{name}'s source has a '>>> ' line but doctest finds no example in it"
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
