"""Follow the `path` argument of `posym discrepancy` through the code, from the command to the written tables.

The measure of issue 32's acceptance: run `posym discrepancy RUN_DIR` in this process under
`sys.settrace` and record every call of a posym function that receives the run's path (a `str` or
`Path` equal to it, or a path inside it: its checkpoint, its output directory). Consecutive calls in one
file are one stay. Reported: the stays, the distinct files entered, the returns (a stay in a file already
left before) and the climbs (a stay one layer up from the one before: core < the middle floor < commands
< cli).

    python scripts/path_walk.py            # trains a 2-layer run in a temporary directory (~10 s), then walks
    python scripts/path_walk.py --json     # the same numbers as JSON
    python scripts/path_walk.py --without io.py   # the walk without the shared readers and writers
    python scripts/path_walk.py --exact    # only the calls that receive the path itself

The run is tiny and the lengths short (17 and 34 tokens): the walk depends on the code, not the sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import posym  # noqa: E402

PACKAGE = Path(posym.__file__).resolve().parent
calls: list[str] = []
"""file:function of every call of the last walk, in order."""


def layer(file: str) -> int:
    """0 core, 1 the middle floor (models, prompts, io, ...), 2 commands, 3 cli."""
    rel = Path(file).relative_to(PACKAGE).parts
    return {"core": 0, "commands": 2, "cli": 3}.get(rel[0], 1) if len(rel) > 1 else 1


def carries(value, run: Path, exact: bool = False) -> bool:
    """Whether an argument is the run's path (`exact`) or the run's path or a path inside it."""
    if isinstance(value, (str, os.PathLike)):
        try:
            path = Path(value).resolve()
        except (OSError, ValueError, TypeError):
            return False
        return path == run or (not exact and run in path.parents)
    return False


def walk(run: Path, out: Path, exact: bool = False) -> list[str]:
    """The posym files, in call order, of every call that receives the run's path (with `exact`, the
    path itself only; else also a path inside the run: a checkpoint, config.json, an output)."""
    from posym.cli import main

    files: list[str] = []
    calls.clear()

    def tracer(frame, event, arg):
        if event != "call":
            return None
        file = frame.f_code.co_filename
        if not file.startswith(str(PACKAGE)):
            return None
        code = frame.f_code
        args = [frame.f_locals.get(name) for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]]
        if any(carries(value, run, exact) for value in args):
            files.append(str(Path(file).relative_to(PACKAGE)))
            calls.append(f"{files[-1]}:{code.co_name}")
        return None

    argv = ["discrepancy", str(run), "--n", "4", "--lengths", "17,34", "--out", str(out), "--device", "cpu"]
    sys.argv = ["posym", *argv]
    sys.settrace(tracer)
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        sys.settrace(None)
    return files


def summary(files: list[str], without: tuple[str, ...] = ()) -> dict:
    """Stays, files, returns and climbs of a walk; files in `without` (e.g. io.py, whose guarded readers
    and writers every floor calls) are left out of it first."""
    files = [f for f in files if f not in without]
    stays = [f for k, f in enumerate(files) if k == 0 or files[k - 1] != f]
    returns = sum(1 for k, f in enumerate(stays) if f in stays[:k])
    climbs = sum(1 for a, b in zip(stays, stays[1:]) if layer(PACKAGE / b) > layer(PACKAGE / a))
    return {"stays": len(stays), "files": len(set(stays)), "returns": returns, "climbs": climbs, "walk": stays}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--calls", action="store_true", help="also print every call (file:function) of the walk")
    parser.add_argument(
        "--exact", action="store_true", help="follow the run's path itself only, not the paths inside it"
    )
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="FILE",
        help="leave FILE (relative to the package, e.g. io.py) out of the walk; repeatable",
    )
    args = parser.parse_args()
    from tiny_runs import train_tiny

    with tempfile.TemporaryDirectory() as tmp:
        run = train_tiny(Path(tmp), steps=4, every=4).resolve()
        result = summary(walk(run, run / "discrepancy", args.exact), tuple(args.without))
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(" -> ".join(result["walk"]))
    if args.calls:
        print("\n".join(calls))
    print(
        f"{result['stays']} stays in {result['files']} files, {result['returns']} returns to a file already "
        f"left, {result['climbs']} climbs up a layer"
    )


if __name__ == "__main__":
    main()
