"""The committed tables of the number cliff's measurement (issue 28, docs/results/number-cliff), read back:
columns and row counts, Wilson intervals and alias shares recomputed, the causal check's identity at the
training length, and quoted.json (the numbers docs/results.md quotes) recomputed from the tables."""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import number_cliff  # noqa: E402

from posym.core.aliasing import alias_share  # noqa: E402
from posym.core.stats import wilson_interval  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "number-cliff"
OUT_AUTHORS64 = OUT.with_name("number-cliff-authors64")
"""The same measurement on the `authors64` variant's seed-0 number model at step 6,000."""
OUT_NOID1 = OUT.with_name("number-cliff-noid1")
"""The same measurement on the `noid1` variant's (plane ID 1 not rotated) seed-0 number model at step 6,000."""
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"


@pytest.fixture(
    scope="module",
    params=[
        OUT,
        OUT_AUTHORS64,
        OUT.with_name("number-cliff-authors64-s1"),
        OUT.with_name("number-cliff-authors64-s2"),
        OUT_NOID1,
    ],
    ids=["authors-2750", "authors64-6000", "authors64-s1-6000", "authors64-s2-6000", "noid1-6000"],
)
def out(request) -> Path:
    return request.param


@pytest.fixture(scope="module")
def tables(out):
    names = ("accuracy", "answer_offsets", "heads", "head_offsets", "top_keys", "alias", "planes", "interventions")
    return {name: pd.read_parquet(out / f"{name}.parquet") for name in names}


def test_quoted_numbers_are_the_tables(out):
    recomputed = json.loads(json.dumps(number_cliff.headline(out), default=str))  # as write_json stores it
    assert recomputed == json.loads((out / "quoted.json").read_text())


def test_accuracy_table(tables):
    acc = tables["accuracy"]
    assert sorted(acc.length.unique()) == number_cliff.LENGTHS
    assert sorted(acc.hop.unique()) == [0, 1, 2, 3, 4]
    every = acc[acc.hop == 0]
    assert (every.n == 480).all()
    per_hop = acc[acc.hop > 0].groupby("length")[["n", "correct"]].sum()
    assert (per_hop.n.to_numpy() == every.set_index("length").n.loc[per_hop.index].to_numpy()).all()
    assert (per_hop.correct.to_numpy() == every.set_index("length").correct.loc[per_hop.index].to_numpy()).all()
    np.testing.assert_allclose(acc.acc, acc.correct / acc.n)
    for row in acc.itertuples():
        assert (row.lo, row.hi) == pytest.approx(wilson_interval(row.correct, row.n))
    assert every.set_index("length").acc[17] == 1.0


def test_alias_shares_recomputed(tables):
    alias = tables["alias"].set_index(["source", "length"])
    for source, name in (("positional heads", "head_offsets"), ("answers", "answer_offsets")):
        for length, hist in tables[name].groupby("length"):
            got = alias.loc[(source, length)]
            for key, value in alias_share(hist).items():
                assert got[key] == pytest.approx(value, nan_ok=True)
    heads = tables["head_offsets"]
    counts = heads.groupby("length")["observed"].sum()
    tops = tables["top_keys"].groupby("length").rows.sum()
    assert (counts.loc[tops.index] == tops).all()  # the same wrong keys, by offset and by position
    assert (heads.groupby("length").expected.sum().round(6) == counts.round(6)).all()  # one unit per wrong key


def test_planes_add_up(tables):
    planes = tables["planes"].dropna(subset=["total"])
    np.testing.assert_allclose(planes.total, planes.id1 + planes.ids2_8 + planes.ids9_free, atol=1e-9)
    assert (planes.total > 0).all()  # the wrong key is the top key: it out-scores the chain key
    for g in ("total", "id1", "ids2_8", "ids9_free", "id1_others", "ids2_8_others", "ids9_free_others"):
        assert (planes[f"{g}_lo"] <= planes[g] + 1e-12).all() and (planes[g] <= planes[f"{g}_hi"] + 1e-12).all()


def test_causal_check_is_the_identity_at_the_training_length(tables, out):
    causal = tables["interventions"]
    assert causal.groupby("condition").draw.nunique().to_dict() == {
        "none": 1,
        "id1_far": 1,
        "random_plane_far": 3,
        "id1_far_other_heads": 3,
        "id1_all_keys": 1,
        "id1_mean_shift_far": 1,
    }
    shifts = pd.read_parquet(out / "shifts.parquet")
    assert sorted(shifts.length.unique()) == sorted(causal.length.unique())
    positional = json.loads((out / "quoted.json").read_text())["positional_layers"]
    assert all(sorted(g.layer) == positional for _, g in shifts.groupby("length"))  # the positional heads
    assert (shifts[shifts.length == 17]["shift"] == 0).all()  # a 17-token prompt has no far key
    at17 = causal[(causal.length == 17) & causal.condition.str.contains("far")]
    none17 = causal[(causal.length == 17) & (causal.condition == "none")].correct.iloc[0]
    assert (at17.correct == none17).all()  # no key of a 17-token prompt is farther than 16 back
    for row in causal.itertuples():
        assert (row.lo, row.hi) == pytest.approx(wilson_interval(row.correct, row.n))
    base = causal[causal.condition == "none"].set_index("length")
    acc = tables["accuracy"]
    acc = acc[acc.hop == 0].set_index("length")
    for length in base.index:  # the same questions, the same model: the accuracy table's numbers
        assert base.correct[length] == acc.correct[length]


def test_docs_quote_these_tables():
    """docs/results.md's paragraph cites quoted.json (scripts/readme_numbers.py checks every number in it)
    and quotes its headline numbers at the places they belong."""
    q = json.loads((OUT / "quoted.json").read_text())
    text = RESULTS.read_text()
    start = text.index("**The number cliff, measured**")
    section = " ".join(text[start : text.index("bf16 is not among them", start)].split())
    assert "docs/results/number-cliff/quoted.json" in section
    assert f"step {q['step']:,}" in section and f"of the {q['base_right_rows']}" in section
    for length in (50, 56, 60, 128):
        acc, lo, hi = q["accuracy"][str(length)]
        assert f"{acc:.3f} ({lo:.3f}-{hi:.3f}) at {length}" in section
    for length in (56, 60, 68, 128):
        acc, lo, hi = q["causal"]["id1_far"][str(length)][0], *q["causal_wilson"]["id1_far"][str(length)]
        assert f"{acc:g} ({lo:g}-{hi:g}) at {length}" in section
        planes = q["planes"][str(length)]
        row = f"| {length} | {planes['rows']} | {planes['total'][0]:g} | {planes['id1'][0]:g} ({planes['id1'][1]:g} to"
        assert row in section
    shift = q["causal"]["id1_mean_shift_far"]
    low = min(lo for lo, _ in q["shifts"].values())
    assert (
        f"between {low:g} and 0.0" in section
        and f"({shift['56'][0]:g} at 56 tokens, {shift['128'][0]:g} at 128)" in section
    )
    most = q["offsets"]["128"]["most"][0]
    assert most == [51, 119] and f"{most[1]} of the {q['wrong_keys']['128']} at 128" in section


def test_docs_quote_the_authors64_tables():
    """docs/results.md's paragraph on the authors64 number model cites its quoted.json and quotes the causal
    check's headline numbers (the removal and its controls) at the places they belong."""
    q = json.loads((OUT_AUTHORS64 / "quoted.json").read_text())
    text = RESULTS.read_text()
    start = text.index("**The same check on `authors64`**")
    section = " ".join(text[start : text.index("bf16 is not among them", start)].split())
    assert "docs/results/number-cliff-authors64/quoted.json" in section and f"step {q['step']:,}" in section
    for condition, lengths in (("none", (56, 60, 68, 128)), ("id1_far", (56, 60, 68, 128))):
        cells = ", ".join(f"{q['causal'][condition][str(n)][0]:.2f}" for n in lengths)
        assert cells in section, (condition, cells)
    low, high = q["causal"]["random_plane_far"]["128"][1:]
    assert f"{low:.2f}-{high:.2f} at 128" in section
    assert (
        f"{q['causal']['id1_far_other_heads']['128'][0]:.2f} and {q['causal']['id1_mean_shift_far']['128'][0]:.2f}"
        in section
    )


def test_docs_quote_the_noid1_tables():
    """docs/results.md's paragraph on the noid1 number model (plane ID 1 not rotated) cites its quoted.json
    and quotes its accuracy, where its wrong keys sit and the planes' split at the places they belong."""
    q = json.loads((OUT_NOID1 / "quoted.json").read_text())
    text = RESULTS.read_text()
    start = text.index("**Without plane ID 1's rotation (`noid1`")
    section = " ".join(text[start : text.index("\n\n", start + 10)].split())
    assert "docs/results/number-cliff-noid1/quoted.json" in section and f"step {q['step']:,}" in section
    assert f"lies below 0.9 is {q['cliff_first_below_0p9']}" in section
    assert f"0.84 ({q['accuracy']['60'][1]:g}-{q['accuracy']['60'][2]:g}) at 60" in section
    (offset, count), *_ = q["offsets"]["68"]["most"]
    assert offset == 58 and f"{count} of the {q['wrong_keys']['68']} at 68" in section
    planes = q["planes"]["68"]
    assert f"wrong keys {-planes['ids2_8'][0]:g} below the chain key at 68 tokens" in section
    assert f"the average key {-planes['ids2_8_others'][0]:g}" in section
    assert f"lead of {planes['ids9_free'][0]:g}" in section
    assert f"{q['causal']['id1_far']['68'][0]:g} at 68 tokens, {q['causal']['none']['68'][0]:g} without" in section
