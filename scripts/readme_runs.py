"""Run every ```bash block of README.md and the docs, in order, in a scratch copy of the repository.

The README is the manual: each of its shell examples must run as written. This script copies the
tracked files of the repository into a scratch directory, then runs each block there with
`bash -e -o pipefail` (README.md first, then the command pages docs/commands/*.md in the order of
`posym --help`, whose blocks build on each other: training's runs are what analysis reads, then any
other command page and docs/*.md by name), printing file:line, exit code and seconds per block, and exits 1 if any block exited non-zero (0 when all ran or were skipped).

Markers (an HTML comment on the line before the fence, invisible on GitHub):
    <!-- readme-runs: skip (needs a GPU) -->      never run here; the reason is printed
    <!-- readme-runs: slow (trains 6,000 steps) --> skipped when POSYM_README_FAST=1, run otherwise
POSYM_README_FAST=1 (the README's "Install, run, test" section names it) is the only way to shorten a
run: the text of a block is never edited.

    python scripts/readme_runs.py [--scratch DIR] [--stop] [--timeout S] [--json FILE] [FILE.md ...]

--json FILE records the run (date, machine, load, versions, and each block's file:line, outcome and
seconds) as docs/benchmarks/readme_runs.json does.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!--\s*readme-runs:\s*(skip|slow)\s*\((.+?)\)\s*-->")
FAST_ENV = "POSYM_README_FAST"


@dataclass
class Block:
    """One ```bash block: where it starts, its text and its marker (if any)."""

    path: str  # as printed (relative to the repository)
    line: int  # 1-based line of the opening fence
    text: str
    marker: str | None = None  # "skip" / "slow"
    reason: str = ""


def extract_blocks(markdown: str, path: str) -> list[Block]:
    """The ```bash blocks of one Markdown text, with the marker on the last non-blank line above each."""
    blocks, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            start, body = i, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            above = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            found = MARKER.search(above)
            blocks.append(
                Block(
                    path,
                    start + 1,
                    "\n".join(body) + "\n",
                    found.group(1) if found else None,
                    found.group(2) if found else "",
                )
            )
        i += 1
    return blocks


COMMAND_PAGES = ("training", "analysis", "models", "runs")
"""docs/commands/<page>.md in the order they run (the order of `posym --help`)."""


def default_files(root: Path = ROOT) -> list[Path]:
    """README.md, the command pages in COMMAND_PAGES order (then any other, by name), then docs/*.md."""
    pages = sorted(
        (root / "docs" / "commands").glob("*.md"),
        key=lambda p: (COMMAND_PAGES.index(p.stem) if p.stem in COMMAND_PAGES else len(COMMAND_PAGES), p.name),
    )
    return [root / "README.md", *pages, *sorted((root / "docs").glob("*.md"))]


def scratch_copy(root: Path, scratch: Path) -> None:
    """The tracked files of the repository (what a clean clone has), copied into scratch."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True)
    for name in listed.stdout.decode().split("\0"):
        if name and (root / name).is_file():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, scratch / name)


def block_env(scratch: Path) -> dict[str, str]:
    """The environment of every block: the scratch copy's sources first on PYTHONPATH, and a `posym`
    command on PATH (a `python -m posym` shim where posym is not installed as a console script)."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(scratch / "src"), os.environ.get("PYTHONPATH")]))
    )
    if shutil.which("posym") is None:
        shim = scratch / ".readme-runs-bin"
        shim.mkdir(exist_ok=True)
        (shim / "posym").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m posym "$@"\n')
        (shim / "posym").chmod(0o755)
        env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    return env


def run_blocks(
    blocks: list[Block],
    scratch: Path,
    *,
    fast: bool,
    stop: bool = False,
    timeout: float | None = None,
    out=sys.stdout,
    record: list | None = None,
) -> list[Block]:
    """Run the blocks in order in scratch; returns those that failed (non-zero exit or timeout).
    `record`, if given, receives one dict per block: where, outcome (ok, failed, skipped), exit, seconds, reason."""
    env, failed = block_env(scratch), []
    record = [] if record is None else record
    for block in blocks:
        where = f"{block.path}:{block.line}"
        if block.marker == "skip" or (block.marker == "slow" and fast):
            print(f"SKIP {where} ({block.reason})", file=out, flush=True)
            record.append({"where": where, "outcome": "skipped", "marker": block.marker, "reason": block.reason})
            continue
        print(f"RUN  {where}\n{block.text}", end="", file=out, flush=True)
        start = time.perf_counter()
        try:
            code = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=scratch, env=env, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        seconds = time.perf_counter() - start
        print(f"{'ok  ' if code == 0 else 'FAIL'} {where} exit {code}, {seconds:.1f} s", file=out, flush=True)
        record.append(
            {
                "where": where,
                "outcome": "ok" if code == 0 else "failed",
                "exit": code,
                "seconds": round(seconds, 1),
                "marker": block.marker,
            }
        )
        if code != 0:
            failed.append(block)
            if stop:
                break
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "files", nargs="*", type=Path, help="Markdown files (default README.md, docs/commands/*.md, docs/*.md)"
    )
    parser.add_argument("--scratch", type=Path, help="scratch directory (default a new temporary one, kept)")
    parser.add_argument("--stop", action="store_true", help="stop at the first failing block")
    parser.add_argument("--timeout", type=float, help="seconds allowed per block")
    parser.add_argument("--json", type=Path, help="write the record of this run here")
    args = parser.parse_args(argv)
    files = args.files or default_files()
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="posym-readme-runs-"))
    scratch.mkdir(parents=True, exist_ok=True)
    scratch_copy(ROOT, scratch)
    blocks = [b for f in files for b in extract_blocks(f.read_text(), os.path.relpath(f, ROOT))]
    fast = os.environ.get(FAST_ENV) == "1"
    print(f"{len(blocks)} blocks from {len(files)} files in {scratch}{' (' + FAST_ENV + '=1)' if fast else ''}")
    start, load, record = time.perf_counter(), os.getloadavg(), []
    failed = run_blocks(blocks, scratch, fast=fast, stop=args.stop, timeout=args.timeout, record=record)
    wall = time.perf_counter() - start
    print(
        f"{len(failed)} failed of {len(blocks)} blocks, {wall:.0f} s wall"
        + "".join(f"\n  {b.path}:{b.line}" for b in failed)
    )
    if args.json:
        sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "src")]
        from record import benchmark_header
        from posym.io import write_json

        counts = {o: sum(r["outcome"] == o for r in record) for o in ("ok", "failed", "skipped")}
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        write_json(
            args.json,
            {
                **benchmark_header(None, load),
                "command": "python scripts/readme_runs.py",
                "commit": commit,
                FAST_ENV: fast,
                "files": [os.path.relpath(f, ROOT) for f in files],
                "wall_s": round(wall, 1),
                "blocks": len(blocks),
                **counts,
                "rows": record,
            },
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
