"""Dead code the eye misses: unused imports and variables, undefined names (pyflakes), in src and tests."""

import ast
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
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--config", str(root / "pyproject.toml"), *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=root,
    )
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


# ---- one source per constant: tau and gamma defaults read posym.core.paper ---------------------------

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "posym"
LITERALS = {"tau": {1e-4}, "gamma": {0.1, 0.05}, "gammas": {0.1, 0.05}}
"""The constants posym.core.paper defines once (TAU, GAMMA, GAMMAS), by the names that carry them."""
DEFINITION = PACKAGE / "core" / "paper.py"


def _name(node) -> str | None:
    """The tau/gamma name a node spells (a variable, attribute, keyword, or string key), else None."""
    text = (
        node.id
        if isinstance(node, ast.Name)
        else node.attr
        if isinstance(node, ast.Attribute)
        else node.value
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        else None
    )
    text = text.lower() if text else None
    return text if text in LITERALS else None


def _literals(node, name: str) -> list[int]:
    """Lines of number literals inside `node` that spell a value of `name`'s constant."""
    return [
        n.lineno
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and type(n.value) is float and n.value in LITERALS[name]
    ]


def constant_literals(path: Path) -> list[int]:
    """The lines of every tau or gamma default written as a number: a parameter's default (also a
    typer.Option's), a field or variable, a keyword argument, a dict entry, `.get("tau", 1e-4)`,
    `x.tau or 1e-4`, and a comparison `gamma == 0.1`. The quantisation step 1e-4 of a name that is not
    tau (lr, weight_decay, explore's STEPS) is not one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        pairs = []  # (name, the expression holding its value)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            pairs += [(arg.arg, d) for arg, d in zip(positional[len(positional) - len(a.defaults) :], a.defaults)]
            pairs += [(arg.arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            pairs.append((_name(node.target), node.value))
        elif isinstance(node, ast.Assign):
            pairs += [(_name(t), node.value) for t in node.targets]
        elif isinstance(node, ast.keyword) and node.arg:
            pairs.append((node.arg, node.value))
        elif isinstance(node, ast.Dict):
            pairs += [(_name(k), v) for k, v in zip(node.keys, node.values) if k is not None]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and len(node.args) == 2
        ):
            pairs.append((_name(node.args[0]), node.args[1]))
        elif isinstance(node, ast.BoolOp):
            named = [n for v in node.values for n in map(_name, ast.walk(v)) if n]
            pairs += [(named[0], v) for v in node.values if named]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = [n for side in sides for n in map(_name, ast.walk(side)) if n]
            pairs += [(named[0], side) for side in sides if named]
        for name, value in pairs:
            name = name.lower() if name else None
            if name in LITERALS:
                found += _literals(value, name)
    return sorted(set(found))


def test_tau_and_gamma_are_written_once():
    """Every default of tau (1e-4) and gamma (0.1, 0.05) in the package, scripts and benchmarks reads
    posym.core.paper's TAU / GAMMA / GAMMAS."""
    files = sorted([*PACKAGE.rglob("*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("benchmarks/*.py")])
    assert len(files) > 30
    assert len(constant_literals(DEFINITION)) == 2  # TAU = 1e-4 and GAMMAS = (0.1, 0.05): the scan sees them
    found = [
        f"{path.relative_to(ROOT)}:{line}" for path in files if path != DEFINITION for line in constant_literals(path)
    ]
    assert found == []


def test_a_tau_literal_is_found(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import typer\n"
        "def f(x, tau: float = 1e-4, lr=1e-4):\n"  # 2: tau, not lr
        "    return x\n"
        "class C:\n"
        "    tau: float = 1e-4\n"  # 5
        "    weight_decay: float = 1e-4\n"
        "def g(s, tau=typer.Option(1e-4, help='t')):\n"  # 7
        "    f(1, tau=1e-4)\n"  # 8
        "    d = {'tau': 1e-4, 'step': 1e-4}\n"  # 9
        "    s.get('tau', 1e-4)\n"  # 10
        "    s.model.tau or 1e-4\n"  # 11
        "    return [r for r in s if r['gamma'] == 0.1]\n"  # 12
        "def h(gamma: float = 0.1, gammas=(0.1, 0.05)):\n"  # 13
        "    pass\n"
    )
    assert constant_literals(bad) == [2, 5, 7, 8, 9, 10, 11, 12, 13]


# ---- every Parquet read goes through posym.io.read_parquet (its one-line error for a damaged file) -----

READERS = {"read_parquet", "read_table", "read_pandas", "ParquetFile", "ParquetDataset"}
"""pandas' and pyarrow's Parquet readers; only posym.io calls them."""


def unguarded_reads(path: Path) -> list[int]:
    """Lines that read Parquet around posym.io.read_parquet: `pd.read_parquet(...)`,
    `pq.read_table(...)`, `pq.ParquetFile(...)`, or such a reader imported by name from pandas/pyarrow."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in READERS:
            owner = node.value
            through_io = (isinstance(owner, ast.Name) and owner.id == "io") or (
                isinstance(owner, ast.Attribute) and owner.attr == "io"
            )
            if not (node.attr == "read_parquet" and through_io):
                found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("pandas", "pyarrow"):
            found += [node.lineno for alias in node.names if alias.name in READERS]
    return sorted(found)


def test_every_parquet_read_is_guarded():
    io_module = PACKAGE / "io.py"
    assert unguarded_reads(io_module)  # the guarded reader itself calls pandas and pyarrow: the scan sees them
    found = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != io_module
        for line in unguarded_reads(path)
    ]
    assert found == []


def test_an_unguarded_read_is_found(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pandas as pd\n"
        "import pyarrow.parquet as pq\n"
        "from pandas import read_parquet\n"  # 3
        "from posym import io\n"
        "from posym.io import read_parquet as guarded\n"
        "a = pd.read_parquet('x.parquet')\n"  # 6
        "b = pq.read_table('x.parquet')\n"  # 7
        "c = pq.ParquetFile('x.parquet')\n"  # 8
        "d = io.read_parquet('x.parquet')\n"
        "e = guarded('x.parquet')\n"
    )
    assert unguarded_reads(bad) == [3, 6, 7, 8]


# ---- figure functions return a Figure; the caller saves it --------------------------------------------


def self_saving_plots(path: Path) -> list[str]:
    """`plot_*` functions that save (call save_figure or savefig) instead of returning their Figure."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("plot"):
            calls = {
                n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
                for n in ast.walk(node)
                if isinstance(n, ast.Call)
            }
            if calls & {"save_figure", "savefig"}:
                found.append(node.name)
    return sorted(found)


def test_every_plot_function_returns_its_figure():
    plots = [
        f"{path.relative_to(PACKAGE)}:{name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in self_saving_plots(path)
    ]
    assert plots == []


def test_a_self_saving_plot_is_found(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from posym.figures import save_figure, subplots\n"
        "def plot_a(x, stem):\n    fig, ax = subplots()\n    return save_figure(fig, stem)\n"
        "def plot_b(x):\n    fig, ax = subplots()\n    return fig\n"
        "def write(x, stem):\n    return save_figure(plot_b(x), stem)\n"
    )
    assert self_saving_plots(bad) == ["plot_a"]


# ---- an expected error names its message ----------------------------------------------------------------


def bare_raises(path: Path) -> list[int]:
    """Lines of `with pytest.raises(PosymError)` that neither pass `match=` nor keep the error (`as caught`) to
    read its message: such a test passes for any error of the type, the wrong one included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.With):
            continue
        for item in node.items:
            call = item.context_expr
            is_raises = (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "raises"
                and getattr(call.func.value, "id", None) == "pytest"
            )
            if not is_raises or not call.args or getattr(call.args[0], "id", None) != "PosymError":
                continue
            if item.optional_vars is None and not any(k.arg == "match" for k in call.keywords):
                found.append(call.lineno)
    return found


def test_every_expected_error_names_its_message():
    found = [
        f"{path.name}:{line}" for path in sorted(Path(__file__).parent.glob("test_*.py")) for line in bare_raises(path)
    ]
    assert found == []


def test_a_bare_raises_is_found(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pytest\n"
        "with pytest.raises(PosymError):\n"  # 2
        "    f()\n"
        "with pytest.raises(PosymError, match='x'):\n"
        "    f()\n"
        "with pytest.raises(PosymError) as caught:\n"
        "    f()\n"
        "with open('a'), pytest.raises(PosymError):\n"  # 8
        "    f()\n"
        "with pytest.raises(KeyboardInterrupt):\n"
        "    f()\n"
    )
    assert bare_raises(bad) == [2, 8]
