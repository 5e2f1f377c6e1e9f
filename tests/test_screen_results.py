"""The committed screens of issue 52 (docs/results/<model>/screen-issue52/, and Qwen2.5-Coder-0.5B's screen of
the first six formats in docs/results/llm-study-qwen2.5-coder-0.5b/screen/): every accuracy, n and Wilson
interval recomputed from the per-prompt rows, every format of the run's config reported (the chat forms
only where the model has a chat template), and docs/results.md's table rendered from them
(scripts/screen_table.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from posym.core.stats import wilson_interval

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import screen_table  # noqa: E402

SCREENS = sorted(
    [
        *(ROOT / "docs" / "results").glob(f"llm-study*/{screen_table.SCREEN}"),
        ROOT / "docs/results/llm-study-qwen2.5-coder-0.5b/screen",
    ]
)
NO_CHAT_TEMPLATE = {"llm-study-gemma3"}
"""Models whose tokenizer has no chat template (Gemma 3 270M base): the screen skips the chat forms."""


def test_the_issue_52_screens_are_committed():
    found = {p.parent.name for p in SCREENS if p.name == screen_table.SCREEN}
    assert {"llm-study", "llm-study-gemma3", "llm-study-qwen2.5-coder-0.5b", "llm-study-qwen2.5-coder-1.5b"} <= found, (
        found
    )


@pytest.mark.parametrize("screen", SCREENS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_screen_tables_agree_with_their_rows(screen):
    summary = pd.read_parquet(screen / "summary.parquet")
    rows = pd.read_parquet(screen / "screen.parquet")
    formats = yaml.safe_load((screen / "study.yaml").read_text())["prediction"]["formats"]
    chat = [f for f in formats if f.endswith(":chat")]
    expected = [f for f in formats if not (f in chat and screen.parent.name in NO_CHAT_TEMPLATE)]
    assert list(summary.format) == expected  # every format asked, in order; none hidden
    for r in summary.itertuples():
        asked = rows[rows.format == r.format]
        assert len(asked) == r.n >= 50 and asked.correct.sum() == round(r.acc * r.n)
        assert (r.lo, r.hi) == pytest.approx(wilson_interval(int(asked.correct.sum()), r.n))
        assert (asked.base_length == r.base_length).all()


def test_results_md_holds_the_rendered_table():
    text = (ROOT / "docs" / "results.md").read_text()
    assert screen_table.table() in text
