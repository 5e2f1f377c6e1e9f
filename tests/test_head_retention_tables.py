"""The committed head-level retention tables (issue 33, item 5), read back: columns, ranges, row counts,
values recomputed by hand from docs/results/paper/discrepancy.parquet and dynamics.parquet, and the
script's own rebuild equal to what is committed."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import paper_head_retention  # noqa: E402

PAPER = Path(__file__).resolve().parents[1] / "docs" / "results" / "paper"
LENGTHS = [17, 34, 51, 68, 128, 256, 512, 850, 1024, 2048]


@pytest.fixture(scope="module")
def committed():
    return {
        name: pd.read_parquet(PAPER / f"{name}.parquet")
        for name in (
            "head_retention",
            "head_retention_labels",
            "head_retention_seeds",
            "head_retention_layers",
            "head_retention_first",
        )
    }


def test_rebuild_equals_committed(committed):
    rebuilt = paper_head_retention.build(PAPER)
    for name, table in committed.items():
        pd.testing.assert_frame_equal(table, rebuilt[name], check_dtype=False)


def test_head_table_columns_rows_ranges(committed):
    heads = committed["head_retention"]
    assert {
        "preset",
        "seed",
        "task",
        "layer",
        "head",
        "length",
        "factor",
        "inputs",
        "gap_q50",
        "gap_mean",
        "gap_q50_base",
        "gap_mean_base",
        "retention_q50",
        "retention_mean",
        "label",
        "label_step",
    } <= set(heads)
    assert len(heads) == 5 * 2 * 12 * len(LENGTHS)  # seeds x tasks x layers (one head each) x lengths
    assert sorted(heads.length.unique()) == LENGTHS and (heads.inputs == 64).all()
    assert heads.label.isin(["positional", "symbolic", "mixed", "uniform"]).all()
    assert (heads.retention_q50 > 0).all() and (heads.retention_mean > 0).all()
    np.testing.assert_allclose(heads[heads.length == 17][["retention_q50", "retention_mean"]], 1.0)
    assert (heads.label_step == 6000).all()


def test_values_recomputed_by_hand(committed):
    gaps = pd.read_parquet(PAPER / "discrepancy.parquet")
    dyn = pd.read_parquet(PAPER / "dynamics.parquet")

    def gap(seed, task, layer, length, col="gap_q50"):
        row = gaps[
            (gaps.preset == "paper")
            & (gaps.seed == seed)
            & (gaps.task == task)
            & (gaps.layer == layer)
            & (gaps["head"] == 0)
            & (gaps.length == length)
        ]
        return float(row[col].iloc[0])

    heads = committed["head_retention"]
    for seed, task, layer, length in [(0, "number", 2, 68), (1, "letter", 9, 128), (2, "number", 10, 2048)]:
        row = heads[(heads.seed == seed) & (heads.task == task) & (heads.layer == layer) & (heads.length == length)]
        assert row.retention_q50.iloc[0] == pytest.approx(gap(seed, task, layer, length) / gap(seed, task, layer, 17))
        assert row.retention_mean.iloc[0] == pytest.approx(
            gap(seed, task, layer, length, "gap_mean") / gap(seed, task, layer, 17, "gap_mean")
        )
    # labels: dynamics at the run's last step, hop queries, gamma 0.1
    hops = dyn[(dyn.preset == "paper") & (dyn.seed == 1) & (dyn.task == "number") & (dyn.query_mode == "hops")]
    last = hops[hops.step == hops.step.max()].set_index("layer").label_gamma_0p1
    ours = heads[(heads.seed == 1) & (heads.task == "number") & (heads.length == 17)].set_index("layer").label
    assert (ours == last).all()
    # per label: the median over the label's heads of the head retentions, per seed
    positional = [layer for layer, label in last.items() if label == "positional"]
    want = np.median([gap(1, "number", l, 68) / gap(1, "number", l, 17) for l in positional])
    labels = committed["head_retention_labels"]
    row = labels[
        (labels.seed == 1)
        & (labels.task == "number")
        & (labels.label == "positional")
        & (labels.length == 68)
        & (labels.measure == "gap_q50")
    ].iloc[0]
    assert row.median_retention == pytest.approx(want) and row.heads == len(positional)


def test_over_seeds_and_the_issue_note(committed):
    """The issue's note: the median ratio at 4x is about 0.30 for positional heads and above 1 for
    symbolic heads (number model); what the tables hold, intervals over the five seeds (0-2, and 3-4 of issue 56)."""
    seeds = committed["head_retention_seeds"].set_index(["task", "label", "length", "measure"])
    pos, sym = seeds.loc[("number", "positional", 68, "gap_q50")], seeds.loc[("number", "symbolic", 68, "gap_q50")]
    assert pos.seeds == 5 and pos.seed_list == "0,1,2,3,4" and 0.2 < pos["mean"] < 0.4 and pos["max"] < 0.5
    assert sym.seeds == 5 and sym["min"] > 1.0
    assert seeds.loc[("letter", "symbolic", 68, "gap_q50")]["min"] > 1.0
    per_seed = committed["head_retention_labels"]
    sub = per_seed[
        (per_seed.task == "number")
        & (per_seed.label == "positional")
        & (per_seed.length == 68)
        & (per_seed.measure == "gap_q50")
    ].median_retention
    assert pos["mean"] == pytest.approx(sub.mean()) and pos["sd"] == pytest.approx(sub.std(ddof=1))
    assert pos.lo == pytest.approx(sub.mean() - 2.7764451051977934 * sub.std(ddof=1) / np.sqrt(5))
    assert (seeds["lo"] <= seeds["mean"]).all() or seeds["lo"].isna().any()


def test_which_layers_lose_their_margin_first(committed):
    layers, first = committed["head_retention_layers"], committed["head_retention_first"]
    assert len(layers) == 5 * 2 * 2 * 12  # seeds x lengths x measures x layers
    assert sorted(layers.length.unique()) == [68, 128]
    assert layers.groupby(["seed", "length", "measure"])["rank"].min().eq(1).all()
    assert len(first) == 5 * 2 * 2
    # in every seed, at 68 and 128 tokens, layers 1-4 lose their margin before layers 7-11
    assert first.L1_L4_all_below_L7_L11.all()
    # seeds 0-2 kept L1-L4 below 0.6; seed 3's mean-gap median at 68 tokens is 0.65 (issue 56's seeds): the
    # ordering above is the claim, these bounds only say how far apart the blocks are
    assert (first.median_L1_L4 < 0.7).all() and (first.median_L7_L11 > 1.0).all()
    assert (first[first.seed <= 2].median_L1_L4 < 0.6).all()


# ---- posym run's two models (quick preset, seed 0): docs/results/run/ --------------------------------

RUN = PAPER.parent / "run"


def test_run_head_tables_columns_rows_ranges():
    heads = pd.read_parquet(RUN / "head_retention.parquet")
    groups = pd.read_parquet(RUN / "head_groups.parquet")
    assert list(heads.columns) == [
        "task",
        "step",
        "layer",
        "head",
        "length",
        "margin",
        "margin_retention",
        "attn_tracked",
        "attn_tracked_retention",
        "prompts",
        "s_pos",
        "s_sym",
        "label",
    ]
    assert list(groups.columns) == [
        "task",
        "step",
        "group",
        "factor",
        "measure",
        "length",
        "value",
        "lo",
        "hi",
        "heads",
        "draws",
        "prompts",
    ]
    assert len(heads) == 2 * 8 * len(LENGTHS)  # tasks x layers (one head each: the quick preset) x lengths
    assert heads.groupby("task").step.first().to_dict() == {"letter": 3000, "number": 1750}
    assert (heads.prompts == 64).all() and (groups.prompts == 64).all()
    assert (heads.margin > 0).all() and heads.attn_tracked.between(0, 1).all()
    np.testing.assert_allclose(heads[heads.length == 17][["margin_retention", "attn_tracked_retention"]], 1.0)
    # the labels of the run's own dynamics summary: number positional L1-L2, symbolic L3-L7; letter symbolic
    # L0-L5, L7 (L6 mixed), no positional head
    labels = heads[heads.length == 17].set_index(["task", "layer"]).label
    assert [labels["number", l] for l in range(8)] == ["mixed", "positional", "positional"] + ["symbolic"] * 5
    assert [labels["letter", l] for l in range(8)] == ["symbolic"] * 6 + ["mixed", "symbolic"]
    # groups: every label present, random draws where enough heads lie outside the group
    assert {(t, g) for t, g in zip(groups.task, groups.group)} == {
        ("number", "positional"),
        ("number", "symbolic"),
        ("number", "mixed"),
        ("number", "random:positional"),
        ("number", "random:mixed"),
        ("letter", "symbolic"),
        ("letter", "mixed"),
        ("letter", "random:mixed"),
    }
    assert len(groups) == 8 * 2 * len(LENGTHS)  # groups x measures x lengths
    assert ((groups.lo <= groups.value + 1e-9) & (groups.value <= groups.hi + 1e-9)).all()
    assert (groups[groups.group.str.startswith("random:")].draws == 10).all()
    np.testing.assert_allclose(groups[groups.length == 17][["value", "lo", "hi"]], 1.0)


def test_run_group_values_are_medians_of_head_retentions():
    heads = pd.read_parquet(RUN / "head_retention.parquet")
    groups = pd.read_parquet(RUN / "head_groups.parquet").set_index(["task", "group", "measure", "length"])
    for task, label, length in [
        ("number", "positional", 68),
        ("number", "symbolic", 68),
        ("letter", "symbolic", 68),
        ("number", "symbolic", 2048),
    ]:
        sub = heads[(heads.task == task) & (heads.label == label) & (heads.length == length)]
        for measure in ("margin", "attn_tracked"):
            row = groups.loc[(task, label, measure, length)]
            assert row.value == pytest.approx(sub[f"{measure}_retention"].median()) and row.heads == len(sub)
    # what the text reports: at 4x the number model's positional heads keep 0.41 of their margin and its
    # symbolic heads 2.0, the letter model's symbolic heads 0.95
    assert groups.loc[("number", "positional", "margin", 68)].value == pytest.approx(0.41, abs=0.01)
    assert groups.loc[("number", "symbolic", "margin", 68)].value == pytest.approx(2.0, abs=0.01)
    assert groups.loc[("letter", "symbolic", "margin", 68)].value == pytest.approx(0.95, abs=0.01)


def test_within_layer_comparison_of_the_seed_preset():
    """docs/results.md's head-retention row: in the 6 x 8 number model (seed preset, seed 1) no layer holds
    positional and symbolic heads together, and layer 2's positional heads keep more margin than its mixed
    ones; the quoted medians are paper_head_retention.within_layer_table's, recomputed from the run's tables."""
    within_dir = PAPER.parent / "seed-preset-s1"
    committed = pd.read_parquet(within_dir / "head_retention_within.parquet")
    heads = paper_head_retention.head_table(
        pd.read_parquet(within_dir / "discrepancy.parquet"), pd.read_parquet(within_dir / "dynamics.parquet")
    )
    pd.testing.assert_frame_equal(paper_head_retention.within_layer_table(heads), committed)
    number = committed[committed.task == "number"]
    assert not any({"positional", "symbolic"} <= set(g.label) for _, g in number.groupby(["length", "layer"]))
    layer2 = number[number.layer == 2].set_index(["length", "label"])
    text = " ".join((PAPER.parent.parent / "results.md").read_text().split())
    q = {(n, k): f"{layer2.retention_q50[n, k]:.2f}" for n in (68, 128) for k in ("positional", "mixed")}
    assert layer2.heads[68, "positional"] == 4 and layer2.heads[68, "mixed"] == 4
    assert (
        f"its 4 positional heads keep more of their margin than its 4 mixed ones (median {q[68, 'positional']} "
        f"against {q[68, 'mixed']} at 68 tokens, {q[128, 'positional']} against {q[128, 'mixed']} at 128; one run)"
    ) in text
