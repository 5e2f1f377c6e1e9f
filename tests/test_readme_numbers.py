"""scripts/readme_numbers.py: the README's performance and results numbers come from the files they cite."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from readme_numbers import check, default_files, matches  # noqa: E402


def test_every_readme_number_is_backed_by_the_file_it_cites():
    files = default_files()
    assert ROOT / "README.md" in files and len([f for f in files if f.parent.name == "commands"]) == 4
    problems = [p for f in files for p in check(f)]
    assert not problems, "numbers no recorded run backs:\n" + "\n".join(problems)


def test_rounding_rules():
    assert matches("5.4", [5.382]) and not matches("5.4", [5.46])
    assert matches("2.8e-16", [2.7756e-16]) and not matches("2.8e-16", [3.3e-16])
    assert matches("1,024", [1024.0]) and not matches("1,024", [1025.0])


def test_a_wrong_or_uncited_number_is_listed(tmp_path):
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "docs" / "benchmarks" / "b.json").write_text(
        json.dumps({"fast_s": 1.234, "ratio": 140.2, "bytes": 2**21})
    )
    page = tmp_path / "README.md"
    page.write_text(
        "Scores take 1.23 s, 140x the brute force, 2 MiB (docs/benchmarks/b.json).\n\n"
        "| a | b |\n| 1.2 s | 141x |\n\n"
        "Training runs 12.5 steps/s on 2 cores.\n\n"
        "See 3 s (docs/benchmarks/missing.json).\n"
    )
    problems = check(page, tmp_path)
    assert problems == [
        "README.md:3: 141 is not in docs/benchmarks/b.json",
        "README.md:6: '12.5 steps/s' is quoted without a docs/benchmarks or docs/results file",
        "README.md:8: cites docs/benchmarks/missing.json, which does not exist",
    ]


def test_numbers_inside_a_cited_path_are_not_results(tmp_path):
    (tmp_path / "docs" / "results" / "study-0.5b").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "study-0.5b" / "t.json").write_text(json.dumps({"seconds": 2252.98}))
    page = tmp_path / "page.md"
    page.write_text(
        "It took 2,253 s (docs/results/study-0.5b/t.json).\n\nIt took 2,254 s (docs/results/study-0.5b/t.json).\n"
    )
    assert check(page, tmp_path) == ["page.md:3: 2,254 is not in docs/results/study-0.5b/t.json"]


def test_generated_option_tables_are_not_read(tmp_path):
    """A default in an options table is an argument, not a result: only the numbers outside are checked."""
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "docs" / "benchmarks" / "b.json").write_text(json.dumps({"s": 1.5}))
    page = tmp_path / "page.md"
    page.write_text(
        "Scoring took 1.5 s (docs/benchmarks/b.json).\n\n<!-- options:score:begin -->\n"
        "| `--timeout` | float | `60` | 60 s per reply |\n<!-- options:score:end -->\n\n"
        "| after | 2.5 s |\n"
    )
    assert check(page, tmp_path) == [
        "page.md:7: 2.5 is not in docs/benchmarks/b.json"
    ]  # the table after still inherits
