"""The API reference builds offline from the docstrings (scripts/build_api_docs.py, pdoc) and has a page
per module, the root's page listing the notebook entry points."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from build_api_docs import build  # noqa: E402

import posym  # noqa: E402


def test_the_api_reference_builds_with_a_page_per_module(tmp_path):
    pytest.importorskip("pdoc")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unresolved name or a module documented twice is a defect
        pages = {p.relative_to(tmp_path).as_posix() for p in build(tmp_path)}
    for page in (
        "posym.html",
        "posym/core/scores.html",
        "posym/core/paper.html",
        "posym/models.html",
        "posym/commands/llm_study.html",
        "posym/cli/options.html",
    ):
        assert page in pages, page
    root = (tmp_path / "posym.html").read_text()
    for name in posym.__all__:
        assert f'id="{name}"' in root, name
    scores = (tmp_path / "posym" / "core" / "scores.html").read_text()
    assert 'id="score_model"' in scores and "one row per prompt, query, layer, head" in scores  # entry, docstring
