"""The Markdown table of docs/results.md's section "More real models: Qwen2.5-Coder (issue 52)", from the
committed screens.

Each model's screen of the issue-52 formats (docs/results/<dir>/screen-issue52/summary.parquet, written by
`posym llm-study MODEL --stages screen`; arithmetic reasoning judged on the whole answer, key-value
questions with more facts and stale values, each plainly and in the model's chat format where it has one)
is one column: accuracy, Wilson 95% interval and n per format; '-' where the format was not asked (the
chat forms for a model without a chat template). tests/test_screen_results.py checks that docs/results.md
holds exactly this table.

    python scripts/screen_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pandas as pd  # noqa: E402

MODELS = {
    "SmolLM2-135M": "llm-study",
    "Gemma 3 270M": "llm-study-gemma3",
    "Qwen2.5-Coder-0.5B": "llm-study-qwen2.5-coder-0.5b",
    "Qwen2.5-Coder-1.5B": "llm-study-qwen2.5-coder-1.5b",
}
"""Column heading -> directory under docs/results (a model whose screen is not committed is left out)."""
SCREEN = "screen-issue52"


def summaries() -> dict[str, pd.DataFrame]:
    """{model: its screen summary (format, acc, lo, hi, n, base_length)} of every committed screen."""
    out = {}
    for model, directory in MODELS.items():
        path = ROOT / "docs" / "results" / directory / SCREEN / "summary.parquet"
        if path.is_file():
            out[model] = pd.read_parquet(path)
    return out


def cell(row) -> str:
    """'0.82 [0.76, 0.87] (200)'."""
    return f"{row.acc:.2f} [{row.lo:.2f}, {row.hi:.2f}] ({row.n})"


def table() -> str:
    found = summaries()
    formats = list(dict.fromkeys(f for summary in found.values() for f in summary.format))
    lines = ["| format | " + " | ".join(found) + " |", "|---" * (len(found) + 1) + "|"]
    for fmt in formats:
        cells = []
        for summary in found.values():
            rows = summary[summary.format == fmt]
            cells.append(cell(next(rows.itertuples())) if len(rows) else "-")
        lines.append(f"| `{fmt}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
