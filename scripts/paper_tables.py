"""The Markdown tables of docs/results.md's paper-preset section, from the committed tables.

Reads docs/results/paper/*.parquet (written by scripts/collect_paper_results.py) and prints, per task,
each number as the mean ± std (ddof 1) over the seeds present (a single value where one seed is):
accuracy over training (Fig. 2A), the best step by validation, head labels per layer at the
max-accuracy and last step for both gammas and every query role (Fig. 7), the weighted frequency ID
per layer under every weighting (Table 1), accuracy by length at the last and best checkpoints
(Fig. 5B, paper protocol; the seed protocol's retention) and the median discrepancy by length (Theorem
3.2, gap_q50 of each head).

    python scripts/paper_tables.py [--dir docs/results/paper] [--preset paper]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pandas as pd  # noqa: E402

from posym.core.geometry import WEIGHTINGS  # noqa: E402
from posym.core.purity import layer_ranges  # noqa: E402
from posym.core.stats import seed_interval  # noqa: E402

STEPS = (500, 1000, 1500, 2000, 3000, 4000, 5000, 6000)
"""Checkpoints of the accuracy table."""
KINDS = ("positional", "symbolic", "mixed", "uniform")
"""Head labels (posym.core.scores.head_labels)."""


def spread(values, digits: int = 3) -> str:
    """'0.912' for one value, '0.912 ± 0.004' (the std over seeds, ddof 1) for several."""
    values = pd.Series(values, dtype=float).dropna()
    if values.empty:
        return "-"
    if len(values) == 1:
        return f"{values.iloc[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def spread_ci(values, digits: int = 2) -> str:
    """`spread` and the 95% t interval of the mean over seeds (posym.core.stats.seed_interval) in brackets.

    >>> spread_ci([0.6, 0.7, 0.8])
    '0.70 ± 0.10 [0.45, 0.95]'
    """
    values = pd.Series(values, dtype=float).dropna()
    if len(values) < 2:
        return spread(values, digits)
    _, _, lo, hi = seed_interval(values)
    return f"{spread(values, digits)} [{lo:.{digits}f}, {hi:.{digits}f}]"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(map(str, r)) + " |" for r in rows)])


def accuracy(training: pd.DataFrame, task: str) -> str:
    runs = training[training.task == task]
    rows = []
    for step in STEPS:
        at = runs[runs.step == step]
        if not at.empty:
            hops = " / ".join(spread(at[f"acc_hop{h}"], 2) for h in range(1, 5))
            rows.append([f"{step:,}", spread(at.acc), hops, spread(at.loss)])
    return table(["step", "test acc", "hops 1 / 2 / 3 / 4", "test loss"], rows)


def labels(composition: pd.DataFrame, task: str) -> str:
    runs = composition[composition.task == task]
    rows = []
    for (gamma, stage, mode, seed), group in runs.groupby(["gamma", "stage", "query_mode", "seed"], sort=True):
        named = [layer_ranges(group[group.label == kind].layer) or "-" for kind in KINDS]
        rows.append([gamma, stage, mode, seed, int(group.step.iloc[0]), *named])
    return table(["gamma", "stage", "query role", "seed", "step", *KINDS], rows)


def frequency(geometry: pd.DataFrame, task: str) -> str:
    runs = geometry[geometry.task == task]
    columns = [f"weighted_id_{name}" for name in WEIGHTINGS]
    per_layer = runs.groupby(["seed", "layer"])[columns].mean().reset_index()
    rows = [
        [name.removeprefix("weighted_id_")]
        + [spread(per_layer[per_layer.layer == layer][name], 1) for layer in sorted(per_layer.layer.unique())]
        for name in columns
    ]
    note = f"planes {int(runs.planes.max())}, uniform baseline {runs.uniform_id.max():g}"
    return table(["weighting"] + [f"L{layer}" for layer in sorted(per_layer.layer.unique())], rows) + f"\n\n({note})"


def lengths(lengthgen: pd.DataFrame, task: str) -> str:
    runs = lengthgen[(lengthgen.task == task) & (lengthgen.hop == 0)]
    rows = []
    for (protocol, checkpoint), group in runs.groupby(["protocol", "checkpoint"], sort=True):
        steps = ", ".join(str(s) for s in sorted(group.step.unique()))
        cells = [spread(group[group.length == n].acc, 2) for n in sorted(runs.length.unique())]
        rows.append([protocol, f"{checkpoint} ({steps})", int(group.n.max()), *cells])
    return table(["protocol", "checkpoint (step)", "questions"] + [str(n) for n in sorted(runs.length.unique())], rows)


def gaps(discrepancy: pd.DataFrame, task: str) -> str:
    runs = discrepancy[discrepancy.task == task]
    rows = [
        [f"L{layer}"]
        + [spread(runs[(runs.layer == layer) & (runs.length == n)].gap_q50, 2) for n in sorted(runs.length.unique())]
        for layer in sorted(runs.layer.unique())
    ]
    return table(["layer"] + [str(n) for n in sorted(runs.length.unique())], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=ROOT / "docs" / "results" / "paper")
    parser.add_argument("--preset", default="paper")
    args = parser.parse_args()
    tables = {p.stem: pd.read_parquet(p) for p in sorted(args.dir.glob("*.parquet"))}
    tables = {k: v[v.preset == args.preset] for k, v in tables.items() if "preset" in v}  # theory's have no runs
    sections = [
        ("training", "Accuracy (Fig. 2A)", accuracy),
        ("composition", "Head labels (Fig. 7)", labels),
        ("geometry", "Weighted frequency ID per layer (Table 1)", frequency),
        ("lengthgen", "Accuracy by length (Fig. 5B)", lengths),
        ("discrepancy", "Median discrepancy by length (Theorem 3.2)", gaps),
    ]
    for task in ("number", "letter"):
        if "validation" in tables:
            best = tables["validation"][tables["validation"].task == task].groupby("seed").best_step.first()
            print(f"## {task}: best step by validation per seed: { ({int(k): int(v) for k, v in best.items()}) }\n")
        for kind, title, render in sections:
            if kind in tables and (tables[kind].task == task).any():
                seeds = sorted(int(s) for s in tables[kind][tables[kind].task == task].seed.unique())
                print(f"### {task}, {title}, seeds {seeds}\n\n{render(tables[kind], task)}\n")


if __name__ == "__main__":
    main()
