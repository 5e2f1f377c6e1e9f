"""scripts/build_cli_docs.py: the option tables of docs/commands/*.md are the command line's own options,
every command is on one page, and `--check` fails on a stale page (a copy edited in tmp_path)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from build_cli_docs import PAGES, build, commands, problems, table  # noqa: E402


def copy_pages(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "docs" / "commands", tmp_path / "docs" / "commands")
    return tmp_path / "docs" / "commands"


def test_committed_pages_are_current():
    assert build(ROOT, check=True) == []


def test_every_command_is_on_exactly_one_page():
    listed = [c for names in PAGES.values() for c in names]
    assert sorted(listed) == sorted(commands()) and len(listed) == len(set(listed))


def test_a_row_is_what_help_says():
    rows = table(commands()["score"]).splitlines()
    assert rows[:2] == ["| option | type | default | help |", "| --- | --- | --- | --- |"]
    assert rows[2].startswith("| `PATH` (argument) | path | required | The model: a posym run")
    assert "| `--queries` | `last` \\| `hops` \\| `all` |  |" in table(commands()["score"])
    assert "| `--n` | int (>= 1) | `100` | How many task prompts to score (the paper uses 100). |" in rows
    assert "| `--progress` / `--no-progress` | on/off | `--progress` | Show a progress bar. |" in table(
        commands()["train"]
    )
    assert "| `--step` | `STEP\\|best` |  |" in table(commands()["eval"])  # a pipe inside a cell is escaped


def test_check_fails_on_a_stale_page_and_a_rebuild_fixes_it(tmp_path):
    pages = copy_pages(tmp_path)
    page = pages / "analysis.md"
    text = page.read_text()
    row = "| `--n` | int (>= 1) | `100` | How many task prompts to score (the paper uses 100). |"
    assert row in text
    page.write_text(text.replace(row, row.replace("`100`", "`50`"), 1))  # what a changed default leaves behind
    assert build(tmp_path, check=True) == ["docs/commands/analysis.md is stale: run python scripts/build_cli_docs.py"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_cli_docs.py"), "--check", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "analysis.md is stale" in done.stdout
    assert build(tmp_path) == [] and page.read_text() == text and build(tmp_path, check=True) == []


def test_a_page_without_a_commands_block_or_a_missing_page_is_listed(tmp_path):
    pages = copy_pages(tmp_path)
    text = (pages / "runs.md").read_text()
    begin, end = "<!-- options:sweep:begin -->", "<!-- options:sweep:end -->"
    (pages / "runs.md").write_text(text[: text.index(begin)] + text[text.index(end) + len(end) :])
    (pages / "models.md").unlink()
    assert problems(tmp_path) == [
        "docs/commands/models.md is missing",
        "docs/commands/runs.md has no options block for posym sweep",
    ]
