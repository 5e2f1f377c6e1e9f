"""The causal stage's random-set null from attribution patching, and its calibration against real ablation.

The causal stage (`posym.commands.llm_study.prediction.causal_rows`) ablates each named group (the top-k
symbolic and positional heads of each ranking) and `causal_draws` matched random sets for real: one
forward pass per set, prompt and length, so its randomization p cannot go below 1 / (causal_draws + 1).
Here the null comes from the attribution engine (`posym.core.attribution`, issue 51) instead:

estimate     per causal length, on the stage's 'between' prompts of that length, every head's AtP
             effect on the answer's logit margin (`attribute(method="atp", metric="margin")`; mean-
             ablation's reference: the prompts of that length, as `attribute` does), one forward and one
             backward pass per prompt (a no-grad forward more for the means). A set's ESTIMATED effect
             is the sum of its heads' effects (`group_estimates`), so `estimate_draws` matched random
             sets per (ranking, group) (drawn as `causal_groups` draws, layer and layer kind matched;
             their first causal_draws are the sets the stage ablates) cost an index sum each. The
             estimated answer is right when clean margin + estimated change > 0 (the margin's contrast
             is the clean run's best other token, so the clean answer is right when the clean margin
             is > 0): judged on the next token (`LengthPrompt.answer_id`), also for a format judged on
             its whole answer elsewhere.
tests        like for like: a named group's ESTIMATED accuracy drop, margin change and length effect
             (drop(L) - drop(base)) against the same measure of its pool's ESTIMATED draws: the
             randomization p (`posym.core.stats.randomization_p`), Holm over the family of one (source,
             k, mode), the verdict (Holm p < 0.05: 'above random' or 'below random', by the side of the
             null's median; else 'not separated') and the minimal detectable effect at the family's
             level from the per-prompt spread of the group minus its pool's mean (ddof 1).
real         the named groups and the first sets of each pool ablated for real, once for the whole stage
             (`ablation_effects`, the same mode, metric, contrast token and same-length reference: the
             exact counterpart of the estimate; max(causal_draws, calibration_draws) sets per pool): the
             causal rows (`prediction.causal_rows`, causal_summary.parquet) read their answers from them,
             and the first calibration_draws are tested here the same way among the real draws (source
             'real', whose p cannot go below 1 / (calibration_draws + 1)); beside each estimate row the
             named group's real value (real_value), its p among the ESTIMATED draws (real_p), the verdict
             that p gives in the same Holm family (real_verdict) and whether it is the estimate's verdict
             (agrees). (Studies committed before 2026-12-07 ablated their causal rows apart, with each
             head's mean over every position of the base-length prompts at every length.)
calibration  per (k, mode, length), over prompt x ablated set (each distinct set once): Pearson and
             Spearman of the estimated against the real margin change, the real / estimate slope
             through 0, both means, how often the estimated and the real answer agree, how many named
             groups' verdicts agree; `trusted` when Pearson >= TRUST_PEARSON and the slope lies within
             TRUST_SLOPE (on the real models AtP tracks group ablation at 1x with slopes ~0.8-0.94, but
             not at 16x on Gemma 3: docs/attribution.md).

reuse        real ablations are the stage's cost (one pass per set, prompt and length); those of an earlier
             run's causal/calibration_points.parquet (`posym llm-study --reuse-ablations`) are taken again
             for every (mode, length, set) it holds on all prompts, provided its clean margins equal this
             run's (the same prompts on the same weights: `reused_ablations`); the rest is ablated. A
             point's `reused` says which. So a null with more draws costs the attribution passes only.

Tables: causal/estimates.parquet (`estimate_table`), causal/calibration.parquet (`calibration_table`),
causal/calibration_points.parquet (`calibration_points`, per prompt and set ablated for real).
"""

from __future__ import annotations

import numpy as np

from posym.commands.llm_study.prediction import CAUSAL_MEASURES, causal_groups
from posym.core import attribution
from posym.core.retention import RANDOM
from posym.core.stats import ALPHA, detectable_effect, holm, pearson, randomization_p, spearman
from posym.errors import PosymError

SOURCES = ("estimate", "real")
"""Where a row's numbers come from: the sum of the heads' AtP effects, or real ablation."""
VERDICTS = ("above random", "below random", "not separated")
NULL_INTERVAL = (2.5, 97.5)
"""Percentiles of the null's central 95% interval."""
TRUST_PEARSON = 0.8
"""Least Pearson r of estimated against real margin change for a length's estimate to be `trusted`."""
TRUST_SLOPE = (0.8, 1.25)
"""Range of the real / estimate slope through 0 for a length's estimate to be `trusted`."""
ATP_TOKENS = 2048
"""Tokens per attribution batch (prompts x length, at least one prompt, at most `attribution.attribute`'s
default 4): its backward pass keeps every layer's activations (with the eager kernel, [heads, L, L]
attention per layer and prompt), so long prompts go one at a time."""

CLEAN_TOLERANCE = 1e-4
"""Largest difference of a clean margin between an earlier run's calibration points and this run's for its
real ablations to be reused (float rounding across thread counts is ~1e-6; another prompt or model is ~1)."""

Head = tuple[int, int]
REUSED_COLUMNS = ("mode", "factor", "length", "heads", "prompt", "real", "correct_real", "clean")
"""The columns of calibration points that `reused_ablations` reads (a table without them is not one)."""


def set_text(heads) -> str:
    """A head set as calibration_points' `heads` column writes it, and as `reused_ablations` finds it again.

    >>> set_text([(0, 1), (12, 3)])
    '0.1,12.3'
    """
    return ",".join(f"{a}.{b}" for a, b in heads)


# ---- the estimates ---------------------------------------------------------------------------------


def set_sums(effect: np.ndarray, sets: list[list[Head]]) -> np.ndarray:
    """Sum-of-heads estimates [P, S] of S head sets of one size from per-head effects [P, L, H]: one index
    sum over all sets at once (`attribution.group_estimates`, vectorised).

    >>> set_sums(np.arange(8.0).reshape(1, 2, 4), [[(0, 1), (1, 3)], [(0, 0), (1, 0)]]).tolist()
    [[8.0, 4.0]]
    """
    n_prompt, _, n_head = effect.shape
    if not sets:
        return np.zeros((n_prompt, 0))
    if len({len(s) for s in sets}) != 1:
        raise PosymError(f"set_sums needs sets of one size, got sizes {sorted({len(s) for s in sets})}")
    index = np.array([[l * n_head + h for l, h in s] for s in sets], dtype=np.int64)  # [S, k]
    return effect.reshape(n_prompt, -1)[:, index].sum(-1)  # [P, S]


def pools(groups: dict[tuple[str, str], list[Head]]) -> dict[tuple[str, str], tuple[list[Head], list[list[Head]]]]:
    """{(ranking, group): (the group's heads, its pool's random sets in draw order)} of `causal_groups`.

    >>> g = {("sink-free", "symbolic"): [(0, 1)], ("sink-free", "random:symbolic:0"): [(0, 2)],
    ...      ("sink-free", "random:symbolic:1"): [(0, 3)]}
    >>> pools(g)
    {('sink-free', 'symbolic'): ([(0, 1)], [[(0, 2)], [(0, 3)]])}
    """
    out: dict[tuple[str, str], tuple[list[Head], list[list[Head]]]] = {}
    for (ranking, name), heads in groups.items():
        if not name.startswith(RANDOM):
            draws = []
            i = 0
            while (ranking, f"{RANDOM}:{name}:{i}") in groups:
                draws.append(groups[(ranking, f"{RANDOM}:{name}:{i}")])
                i += 1
            out[(ranking, name)] = (list(heads), draws)
    return out


def stat_rows(clean_correct, correct, change, null_correct, null_change, real: dict | None = None) -> list[dict]:
    """Per factor and measure: the group's value, its null's median and 95% interval, the randomization p
    and the per-prompt spread of the group minus its pool's mean (the MDE's sd).

    clean_correct [F, P] bool; correct [F, P] bool and change [F, P] the group's; null_correct [F, P, D] and
    null_change [F, P, D] its draws'. Factor 0 is the base length. real: {(measure, j): the group's real
    value}, whose randomization p among these draws each row then holds as real_p."""
    drop = clean_correct.astype(float) - correct  # [F, P] per prompt
    null_drop = clean_correct[..., None].astype(float) - null_correct  # [F, P, D]
    per_prompt = {
        "acc_drop": (drop, null_drop),
        "margin_change": (change, null_change),
        "length_effect": (drop - drop[:1], null_drop - null_drop[:1]),
    }
    rows = []
    for measure in CAUSAL_MEASURES:
        mine, theirs = per_prompt[measure]
        values, nulls = mine.mean(1), theirs.mean(1)  # [F], [F, D]
        for j in range(len(values)):
            if measure == "length_effect" and j == 0:
                continue
            null = nulls[j]
            lo, hi = np.percentile(null, NULL_INTERVAL) if len(null) else (np.nan, np.nan)
            diff = mine[j] - theirs[j].mean(-1)  # [P] the group minus its pool's mean
            rows.append(
                {
                    "measure": measure,
                    "j": j,
                    "value": float(values[j]),
                    "null_median": float(np.median(null)) if len(null) else np.nan,
                    "null_lo": float(lo),
                    "null_hi": float(hi),
                    "p": randomization_p(float(values[j]), null),
                    "p_floor": 1.0 / (len(null) + 1),
                    "draws": len(null),
                    "sd": float(np.std(diff, ddof=1)) if len(diff) > 1 else np.nan,
                }
            )
            if real is not None:
                value = real[(measure, j)]
                rows[-1].update(real_value=value, real_p=randomization_p(value, null))
    return rows


def verdict(p_holm: float, value: float, null_median: float) -> str:
    """'above random' / 'below random' (by the side of the null's median) when the Holm-adjusted p is below
    ALPHA, else 'not separated' (also for a NaN p: no test).

    >>> verdict(0.01, 0.5, 0.1), verdict(0.01, -0.5, 0.1), verdict(0.2, 0.5, 0.1)
    ('above random', 'below random', 'not separated')
    """
    if not p_holm < ALPHA:
        return VERDICTS[2]
    return VERDICTS[0] if value > null_median else VERDICTS[1]


def _finish(table):
    """Holm over each (source, k, mode) family, the verdicts and the minimal detectable effects; for a row
    with a real value (real_p: its p among this row's draws) real_verdict, the verdict the same test gives
    with the real value in place of this one (its p put in this row's place in the family before Holm)."""
    table["p_holm"] = np.nan
    table["family"] = 0
    table["mde"] = np.nan
    table["verdict"] = VERDICTS[2]
    table["real_verdict"] = None
    for _, part in table.groupby(["source", "k", "mode"], sort=False):
        ps = part.p.to_numpy()
        adjusted = holm(ps)
        family = int(np.sum(~np.isnan(ps)))
        level = ALPHA / max(family, 1)
        table.loc[part.index, "p_holm"] = adjusted
        table.loc[part.index, "family"] = family
        for n, i in enumerate(part.index):
            row = table.loc[i]
            if not np.isnan(row.real_p):
                swapped = ps.copy()
                swapped[n] = row.real_p
                table.at[i, "real_verdict"] = verdict(holm(swapped)[n], row.real_value, row.null_median)
            # an accuracy difference that never varied (sd 0) gives no spread: the binomial worst case (as
            # `accuracy_tests`); a margin change always varies
            sd = row.sd if (row.sd > 0 or row.measure == "margin_change") else 1.0
            table.at[i, "mde"] = detectable_effect(sd, int(row.prompts), alpha=level)
            table.at[i, "verdict"] = verdict(row.p_holm, row.value, row.null_median)
    return table


def measure_rows(
    effects: dict,
    real: dict,
    every_group: dict,
    calibration_draws: int,
    lengths: dict[int, int],
    ablated: tuple[list, dict] | None = None,
):
    """(test rows, calibration points) of one mode, from per-length attribution and real-ablation outputs.

    effects: {factor: `attribution.attribute` output (margin metric) on that length's prompts}; real: {factor:
    `attribution.ablation_effects` output on the same prompts for the sets of `ablated` (the (sets, where) of
    `calibrated_sets`: by default `calibrated_sets(every_group, calibration_draws)`; more draws per pool may
    be ablated, the real tests read the first calibration_draws), in that order}; every_group: {k:
    `prediction.causal_groups` with the estimate draws}; lengths: {factor: tokens}. The smallest factor is
    the base. Test rows come without Holm (`estimate_table` adds it); points are per ablated set and prompt."""
    factors = sorted(effects)
    sets, where = ablated if ablated is not None else calibrated_sets(every_group, calibration_draws)
    rows = []
    clean = np.stack([effects[f]["clean"] for f in factors])  # [F, P] clean margin
    clean_correct = clean > 0  # the contrast is the clean run's best other token
    r_clean = np.stack([real[f]["clean_correct"] for f in factors])  # [F, P] the clean argmax is the answer
    for k, groups in every_group.items():
        for (ranking, group), (named, draws) in pools(groups).items():
            est_named = np.stack([set_sums(effects[f]["effect"], [named])[:, 0] for f in factors])  # [F, P]
            est_draws = np.stack([set_sums(effects[f]["effect"], draws) for f in factors])  # [F, P, D]
            index = [where[(k, ranking, group, i)] for i in range(-1, min(calibration_draws, len(draws)))]
            r_effect = np.stack([real[f]["effect"][:, index] for f in factors])  # [F, P, 1 + C]
            r_correct = np.stack([real[f]["correct"][:, index] for f in factors])  # [F, P, 1 + C]
            actual = stat_rows(r_clean, r_correct[..., 0], r_effect[..., 0], r_correct[..., 1:], r_effect[..., 1:])
            real_of = {(r["measure"], r["j"]): r["value"] for r in actual}
            estimate = stat_rows(
                clean_correct, clean + est_named > 0, est_named, clean[..., None] + est_draws > 0, est_draws, real_of
            )
            common = {"k": k, "ranking": ranking, "group": group, "prompts": clean.shape[1]}
            accuracies = {
                "estimate": (clean_correct.mean(1), (clean + est_named > 0).mean(1)),
                "real": (r_clean.mean(1), r_correct[..., 0].mean(1)),
            }
            for source, part in (("estimate", estimate), ("real", actual)):
                for r in part:
                    j = r.pop("j")
                    row = {"source": source, **common, "factor": factors[j], "length": lengths[factors[j]], **r}
                    row.update(acc_clean=float(accuracies[source][0][j]), acc=float(accuracies[source][1][j]))
                    rows.append({"real_value": np.nan, "real_p": np.nan, **row})
    points = []
    for s, heads in enumerate(sets):
        text = set_text(heads)
        for j, f in enumerate(factors):
            estimated = set_sums(effects[f]["effect"], [heads])[:, 0]  # [P]
            for prompt, value in enumerate(estimated):
                points.append(
                    {
                        "k": len(heads),
                        "factor": f,
                        "length": lengths[f],
                        "set": s,
                        "heads": text,
                        "prompt": prompt,
                        "estimate": float(value),
                        "real": float(real[f]["effect"][prompt, s]),
                        "clean": float(clean[j, prompt]),
                        "correct_estimate": bool(clean[j, prompt] + value > 0),
                        "correct_real": bool(real[f]["correct"][prompt, s]),
                    }
                )
    return rows, points


def calibrated_sets(every_group: dict, calibration_draws: int):
    """(distinct head sets to ablate for real, {(k, ranking, group, draw or -1 for the group): index}):
    the named groups and the first calibration_draws random sets of each pool, of every k.

    >>> g = {("sink-free", "symbolic"): [(0, 1)], ("sink-free", "random:symbolic:0"): [(0, 2)],
    ...      ("plain", "symbolic"): [(0, 1)], ("plain", "random:symbolic:0"): [(0, 3)]}
    >>> sets, where = calibrated_sets({1: g}, 1)
    >>> sets, where[(1, "plain", "symbolic", -1)], where[(1, "plain", "symbolic", 0)]
    ([[(0, 1)], [(0, 2)], [(0, 3)]], 0, 2)
    """
    sets: list[list[Head]] = []
    index: dict[tuple, int] = {}
    where: dict[tuple, int] = {}
    for k, groups in every_group.items():
        for (ranking, group), (named, draws) in pools(groups).items():
            for draw, heads in [(-1, named), *enumerate(draws[:calibration_draws])]:
                key = tuple(sorted(heads))
                if key not in index:
                    index[key] = len(sets)
                    sets.append(sorted(heads))
                where[(k, ranking, group, draw)] = index[key]
    return sets, where


# ---- the tables ------------------------------------------------------------------------------------

ESTIMATE_COLUMNS = (
    *("source", "k", "mode", "ranking", "group", "factor", "length", "measure", "value", "acc_clean", "acc"),
    *("prompts", "draws", "null_median", "null_lo", "null_hi", "p", "p_floor", "p_holm", "family", "verdict"),
    *("sd", "mde", "real_value", "real_p", "real_verdict", "agrees"),
)
"""Columns of causal/estimates.parquet (`estimate_table`)."""


def estimate_table(rows):
    """causal/estimates.parquet from `measure_rows`' rows (the mode added): one row per (source, k, mode,
    ranking, group, factor, measure). Holm over each (source, k, mode) family of tests (family: its size),
    verdict (`verdict`) and mde at the family's level (`_finish`). Estimate rows also hold the named group's
    REAL value of the same measure (real_value), its randomization p among the ESTIMATED draws (real_p), the
    verdict that p gives in the same Holm family (real_verdict) and whether it is the estimate's (agrees)."""
    import pandas as pd

    table = _finish(pd.DataFrame(rows).reset_index(drop=True))
    estimate = table.source == "estimate"
    table["agrees"] = None
    table.loc[estimate, "agrees"] = (table.verdict[estimate] == table.real_verdict[estimate]).astype(object)
    return table[list(ESTIMATE_COLUMNS)]


def calibration_table(points, estimates):
    """causal/calibration.parquet: per (k, mode, factor), over prompt x ablated set, the estimated (sum
    of AtP) against the real margin change: Pearson, Spearman, slope real / estimate through 0, both means,
    acc_agreement (the share of points whose estimated and real answers agree), verdicts_agree / verdicts
    (the named groups whose estimated accuracy-drop verdict is the one their REAL drop gets against the
    same estimated null: `estimate_table`'s agrees), trusted (Pearson >= TRUST_PEARSON and the slope within TRUST_SLOPE)."""
    import pandas as pd

    rows = []
    named = estimates[(estimates.source == "estimate") & (estimates.measure == "acc_drop")]
    for (k, mode, factor), part in points.groupby(["k", "mode", "factor"], sort=True):
        e, r = part.estimate.astype(float), part.real.astype(float)
        square = float((e**2).sum())
        slope = float((e * r).sum() / square) if square > 0 else np.nan
        mine = named[(named.k == k) & (named["mode"] == mode) & (named.factor == factor)]
        r_pearson = pearson(e, r)
        rows.append(
            {
                "k": k,
                "mode": mode,
                "factor": factor,
                "length": int(part.length.iloc[0]),
                "sets": int(part.set.nunique()),
                "points": len(part),
                "pearson": r_pearson,
                "spearman": spearman(e, r),
                "slope": slope,
                "mean_real": float(r.mean()),
                "mean_estimate": float(e.mean()),
                "acc_agreement": float((part.correct_estimate == part.correct_real).mean()),
                "verdicts_agree": int(mine.agrees.astype(bool).sum()),
                "verdicts": len(mine),
                "trusted": bool(r_pearson >= TRUST_PEARSON and TRUST_SLOPE[0] <= slope <= TRUST_SLOPE[1]),
            }
        )
    return pd.DataFrame(rows)


# ---- the stage's work --------------------------------------------------------------------------------


def reused_ablations(measured, mode: str, factor: int, length: int, sets: list[list[Head]], clean) -> dict:
    """The real ablations of `sets` that an earlier run's calibration points (`measured`, a DataFrame, or
    None) already hold for this mode, factor and length on every prompt, when its clean margins are this
    run's `clean` [P] (within CLEAN_TOLERANCE; else none is reused): {"effect": [P, S], "correct": [P, S]
    (NaN / False where not held), "clean_correct": [P] (clean > 0: the margin's contrast is the best other
    token), "have": [S] bool}.

    >>> import pandas as pd
    >>> old = pd.DataFrame({"mode": "mean", "factor": 1, "length": 4, "heads": "0.1", "prompt": [0, 1],
    ...                     "real": [-0.5, 0.25], "correct_real": [False, True], "clean": [0.3, 0.7]})
    >>> got = reused_ablations(old, "mean", 1, 4, [[(0, 1)], [(0, 2)]], np.array([0.3, 0.7]))
    >>> got["have"].tolist(), got["effect"][:, 0].tolist()
    ([True, False], [-0.5, 0.25])
    >>> reused_ablations(old, "mean", 1, 4, [[(0, 1)]], np.array([0.3, 0.9]))["have"].tolist()  # other prompts
    [False]
    """
    clean = np.asarray(clean, dtype=float)
    n_prompt = len(clean)
    out = {
        "effect": np.full((n_prompt, len(sets)), np.nan),
        "correct": np.zeros((n_prompt, len(sets)), dtype=bool),
        "clean_correct": clean > 0,
        "have": np.zeros(len(sets), dtype=bool),
    }
    if measured is None or not len(measured):
        return out
    part = measured[(measured["mode"] == mode) & (measured.factor == factor) & (measured.length == length)]
    part = part[(part.prompt >= 0) & (part.prompt < n_prompt)]
    if part.empty:
        return out
    held = part.groupby("prompt").clean.first()
    if len(held) != n_prompt or not np.allclose(held.sort_index().to_numpy(float), clean, atol=CLEAN_TOLERANCE):
        return out  # other prompts, or another model: nothing of it applies
    by_set = {text: rows.sort_values("prompt") for text, rows in part.groupby("heads")}
    for s, heads in enumerate(sets):
        rows = by_set.get(set_text(sorted(heads)))
        if rows is None or rows.prompt.nunique() != n_prompt or len(rows) != n_prompt:
            continue
        out["effect"][:, s] = rows.real.to_numpy(float)
        out["correct"][:, s] = rows.correct_real.to_numpy(bool)
        out["have"][s] = True
    return out


def causal_estimates(
    model,
    chosen: dict,
    config,
    heads,
    *,
    seed: int,
    kinds: dict | None = None,
    progress=None,
    measured=None,
):
    """(estimates, calibration, points, ablations): the causal stage's estimated tests, their calibration,
    and its real ablations (`prediction.causal_rows` reads its answers from them).

    chosen: {factor: the stage's 'between' `LengthPrompt`s at that length} (its n_causal per length); config:
    a `PredictionConfig` (causal_ks, causal_modes, estimate_draws, calibration_draws); heads: the lengths
    stage's heads of the 'between' layout (both rankings), as `causal_groups` takes them. Per mode and length:
    `attribute` (AtP, margin) on that length's prompts, then `ablation_effects` of the named groups and the
    first max(causal_draws, calibration_draws) sets of each pool (those `measured`, an earlier run's
    calibration points, holds for these prompts are taken from it: `reused_ablations`); progress(1) after
    each (2 x modes x lengths steps). ablations: {"groups": {k: `causal_groups` with estimate_draws draws},
    "sets": the sets ablated, "where": {(k, ranking, group, draw or -1): set index}, "real": {mode: {factor:
    ablation_effects output over the sets}}}."""
    import pandas as pd

    progress = progress or (lambda n=1: None)
    factors = sorted(chosen)
    lengths = {f: chosen[f][0].length for f in factors}
    every_group = {
        k: causal_groups(heads, k, config.estimate_draws, seed, kinds=kinds, rankings=config.causal_rankings)
        for k in config.causal_ks
    }
    # the sets ablated for real, once: the named groups and the first draws of each pool, as many as the
    # causal rows (causal_draws) or the calibration (calibration_draws) read, whichever is more
    sets, where = calibrated_sets(every_group, max(config.causal_draws, config.calibration_draws))
    rows, points, ablations = [], [], {"groups": every_group, "sets": sets, "where": where, "real": {}}
    for mode in config.causal_modes:
        effects, real = {}, {}
        ablations["real"][mode] = real
        for f in factors:
            ids, answers = [p.ids for p in chosen[f]], [p.answer_id for p in chosen[f]]
            batch = max(1, min(4, ATP_TOKENS // lengths[f]))
            # the mean-ablation reference (one forward pass over the length's prompts), shared by the
            # attribution and the real ablations, which would each compute the same means again
            means = attribution.reference_means(model, ids) if mode == "mean" else None
            effects[f] = attribution.attribute(
                model, ids, answers, mode=mode, method="atp", metric="margin", means=means, batch_size=batch
            )
            progress(1)
            old = reused_ablations(measured, mode, f, lengths[f], sets, effects[f]["clean"])
            missing = [s for s in range(len(sets)) if not old["have"][s]]
            real[f] = old
            if missing:
                new = attribution.ablation_effects(
                    model, ids, answers, [sets[s] for s in missing], mode=mode, metric="margin", means=means
                )
                real[f]["effect"][:, missing], real[f]["correct"][:, missing] = new["effect"], new["correct"]
                real[f]["clean_correct"] = new["clean_correct"]
            progress(1)
        found, spots = measure_rows(effects, real, every_group, config.calibration_draws, lengths, (sets, where))
        rows += [{**r, "mode": mode} for r in found]
        points += [{**p, "mode": mode, "reused": bool(real[p["factor"]]["have"][p["set"]])} for p in spots]
    estimates = estimate_table(rows)
    points = pd.DataFrame(points)
    return estimates, calibration_table(points, estimates), points, ablations
