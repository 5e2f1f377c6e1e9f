"""scripts/readme_numbers.py: the README's performance and results numbers come from the files they cite."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from readme_numbers import check, matches  # noqa: E402


def test_every_readme_number_is_backed_by_the_file_it_cites():
    problems = check(ROOT / "README.md")
    assert not problems, "numbers no recorded run backs:\n" + "\n".join(problems)


def test_rounding_rules():
    assert matches("5.4", [5.382]) and not matches("5.4", [5.46])
    assert matches("2.8e-16", [2.7756e-16]) and not matches("2.8e-16", [3.3e-16])
    assert matches("1,024", [1024.0]) and not matches("1,024", [1025.0])


def test_a_wrong_or_uncited_number_is_listed(tmp_path):
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "docs" / "benchmarks" / "b.json").write_text(json.dumps({"fast_s": 1.234, "ratio": 140.2, "bytes": 2**21}))
    page = tmp_path / "README.md"
    page.write_text("Scores take 1.23 s, 140x the brute force, 2 MiB (docs/benchmarks/b.json).\n\n"
                    "| a | b |\n| 1.2 s | 141x |\n\n"
                    "Training runs 12.5 steps/s on 2 cores.\n\n"
                    "See 3 s (docs/benchmarks/missing.json).\n")
    problems = check(page, tmp_path)
    assert problems == ["README.md:3: 141 is not in docs/benchmarks/b.json",
                        "README.md:6: '12.5 steps/s' is quoted without a docs/benchmarks or docs/results file",
                        "README.md:8: cites docs/benchmarks/missing.json, which does not exist"]
