"""Head-level retention of `posym lengthgen` (issue 33) on a tiny trained run: the tables' columns, ranges
and row counts, group intervals around their point values, random draws matched to a group, the figure,
the report's table, and the switch that turns it off."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from cli_runner import run_posym
from tiny_runs import train_tiny

from posym.commands import lengthgen as lg
from posym.core import lengthgen as core_lengthgen
from posym.commands import report
from posym.core.retention import GROUP_TEST_COLUMNS, RANDOM
from posym.core.scores import LABELS
from posym.core.tasks import generate, task_config
from posym.errors import PosymError

HEADS = 4  # 2 layers x 2 heads
LENGTHS = [17, 34, 51]
PROMPTS = 8
HEAD_COLUMNS = [
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
GROUP_COLUMNS = [
    "group",
    "factor",
    "measure",
    "statistic",
    "length",
    "value",
    "lo",
    "hi",
    "level",
    "heads",
    "draws",
    "prompts",
    *GROUP_TEST_COLUMNS,
]
MEASURES = ("margin", "attn_tracked")
"""What the toy tasks measure (their tracked key is the chain's; they have no answer-bearing fact key)."""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """12 steps of a 2-layer, 2-head, width-32 number model (4 symbols)."""
    return train_tiny(
        tmp_path_factory.mktemp("run"),
        "number",
        steps=12,
        every=12,
        task_overrides={"alphabet_size": 4},
        model={"n_head": 2, "n_positions": 64},
    )


FORCED = ["positional", "mixed", "symbolic", "mixed"]
"""Labels of heads 0.0, 0.1, 1.0, 1.1 in `measured` (a 12-step model's own are all alike): one positional,
one symbolic and two mixed heads, so every kind of group and of random draw occurs."""


@pytest.fixture(scope="module")
def measured(tiny_run, tmp_path_factory):
    """`run_lengthgen` with the head-level retention on, the heads' labels set to FORCED (their scores are
    the model's own): (result, output directory)."""
    out = tmp_path_factory.mktemp("lg")
    config = core_lengthgen.LengthGenConfig(lengths=LENGTHS, factors=[1, 2], n=16, head_prompts=PROMPTS, max_tokens=256)
    real = lg.label_heads

    def forced(*args, **kwargs):
        return real(*args, **kwargs).assign(label=FORCED)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lg, "label_heads", forced)
        return lg.run_lengthgen(tiny_run, config, out), out


def test_head_table_columns_ranges_and_rows(measured):
    result, out = measured
    table = pd.read_parquet(out / "head_retention.parquet")
    pd.testing.assert_frame_equal(table, result["head_table"])
    assert list(table.columns) == HEAD_COLUMNS
    assert len(table) == HEADS * len(LENGTHS)
    assert sorted(table.length.unique()) == LENGTHS and (table.prompts == PROMPTS).all()
    assert table.groupby(["layer", "head"]).size().eq(len(LENGTHS)).all()
    assert (table.margin >= 0).all() and table.attn_tracked.between(0, 1).all()
    assert (
        table.drop_duplicates(["layer", "head"]).label.tolist() == FORCED
        and table.label.isin(LABELS).all()
        and table.s_pos.between(0, 1).all()
        and table.s_sym.between(0, 1).all()
    )
    base = table[table.length == 17]
    np.testing.assert_allclose(base.margin_retention, 1.0)
    np.testing.assert_allclose(base.attn_tracked_retention, 1.0)
    merged = table.merge(base[["layer", "head", "margin", "attn_tracked"]], on=["layer", "head"], suffixes=("", "_17"))
    np.testing.assert_allclose(merged.margin_retention, merged.margin / merged.margin_17)
    np.testing.assert_allclose(merged.attn_tracked_retention, merged.attn_tracked / merged.attn_tracked_17)
    assert (table.margin_retention > 0).all() and np.isfinite(table.margin_retention).all()


def test_head_measures_track_the_chain_key(tiny_run):
    """Queries are the chain's pointers and the tracked key the next chain position, at every length
    moved by the extra tokens; the values are the prompt means of those rows."""
    from posym.models import load_checkpoint

    model, info = load_checkpoint(tiny_run)
    task = info["task_config"]
    config = core_lengthgen.LengthGenConfig(n=4, head_prompts=4)
    rows = core_lengthgen.measure_heads(model, task, [17, 40], config)
    for length, extra in [(17, 0), (40, 23)]:
        samples = generate(core_lengthgen.extension(task, length), 4, 0, "test")
        base = generate(task, 4, 0, "test")
        np.testing.assert_array_equal(np.where(base.chain >= 0, base.chain + extra, -1), samples.chain)
        sub = rows[rows.length == length]
        for k, chain in enumerate(samples.chain):
            chain = [int(p) for p in chain if p >= 0]
            mine = sub[sub.prompt == k]
            assert sorted(mine["query"].unique()) == sorted(chain[:-1])
            for query, key in zip(chain[:-1], chain[1:]):
                assert (mine[mine["query"] == query].tracked_key == key).all()
    assert rows.attn_tracked.notna().all() and len(rows.groupby(["layer", "head"])) == HEADS


def test_group_table_intervals_contain_the_point(measured):
    result, out = measured
    groups = pd.read_parquet(out / "head_groups.parquet")
    assert list(groups.columns) == GROUP_COLUMNS
    table = result["head_table"]
    real = [g for g in core_lengthgen.HEAD_GROUPS if (table.label == g).any()]
    assert [g for g in dict.fromkeys(groups.group) if not g.startswith(RANDOM)] == real
    assert len(groups) == len(groups.group.unique()) * len(MEASURES) * len(LENGTHS)
    _check_intervals(groups)
    summary = json.loads((out / "lengthgen.json").read_text())["head_retention"]
    assert summary["base_length"] == 17 and summary["lengths"] == LENGTHS and summary["prompts"] == PROMPTS
    assert set(summary["retention"]) == set(groups.group)
    assert sum(len(v) for v in summary["labels"].values()) == HEADS
    assert set(summary["groups"]) == set(real)
    for name in real:  # the point value is the median over the group's heads of the head retentions
        heads = table[(table.label == name) & (table.length == 51)]
        row = groups[(groups.group == name) & (groups.measure == "margin") & (groups.length == 51)].iloc[0]
        assert row.value == pytest.approx(heads.margin_retention.median()) and row.heads == len(heads)


def _check_intervals(groups):
    assert groups.prompts.eq(PROMPTS).all() and (groups.heads >= 1).all() and (groups.draws >= 1).all()
    assert np.isfinite(groups[["value", "lo", "hi"]]).all().all()
    assert ((groups.lo <= groups.value + 1e-9) & (groups.value <= groups.hi + 1e-9)).all(), groups
    base = groups[groups.length == 17]
    np.testing.assert_allclose(base[["value", "lo", "hi"]], 1.0)
    np.testing.assert_allclose(groups.factor, groups.length / 17)


def test_random_draws_are_matched_to_their_group(measured):
    """Each group gets 10 random draws matched layer by layer, never of the group's own heads: the
    positional head 0.0 is replaced by 0.1, the mixed pair 0.1, 1.1 by 0.0, 1.0; the notes say so."""
    result, _ = measured
    groups, per_head = result["group_table"], result["head_table"]
    notes = result["head_retention"]["groups"]
    assert set(groups.group) == {
        "positional",
        "symbolic",
        "mixed",
        "random:positional",
        "random:symbolic",
        "random:mixed",
    }
    assert notes["positional"] == {"heads": 1, "draws": 10, "layer_matched_draws": 10, "random": "same layers"}
    assert notes["mixed"]["draws"] == 10 and notes["mixed"]["layer_matched_draws"] == 10
    random = groups[groups.group == "random:positional"]
    assert random.draws.eq(10).all() and random.heads.eq(1).all()
    # the positional group's random draws are all head 0.1 (the only other head of layer 0)
    other = per_head[(per_head.layer == 0) & (per_head["head"] == 1)].set_index("length")
    for r in random[random.measure == "margin"].itertuples():
        assert r.value == pytest.approx(other.loc[r.length, "margin_retention"])
    labels = per_head.drop_duplicates(["layer", "head"])
    drawn, _ = core_lengthgen.head_groups(labels)
    assert all((0, 0) not in heads for name, heads in drawn.items() if name.startswith("random:positional"))
    assert all(sorted(heads) == [(0, 0), (1, 0)] for name, heads in drawn.items() if name.startswith("random:mixed"))


def test_too_few_heads_outside_a_group_get_no_draws():
    labels = pd.DataFrame(
        {"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "label": ["mixed", "mixed", "mixed", "uniform"]}
    )
    groups, notes = core_lengthgen.head_groups(labels)
    assert list(groups) == ["mixed"] and notes["mixed"] == {
        "heads": 3,
        "draws": 0,
        "random": "none: 1 heads outside the group of 3",
    }


def test_one_head_per_layer_falls_back_to_nearest_layers():
    labels = pd.DataFrame({"layer": range(4), "head": 0, "label": ["positional", "mixed", "symbolic", "symbolic"]})
    groups, notes = core_lengthgen.head_groups(labels)
    assert "one head per layer" in notes["positional"]["random"] and notes["positional"]["layer_matched_draws"] == 0
    assert all(heads in ([(1, 0)], [(0, 0)]) for name, heads in groups.items() if name.startswith("random:mixed"))
    assert notes["symbolic"]["draws"] == 10 and all(len(groups[f"random:symbolic:{i}"]) == 2 for i in range(10))


def test_figure_and_report_table(measured, tmp_path):
    import shutil

    result, out = measured
    assert (out / "head_retention.png").stat().st_size > 10_000 and (out / "head_retention.svg").is_file()
    assert str(out / "head_retention.png") in result["figures"]
    fig = lg.plot_head_retention(result["group_table"], task_config("number", alphabet_size=4))
    assert len(fig.axes) == len(MEASURES)
    empty = lg.plot_head_retention(result["group_table"].iloc[:0], task_config("number"))  # no group: a note
    assert "no positional, symbolic or mixed head" in [t.get_text() for t in empty.axes[0].texts]
    run = tmp_path / "run"
    shutil.copytree(out, run / "lengthgen")
    table = report._head_retention_table(run)
    assert table["header"] == ["group", "measure", "heads", "draws", *(f"{n} tokens" for n in LENGTHS)]
    assert len(table["rows"]) == len(result["group_table"].groupby(["group", "measure"]))
    assert report._head_retention_table(tmp_path) is None


def test_switched_off_writes_no_head_tables(tiny_run, tmp_path, monkeypatch, capsys):
    code = run_posym(
        monkeypatch,
        "lengthgen",
        tiny_run,
        "--lengths",
        "17,34",
        "--protocol",
        "paper",
        "--n",
        "8",
        "--no-head-retention",
        "--out",
        tmp_path / "off",
    )
    assert code == 0, capsys.readouterr()
    files = sorted(p.name for p in (tmp_path / "off").iterdir())
    assert files == ["fig5b.png", "fig5b.svg", "lengthgen.json", "lengthgen.parquet"]
    summary = json.loads((tmp_path / "off" / "lengthgen.json").read_text())
    assert "head_retention" not in summary and summary["config"]["heads"] is False
    code = run_posym(
        monkeypatch,
        "lengthgen",
        tiny_run,
        "--lengths",
        "17,34",
        "--protocol",
        "paper",
        "--n",
        "8",
        "--head-prompts",
        "4",
        "--out",
        tmp_path / "off",
    )  # its own directory: a rerun with heads
    printed = capsys.readouterr().out
    assert code == 0 and "head-level retention" in printed
    assert pd.read_parquet(tmp_path / "off" / "head_retention.parquet").prompts.eq(4).all()


def test_bad_head_prompts_is_one_line():
    with pytest.raises(PosymError, match="head_prompts must be at least 2"):
        core_lengthgen.LengthGenConfig(head_prompts=1)
    assert math.isclose(core_lengthgen.LengthGenConfig().head_prompts, 64) and core_lengthgen.LengthGenConfig().heads


def _construction_measures(head, task, lengths, n=32):
    """`head_measures`-like rows of a hand-built head (`posym.core.constructions`) on lengthgen's
    lengthened test questions: every pointer of the chain a query, its chain key tracked."""
    import torch

    from posym.core.constructions import attention_logits

    rows = []
    for length in lengths:
        samples = generate(core_lengthgen.extension(task, length), n, 0, "test")
        logits = attention_logits(head, torch.as_tensor(samples.input_ids))  # [B, L, L]
        for k, chain in enumerate(samples.chain):
            for query, key in core_lengthgen.chain_keys(chain).items():
                row = logits[k, query, : query + 1]  # [query + 1]: the keys the pointer sees
                top = row.topk(2).values  # [2]
                rows.append(
                    {
                        "prompt": k,
                        "query": query,
                        "layer": 0,
                        "head": 0,
                        "length": length,
                        "margin": float(top[0] - top[1]),
                        "attn_tracked": float(torch.softmax(row, -1)[key]),
                    }
                )
    return pd.DataFrame(rows)


def test_hand_built_positional_head_falls_and_symbolic_head_does_not():
    """T_Index (positional, theta of frequency ID 2) and T_Retrieval (symbolic, ID 42), beta 100, on the
    lengthened tasks: at 4x the positional head's margin is gone and its attention on the chain key
    falls to ~0.37; the symbolic head keeps 0.69 of its margin and all of its attention."""
    from posym.core.constructions import index_head, retrieval_head
    from posym.core.retention import head_retention
    from posym.core.theory import frequency_angle

    number, letter = task_config("number"), task_config("letter")
    lengths = [17, 34, 68]
    index = head_retention(
        _construction_measures(index_head(number, frequency_angle(2), 100.0), number, lengths), base_length=17
    ).set_index("length")
    retrieval = head_retention(
        _construction_measures(retrieval_head(letter, frequency_angle(42), 100.0), letter, lengths), base_length=17
    ).set_index("length")
    assert index.loc[68, "margin_retention"] < 0.01 and index.loc[68, "attn_tracked_retention"] < 0.5
    assert index.loc[34, "attn_tracked_retention"] > index.loc[68, "attn_tracked_retention"]
    assert retrieval.loc[68, "margin_retention"] > 0.6 and retrieval.loc[68, "attn_tracked_retention"] > 0.99
    assert (retrieval.attn_tracked > 0.99).all() and index.loc[17, "attn_tracked"] > 0.9
