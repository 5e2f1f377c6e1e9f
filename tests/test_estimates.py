"""posym.commands.llm_study.estimates: the causal stage's estimated random-set null and its calibration.

- On a one-layer model whose heads reach the margin linearly (MLP zeroed, final norm an identity; see
  tests/test_attribution.py) the sum of the heads' AtP effects IS the real group ablation: every estimated
  set equals its real ablation to 1e-9, the calibration slope is 1 and the estimate rows' margin changes
  are the real rows'.
- On planted per-head effects the randomization p, the null's median and interval equal a brute-force
  count over the draws (each summed head by head), and Holm runs over each (source, k, mode) family.
- `check_verdicts` recomputes every verdict, Holm p, family and agreement from a table's own numbers; it
  passes on the tables a tiny study writes (tests/test_llm_study.py) and fails on a doctored one.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from test_attribution import linear_model
from tiny_models import random_prompts

from posym.commands.llm_study import estimates, prediction
from posym.core import attribution, stats
from posym.errors import PosymError


def head_frame(n_layer: int, n_head: int, seed: int = 0):
    """Sink-free and plain scores of every head, as the lengths stage writes them."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        [
            {"variant": v, "layer": l, "head": h, "s_pos": rng.random(), "s_sym": rng.random()}
            for v in prediction.RANKINGS
            for l in range(n_layer)
            for h in range(n_head)
        ]
    )


def length_prompts(lengths=(8, 16), n=4, answers=(3, 5, 7, 9)):
    """{factor: stand-ins of LengthPrompt (ids, answer_id, length)} of random tokens, factor = length / 8."""
    out = {}
    for length in lengths:
        ids = random_prompts([length] * n, seed=length)
        out[length // lengths[0]] = [
            SimpleNamespace(ids=p, answer_id=a, length=length) for p, a in zip(ids, answers[:n])
        ]
    return out


def check_verdicts(table, calibration=None) -> None:
    """Every verdict, Holm p, family size and agreement of an estimates table (and the calibration's
    agreement counts and trusted flags) follows from the table's own numbers; AssertionError if not."""
    for _, part in table.groupby(["source", "k", "mode"]):
        ps = part.p.to_numpy(dtype=float)
        np.testing.assert_allclose(part.p_holm.to_numpy(dtype=float), stats.holm(ps), atol=1e-12)
        assert (part.family == np.sum(~np.isnan(ps))).all()
        for n, row in enumerate(part.itertuples()):
            assert row.verdict == estimates.verdict(row.p_holm, row.value, row.null_median), row
            assert row.p_floor == pytest.approx(1 / (row.draws + 1))
            assert row.p >= row.p_floor - 1e-12
            if row.source == "estimate":
                swapped = ps.copy()
                swapped[n] = row.real_p
                real = estimates.verdict(stats.holm(swapped)[n], row.real_value, row.null_median)
                assert row.real_verdict == real and row.agrees == (row.verdict == real), row
    if calibration is not None:
        named = table[(table.source == "estimate") & (table.measure == "acc_drop")]
        for row in calibration.itertuples():
            mine = named[(named.k == row.k) & (named["mode"] == row.mode) & (named.factor == row.factor)]
            assert row.verdicts == len(mine) and row.verdicts_agree == int(mine.agrees.astype(bool).sum())
            lo, hi = estimates.TRUST_SLOPE
            assert row.trusted == bool(row.pearson >= estimates.TRUST_PEARSON and lo <= row.slope <= hi)


def holm_by_hand(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment written out: the r-th smallest p times (m - r), running maximum, cap 1."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


# ---- exact on a linear model ---------------------------------------------------------------------------

DRAWS = 400
"""Estimated draws of the tests here: the least round count whose p floor lets Holm separate over two
lengths' family (20 tests: 20 / 401 < 0.05)."""


def wide_config(**draws) -> prediction.PredictionConfig:
    """k 1 and 2, both modes and rankings, two lengths, DRAWS estimated draws; `draws` the real ones."""
    return prediction.PredictionConfig(
        causal_ks=[1, 2],
        causal_modes=["mean", "zero"],
        causal_factors=[1, 2],
        causal_rankings=["sink-free", "plain"],
        estimate_draws=DRAWS,
        **draws,
    )


def test_estimates_equal_real_ablation_where_atp_is_exact():
    model = linear_model()
    _, _, n_head, _ = attribution.layout(model)
    chosen = length_prompts()
    config = wide_config(calibration_draws=3)
    table, calibration, points, _ = estimates.causal_estimates(model, chosen, config, head_frame(1, n_head), seed=0)
    # what the config's check counts (both rankings here; the default is sink-free alone)
    assert (table.family == prediction.estimate_family(sorted(chosen), config.causal_rankings)).all()
    assert set(table.ranking) == {"sink-free", "plain"}
    assert np.abs(points.real).max() > 1e-5  # the heads matter: the check is not 0 == 0
    np.testing.assert_allclose(points.estimate, points.real, atol=1e-9)
    assert len(calibration) == 2 * 2 * 2  # k x mode x factor
    np.testing.assert_allclose(calibration.slope, 1.0, atol=1e-9)
    np.testing.assert_allclose(calibration.pearson, 1.0, atol=1e-9)
    np.testing.assert_allclose(calibration.mean_real, calibration.mean_estimate, atol=1e-9)
    assert calibration.trusted.all() and (calibration.points == calibration.sets * 4).all()
    # the named groups: estimated margin change == real, at every length, mode, ranking and k
    margin = table[table.measure == "margin_change"]
    est = margin[margin.source == "estimate"].set_index(["k", "mode", "ranking", "group", "factor"])
    real = margin[margin.source == "real"].set_index(["k", "mode", "ranking", "group", "factor"])
    np.testing.assert_allclose(est.value, real.loc[est.index].value, atol=1e-9)
    np.testing.assert_allclose(est.value, est.real_value, atol=1e-9)
    assert (est.draws == DRAWS).all() and (real.draws == 3).all()
    # and against the engine's own reference, group by group
    groups = prediction.causal_groups(head_frame(1, n_head), 2, DRAWS, 0)
    ids, answers = [p.ids for p in chosen[2]], [p.answer_id for p in chosen[2]]
    named = [groups[("sink-free", "symbolic")], groups[("plain", "positional")]]
    exact = attribution.ablation_effects(model, ids, answers, named, mode="mean", metric="margin")["effect"].mean(0)
    for (ranking, group), value in zip([("sink-free", "symbolic"), ("plain", "positional")], exact):
        assert est.loc[(2, "mean", ranking, group, 2)].value == pytest.approx(value, abs=1e-9)
    check_verdicts(table, calibration)


def test_set_sums_is_group_estimates_vectorised():
    rng = np.random.default_rng(3)
    effect = rng.normal(size=(5, 3, 4))
    sets = [[(0, 1), (2, 3)], [(1, 0), (1, 2)], [(2, 2), (0, 0)]]
    np.testing.assert_allclose(estimates.set_sums(effect, sets), attribution.group_estimates(effect, sets))
    with pytest.raises(PosymError, match="one size"):
        estimates.set_sums(effect, [[(0, 1)], [(0, 1), (1, 1)]])


# ---- the tests on planted effects ----------------------------------------------------------------------


def planted(draws=999, calibration_draws=4, seed=5):
    """Per-head effects of 3 layers x 4 heads on 6 prompts at two lengths, the sink-free symbolic group's
    heads planted far below every other head; real ablations made up for the calibrated sets."""
    rng = np.random.default_rng(seed)
    heads = head_frame(3, 4, seed)
    every_group = {2: prediction.causal_groups(heads, 2, draws, seed)}
    planted_heads = every_group[2][("sink-free", "symbolic")]
    effects = {}
    for f in (1, 4):
        effect = rng.normal(0, 0.3, size=(6, 3, 4))
        for l, h in planted_heads:
            effect[:, l, h] = -3.0
        effects[f] = {"effect": effect, "clean": rng.normal(1.0, 0.5, size=6)}
    sets, _ = estimates.calibrated_sets(every_group, calibration_draws)
    real = {
        f: {
            "effect": rng.normal(size=(6, len(sets))),
            "correct": rng.random((6, len(sets))) < 0.5,
            "clean_correct": rng.random(6) < 0.8,
        }
        for f in (1, 4)
    }
    return effects, real, every_group, planted_heads


def test_randomization_p_and_null_equal_a_brute_force_count():
    effects, real, every_group, planted_heads = planted()
    rows, _ = estimates.measure_rows(effects, real, every_group, 4, {1: 10, 4: 40})
    table = estimates.estimate_table([{**r, "mode": "mean"} for r in rows])
    groups = every_group[2]
    assert estimates.pools(groups)[("sink-free", "symbolic")][0] == planted_heads
    for (ranking, group), (named, draws) in estimates.pools(groups).items():
        assert len(draws) == 999
        for f in (1, 4):
            e, clean = effects[f]["effect"], effects[f]["clean"]

            def margin(heads, e=e):  # the set's mean estimated margin change, head by head
                return float(np.mean([sum(e[p, l, h] for l, h in heads) for p in range(len(e))]))

            def drop(heads, e=e, clean=clean):  # estimated accuracy drop
                after = [clean[p] + sum(e[p, l, h] for l, h in heads) > 0 for p in range(len(e))]
                return float(np.mean(clean > 0) - np.mean(after))

            for measure, statistic in (("margin_change", margin), ("acc_drop", drop)):
                null = [statistic(d) for d in draws]
                centre = float(np.median(null))
                observed = statistic(named)
                at_least = sum(1 for v in null if abs(v - centre) >= abs(observed - centre) - 1e-12)
                row = table[
                    (table.source == "estimate")
                    & (table.ranking == ranking)
                    & (table.group == group)
                    & (table.factor == f)
                    & (table.measure == measure)
                ].iloc[0]
                assert row.value == pytest.approx(observed, abs=1e-12)
                assert row.p == pytest.approx((1 + at_least) / (len(null) + 1), abs=1e-12)
                assert row.null_median == pytest.approx(centre, abs=1e-12)
                assert (row.null_lo, row.null_hi) == pytest.approx(tuple(np.percentile(null, [2.5, 97.5])))
    # the planted group is the most extreme of its 999 draws: p = 1 / 1000, and Holm over its family
    row = table[
        (table.source == "estimate")
        & (table.ranking == "sink-free")
        & (table.group == "symbolic")
        & (table.measure == "margin_change")
        & (table.factor == 4)
    ].iloc[0]
    family = table[(table.source == "estimate")]
    assert row.p == pytest.approx(1 / 1000) and row.value < -5.9
    assert row.family == int(family.p.notna().sum()) == 4 * (2 + 2 + 1)  # 4 groups x (2 drops, 2 margins, 1 effect)
    assert row.p_holm == pytest.approx(holm_by_hand(family.p.tolist())[family.index.get_loc(row.name)])
    assert row.verdict == "below random"  # its margin falls far below every random set's
    drop = table[(table.source == "estimate") & (table.ranking == "sink-free") & (table.group == "symbolic")]
    drop = drop[(drop.measure == "acc_drop") & (drop.factor == 4)].iloc[0]
    assert drop.value > 0.5 and drop.verdict == "above random"  # and it loses answers no random set loses
    # the real rows: the null is the calibrated draws' real ablations, their own family
    real_rows = table[table.source == "real"]
    assert (real_rows.draws == 4).all() and np.allclose(real_rows.p_floor, 0.2)
    assert real_rows.real_verdict.isna().all() and real_rows.agrees.isna().all()
    check_verdicts(table)


def test_verdict_check_fails_when_a_verdict_does_not_follow():
    effects, real, every_group, _ = planted()
    rows, _ = estimates.measure_rows(effects, real, every_group, 4, {1: 10, 4: 40})
    table = estimates.estimate_table([{**r, "mode": "mean"} for r in rows])
    check_verdicts(table)
    for column, value in (("verdict", "above random"), ("p_holm", 0.5), ("agrees", False), ("family", 3)):
        doctored = table.copy()
        i = doctored.index[(doctored.source == "estimate") & (doctored.verdict == "below random")][0]
        doctored.at[i, column] = value
        with pytest.raises(AssertionError):
            check_verdicts(doctored)


def test_calibrated_sets_are_the_first_draws_and_the_named_groups_once():
    _, _, every_group, _ = planted(calibration_draws=4)
    sets, where = estimates.calibrated_sets(every_group, 4)
    groups = every_group[2]
    assert len({tuple(s) for s in sets}) == len(sets)  # each distinct set once
    for (ranking, group), (named, draws) in estimates.pools(groups).items():
        assert sets[where[(2, ranking, group, -1)]] == sorted(named)
        assert [sets[where[(2, ranking, group, i)]] for i in range(4)] == [sorted(d) for d in draws[:4]]
    # the estimate's draws begin with the ones the causal stage ablates (same seeds, drawn in order)
    few = prediction.causal_groups(head_frame(3, 4, 5), 2, 3, 5)
    assert all(few[key] == groups[key] for key in few)


def test_real_ablations_are_reused_where_they_are_the_same(monkeypatch):
    """A second run handed the first's calibration points ablates nothing and gives the same tables (its
    points say `reused`); a set the points lack is ablated, alone; points of other prompts (another clean
    margin) are not taken."""
    model = linear_model()
    _, _, n_head, _ = attribution.layout(model)
    chosen, heads = length_prompts(), head_frame(1, n_head)
    config = prediction.PredictionConfig(
        causal_ks=[1], causal_factors=[1, 2], estimate_draws=DRAWS, calibration_draws=3
    )
    first = estimates.causal_estimates(model, chosen, config, heads, seed=0)
    assert not first[2].reused.any()
    calls = []
    real = attribution.ablation_effects

    def counted(model, ids, answers, sets, **kw):
        calls.append([list(s) for s in sets])
        return real(model, ids, answers, sets, **kw)

    monkeypatch.setattr(attribution, "ablation_effects", counted)
    again = estimates.causal_estimates(model, chosen, config, heads, seed=0, measured=first[2])
    assert calls == [] and again[2].reused.all()
    pd.testing.assert_frame_equal(again[0], first[0])
    pd.testing.assert_frame_equal(again[1], first[1])
    pd.testing.assert_frame_equal(again[2].drop(columns="reused"), first[2].drop(columns="reused"))
    lacking = first[2][first[2].set != 0]  # one set's real ablations lost
    partly = estimates.causal_estimates(model, chosen, config, heads, seed=0, measured=lacking)
    wanted = [[tuple(map(int, h.split("."))) for h in first[2].heads[first[2].set == 0].iloc[0].split(",")]]
    assert calls == [wanted, wanted]  # that set alone, at each of the two lengths
    assert set(partly[2][~partly[2].reused].set) == {0}
    np.testing.assert_allclose(partly[2].real, first[2].real, atol=1e-12)
    calls.clear()
    moved = first[2].assign(clean=first[2].clean + 0.5)  # another prompt set's margins: nothing applies
    estimates.causal_estimates(model, chosen, config, heads, seed=0, measured=moved)
    assert len(calls) == 2 and all(len(c) == first[2].set.nunique() for c in calls)


def test_config_bounds_the_draws():
    with pytest.raises(PosymError, match="estimate_draws"):
        prediction.PredictionConfig(estimate_draws=0)
    # no Holm p of a 56-test family (both rankings, five lengths) can go below 56 / (draws + 1): 1,000 draws
    # could never separate; the default family (sink-free, 1x and 16x) has 10 tests, where 1,000 can
    wide = {"causal_factors": [1, 2, 4, 8, 16], "causal_rankings": ["sink-free", "plain"]}
    with pytest.raises(PosymError, match=r"estimate_draws 1,000 cannot separate anything.*at least 1,120"):
        prediction.PredictionConfig(estimate_draws=1000, **wide)
    assert prediction.PredictionConfig(estimate_draws=1120, **wide).estimate_draws == 1120  # 56 / 1,121 < 0.05
    assert prediction.PredictionConfig(estimate_draws=1000).estimate_draws == 1000  # 10 / 1,001 < 0.05
    assert prediction.PredictionConfig().estimate_draws == 10_000
    assert prediction.PredictionConfig(causal_factors=[1], estimate_draws=80, calibration_draws=20)  # 4 tests
    with pytest.raises(PosymError, match="calibration_draws .* cannot exceed"):
        prediction.PredictionConfig(estimate_draws=2000, calibration_draws=2001)
    with pytest.raises(PosymError, match="n_causal >= 2"):
        prediction.PredictionConfig(n_causal=1)
    assert prediction.PredictionConfig(n_causal=1, causal_modes=["zero"]).n_causal == 1


def test_committed_smollm2_estimates_follow_from_their_numbers():
    """docs/results/llm-study/causal: every verdict, Holm p, family and agreement of the estimates, and the
    calibration's agreement counts and trusted flags, follow from the committed numbers; the null has the draws
    a 56-test family needs, and its real ablations are the first run's (all reused, none differing)."""
    causal = Path(__file__).resolve().parents[1] / "docs" / "results" / "llm-study" / "causal"
    table = pd.read_parquet(causal / "estimates.parquet")
    calibration = pd.read_parquet(causal / "calibration.parquet")
    est = table[table.source == "estimate"]
    assert set(table.source) == {"estimate", "real"} and (est.draws == 10_000).all()
    assert (est.family == prediction.estimate_family([1, 2, 4, 8, 16])).all()
    assert (est.p_holm >= est.family * est.p_floor - 1e-12).all()  # no Holm p below the floor the config checks
    check_verdicts(table, calibration)
    # what docs/results.md says: the sink-free symbolic group's estimated drop is above random at 1x, 2x and
    # 16x (Holm p 0.0056), its margin change below random at every length, its length effect nowhere separated
    sym = est[(est.ranking == "sink-free") & (est.group == "symbolic")]
    drops = sym[sym.measure == "acc_drop"].set_index("factor")
    assert drops.verdict.to_dict() == {
        1: "above random",
        2: "above random",
        4: "not separated",
        8: "not separated",
        16: "above random",
    }
    assert (sym[sym.measure == "margin_change"].verdict == "below random").all()
    assert (sym[sym.measure == "length_effect"].verdict == "not separated").all()
    assert calibration.trusted.all()
    assert pd.read_parquet(causal / "calibration_points.parquet").reused.all()


def test_committed_gemma3_estimates_follow_from_their_numbers():
    """docs/results/llm-study-gemma3/causal: verdicts and calibration follow from the committed numbers, and
    what docs/results.md says of them holds: the estimate is trusted at 72 tokens only and stops tracking real
    ablation past the local layers' 512-key window; the sink-free symbolic group's real drop is above each
    of its pool's 20 real draws at every length (p at the floor 1 / 21) yet passes Holm nowhere."""
    causal = Path(__file__).resolve().parents[1] / "docs" / "results" / "llm-study-gemma3" / "causal"
    table = pd.read_parquet(causal / "estimates.parquet")
    calibration = pd.read_parquet(causal / "calibration.parquet").set_index("factor")
    check_verdicts(table, calibration.reset_index())
    est = table[table.source == "estimate"]
    assert (est.draws == 10_000).all() and (est.family == prediction.estimate_family([1, 2, 4, 8, 16])).all()
    assert calibration.trusted.to_dict() == {1: True, 2: False, 4: False, 8: False, 16: False}
    assert calibration.verdicts_agree[1] == 1 and calibration.pearson[16] < 0.05 and calibration.slope[16] < 0.05
    points = pd.read_parquet(causal / "calibration_points.parquet")
    wide = points[points.factor == 16]
    assert 5.5 < wide.estimate.std() / wide.real.std() < 7  # "about 6 times as wide" (sd, ddof 1)
    real = table[table.source == "real"]
    assert (real.draws == 20).all() and (real.p_holm == 1.0).all()
    sym = real[(real.ranking == "sink-free") & (real.group == "symbolic") & (real.measure == "acc_drop")]
    assert len(sym) == 5 and np.allclose(sym.p, 1 / 21) and (sym.value > sym.null_hi).all()
    others = real[(real.measure == "acc_drop") & ~((real.ranking == "sink-free") & (real.group == "symbolic"))]
    assert (others.groupby(["ranking", "group"]).p.max() > 0.1).all()  # no other group shows the pattern


def test_committed_qwen_estimates_follow_from_their_numbers():
    """docs/results/llm-study-qwen2.5-coder-0.5b/causal (the default causal sizes: 1x and 16x, the sink-free
    ranking, 3 real draws, 2 calibration draws, 10,000 estimated draws): every verdict, Holm p and agreement
    follows from the committed numbers, and its prompts are the lengths stage's format (136 and 2,176 tokens)."""
    study = Path(__file__).resolve().parents[1] / "docs" / "results" / "llm-study-qwen2.5-coder-0.5b"
    table = pd.read_parquet(study / "causal" / "estimates.parquet")
    calibration = pd.read_parquet(study / "causal" / "calibration.parquet")
    check_verdicts(table, calibration)
    est = table[table.source == "estimate"]
    assert (est.draws == 10_000).all() and (est.family == prediction.estimate_family([1, 16], ["sink-free"])).all()
    assert set(table.ranking) == {"sink-free"} and set(calibration.factor) == {1, 16}
    rows = pd.read_parquet(study / "causal" / "causal.parquet")
    lengths = json.loads((study / "lengths" / "lengths.json").read_text())
    base = lengths["base_lengths"]["between"]
    assert base == 136 and set(rows.length) == {base, 16 * base}
    accuracy = pd.read_parquet(study / "lengths" / "accuracy.parquet")
    clean = rows[rows.group == "none"].merge(
        accuracy[accuracy.layout == "between"], on=["factor", "length", "prompt"], suffixes=("", "_lengths")
    )
    assert len(clean) == len(rows[rows.group == "none"]) and (clean.correct == clean.correct_lengths).all()


def test_causal_rows_are_the_real_ablations_of_their_sets(monkeypatch):
    """The causal rows (`prediction.causal_rows`) read every condition's answers from the stage's real
    ablations, made once for them and for the calibration: each named group's and random draw's rows are
    `ablation_effects` of that set alone (mean over the same-length prompts at each position, or zero), the
    first causal_draws of each pool; the stage ablates max(causal_draws, calibration_draws) sets per pool,
    each distinct set once per mode and length, and its clean rows are the clean model's greedy answers."""
    import torch

    from tiny_models import tiny_model

    model = tiny_model("llama")
    layers, _, n_head, _ = attribution.layout(model)
    n_layer = len(layers)
    chosen = {}
    for f, length in ((1, 8), (2, 16)):
        ids = random_prompts([length] * 6, seed=length)
        with torch.no_grad():
            logits = model(torch.tensor(ids)).logits[:, -1]  # [P, vocab]
        # half the answers the clean model's greedy token, half its second choice: flips both ways
        ranked = logits.argsort(-1, descending=True)
        answers = [int(ranked[i, i % 2]) for i in range(len(ids))]
        chosen[f] = [
            SimpleNamespace(ids=p, answer_id=a, length=length, index=i) for i, (p, a) in enumerate(zip(ids, answers))
        ]
    heads = head_frame(n_layer, n_head)
    config = wide_config(causal_draws=3, calibration_draws=1)
    every_group = {
        k: prediction.causal_groups(heads, k, DRAWS, 0, rankings=config.causal_rankings) for k in config.causal_ks
    }
    calls = []
    real = attribution.ablation_effects

    def counted(model, ids, answers, sets, **kw):
        calls.append((len(ids[0]), kw["mode"], [tuple(sorted(s)) for s in sets]))
        return real(model, ids, answers, sets, **kw)

    monkeypatch.setattr(attribution, "ablation_effects", counted)
    table, _, points, ablations = estimates.causal_estimates(model, chosen, config, heads, seed=0)
    assert ablations["groups"] == every_group  # the groups the causal rows read are causal_groups' own
    assert len(calls) == 4  # per mode and length one call, over every set
    for _, _, sets in calls:
        assert len(sets) == len(set(sets)) == len(ablations["sets"])
    wanted = {(k, r, g) for k in config.causal_ks for r in config.causal_rankings for g in prediction.CAUSAL_GROUPS}
    assert {key[:3] for key in ablations["where"]} == wanted
    assert {key[3] for key in ablations["where"]} == {-1, 0, 1, 2}  # max(causal_draws, calibration_draws)
    assert set(table[table.source == "real"].draws) == {1}  # the real tests read calibration_draws
    assert points.heads.nunique() == len(ablations["sets"])  # every real ablation is a calibration point

    rows = prediction.causal_rows(chosen, config, ablations)
    clean = rows[rows.group == "none"]
    conditions = rows[rows.group != "none"]
    assert set(conditions.draw) == {-1, 0, 1, 2}
    per_k = len(config.causal_modes) * len(config.causal_rankings) * 2 * (1 + config.causal_draws)
    assert len(conditions) == len(config.causal_ks) * per_k * 12
    assert conditions.correct.any() and not conditions.correct.all()
    for (mode, text), part in conditions.groupby(["mode", "heads"]):
        members = [tuple(map(int, h.split("."))) for h in text.split(",")]
        for f, prompts in chosen.items():
            one = real(model, [p.ids for p in prompts], [p.answer_id for p in prompts], [members], mode=mode)
            for _, condition in part[part.factor == f].groupby(["k", "ranking", "group", "draw"]):
                assert condition.sort_values("prompt").correct.tolist() == one["correct"][:, 0].tolist()
            assert clean[clean.factor == f].sort_values("prompt").correct.tolist() == one["clean_correct"].tolist()
    assert clean.correct.tolist() == [i % 2 == 0 for i in range(6)] * 2
