"""The committed Qwen2.5-Coder-0.5B-Instruct atlas (docs/results/atlas-qwen2.5-coder-0.5b/): the numbers
docs/results.md quotes, read back from the tables and recomputed from the per-head table (no model is run).
The labels of issue 53's third kv-eval model (docs/results/kv-eval-qwen2.5-coder-0.5b/)."""

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
DIR = ROOT / "docs" / "results" / "atlas-qwen2.5-coder-0.5b"
CONFIG = command.AtlasConfig()


@pytest.fixture(scope="module")
def heads():
    return pd.read_parquet(DIR / "atlas.parquet")


def test_the_default_config_made_it(heads):
    summary = json.loads((DIR / "summary.json").read_text())
    assert summary["model"] == "qwen2.5-coder-0.5b" and summary["config"] == configs.to_dict(CONFIG)
    # grouped-query attention: 14 query heads share 2 KV heads in each of 24 layers
    assert len(heads) == 336 and heads.layer.nunique() == 24 and heads.kv_head.nunique() == 2
    assert heads.groupby(["layer", "kv_head"]).size().eq(7).all()
    assert summary["needle_recall"]["recalled"] == 36 and summary["needle_recall"]["n"] == 36
    assert summary["sinks"] == []  # no binding-prompt sink: the sink-free scores are the plain ones
    assert (heads.s_sym_sinkfree == heads.s_sym).all() and (heads.label_sinkfree == heads.label).all()
    timing = json.loads((DIR / "timing.json").read_text())
    assert (timing["wall_s"], round(timing["cpu_s"])) == (915, 597)


def test_auroc_is_the_per_head_table_and_what_results_md_quotes(heads):
    auroc = pd.read_parquet(DIR / "agreement_auroc.parquet")
    check_auroc_rows(auroc, heads, None)
    at = auroc.set_index(["target", "scorer"])
    quotes = {
        ("retrieval", "s_sym_sinkfree"): (0.798, 0.731, 0.859),
        ("retrieval", "s_sym_sinkfree within layers"): (0.677, 0.553, 0.795),
        ("retrieval", "layer"): (0.700, 0.630, 0.772),
        ("induction", "s_sym_sinkfree"): (0.837, 0.767, 0.897),
        ("induction", "s_sym_sinkfree within layers"): (0.641, 0.511, 0.773),
        ("induction", "layer"): (0.728, 0.655, 0.794),
        ("non-streaming", "s_sym_sinkfree"): (0.538, 0.458, 0.614),
        ("non-streaming", "s_sym_sinkfree within layers"): (0.740, 0.589, 0.862),
    }
    check_quoted_intervals(auroc, quotes)
    assert at.loc[("retrieval", "s_sym_sinkfree"), "positives"] == 35


def test_labels_and_where_the_top_heads_sit(heads):
    assert heads.label.value_counts().to_dict() == {"symbolic": 232, "mixed": 66, "positional": 38}
    top = {c: atlas.top_heads(heads[c], CONFIG.top_share) for c in ("retrieval", "induction", "non_streaming_w64")}
    assert (heads.label[top["retrieval"]] == "symbolic").all() and top["retrieval"].sum() == 35
    assert (heads.label[top["induction"]] == "symbolic").all() and top["induction"].sum() == 34
    assert heads.label[top["non_streaming_w64"]].value_counts().to_dict() == {
        "symbolic": 26,
        "mixed": 7,
        "positional": 1,
    }
    assert (heads.layer[top["retrieval"]] >= 13).sum() == 25
    assert (heads.layer[heads.label == "positional"] <= 2).sum() == 14


def test_spearman(heads):
    rho = pd.read_parquet(DIR / "agreement_spearman.parquet").set_index(["a", "b"]).rho
    assert round(rho[("retrieval", "induction")], 3) == 0.705 and round(rho[("weighted_id", "induction")], 3) == 0.499
    assert rho[("weighted_id", "induction")] == pytest.approx(stats.spearman(heads.weighted_id, heads.induction))
    assert not pd.read_parquet(DIR / "agreement_sink_decides.parquet").sink_decides.any()


def test_the_export_is_the_pooled_table():
    check_export(DIR, 24, 2, 24)
