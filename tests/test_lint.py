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


def _ruff_format_check(*paths) -> tuple[int, str]:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "--config", str(root / "pyproject.toml"),
                           *map(str, paths)], capture_output=True, text=True, cwd=root)
    return done.returncode, done.stdout + done.stderr


def test_the_code_is_formatted():
    """`ruff format` (black's style at 120 columns, pyproject.toml) leaves every file as it is."""
    root = Path(__file__).resolve().parents[1]
    code, out = _ruff_format_check(root / "src", root / "tests", root / "scripts", root / "benchmarks")
    assert code == 0, out


def test_an_unformatted_file_is_found(tmp_path):
    (tmp_path / "bad.py").write_text("x = {  'a':1 }\n")
    code, out = _ruff_format_check(tmp_path / "bad.py")
    assert code == 1 and "bad.py" in out
