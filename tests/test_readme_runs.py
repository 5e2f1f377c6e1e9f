"""scripts/readme_runs.py: every shell block of the README and docs runs as written (slow), and the
checker itself fails on a broken example and honours its skip markers (fast, throwaway Markdown)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from readme_runs import default_files, extract_blocks, run_blocks  # noqa: E402

THROWAWAY = """# demo

```bash
echo one > made.txt
```

<!-- readme-runs: skip (needs a GPU) -->
```bash
nvidia-smi --this-would-fail
```

<!-- readme-runs: slow (long) -->
```bash
exit 7
```

```bash
test -f made.txt
posym --this-option-does-not-exist
echo never reached
```
"""


def test_extract_blocks_reads_markers_and_lines():
    blocks = extract_blocks(THROWAWAY, "demo.md")
    assert [b.line for b in blocks] == [3, 8, 13, 17]
    assert [(b.marker, b.reason) for b in blocks] == [(None, ""), ("skip", "needs a GPU"), ("slow", "long"), (None, "")]
    assert blocks[3].text.splitlines()[1] == "posym --this-option-does-not-exist"


def test_default_order_readme_then_command_pages_then_docs():
    """The command pages run in the order of `posym --help`: analysis reads the runs training made."""
    names = [str(f.relative_to(ROOT)) for f in default_files()]
    assert names[:5] == [
        "README.md",
        "docs/commands/training.md",
        "docs/commands/analysis.md",
        "docs/commands/models.md",
        "docs/commands/runs.md",
    ]
    assert names[5:] == sorted(names[5:]) and all(n.startswith("docs/") and n.count("/") == 1 for n in names[5:])


def test_a_broken_example_fails_and_skips_say_why(tmp_path):
    out = io.StringIO()
    failed = run_blocks(extract_blocks(THROWAWAY, "demo.md"), tmp_path, fast=True, out=out)
    log = out.getvalue()
    assert [b.line for b in failed] == [17]  # the bad posym option; the earlier file-creating block ran
    assert "SKIP demo.md:8 (needs a GPU)" in log and "SKIP demo.md:13 (long)" in log
    assert "FAIL demo.md:17 exit 2" in log


def test_slow_blocks_run_without_the_fast_variable(tmp_path):
    failed = run_blocks(extract_blocks(THROWAWAY, "demo.md"), tmp_path, fast=False, out=io.StringIO())
    assert [b.line for b in failed] == [13, 17]


def test_the_script_exits_1_on_a_broken_file(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(THROWAWAY)
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "readme_runs.py"),
            "--scratch",
            str(tmp_path / "s"),
            "--json",
            str(tmp_path / "record.json"),
            str(page),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, POSYM_README_FAST="1"),
    )
    assert done.returncode == 1 and "1 failed of 4 blocks" in done.stdout
    record = json.loads((tmp_path / "record.json").read_text())
    assert (record["ok"], record["failed"], record["skipped"], record["POSYM_README_FAST"]) == (1, 1, 2, True)
    assert [r["outcome"] for r in record["rows"]] == ["ok", "skipped", "skipped", "failed"]
    assert record["rows"][3]["where"].endswith("page.md:17") and record["rows"][3]["exit"] == 2
    assert record["versions"]["posym"] and record["wall_s"] >= 0


@pytest.mark.slow
def test_every_readme_and_docs_block_runs(tmp_path):
    """The acceptance run: README.md, docs/commands/*.md, then docs/*.md, quick preset, POSYM_README_FAST=1."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme_runs.py"), "--scratch", str(tmp_path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, POSYM_README_FAST="1"),
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
