"""docs/results.md, "A second real model: Gemma 3 270M": every number it quotes, read back from the
committed tables (docs/results/llm-study-gemma3/, docs/benchmarks/long_prompts_gemma3.json). Needs no model."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "docs" / "results" / "llm-study-gemma3"
GLOBAL = [5, 11, 17]


def _counts(labels) -> tuple[int, int, int]:
    """(symbolic, positional, mixed) counts."""
    counts = pd.Series(labels).value_counts()
    return tuple(int(counts.get(label, 0)) for label in ("symbolic", "positional", "mixed"))


def test_gemma3_labels_sinks_and_layer_kinds():
    from posym.core.scores import head_labels

    heads = pd.read_parquet(STUDY / "scores" / "heads.parquet")
    assert heads.groupby(["set", "variant"]).size().eq(72).all()
    pick = {(s, v): g for (s, v), g in heads.groupby(["set", "variant"])}
    last, free = pick["binding-last", "plain"], pick["binding-last", "sinks excluded"]
    assert _counts(last.label) == (59, 6, 7) and _counts(head_labels(last.s_pos, last.s_sym, 0.05)) == (57, 6, 9)
    assert _counts(free.label) == (19, 15, 38) and _counts(head_labels(free.s_pos, free.s_sym, 0.05)) == (17, 10, 45)
    assert json.loads((STUDY / "scores" / "sinks.json").read_text()) == {
        s: [0] for s in ("binding-last", "binding-name", "number", "letter")
    }
    profile = json.loads((STUDY / "profile" / "profile.json").read_text())
    assert round(profile["binding-last"]["pearson_r"], 3) == -0.980
    attn = last.groupby("label").attn_first.mean().round(2).to_dict()
    assert attn == {"symbolic": 0.39, "positional": 0.17, "mixed": 0.17}
    changes = pd.read_parquet(STUDY / "profile" / "sink_changes.parquet")
    changed = changes[changes.changed & (changes.set == "binding-last")]
    assert len(changed) == 41 and not (changed.label == "positional").any()
    assert changed.groupby(["label", "label_excluded"]).size().to_dict() == {
        ("symbolic", "mixed"): 32,
        ("symbolic", "positional"): 8,
        ("mixed", "positional"): 1,
    }
    for rows, plain, sink_free in (
        (~last.layer.isin(GLOBAL), (47, 6, 7), (11, 14, 35)),
        (last.layer.isin(GLOBAL), (12, 0, 0), (8, 1, 3)),
    ):
        assert (
            _counts(last[rows].label) == plain and _counts(free[free.layer.isin(last[rows].layer)].label) == sink_free
        )
    kept = changes[(changes.set == "binding-last") & (changes.label == "symbolic") & ~changes.changed]
    assert (int((~kept.layer.isin(GLOBAL)).sum()), int(kept.layer.isin(GLOBAL).sum())) == (11, 8)
    positional = last[last.label == "positional"]
    assert sorted(zip(positional.layer, positional["head"])) == [(2, 3), (3, 1), (4, 0), (4, 1), (4, 2), (8, 2)]
    layers = pd.read_parquet(STUDY / "profile" / "layers.parquet")
    median = layers[layers.set == "binding-last"].set_index("layer").median_s_pos
    assert [round(median[layer], 2) for layer in (2, 3, 4)] == [0.80, 0.39, 1.00]
    for name, plain, sink_free in (("number", (41, 13, 18), (13, 32, 27)), ("letter", (46, 7, 19), (14, 28, 30))):
        assert _counts(pick[name, "plain"].label) == plain and _counts(pick[name, "sinks excluded"].label) == sink_free
    agreement = pd.read_parquet(STUDY / "profile" / "agreement.parquet")
    assert agreement.agreement.round(2).tolist() == [0.67, 0.76, 0.69]


def test_gemma3_frequency_use_per_layer_kind_and_discrepancy():
    behaviour = pd.read_parquet(STUDY / "frequency" / "behaviour.parquet")
    kind = behaviour.layer.isin(GLOBAL).map({False: "local", True: "global"})
    means = behaviour.groupby(kind)[["weighted_id", "dominant_id"]].mean().round(1)
    assert means.to_dict() == {
        "weighted_id": {"global": 94.0, "local": 73.9},
        "dominant_id": {"global": 121.4, "local": 96.8},
    }
    assert behaviour.uniform_id.eq(64.5).all()
    bases = behaviour.groupby(kind).rope_base.agg(["min", "max"])
    assert 0.99999e6 < bases.loc["global", "min"] <= bases.loc["global", "max"] < 1.00001e6
    assert 0.99999e4 < bases.loc["local", "min"] <= bases.loc["local", "max"] < 1.00001e4
    assert behaviour.groupby("label").weighted_id.mean().round(1).to_dict() == {
        "mixed": 69.9,
        "positional": 46.0,
        "symbolic": 81.3,
    }
    frequency = json.loads((STUDY / "frequency" / "frequency.json").read_text())
    assert (round(frequency["pearson"], 2), round(frequency["spearman"], 2)) == (-0.59, -0.06)
    gaps = pd.read_parquet(STUDY / "discrepancy" / "gaps.parquet")
    median = gaps.groupby(["layer", "head", "length"]).gap.median().round(2)
    assert median[2, 3].tolist() == [2.96, 2.92, 1.58, 2.46] and median[4, 1].tolist() == [1.30, 0.84, 1.14, 0.88]
    positional = gaps[gaps.group == "positional"]
    assert (positional.top_key == positional.length - 2).all()
    assert sorted(set(zip(positional.layer, positional["head"], positional.dominant_id))) == [(2, 3, 1), (4, 1, 78)]
    assert round(gaps[gaps.layer == 4].theta.iloc[0], 4) == 0.0039  # the local base's plane 78
    symbolic = gaps[gaps.group == "symbolic"]
    assert sorted(set(zip(symbolic.layer, symbolic["head"]))) == [(1, 1), (1, 3)]
    assert (symbolic[symbolic.length <= 256].top_key == 0).all()
    assert symbolic[symbolic.length == 1024].top_key.eq(962).all()
    assert sorted(symbolic[symbolic.length == 4096].top_key.unique()) == [3848, 3849]
    assert (symbolic[symbolic.length >= 1024].top_key >= symbolic[symbolic.length >= 1024].length - 512).all()
    # the RoPE base of each gap row is its layer's (all four heads sit on local layers), and the stage records
    # both kinds' bases instead of the config's single fallback
    assert gaps.rope_base.eq(10000.0).all()
    info = json.loads((STUDY / "discrepancy" / "discrepancy.json").read_text())
    assert info["rope_bases"] == {"full_attention": 1e6, "sliding_attention": 1e4} and "rope_base" not in info
    assert info["layers_by_kind"]["full_attention"] == [5, 11, 17]


def test_gemma3_long_prompt_benchmark():
    """The numbers docs/results.md quotes from the benchmark (the batched engine, one process)."""
    runs = json.loads((ROOT / "docs" / "benchmarks" / "long_prompts_gemma3.json").read_text())["runs"]
    last = {r["tokens"]: r for r in runs if r["queries"] == "last"}
    assert sorted(last) == [512, 1024, 2048, 4096]
    assert [round(last[n]["scores_s"], 1) for n in sorted(last)] == [2.2, 4.8, 11.2, 35.4]
    assert [round(last[n]["forward_s"], 1) for n in sorted(last)] == [5.2, 11.2, 27.7, 66.7]
    assert [round(last[n]["time_ratio"], 2) for n in sorted(last)] == [0.42, 0.43, 0.40, 0.53]
    assert all(0.10 <= round(r["memory_ratio"], 2) <= 0.11 for r in last.values())
    assert all(r["keys_local"] == [512] and r["keys_global"] == [n] for n, r in last.items())
    for n in (512, 1024):
        assert max(last[n]["max_abs_diff_local"], last[n]["max_abs_diff_global"]) <= 8.9e-16
        assert last[n]["max_bound"] <= 4.3e-14
    every = {r["tokens"]: r for r in runs if r["queries"] == "all" and "dense_s" not in r}
    assert {n: (round(r["scores_s"], 1), round(r["time_ratio"], 2)) for n, r in every.items()} == {
        256: (2.1, 0.68),
        512: (4.8, 0.86),
        1024: (10.8, 0.75),
    }
    dense = next(r for r in runs if r["queries"] == "all" and "dense_s" in r)
    assert dense["tokens"] == 256 and dense["diff_within_bound"] and f"{dense['max_abs_diff']:.1e}" == "9.3e-13"


# ---- what a head type predicts (issue 33): the screen, lengths and causal stages on Gemma 3 270M ----


def test_gemma3_length_task_screen_and_accuracy():
    from posym.core.stats import wilson_interval

    summary = pd.read_parquet(STUDY / "screen" / "summary.parquet").set_index("format")
    assert summary.n.to_dict() == {
        "kv-code": 200,
        "copy": 50,
        "kv-list": 50,
        "kv-fewshot": 50,
        "possession": 50,
        "arithmetic": 50,
    }
    assert summary.acc.round(3).to_dict() == {
        "kv-code": 0.845,
        "copy": 1.0,
        "kv-list": 0.66,
        "kv-fewshot": 0.64,
        "possession": 0.52,
        "arithmetic": 0.04,
    }
    assert (summary.lo["kv-code"], summary.hi["kv-code"]) == wilson_interval(169, 200)
    chosen = json.loads((STUDY / "screen" / "screen.json").read_text())
    assert (chosen["format"], chosen["passes"], chosen["prompts"]) == ("kv-code", True, 200)
    acc = pd.read_parquet(STUDY / "lengths" / "accuracy_summary.parquet")
    by = {layout: rows.sort_values("factor").acc.round(3).tolist() for layout, rows in acc.groupby("layout")}
    assert by == {
        "between": [0.719, 0.688, 0.625, 0.562, 0.562],
        "before": [0.875, 0.906, 0.906, 0.938, 0.875],
        "marked": [0.812, 0.781, 0.531, 0.5, 0.5],
    }
    assert (acc.n == 32).all() and acc[acc.layout == "between"].length.max() == 1152


def test_gemma3_head_retention_on_the_answer_key():
    """Issue 50's measure (docs/results.md, the llm-verdicts block): at 16x the 7 sink-free symbolic heads
    (2 of them global) keep 0.13 of their answer-key attention, more than their matched random heads
    (Holm p 0.028 of 28); the 11 positional heads, all local, keep none of it (the key is outside their
    512-key window); 51 of 72 heads track the sink and have no disjoint random set."""
    groups = pd.read_parquet(STUDY / "lengths" / "group_retention.parquet")
    at = groups[(groups.layout == "between") & (groups.ranking == "sink-free") & (groups.length == 1152)]
    at = at[at.measure == "attn_answer"].set_index("group")
    assert at.loc["symbolic", ["heads", "value", "p_holm", "verdict"]].tolist()[0] == 7
    assert round(at.loc["symbolic", "value"], 2) == 0.13 and round(at.loc["symbolic", "p_holm"], 3) == 0.028
    assert at.loc["symbolic", "verdict"] == "keeps more than random"
    assert at.loc["positional", "heads"] == 11 and at.loc["positional", "value"] < 0.005
    assert at.loc["sink", "heads"] == 51 and pd.isna(at.loc["sink", "p_random"])
    assert at.loc["symbolic@global", "heads"] == 2 and "positional@global" not in at.index


def test_gemma3_causal_table():
    table = pd.read_parquet(STUDY / "causal-withdrawn" / "causal_summary.parquet")
    free = table[(table.ranking == "sink-free")].set_index(["group", "factor"])
    assert free.loc["symbolic"].acc.round(2).tolist() == [0.17, 0.17, 0.17, 0.08, 0.17]
    assert free.loc["symbolic"].acc_clean.round(2).tolist() == [0.92, 0.75, 0.67, 0.75, 0.58]
    assert free.loc["symbolic"].drop_separated.tolist() == [True, True, True, True, False]
    assert free.loc["positional"].drop_separated.tolist() == [True] * 5
    assert free.loc["positional"].separated.tolist()[1:] == [False] * 4
    assert free.loc["positional"].needed.tolist()[1:] == [192, 59, 109, 137]
    assert free.loc["random:symbolic"]["drop"].round(2).tolist() == [0.08, -0.09, 0.07, 0.39, 0.37]
    plain = table[(table.ranking == "plain") & (table.group == "symbolic")]
    assert not plain.drop_separated.astype(bool).any()  # the sink heads: no drop beyond random ones
    assert (table.prompts == 12).all() and (table[table.group.str.startswith("random")].draws == 10).all()
