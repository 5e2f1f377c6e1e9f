"""The package's shape: posym.core never imports the layer above it, and no module imports form a cycle.

Every import counts, at module level or inside a function: a late import hides a cycle from Python
but not from this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import posym

CORE = "posym.core"
CORE_MAY_IMPORT = ("posym.core", "posym.errors")  # shared pure helpers the core may use


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def posym_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The posym modules `path` imports (`from posym import io` counts as posym.io)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t == "posym" or t.startswith("posym.")}
    return found - {name}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module name -> the posym modules it imports, for every .py file under `root` (the package dir)."""
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    known = set(paths)
    return {name: posym_imports(path, name, known) for name, path in paths.items()}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{name} imports {target}" for name, targets in graph.items()
                  if name == CORE or name.startswith(CORE + ".")
                  for target in targets if target != "posym" and not target.startswith(CORE_MAY_IMPORT))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None. Package __init__ edges count like any other."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in graph or target == "posym":
                continue
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


PACKAGE = Path(posym.__file__).parent


def test_core_imports_nothing_above_it():
    assert layer_violations(import_graph(PACKAGE)) == []


def test_no_import_cycle():
    assert find_cycle(import_graph(PACKAGE)) is None


def late_posym_imports(root: Path) -> list[str]:
    """posym imports inside functions, outside the CLI and the package root (both import lazily: `posym
    --help` and `import posym` stay fast; the root's __getattr__ hands out its entry points on first use)."""
    found = []
    for path in root.rglob("*.py"):
        name = module_name(path, root)
        if name in ("posym", "posym.cli") or name.startswith("posym.cli."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    module = inner.module if isinstance(inner, ast.ImportFrom) else None
                    names = [a.name for a in inner.names] if isinstance(inner, ast.Import) else [module or ""]
                    if isinstance(inner, (ast.Import, ast.ImportFrom)) and any(
                            n == "posym" or n.startswith("posym.") for n in names):
                        found.append(f"{name}:{inner.lineno}")
    return sorted(found)


def test_posym_imports_sit_at_the_top():
    assert late_posym_imports(PACKAGE) == []


def test_the_core_holds_the_computation():
    graph = import_graph(PACKAGE)
    core = {name for name in graph if name.startswith(CORE + ".")}
    assert {"posym.core.scores", "posym.core.qk", "posym.core.model", "posym.core.train"} <= core


@pytest.fixture
def package_copy(tmp_path):
    """A copy of the package's sources in tmp_path, to add throwaway modules to."""
    copy = tmp_path / "posym"
    for path in PACKAGE.rglob("*.py"):
        target = copy / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    return copy


def test_a_core_module_importing_a_command_fails(package_copy):
    (package_copy / "core" / "bad.py").write_text("def f():\n    from posym.commands import dynamics\n")
    assert layer_violations(import_graph(package_copy)) == ["posym.core.bad imports posym.commands.dynamics"]


def test_a_core_module_importing_loading_fails(package_copy):
    (package_copy / "core" / "bad.py").write_text("from posym import loading\n")
    assert layer_violations(import_graph(package_copy)) == ["posym.core.bad imports posym.loading"]


def test_a_late_import_is_found(package_copy):
    (package_copy / "commands" / "late.py").write_text("def f():\n    from posym import io\n")
    assert late_posym_imports(package_copy) == ["posym.commands.late:2"]


def test_a_cycle_hidden_by_a_late_import_is_found(package_copy):
    (package_copy / "commands" / "ping.py").write_text("from posym.commands import pong\n")
    (package_copy / "commands" / "pong.py").write_text("def f():\n    from posym.commands.ping import g\n")
    cycle = find_cycle(import_graph(package_copy))
    assert cycle is not None and set(cycle) == {"posym.commands.ping", "posym.commands.pong"}
