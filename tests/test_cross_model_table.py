"""scripts/cross_model_table.py and posym.core.retention.label_prediction on the committed lengths tables."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import cross_model_table

from posym.core import retention


def _pairwise_auroc(score, kept, strata):
    """The definition, one pair at a time: P(a keeper outscores a loser of the same stratum), ties 1/2."""
    wins = pairs = 0.0
    for i in np.flatnonzero(kept):
        for j in np.flatnonzero(~kept):
            if strata[i] == strata[j]:
                pairs += 1
                wins += 1.0 if score[i] > score[j] else 0.5 if score[i] == score[j] else 0.0
    return wins / pairs if pairs else float("nan")


def test_docs_block_is_the_scripts_output():
    doc = (ROOT / "docs" / "results.md").read_text()
    begin, end = cross_model_table.BEGIN, cross_model_table.END
    assert begin + doc.split(begin, 1)[1].split(end, 1)[0] + end == cross_model_table.block()
    # one row per studied model, nothing averaged: both real models with lengths tables are in it
    rows = [line for line in cross_model_table.block().splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0][2:] for r in rows[1:]] == [
        cross_model_table.NAMES[s.name] for s in cross_model_table.studied()
    ]
    assert {"SmolLM2-135M-Instruct", "Gemma 3 270M"} <= {r.split(" | ")[0][2:] for r in rows}


@pytest.mark.parametrize("study", ["llm-study", "llm-study-gemma3", "llm-study-qwen2.5-coder-0.5b"])
def test_label_prediction_against_the_definition(study):
    """The AUROC and its counts recomputed head by head from head_retention.parquet, by brute force."""
    lengths = ROOT / "docs" / "results" / study / "lengths"
    heads = pd.read_parquet(lengths / "head_retention.parquet")
    heads = heads[(heads.layout == "between") & (heads.ranking == "sink-free")]
    base, longest = int(heads.length.min()), int(heads.length.max())
    got = retention.label_prediction(heads, base_length=base, length=longest, draws=200)
    looking, kept, score, layer = [], [], [], []
    for (l, h), rows in heads.groupby(["layer", "head"]):
        first = rows[rows.length == base].iloc[0]
        if first.attn_answer >= 1 / base:
            last = rows[rows.length == longest].iloc[0]
            looking.append((l, h))
            kept.append(bool(last.attn_answer_retention >= retention.KEEPS))
            score.append(first.s_sym - first.s_pos)
            layer.append(l)
    kept, score, layer = np.array(kept), np.array(score), np.array(layer)
    assert (got["heads"], got["looking"], got["kept"]) == (
        heads.groupby(["layer", "head"]).ngroups,
        len(looking),
        kept.sum(),
    )
    np.testing.assert_allclose(got["auroc"], _pairwise_auroc(score, kept, np.zeros(len(kept))), atol=1e-12)
    np.testing.assert_allclose(got["auroc_layer"], _pairwise_auroc(score, kept, layer), atol=1e-12, equal_nan=True)
    if kept.any():
        assert got["auroc_lo"] <= got["auroc"] <= got["auroc_hi"]


def test_committed_predictions():
    """The numbers the docs' prose states: SmolLM2's label ranks keepers above losers (0.70) but not inside
    layers (interval spans 0.5); on Gemma 3 no head keeps half of its answer-key attention at 16x."""
    smol = cross_model_table.prediction(ROOT / "docs" / "results" / "llm-study")
    assert (smol["looking"], smol["kept"]) == (47, 20)
    assert round(smol["auroc"], 2) == 0.70 and smol["auroc_lo"] > 0.5
    assert smol["auroc_layer_lo"] < 0.5 < smol["auroc_layer_hi"]
    gemma = cross_model_table.prediction(ROOT / "docs" / "results" / "llm-study-gemma3")
    assert (gemma["looking"], gemma["kept"]) == (17, 0) and np.isnan(gemma["auroc"])


def test_committed_qwen_row():
    """What docs/results.md says of Qwen2.5-Coder-0.5B: the label ranks keepers neither overall nor inside
    layers (both intervals span 0.5); its positional and mixed heads lose the answer key more than random
    (Holm p 0.008); two thirds of its heads are symbolic, a group without a disjoint random set (untested);
    no sink heads, so its plain and sink-free groups are the same."""
    study = ROOT / "docs" / "results" / "llm-study-qwen2.5-coder-0.5b"
    lengths = study / "lengths"
    qwen = cross_model_table.prediction(study)
    assert (qwen["heads"], qwen["looking"], qwen["kept"]) == (336, 107, 50)
    assert qwen["auroc_lo"] < 0.5 < qwen["auroc_hi"] and qwen["auroc_layer_lo"] < 0.5 < qwen["auroc_layer_hi"]
    groups = pd.read_parquet(lengths / "group_retention.parquet")
    answer = groups[(groups.layout == "between") & (groups.measure == "attn_answer") & (groups.length == 2176)]
    by = {(r.ranking, r.group): r for r in answer.itertuples()}
    for ranking in ("sink-free", "plain"):
        assert by[(ranking, "symbolic")].heads == 224 and pd.isna(by[(ranking, "symbolic")].p_holm)
        for group, value, null in (("positional", 0.06, 0.34), ("mixed", 0.14, 0.42)):
            r = by[(ranking, group)]
            assert (round(r.value, 2), round(r.null_median, 2)) == (value, null)
            assert r.verdict == "loses more than random" and round(r.p_holm, 3) == 0.008
