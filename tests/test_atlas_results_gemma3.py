"""The committed Gemma 3 270M atlas (docs/results/atlas-gemma3/): the numbers docs/results.md quotes, read back
from the tables and recomputed from the per-head table (no model is run)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from test_atlas_results import check_auroc_rows, check_export, check_quoted_intervals

from posym import configs
from posym.commands import atlas as command
from posym.core import atlas, stats

ROOT = Path(__file__).resolve().parents[1]
DIR = ROOT / "docs" / "results" / "atlas-gemma3"
CONFIG = command.AtlasConfig()
GLOBAL_LAYERS = {5, 11, 17}  # Gemma 3 270M's full-attention layers (the others: a 512-token window)


@pytest.fixture(scope="module")
def heads():
    return pd.read_parquet(DIR / "atlas.parquet")


def test_the_default_config_made_it(heads):
    summary = json.loads((DIR / "summary.json").read_text())
    assert summary["model"] == "gemma3-270m" and summary["config"] == configs.to_dict(CONFIG)
    assert len(heads) == 72 and heads.layer.nunique() == 18 and heads.kv_head.nunique() == 1
    assert summary["needle_recall"]["recalled"] == 36 and summary["needle_recall"]["n"] == 36
    assert summary["sinks"] == [0]
    timing = json.loads((DIR / "timing.json").read_text())
    assert timing["wall_s"] <= timing["acceptance_bound_s"] == 600


def test_auroc_is_the_per_head_table_and_what_results_md_quotes(heads):
    auroc = pd.read_parquet(DIR / "agreement_auroc.parquet")
    check_auroc_rows(auroc, heads, 7)
    at = auroc.set_index(["target", "scorer"])
    quotes = {
        ("retrieval", "s_sym_sinkfree"): (0.912, 0.812, 0.986),
        ("retrieval", "s_sym_sinkfree within layers"): (0.933, 0.636, 1.0),
        ("induction", "s_sym_sinkfree"): (0.927, 0.846, 0.987),
        ("induction", "s_sym_sinkfree within layers"): (0.889, 0.472, 1.0),
        ("non-streaming", "s_sym_sinkfree"): (0.686, 0.536, 0.842),
        ("non-streaming", "s_sym_sinkfree within layers"): (0.778, 0.257, 1.0),
    }
    check_quoted_intervals(auroc, quotes)
    plain = {"retrieval": 0.613, "induction": 0.618, "non-streaming": 0.684}
    layer = {"retrieval": 0.557, "induction": 0.513, "non-streaming": 0.381}
    for target in plain:
        assert round(float(at.loc[(target, "s_sym"), "auroc"]), 3) == plain[target]
        assert round(float(at.loc[(target, "layer"), "auroc"]), 3) == layer[target]


def test_retrieval_and_induction_heads_sit_in_the_global_layers(heads):
    top = {c: atlas.top_heads(heads[c], CONFIG.top_share) for c in ("retrieval", "induction", "non_streaming_w64")}
    assert heads.layer[top["retrieval"]].isin(GLOBAL_LAYERS).sum() == 5
    assert heads.layer[top["induction"]].isin(GLOBAL_LAYERS).sum() == 6
    assert heads.layer.isin(GLOBAL_LAYERS).sum() == 12
    assert heads.label_sinkfree[top["retrieval"]].value_counts().to_dict() == {"symbolic": 5, "mixed": 2}
    assert (heads.layer[top["non_streaming_w64"]] == 1).sum() == 4
    assert heads.label.value_counts().to_dict()["symbolic"] == 59
    assert heads.label_sinkfree.value_counts().to_dict() == {"mixed": 38, "symbolic": 19, "positional": 15}


def test_spearman_and_where_the_sink_decides(heads):
    rho = pd.read_parquet(DIR / "agreement_spearman.parquet").set_index(["a", "b"]).rho
    assert round(rho[("weighted_id", "induction")], 3) == 0.883 and round(rho[("weighted_id", "retrieval")], 3) == 0.468
    assert rho[("weighted_id", "induction")] == pytest.approx(stats.spearman(heads.weighted_id, heads.induction))
    decides = pd.read_parquet(DIR / "agreement_sink_decides.parquet")
    flipped = decides[decides.sink_decides & (decides.score == "s_sym")]
    assert sorted(flipped.measure) == [f"spearman rho with {m}" for m in ("echo", "entropy", "induction")]
    row = flipped[flipped.measure == "spearman rho with induction"].iloc[0]
    assert (round(row.plain, 3), round(row.sinkfree, 3)) == (-0.016, 0.740)


def test_the_export_is_the_pooled_table():
    check_export(DIR, 18, 1, 9)
