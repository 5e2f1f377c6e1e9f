"""scripts/llm_verdicts.py: docs/results.md's llm-verdicts block is the script's output on the committed tables."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import llm_verdicts


def _block(text: str, begin: str, end: str) -> str:
    return begin + text.split(begin, 1)[1].split(end, 1)[0] + end


def test_docs_block_is_the_scripts_output():
    """A committed table changed without rerunning the script (or the block edited by hand) fails here."""
    doc = (ROOT / "docs" / "results.md").read_text()
    assert _block(doc, llm_verdicts.BEGIN, llm_verdicts.END) == llm_verdicts.block()


def test_write_replaces_only_the_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- a -->\nold\n<!-- b -->\nafter\n")
    llm_verdicts.write(page, "<!-- a -->", "<!-- b -->", lambda: "<!-- a -->\nnew\n<!-- b -->")
    assert page.read_text() == "before\n<!-- a -->\nnew\n<!-- b -->\nafter\n"
    page.write_text("no block here\n")
    with pytest.raises(SystemExit, match="has no <!-- a --> ... <!-- b --> block"):
        llm_verdicts.write(page, "<!-- a -->", "<!-- b -->", lambda: "")


def test_past_context_block_is_the_scripts_output():
    doc = (ROOT / "docs" / "results.md").read_text()
    assert _block(doc, llm_verdicts.PAST_BEGIN, llm_verdicts.PAST_END) == llm_verdicts.past_context_block()


def test_causal_block_is_the_scripts_output():
    doc = (ROOT / "docs" / "results.md").read_text()
    assert _block(doc, llm_verdicts.CAUSAL_BEGIN, llm_verdicts.CAUSAL_END) == llm_verdicts.causal_block()
    assert (llm_verdicts.MODELS["SmolLM2-135M-Instruct"] / "causal" / "estimates.parquet").is_file()
