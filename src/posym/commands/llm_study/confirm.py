"""A confirmatory causal test of one named head group: fixed before it is run, on prompts the causal stage did
not use, against real ablations of layer-matched random sets.

The causal stage (`prediction.causal_rows`, `estimates.causal_estimates`) tests every named group at every
length in one Holm family, so a few real draws can never pass it, and an estimated null is only as good as
its calibration (on Gemma 3 it stops tracking real ablation past 4x: docs/results.md). A pattern seen there
(one group above every real draw at every length) is a hypothesis, not a verdict; this module tests it again
the way a reviewer would accept:

plan         `ConfirmPlan`: the group (ranking, group, k: the causal stage's `causal_groups` ranks it again
             from the lengths stage's heads), the lengths (factors), the measure and the family (the
             measure at each factor, Holm over them: nothing else is tested), the prompts (a slice of the
             study's 'between' prompts the causal stage did not use: it took the first n_causal), the random
             draws (`matched_random` with the plan's own seed, matched on layer and layer kind) and the mode.
             Written down (`plan.yaml`) before the first ablation.
points       per factor, set (-1: the named group, then the draws) and prompt, the real ablation's margin
             change and whether the answer stays the greedy token (`attribution.ablation_effects`: the
             reference of mean-ablation is the same prompts, as the estimate's calibration); clean margin and
             clean answer beside them (`confirm_points`).
table        per factor and measure (acc_drop: clean accuracy minus ablated; margin_change: mean change of
             the answer's logit margin; length_effect: acc_drop(L) - acc_drop(base)) the named group's value
             against its draws (median, central 95%, the two-sided randomization p, its floor 1 / (draws +
             1)); the planned family's rows get Holm and a verdict, the others are described, not tested
             (`confirm_table`); the MDE at the family's level from the per-prompt spread of the group minus
             its draws' mean (ddof 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from posym.commands.llm_study.estimates import stat_rows, verdict
from posym.commands.llm_study.prediction import CAUSAL_GROUPS, CAUSAL_MEASURES, RANKINGS, every_head, ranked_group
from posym.core import attribution
from posym.core.interventions import ABLATION_MODES
from posym.core.retention import matched_random
from posym.core.stats import ALPHA, detectable_effect, holm, holm_floor
from posym.errors import PosymError

Head = tuple[int, int]
NAMED = -1
"""The `set` index of the named group in the points (the random draws are 0, 1, ...)."""


@dataclass
class ConfirmPlan:
    """What a confirmatory test asks, fixed before it runs (dumped as plan.yaml beside its tables)."""

    ranking: str = "sink-free"
    """Which labels rank the heads: 'sink-free' or 'plain' (the lengths stage's heads table)."""
    group: str = "symbolic"
    """'symbolic' (the k heads of lowest s_pos - s_sym) or 'positional' (highest), as `causal_groups`."""
    k: int = 8
    """Heads in the group and in each random set."""
    factors: list[int] = field(default_factory=lambda: [1, 16])
    """Lengths, as multiples of the study's base length; the smallest is the base of length_effect."""
    measure: str = "acc_drop"
    """The tested measure (one of `CAUSAL_MEASURES`); the family is this measure at every factor (for
    length_effect: every factor but the base). The other measures are reported, untested."""
    first_prompt: int = 12
    """First of the study's 'between' prompts used (the causal stage used prompts 0 .. n_causal - 1)."""
    prompts: int = 20
    """Prompts per length (first_prompt .. first_prompt + prompts - 1 of the study's n_length)."""
    draws: int = 60
    """Layer-matched random sets ablated for real; the smallest p is 1 / (draws + 1)."""
    seed: int = 1
    """Seed of the random sets (another than the causal stage's, whose draws the hypothesis was seen on)."""
    mode: str = "mean"
    """'mean' (the reference: the same prompts, per position) or 'zero'."""

    def __post_init__(self):
        if self.ranking not in RANKINGS:
            raise PosymError(f"ranking {self.ranking!r} is not one of {', '.join(RANKINGS)}")
        if self.group not in CAUSAL_GROUPS:
            raise PosymError(f"group {self.group!r} is not one of {', '.join(CAUSAL_GROUPS)}")
        if self.measure not in CAUSAL_MEASURES:
            raise PosymError(f"measure {self.measure!r} is not one of {', '.join(CAUSAL_MEASURES)}")
        if self.mode not in ABLATION_MODES:
            raise PosymError(f"mode {self.mode!r} is not one of {', '.join(ABLATION_MODES)}")
        if self.k < 1 or self.prompts < 2 or self.first_prompt < 0:
            raise PosymError("k must be >= 1, prompts >= 2 and first_prompt >= 0")
        if len(set(self.factors)) != len(self.factors) or not self.factors or min(self.factors) < 1:
            raise PosymError(f"factors must be distinct and >= 1, got {self.factors}")
        if self.measure == "length_effect" and len(self.factors) < 2:
            raise PosymError("length_effect needs at least two factors")
        family = self.family_size()
        # no Holm p of the family can go below family / (draws + 1): refuse a plan that cannot pass
        if holm_floor(family, self.draws) >= ALPHA:
            need = int(np.ceil(family / ALPHA))
            raise PosymError(f"draws {self.draws} cannot pass Holm over {family} tests; use at least {need}")

    def family_size(self) -> int:
        return len(self.factors) - (self.measure == "length_effect")


def plan_sets(heads, plan: ConfirmPlan, *, kinds: dict | None = None) -> tuple[list[Head], list[list[Head]]]:
    """(the named group, its plan.draws random sets): the group the causal stage ablates (`ranked_group`), the
    sets `matched_random` over every head of the model with the plan's seed, layer and layer kind matched."""
    every = every_head(heads)
    if plan.k > len(every) // 2:
        raise PosymError(f"k = {plan.k} is more than half of the {len(every)} heads: no disjoint random set")
    named = ranked_group(heads, plan.ranking, plan.group, plan.k)
    return named, matched_random(every, named, plan.draws, seed=plan.seed, kinds=kinds)


def confirm_points(model, prompts, sets: list[list[Head]], *, mode: str, factor: int, first_set: int = NAMED):
    """Rows (factor, length, set, prompt, effect, correct, clean, clean_correct) of `sets` ablated for real on
    `prompts` (`LengthPrompt`s of one length); set numbers start at first_set (NAMED for the group), so a run
    in chunks of sets gives the rows one run would."""
    out = attribution.ablation_effects(
        model, [p.ids for p in prompts], [p.answer_id for p in prompts], sets, mode=mode, metric="margin"
    )
    return [
        {
            "factor": factor,
            "length": prompts[0].length,
            "set": first_set + s,
            "prompt": p.index,
            "effect": float(out["effect"][i, s]),
            "correct": bool(out["correct"][i, s]),
            "clean": float(out["clean"][i]),
            "clean_correct": bool(out["clean_correct"][i]),
        }
        for s in range(len(sets))
        for i, p in enumerate(prompts)
    ]


def confirm_table(points, plan: ConfirmPlan):
    """The test's table from its points (every set on every prompt at every factor; see the module): one row
    per (measure, factor), the planned family's with Holm p and verdict, the rest with tested False."""
    import pandas as pd

    factors = sorted(int(f) for f in points.factor.unique())
    if factors != sorted(plan.factors):
        raise PosymError(f"the points hold factors {factors}, the plan {sorted(plan.factors)}")
    grid = points.pivot_table(index=["factor", "prompt"], columns="set", values=["effect", "correct"], aggfunc="first")
    draws = [s for s in grid["effect"].columns if s != NAMED]
    if grid.isna().any().any() or NAMED not in grid["effect"].columns or len(draws) != plan.draws:
        raise PosymError("the points do not hold every set on every prompt at every factor: the run is not finished")
    prompts = grid.index.get_level_values("prompt")
    n = len(prompts) // len(factors)
    shape = (len(factors), n)
    clean = points[points.set == NAMED].sort_values(["factor", "prompt"])
    clean_correct = clean.clean_correct.to_numpy(bool).reshape(shape)  # [F, P]
    correct = grid["correct"][NAMED].to_numpy(bool).reshape(shape)  # [F, P]
    change = grid["effect"][NAMED].to_numpy(float).reshape(shape)  # [F, P]
    null_correct = grid["correct"][draws].to_numpy(bool).reshape(*shape, len(draws))  # [F, P, D]
    null_change = grid["effect"][draws].to_numpy(float).reshape(*shape, len(draws))  # [F, P, D]
    rows = stat_rows(clean_correct, correct, change, null_correct, null_change)
    table = pd.DataFrame(rows)
    table["factor"] = [factors[j] for j in table.pop("j")]
    table["length"] = table.factor.map(points.groupby("factor").length.first())
    table["prompts"] = n
    table["tested"] = table.measure == plan.measure
    tested = table.tested.to_numpy()
    family = int(tested.sum())
    table["family"] = np.where(tested, family, 0)
    table["p_holm"] = np.nan
    table.loc[tested, "p_holm"] = holm(table.p[tested].to_numpy())
    table["verdict"] = [
        verdict(r.p_holm, r.value, r.null_median) if r.tested else "not tested" for r in table.itertuples()
    ]
    level = ALPHA / max(family, 1)
    spread = [s if (s > 0 or m == "margin_change") else 1.0 for s, m in zip(table.sd, table.measure)]
    table["mde"] = [detectable_effect(s, n, alpha=level) for s in spread]
    table["acc_clean"] = table.factor.map(dict(zip(factors, clean_correct.mean(1))))
    table["acc"] = table.factor.map(dict(zip(factors, correct.mean(1))))
    head = ["measure", "factor", "length", "prompts", "draws", "acc_clean", "acc", "value", "null_median"]
    return table[head + ["null_lo", "null_hi", "p", "p_floor", "tested", "family", "p_holm", "verdict", "sd", "mde"]]
