"""posym.commands.llm_study.confirm (and scripts/causal_confirm.py): a planned confirmatory causal test.

- The plan refuses a test that cannot pass: too few draws for its Holm family, unknown names.
- The named group is the one the causal stage ranks (`causal_groups`), the random sets are matched on layer
  and differ from the group; another seed gives other sets.
- Points of sets ablated in chunks are the points of one call, and they are `ablation_effects`' numbers.
- The table's values, null medians, randomization p, Holm (over the planned family only) and verdicts equal
  a brute-force count from the points; a run that is not finished is refused.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from test_estimates import head_frame, holm_by_hand
from tiny_models import random_prompts, tiny_model

from posym.commands.llm_study import confirm, estimates, prediction
from posym.core import attribution, stats
from posym.errors import PosymError

ROOT = Path(__file__).resolve().parents[1]


def test_plan_refuses_what_cannot_pass():
    assert confirm.ConfirmPlan().family_size() == 2
    with pytest.raises(PosymError, match=r"draws 30 cannot pass Holm over 2 tests; use at least 40"):
        confirm.ConfirmPlan(draws=30)
    assert confirm.ConfirmPlan(draws=40).draws == 40  # 2 / 41 < 0.05
    assert confirm.ConfirmPlan(measure="length_effect", factors=[1, 4, 16], draws=40).family_size() == 2
    with pytest.raises(PosymError, match="length_effect needs at least two factors"):
        confirm.ConfirmPlan(measure="length_effect", factors=[16])
    for bad, message in [
        ({"group": "mixed"}, "group 'mixed'"),
        ({"ranking": "top"}, "ranking 'top'"),
        ({"measure": "accuracy"}, "measure 'accuracy'"),
        ({"mode": "resample"}, "mode 'resample'"),
        ({"factors": [1, 1]}, "factors must be distinct"),
        ({"prompts": 1}, "prompts >= 2"),
    ]:
        with pytest.raises(PosymError, match=message):
            confirm.ConfirmPlan(**bad)


@pytest.mark.parametrize("ranking", prediction.RANKINGS)
@pytest.mark.parametrize("group", ["symbolic", "positional"])
def test_plan_sets_rank_like_the_causal_stage_and_match_layers(ranking, group):
    heads = head_frame(4, 6)
    plan = confirm.ConfirmPlan(ranking=ranking, group=group, k=3, draws=50, seed=5)
    named, draws = confirm.plan_sets(heads, plan)
    assert named == prediction.causal_groups(heads, 3, 0, 0)[(ranking, group)]
    assert len(draws) == 50
    layers = Counter(l for l, _ in named)
    for draw in draws:
        assert Counter(l for l, _ in draw) == layers and not set(draw) & set(named)
    other = confirm.plan_sets(heads, confirm.ConfirmPlan(ranking=ranking, group=group, k=3, draws=50, seed=6))[1]
    assert other != draws
    with pytest.raises(PosymError, match="no disjoint random set"):
        confirm.plan_sets(heads, confirm.ConfirmPlan(k=13, draws=50))


def test_points_in_chunks_are_one_calls_points():
    model = tiny_model("llama")
    ids = random_prompts([12] * 3, seed=3)
    prompts = [
        SimpleNamespace(ids=p, answer_id=a, length=12, index=10 + i) for i, (p, a) in enumerate(zip(ids, (3, 5, 7)))
    ]
    sets = [[(0, 0), (1, 1)], [(0, 1), (1, 0)], [(1, 0), (1, 1)], [(0, 0), (0, 1)]]
    whole = confirm.confirm_points(model, prompts, sets, mode="mean", factor=2)
    parts = confirm.confirm_points(model, prompts, sets[:1], mode="mean", factor=2) + confirm.confirm_points(
        model, prompts, sets[1:], mode="mean", factor=2, first_set=confirm.NAMED + 1
    )
    a, b = pd.DataFrame(whole), pd.DataFrame(parts)
    pd.testing.assert_frame_equal(a.sort_values(["set", "prompt"]).reset_index(drop=True), b, atol=1e-9)
    assert sorted(a.set.unique()) == [-1, 0, 1, 2] and sorted(a.prompt.unique()) == [10, 11, 12]
    direct = attribution.ablation_effects(model, ids, [3, 5, 7], sets, mode="mean", metric="margin")
    np.testing.assert_allclose(a.sort_values(["prompt", "set"]).effect.to_numpy(), direct["effect"].ravel(), atol=1e-12)


def planted_points(plan, n=12, seed=0):
    """Points of a finished run with random effects and answers: the named group hurts more than most draws."""
    rng = np.random.default_rng(seed)
    rows = []
    for factor in plan.factors:
        clean = rng.normal(1.0, 0.5, n)
        for s in range(confirm.NAMED, plan.draws):
            shift = -1.5 if s == confirm.NAMED else -0.3
            effect = rng.normal(shift, 0.6, n)
            for p in range(n):
                rows.append(
                    {"factor": factor, "length": 8 * factor, "set": s, "prompt": 12 + p, "effect": effect[p],
                     "correct": bool(clean[p] + effect[p] > 0), "clean": clean[p], "clean_correct": bool(clean[p] > 0)}
                )  # fmt: skip
    return pd.DataFrame(rows)


def test_table_is_a_brute_force_count():
    plan = confirm.ConfirmPlan(factors=[1, 4, 16], draws=70, measure="acc_drop")
    points = planted_points(plan)
    table = confirm.confirm_table(points, plan)
    assert set(table.measure) == set(prediction.CAUSAL_MEASURES) and len(table) == 3 + 3 + 2
    tested = table[table.tested]
    assert (
        list(tested.measure) == ["acc_drop"] * 3
        and (tested.family == 3).all()
        and (table.family[~table.tested] == 0).all()
    )
    for row in table.itertuples():
        at = points[points.factor == row.factor]
        base = points[points.factor == 1]

        def measure(part, s):
            mine = part[part.set == s].sort_values("prompt")
            drop = mine.clean_correct.to_numpy(float) - mine.correct.to_numpy(float)
            return drop, mine.effect.to_numpy()

        def value(s):
            drop, change = measure(at, s)
            if row.measure == "acc_drop":
                return drop.mean()
            if row.measure == "margin_change":
                return change.mean()
            return (drop - measure(base, s)[0]).mean()

        observed, null = value(confirm.NAMED), np.array([value(s) for s in range(plan.draws)])
        centre = np.median(null)
        p = (1 + np.sum(np.abs(null - centre) >= abs(observed - centre) - 1e-12)) / (plan.draws + 1)
        assert row.value == pytest.approx(observed) and row.null_median == pytest.approx(centre)
        assert row.p == pytest.approx(p) and row.p_floor == pytest.approx(1 / 71) and row.draws == 70
    np.testing.assert_allclose(tested.p_holm.to_numpy(), holm_by_hand(list(tested.p)), atol=1e-12)
    for row in table.itertuples():
        expected = estimates.verdict(row.p_holm, row.value, row.null_median) if row.tested else "not tested"
        assert row.verdict == expected
    assert (tested.verdict == "above random").all()  # the planted group: drops more than every draw
    assert (table.mde > 0).all() and np.isnan(table.p_holm[~table.tested]).all()
    assert stats.ALPHA == 0.05


def test_an_unfinished_run_is_refused():
    plan = confirm.ConfirmPlan(factors=[1, 16], draws=40)
    points = planted_points(plan)
    with pytest.raises(PosymError, match="not finished"):
        confirm.confirm_table(points[points.set < 30], plan)
    with pytest.raises(PosymError, match="not finished"):
        confirm.confirm_table(points.drop(index=5), plan)
    with pytest.raises(PosymError, match=r"factors \[1\], the plan \[1, 16\]"):
        confirm.confirm_table(points[points.factor == 1], plan)


def test_script_refuses_an_empty_work_directory(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "plan.yaml").write_text("draws: 40\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "causal_confirm.py"), "collect", str(tmp_path), "--work", str(work)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.strip().endswith("holds no chunks: run first"), done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "confirm").exists()


def test_script_collects_a_finished_run_and_prints_its_block(tmp_path, monkeypatch):
    from posym import configs, io

    plan = confirm.ConfirmPlan(factors=[1, 16], draws=40)
    points = planted_points(plan).assign(heads="0.1,2.3")
    work, study = tmp_path / "work", tmp_path / "docs" / "results" / "study"
    work.mkdir()
    study.mkdir(parents=True)
    io.write_yaml(work / "plan.yaml", configs.to_dict(plan))
    for factor, part in points.groupby("factor"):  # two chunks a factor, as `run` saves them
        for lo, chunk in ((0, part[part.set < 20]), (21, part[part.set >= 20])):
            io.write_parquet(work / f"f{factor:02d}-s{lo:04d}.parquet", chunk.assign(chunk=lo, seconds=1.5 + factor))
    script = [sys.executable, str(ROOT / "scripts" / "causal_confirm.py")]
    done = subprocess.run([*script, "collect", str(study), "--work", str(work)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    table = pd.read_parquet(study / "confirm" / "confirm.parquet")
    pd.testing.assert_frame_equal(table, confirm.confirm_table(points, plan), check_dtype=False)
    record = io.read_json_object(study / "confirm" / "confirm.json")
    assert record["seconds_by_factor"] == {"1": 5.0, "16": 35.0} and record["sets"] == 41
    assert io.read_yaml(study / "confirm" / "plan.yaml") == configs.to_dict(plan)
    sys.path.insert(0, str(ROOT / "scripts"))
    import causal_confirm

    monkeypatch.setattr(causal_confirm, "STUDIES", {"Tiny": study})
    text = causal_confirm.block()
    assert text.startswith(causal_confirm.BEGIN) and text.endswith(causal_confirm.END)
    first = table.iloc[0]
    assert f"| acc_drop | 8 | 12 | {first.acc_clean:.2f} | {first.acc:.2f} | {first.value:+.2f} |" in text
    assert text.count("above random") == 2 and text.count("not tested") == 3
    page = tmp_path / "page.md"
    page.write_text(f"a\n{causal_confirm.BEGIN}\nold\n{causal_confirm.END}\nb\n")
    causal_confirm.write_block(page)
    assert page.read_text() == f"a\n{text}\nb\n"


GEMMA = ROOT / "docs" / "results" / "llm-study-gemma3" / "confirm"


@pytest.mark.skipif(not (GEMMA / "confirm.parquet").is_file(), reason="Gemma 3's confirmatory test not committed")
def test_committed_gemma3_confirmation_follows_from_its_points():
    """docs/results/llm-study-gemma3/confirm: the table is the one its points give under the plan committed
    before the run (git: plan.yaml unchanged since), the docs block is the script's output, the prompts are
    the 20 the causal stage did not use and the random sets are the plan's."""
    from posym import configs, io

    sys.path.insert(0, str(ROOT / "scripts"))
    import causal_confirm

    plan = configs.from_dict(confirm.ConfirmPlan, io.read_yaml(GEMMA / "plan.yaml"))
    assert configs.to_dict(plan) == configs.to_dict(confirm.ConfirmPlan())  # the defaults are the plan
    points = pd.read_parquet(GEMMA / "points.parquet")
    table = pd.read_parquet(GEMMA / "confirm.parquet")
    pd.testing.assert_frame_equal(table, confirm.confirm_table(points, plan), check_dtype=False)
    # what docs/results.md and the README say: above random at both lengths, Holm p 2/61, no length claim
    tested = table[table.tested].set_index("length")
    assert list(tested.index) == [72, 1152] and (tested.verdict == "above random").all()
    assert tested.p_holm.to_numpy() == pytest.approx([2 / 61, 2 / 61])
    assert tested.value.round(2).tolist() == [0.55, 0.45] and (tested.null_median == 0).all()
    assert not table[table.measure == "length_effect"].tested.any()
    assert sorted(points.prompt.unique()) == list(range(12, 32)) and set(points.factor) == {1, 16}
    heads = pd.read_parquet(GEMMA.parent / "lengths" / "heads.parquet")
    heads = heads[heads.layout == "between"]
    info = io.read_json_object(GEMMA.parent / "lengths" / "lengths.json")  # the kinds the study recorded
    kinds = {int(layer): kind for layer, kind in info["layer_kinds"].items()}
    assert sorted(layer for layer, kind in kinds.items() if kind == "global") == [5, 11, 17]
    named, draws = confirm.plan_sets(heads, plan, kinds=kinds)
    sets = dict(zip(range(confirm.NAMED, plan.draws), [named, *draws]))
    for s, text in points.groupby("set").heads.first().items():
        assert text == estimates.set_text(sets[s])
    doc = (ROOT / "docs" / "results.md").read_text()
    assert (
        causal_confirm.BEGIN
        + doc.split(causal_confirm.BEGIN, 1)[1].split(causal_confirm.END, 1)[0]
        + causal_confirm.END
        == causal_confirm.block()
    )
