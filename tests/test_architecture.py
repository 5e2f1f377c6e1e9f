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
CORE_MAY_IMPORT = ("posym.core", "posym.errors", "posym.parallel")  # shared pure helpers the core may use
# (posym.parallel: forked workers over CPU cores, which the scores engine splits every query over; it
# imports only posym.errors)


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
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
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
    return sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        if name == CORE or name.startswith(CORE + ".")
        for target in targets
        if target != "posym" and not target.startswith(CORE_MAY_IMPORT)
    )


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
                return stack[stack.index(target) :] + [target]
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
                        n == "posym" or n.startswith("posym.") for n in names
                    ):
                        found.append(f"{name}:{inner.lineno}")
    return sorted(found)


def test_posym_imports_sit_at_the_top():
    assert late_posym_imports(PACKAGE) == []


def test_the_core_holds_the_computation():
    graph = import_graph(PACKAGE)
    core = {name for name in graph if name.startswith(CORE + ".")}
    assert {"posym.core.scores", "posym.core.qk", "posym.core.model", "posym.core.train"} <= core


def copy_package(tmp_path: Path) -> Path:
    """A copy of the package's sources in tmp_path/posym (tests/test_runs.py plants its violations in one too)."""
    copy = tmp_path / "posym"
    for path in PACKAGE.rglob("*.py"):
        target = copy / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    return copy


@pytest.fixture
def package_copy(tmp_path):
    """A copy of the package's sources in tmp_path, to add throwaway modules to."""
    return copy_package(tmp_path)


def test_a_core_module_importing_a_command_fails(package_copy):
    (package_copy / "core" / "bad.py").write_text("def f():\n    from posym.commands import dynamics\n")
    assert layer_violations(import_graph(package_copy)) == ["posym.core.bad imports posym.commands.dynamics"]


def test_a_core_module_importing_models_fails(package_copy):
    (package_copy / "core" / "bad.py").write_text("from posym import models\n")
    assert layer_violations(import_graph(package_copy)) == ["posym.core.bad imports posym.models"]


def test_a_late_import_is_found(package_copy):
    (package_copy / "commands" / "late.py").write_text("def f():\n    from posym import io\n")
    assert late_posym_imports(package_copy) == ["posym.commands.late:2"]


def test_a_cycle_hidden_by_a_late_import_is_found(package_copy):
    (package_copy / "commands" / "ping.py").write_text("from posym.commands import pong\n")
    (package_copy / "commands" / "pong.py").write_text("def f():\n    from posym.commands.ping import g\n")
    cycle = find_cycle(import_graph(package_copy))
    assert cycle is not None and set(cycle) == {"posym.commands.ping", "posym.commands.pong"}


# ---- commands as leaves, one module per CLI command, a CLI that calls ---------------------------------

COMMANDS = "posym.commands"
ORCHESTRATORS = ("run", "llm_study", "sweep", "kv_eval")
"""The commands that run other commands as their stages (`posym run`, `posym llm-study`, `posym sweep`;
`posym kv-eval`, whose labels stage is `posym atlas`):
the only command modules that may import other command modules (a package's own submodules count as it)."""
CLI_MAY_IMPORT = (
    "posym.cli",
    "posym.commands",
    "posym.io",
    "posym.errors",
    "posym.configs",
    "posym.models",
    "posym.prompts",
    "posym.score_options",
    "posym.runs",
)
"""What the CLI layer may import: itself, the commands it calls, and what it needs to name their inputs
(loading a model or a prompt set, reading a config, checking an output path and what each command writes
there, `posym.runs`, the options of `posym score` that it turns into flags)."""
CLI_CORE_NAMES = {
    "LengthGenConfig",
    "ALL_HOPS",
    "TheoryConfig",
    "task_config",
    "resolve_device",
    "TAU",
    "GAMMA",
    "GAMMAS",
}
"""Names the CLI may import from the core: configs it builds from flags and constants it prints by."""


def command_of(module: str) -> str | None:
    """posym.commands.llm_study.report -> 'llm_study'; None outside posym.commands."""
    if not module.startswith(COMMANDS + "."):
        return None
    return module[len(COMMANDS) + 1 :].split(".")[0]


def command_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(command, command) import edges between different command modules (submodules count as their command)."""
    edges = set()
    for name, targets in graph.items():
        source = command_of(name)
        for target in targets:
            other = command_of(target)
            if source and other and other != source:
                edges.add((source, other))
    return edges


def leaf_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} imports {b}" for a, b in command_edges(graph) if a not in ORCHESTRATORS)


ENTRY_POINTS = ("posym", "posym.__main__")
"""The package root (its __getattr__ hands out entry points) and `python -m posym` (calls the CLI)."""


def library_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a command or the CLI by a module of the floor between the core and the commands
    (posym.models, posym.prompts, posym.explorer, ...): what two commands share lives there, below both."""
    return sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        if name not in ENTRY_POINTS and not name.startswith((COMMANDS + ".", "posym.cli", CORE))
        for target in targets
        if target.startswith((COMMANDS, "posym.cli"))
    )


def cli_violations(root: Path) -> list[str]:
    """Imports of the CLI layer outside CLI_MAY_IMPORT (a core import only for CLI_CORE_NAMES)."""
    found = []
    for path in (root / "cli").rglob("*.py"):
        name = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [(node.module, [a.name for a in node.names])]
            else:
                continue
            for module, names in modules:
                if not (module == "posym" or module.startswith("posym.")):
                    continue
                if module.startswith("posym.core"):
                    if names is None or module == "posym.core" or set(names) - CLI_CORE_NAMES:
                        found.append(f"{name}:{node.lineno} imports {module} {names or ''}".rstrip())
                elif module != "posym" and not module.startswith(CLI_MAY_IMPORT):
                    found.append(f"{name}:{node.lineno} imports {module}")
                elif module == "posym" and (extra := set(names or ()) - {n.split(".")[-1] for n in CLI_MAY_IMPORT}):
                    found.append(f"{name}:{node.lineno} imports posym {sorted(extra)}")
    return sorted(found)


def cli_commands() -> set[str]:
    """The CLI's command names, as module names (llm-study -> llm_study)."""
    import typer.main

    from posym.cli import app  # importing it registers every command

    return {name.replace("-", "_") for name in typer.main.get_command(app).commands}


def test_commands_are_leaves():
    """No command imports another but the orchestrators (`posym report` used to import `explore` for its
    explorer page: both now call posym.explorer)."""
    assert leaf_violations(import_graph(PACKAGE)) == []


def test_the_floor_below_the_commands_imports_none():
    assert library_violations(import_graph(PACKAGE)) == []


def test_one_command_module_per_cli_command():
    modules = {p.stem for p in (PACKAGE / "commands").glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in (PACKAGE / "commands").glob("*/__init__.py")}
    assert modules == cli_commands()


def test_the_cli_calls_and_does_not_compute():
    assert cli_violations(PACKAGE) == []


def test_a_leaf_command_importing_another_fails(package_copy):
    (package_copy / "commands" / "geometry.py").write_text("from posym.commands import theory\n")
    assert leaf_violations(import_graph(package_copy)) == ["geometry imports theory"]


def test_report_importing_explore_fails(package_copy):
    """The one leaf-to-leaf import there was (`posym report` embedding the explorer page) is no exception now."""
    report = package_copy / "commands" / "report.py"
    report.write_text("from posym.commands import explore\n" + report.read_text())
    assert leaf_violations(import_graph(package_copy)) == ["report imports explore"]


def test_a_library_module_importing_a_command_fails(package_copy):
    explorer = package_copy / "explorer.py"
    explorer.write_text("from posym.commands import report\n" + explorer.read_text())
    (package_copy / "conditions.py").write_text("def f():\n    from posym.cli import options\n")
    assert library_violations(import_graph(package_copy)) == [
        "posym.conditions imports posym.cli.options",
        "posym.explorer imports posym.commands.report",
    ]


def test_an_orchestrator_may_import_commands(package_copy):
    (package_copy / "commands" / "sweep.py").write_text("from posym.commands import theory\n")
    assert leaf_violations(import_graph(package_copy)) == []


def test_a_cli_module_computing_fails(package_copy):
    (package_copy / "cli" / "bad.py").write_text(
        "def f():\n    from posym.core.scores import score_model\n    from posym import figures\n"
    )
    assert cli_violations(package_copy) == [
        "posym.cli.bad:2 imports posym.core.scores ['score_model']",
        "posym.cli.bad:3 imports posym ['figures']",
    ]


def test_the_path_of_posym_discrepancy_takes_a_short_walk(tmp_path):
    """scripts/path_walk.py: the run's path, from the command to the written tables, enters each file once,
    the shared readers and writers of posym.io and the names of posym.runs aside, which every floor asks
    (issue 54's acceptance: the models package's parts in the order of a load; the layout before issue 32
    entered 11 files, the one before issue 54 entered models.py 3 times)."""
    import importlib.util
    import sys

    from tiny_runs import train_tiny

    spec = importlib.util.spec_from_file_location("path_walk", PACKAGE.parents[1] / "scripts" / "path_walk.py")
    path_walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(path_walk)
    run = train_tiny(tmp_path, steps=2, every=2, eval_size=8).resolve()
    argv = sys.argv
    try:
        files = path_walk.walk(run, run / "discrepancy")
    finally:
        sys.argv = argv
    full, without_io = path_walk.summary(files), path_walk.summary(files, ("io.py", "runs.py"))
    assert full["walk"][0] == "cli/analysis.py" and "commands/discrepancy.py" in full["walk"]
    assert without_io["returns"] == 0, without_io
    parts = [f for f in without_io["walk"] if f.startswith("models/")]
    assert parts == ["models/selection.py", "models/loader.py", "models/spec.py", "models/checkpoints.py"] + [
        "models/files.py",
        "models/weights.py",
    ], parts
    # the walk of the layout before issue 54 (e225f48) fails the same check: models.py entered 3 times
    before_54 = (
        "cli/analysis.py cli/__init__.py models.py commands/discrepancy.py models.py resources.py models.py "
        "configs.py figures.py cli/options.py"
    ).split()
    assert path_walk.summary(before_54)["returns"] == 2
    # the walk of the layout before the restructure (5990c2e) fails the same check
    before = (
        "cli/analysis.py io.py cli/__init__.py commands/validate.py commands/discrepancy.py sources.py loading.py "
        "io.py loading.py io.py loading.py resources.py loading.py io.py loading.py io.py configs.py io.py "
        "figures.py io.py cli/options.py"
    ).split()
    assert path_walk.summary(before)["files"] == 11


# ---- io sits under everything -----------------------------------------------------------------------

IO_MAY_IMPORT = {"posym.errors", "posym.runs"}
"""posym.io writes and reads files for every floor above it, so it imports nothing of posym but its errors
and the names of what posym keeps on disk (`posym.runs`, which imports nothing of posym; not even the
package root for the version: `posym.io.package_version` reads the distribution's metadata)."""


def io_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"posym.io imports {target}" for target in graph.get("posym.io", set()) - IO_MAY_IMPORT)


def test_io_imports_only_the_errors():
    assert io_violations(import_graph(PACKAGE)) == []


def test_io_importing_the_package_root_fails(package_copy):
    io_file = package_copy / "io.py"
    io_file.write_text("import posym\n" + io_file.read_text())
    assert io_violations(import_graph(package_copy)) == ["posym.io imports posym"]


def test_the_layout_on_disk_imports_nothing_of_posym():
    """posym.runs names what posym keeps on disk for every floor, posym.io's guards included: it imports
    nothing of posym, so that io (and the CLI's --help) can ask it."""
    assert import_graph(PACKAGE)["posym.runs"] == set()


def test_a_load_walks_down_through_each_step_once(tmp_path):
    """scripts/model_walk.py: `posym.models.load` of a Hugging Face directory, a GGUF file (its first load,
    and a later process's load from the dequantized copy) and a posym run visits each step of a load once,
    in the order of a load, and re-enters no module but the shared ones (io, weights, configs, runs, the
    core), which lead into no step (issue 54's acceptance)."""
    import importlib.util

    pytest.importorskip("gguf")
    spec = importlib.util.spec_from_file_location("model_walk", PACKAGE.parents[1] / "scripts" / "model_walk.py")
    model_walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model_walk)
    found = model_walk.walks(tmp_path)
    steps = {
        "hf": ["loader", "spec", "files", "resources"],
        "gguf first load": ["loader", "spec", "files", "resources", "cache"],
        "gguf from its copy": ["loader", "spec", "files", "resources", "cache"],
        "posym run": ["loader", "spec", "checkpoints", "files", "resources"],
    }
    for name, result in found.items():
        assert result["reentered"] == [] and result["below_shared"] == [], (name, result)
        walked = [step.split(":")[1].rpartition(".")[2] for step in result["walk"]]
        assert [m for m in walked if m in steps[name]] == steps[name], (name, walked)  # each once, in this order
    # the walk of an HF directory before issue 54 (e225f48: models.py, gguf_files.py, resources.py) fails it
    before = ["0:posym.models", "1:posym.core.model", "1:posym.io", "1:posym.core.qk", "1:posym.io"]
    before += ["1:posym.resources", "1:posym.resources", "1:posym.io", "1:posym.io"]
    visits = [(step.split(":")[1], int(step.split(":")[0])) for step in before]
    assert model_walk.summary(visits)["reentered"] == ["posym.resources"]
