"""The committed tables of the number cliff's measurement (issue 28, docs/results/number-cliff), read back:
columns and row counts, Wilson intervals and alias shares recomputed, the causal check's identity at the
training length, and quoted.json (the numbers docs/results.md quotes) recomputed from the tables."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import number_cliff  # noqa: E402

from posym.core.aliasing import alias_share  # noqa: E402
from posym.core.lengthgen import extension  # noqa: E402
from posym.core.tasks import generate  # noqa: E402
from posym.errors import PosymError  # noqa: E402
from posym.core.stats import wilson_interval  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "number-cliff"
OUT_AUTHORS64 = OUT.with_name("number-cliff-authors64")
"""The same measurement on the `authors64` variant's seed-0 number model at step 6,000."""
OUT_NOID1 = OUT.with_name("number-cliff-noid1")
"""The same measurement on the `noid1` variant's (plane ID 1 not rotated) seed-0 number model at step 6,000."""
OUT_HORIZON = OUT.with_name("number-cliff-horizon")
"""The same measurement on the `horizon` variant's seed-0 number model at step 6,000 (with --planes 1-8, 2-8)."""
RESULTS = ROOT / "docs" / "results.md"


def paragraph(opening: str) -> str:
    """The docs/results.md paragraph that starts with `opening`, on one line (whitespace collapsed)."""
    text = RESULTS.read_text()
    start = text.index(opening)
    return " ".join(text[start : text.index("\n\n", start + 10)].split())


@pytest.fixture(
    scope="module",
    params=[
        OUT,
        OUT_AUTHORS64,
        OUT.with_name("number-cliff-authors64-s1"),
        OUT.with_name("number-cliff-authors64-s2"),
        OUT_NOID1,
        OUT_HORIZON,
    ],
    ids=["authors-2750", "authors64-6000", "authors64-s1-6000", "authors64-s2-6000", "noid1-6000", "horizon-6000"],
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
    section = paragraph("**Without plane ID 1's rotation (`noid1`")
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


def test_plane_sets_parse_and_name_themselves():
    assert number_cliff.parse_planes(" 9-11 ,2", 64) == [2, 9, 10, 11]
    assert number_cliff.parse_planes(number_cliff.DEFAULT_PLANES, 64) == [1]
    for bad, message in [
        ("0", "frequency IDs run 1-64 in this model, got '0'"),
        ("65", "frequency IDs run 1-64 in this model, got '65'"),
        ("3-2", "frequency IDs run 1-64 in this model, got '3-2'"),
        ("x", "takes frequency IDs such as 1, 2,3 or 9-64, got 'x'"),
        ("1-", "takes frequency IDs such as 1, 2,3 or 9-64, got '1-'"),
        ("", "takes frequency IDs such as 1, 2,3 or 9-64, got ''"),
    ]:
        with pytest.raises(PosymError, match=message):
            number_cliff.parse_planes(bad, 64)
    assert [number_cliff.plane_tag(ids) for ids in ([1], [2], [9, 10], [2, 4])] == ["id1", "id2", "ids9_10", "ids2_4"]


def test_plane_id_1_conditions_draw_what_the_committed_tables_drew():
    """The random-plane control of `--planes 1` draws the planes the pre-`--planes` script drew
    (rng.randrange(1, planes) per positional layer), so the committed tables stay reproducible; a set of
    k planes draws k planes outside the set, and none when fewer remain."""
    import random
    from types import SimpleNamespace

    model = SimpleNamespace(config=SimpleNamespace(n_layer=6, rotary_dim=128, n_embd=256, n_head=1))
    labels = pd.DataFrame({"layer": range(6), "label": ["mixed", *["positional"] * 4, "symbolic"]})
    drawn = lambda conds: [f.__defaults__[0] for name, _, f in conds if name == "random_plane_far"]  # noqa: E731
    rng = random.Random(number_cliff.SEED)
    old = [{(l, 0): [rng.randrange(1, 64)] for l in range(1, 5)} for _ in range(number_cliff.DRAWS)]
    conds = number_cliff.conditions(model, labels, 16, [1])
    assert drawn(conds) == old
    assert [name for name, draw, _ in conds if draw == 0] == [
        "none",
        "id1_far",
        "random_plane_far",
        "id1_far_other_heads",
        "id1_all_keys",
        "id1_mean_shift_far",
    ]
    eight = number_cliff.conditions(model, labels, 16, list(range(2, 10)))
    for choice in drawn(eight):
        assert all(len(set(p)) == 8 and not set(p) & set(range(1, 9)) for p in choice.values())
    assert drawn(number_cliff.conditions(model, labels, 16, list(range(2, 65)))) == []  # only plane 0 is left


@pytest.fixture(scope="module")
def tiny_number_run(tmp_path_factory):
    from tiny_runs import train_tiny

    return train_tiny(tmp_path_factory.mktemp("cliff"), "number", steps=2, every=2, eval_size=8)


def test_causal_check_of_a_plane_set(tiny_number_run, tmp_path):
    """`--planes 2-3` on a tiny number model: the conditions carry the set's tag, the mean-shift penalty is
    the two planes' shares summed (logits are linear in the planes) and zero at the training length, and
    headline quotes the set's tables under its tag beside plane ID 1's. (The removal's identity at the
    training length is test_ablate_finetune's far_planes_removed test and, on the trained models,
    test_causal_check_is_the_identity_at_the_training_length: this untrained model answers nothing right.)"""
    from posym.models import load_checkpoint

    model, info = load_checkpoint(tiny_number_run, step=2)
    base = info["task_config"]
    labels = pd.DataFrame({"layer": [0, 1], "label": ["positional", "positional"]})
    lengths = [base.seq_len, 40]
    causal, shifts = number_cliff.causal(model, base, labels, 24, lengths, 4096, [2, 3])
    assert set(causal.condition) == {
        "none",
        "ids2_3_far",
        "random_plane_far",
        "ids2_3_far_other_heads",
        "ids2_3_all_keys",
        "ids2_3_mean_shift_far",
    }
    samples = generate(extension(base, 40), 24, number_cliff.SEED, split="test")
    parts = [number_cliff.far_share(model, samples, [0, 1], base.seq_len - 1, 24, [m]) for m in (1, 2)]
    both = shifts[shifts.length == 40].set_index("layer")["shift"]
    for layer in (0, 1):
        assert both[layer] == pytest.approx(parts[0][layer] + parts[1][layer], abs=1e-9)
        assert both[layer] != 0.0
    assert (shifts[shifts.length == base.seq_len]["shift"] == 0).all()

    out = tmp_path / "cliff"
    shutil.copytree(OUT_NOID1, out)
    causal.to_parquet(out / "interventions-ids2_3.parquet")
    shifts.to_parquet(out / "shifts-ids2_3.parquet")
    q = number_cliff.headline(out)
    committed = json.loads((OUT_NOID1 / "quoted.json").read_text())
    extra = q["causal_planes"].pop("ids2_3")
    assert json.loads(json.dumps(q)) == committed  # the rest as committed, other plane sets included
    assert extra["causal"]["ids2_3_far"][40][0] == round(float(causal.acc[causal.condition == "ids2_3_far"].iloc[1]), 3)
    assert set(extra["causal_wilson"]) == {"none", "ids2_3_far", "ids2_3_all_keys"}


def test_a_bad_plane_set_is_one_line_and_exit_2(tiny_number_run, tmp_path):
    out = tmp_path / "cliff"
    cmd = [sys.executable, str(ROOT / "scripts" / "number_cliff.py"), str(tiny_number_run), "--step", "2"]
    done = subprocess.run([*cmd, "--planes", "99", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "frequency IDs run 1-" in done.stderr
    assert not out.exists()  # nothing half-written


def test_docs_quote_the_noid1_plane_sets():
    """docs/results.md's paragraph on `--planes 2-8` / `--planes 9-64` in noid1 quotes quoted.json's
    causal_planes (the removal, its controls, the mean-shift penalties) at the places they belong."""
    q = json.loads((OUT_NOID1 / "quoted.json").read_text())["causal_planes"]
    fast, slow = q["ids2_8"]["causal"], q["ids9_64"]["causal"]
    section = paragraph("**In `noid1` the fast planes are the cause")
    assert "docs/results/number-cliff-noid1/quoted.json" in section
    lo, hi = q["ids2_8"]["causal_wilson"]["ids2_8_far"]["68"]
    assert all(fast["ids2_8_far"][str(n)][0] == 1.0 for n in (56, 60, 68, 128)) and f"1.0 ({lo:g}-{hi:.1f})" in section
    untouched = ", ".join(f"{fast['none'][str(n)][0]:g}" for n in (56, 60, 68)) + f" and {fast['none']['128'][0]:g}"
    assert untouched in section
    mean, low, high = fast["random_plane_far"]["60"]
    assert f"{mean:g} ({low:g}-{high:g} over 3 draws) at 60 tokens and {fast['random_plane_far']['68'][0]:g}" in section
    other, shift = fast["ids2_8_far_other_heads"], fast["ids2_8_mean_shift_far"]
    assert (
        f"{other['60'][0]:g} and {other['68'][0]:g}" in section
        and f"{shift['60'][0]:g} and {shift['68'][0]:g}" in section
    )
    assert f"({fast['ids2_8_all_keys']['17'][0]:g} at 17 tokens)" in section
    penalties = [v for L, pair in q["ids9_64"]["shifts"].items() if L != "17" for v in pair]
    assert f"{min(penalties):g} to {max(penalties):g} per head" in section
    assert f"({slow['ids9_64_far']['56'][0]:g} at 56 tokens, {slow['ids9_64_far']['68'][0]:g} at 68)" in section
    assert f"({slow['ids9_64_all_keys']['17'][0]:g} at 17 tokens)" in section
    assert f"({slow['ids9_64_all_keys']['68'][0]:g} at 68, {slow['ids9_64_all_keys']['128'][0]:g} at 128)" in section


def test_docs_quote_the_horizon_tables():
    """docs/results.md's paragraph on horizon's number model quotes its accuracy, wrong-key offsets and the
    causal check of plane ID 1, IDs 2-8 and IDs 1-8 with their controls at the places they belong."""
    q = json.loads((OUT_HORIZON / "quoted.json").read_text())
    section = paragraph("**On `horizon`'s number model")
    assert "docs/results/number-cliff-horizon/quoted.json" in section and f"step {q['step']:,}" in section
    assert f"lies below 0.9 is {q['cliff_first_below_0p9']}" in section
    assert "0.867 ({:g}-{:g}) at 50".format(*q["accuracy"]["50"][1:]) in section
    (a, na), (b, nb), (c, nc), _ = q["offsets"]["68"]["most"]
    assert (
        f"{a}, {b} and {c} positions" in section and f"({na}, {nb} and {nc} of the {q['wrong_keys']['68']}" in section
    )
    cells = lambda c, t=None: [(q["causal_planes"][t] if t else q)["causal"][c][str(n)][0] for n in (56, 60, 68, 128)]  # noqa: E731
    one, fast, all8 = cells("id1_far"), cells("ids2_8_far", "ids2_8"), cells("ids1_8_far", "ids1_8")
    assert (
        f"{one[0]:g} at 56 tokens, {one[1]:g} at 60, {one[2]:g} (" in section and f"only {one[3]:g} at 128" in section
    )
    assert "give {:g}, {:g}, {:g} and {:g} (".format(*fast) in section
    assert "together {:g}, {:g}, {:g} and {:g} (".format(*all8) in section
    controls = q["causal_planes"]["ids1_8"]["causal"]
    assert (
        f"{controls['random_plane_far']['56'][0]:g} at 56 tokens and {controls['random_plane_far']['128'][0]:g} at 128"
        in section
    )
    assert (
        f"{controls['ids1_8_far_other_heads']['56'][0]:g} and {controls['ids1_8_far_other_heads']['128'][0]:g}"
        in section
    )
    assert (
        f"{controls['ids1_8_mean_shift_far']['56'][0]:g} and {controls['ids1_8_mean_shift_far']['128'][0]:g}" in section
    )
    assert f"{controls['ids1_8_all_keys']['17'][0]:g} at 17 tokens" in section
