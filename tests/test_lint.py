"""Dead code the eye misses: unused imports and variables, undefined names (pyflakes), in src and tests."""

from pathlib import Path

from pyflakes.api import checkPath
from pyflakes.reporter import Reporter


class _Collect:
    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.append(text)

    def flush(self):
        pass


def test_pyflakes_finds_nothing():
    root = Path(__file__).resolve().parents[1]
    files = sorted([*root.glob("src/posym/**/*.py"), *root.glob("tests/*.py"), *root.glob("benchmarks/*.py")])
    assert len(files) > 30
    out = _Collect()
    problems = sum(checkPath(str(f), Reporter(out, out)) for f in files)
    assert problems == 0, "".join(out.lines)
