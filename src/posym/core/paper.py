"""The paper's own numbers (2605.31558 and its seed summary), each defined once, with the tolerance
within which posym calls a claim "reproduced".

Every verdict of `scripts/paper_scoreboard.py` compares with a value here and nowhere else (a test
perturbs these values and watches the verdicts follow), and `posym report` / `posym geometry` quote
Table 1 from here. Where the paper gives no number (Fig. 7's per-layer labels at gamma 0.05, which
docs/method.md does not transcribe), there is no entry, and the scoreboard says "not compared" instead of
comparing with the nearest number it has.

>>> FIG5B["letter"][850], FIG5B["number"][128]
(0.89, 0.73)
>>> sorted(FIG7_LABELS)              # gammas for which the paper's per-layer labels are known
[0.1]
>>> fig7_shares("number", 0.1)       # 4 of 12 layers positional, 8 symbolic, none mixed
{'positional': 0.3333333333333333, 'symbolic': 0.6666666666666666, 'mixed': 0.0}
"""

from __future__ import annotations

N_LAYERS = 12
"""Layers of the paper's models (one head each)."""

TAU = 1e-4
"""Temperature of the swap weights alpha = softmax(|D_i - D_j| / tau) of 2605's scores: the default of
every score function, config and `--tau` option (nearly a hard max: the swap that moves the query's logits
the most carries almost all the weight)."""
GAMMAS = (0.1, 0.05)
"""The purity thresholds gamma of the labels that the paper shows (footnote 3 of 2605); the first, 0.1, is
the default of every labelling function and `--gamma` option (GAMMA)."""
GAMMA = GAMMAS[0]
"""The default purity threshold (0.1)."""

TABLE1 = {
    "number": [1, 2, 2, 2, 10, 39, 38, 38, 38, 37, 37, 38],
    "letter": [18, 32, 42, 37, 40, 38, 41, 38, 41, 39, 38, 40],
}
"""Table 1: weighted-average frequency ID per layer (64 planes; ID 1 the fastest)."""
TABLE1_WEIGHTING = "linear"
"""The weighting posym declares to be the paper's (docs/results.md, "Weighted frequency ID"); the other
weightings are shown beside it and decide nothing."""
TABLE1_TOLERANCE = 3.0
"""A block of layers reproduces Table 1 when its mean ID is within 3 IDs (5% of 64 planes) of the paper's."""

FIG7_LABELS = {
    0.1: {
        "number": {"positional": range(0, 4), "symbolic": range(4, 12)},
        "letter": {"positional": range(0), "symbolic": range(1, 12)},
    },
}
"""Fig. 7 (docs/method.md section 4): the layers the paper labels pure at each gamma. The letter model's L0 is
labelled neither (not compared). No entry for gamma 0.05: its per-layer labels are not transcribed."""

FIG5B = {
    "letter": {68: 1.00, 128: 1.00, 256: 0.99, 512: 0.95, 850: 0.89, 1024: 0.86, 2048: 0.73},
    "number": {68: 0.87, 128: 0.73, 256: 0.57, 512: 0.32, 850: 0.24, 1024: 0.20, 2048: 0.10},
}
"""Fig. 5B read point by point from the paper's vector figure (docs/method.md section 6; +- 0.01): accuracy by
total length (17 + extra target tokens), paper protocol."""
FIG5B_TOLERANCE = 0.05
"""Fig. 5B reproduces when the mean accuracy is within 0.05 of the paper's at every length above: the
reading's +- 0.01 plus about two binomial standard errors of 480 questions at p = 0.5 (0.023)."""

SEED_SUMMARY_SHARES = {
    "number": {"positional": 0.40, "symbolic": 0.60, "mixed": 0.0},
    "letter": {"symbolic": 0.90},
}
"""The seed summary's shares of pure heads (its 6 x 8 model): ~40% positional / ~60% symbolic with
mixed heads rare (number), > 90% symbolic (letter: a lower bound)."""
SHARE_TOLERANCE = 0.10
"""A share reproduces within 10 percentage points (about one layer of 12); a lower bound (letter) must
be met."""

RETENTION = {"letter": 0.80, "number": 0.30}
"""Seed protocol (the seed summary): the letter model keeps >= 80% of its accuracy at 2x-4x (a lower
bound at every factor), the number model ~30% at the longest (4x)."""
RETENTION_TOLERANCE = 0.10
"""The number model's retention at 4x reproduces within 0.10 of 0.30 (0.2-0.4)."""

EMERGENCE = {"number": ("symbolic", "positional")}
"""Fig. 2B / 7's order of emergence: in the number model symbolic heads are pure early and positional
ones pile up later, in steps (the first kind becomes pure before the second)."""


def fig7_shares(task: str, gamma: float) -> dict[str, float]:
    """The shares of the paper's 12 layers labelled positional / symbolic / neither at `gamma`."""
    labels = FIG7_LABELS[gamma][task]
    pos, sym = len(labels["positional"]), len(labels["symbolic"])
    return {"positional": pos / N_LAYERS, "symbolic": sym / N_LAYERS, "mixed": (N_LAYERS - pos - sym) / N_LAYERS}
