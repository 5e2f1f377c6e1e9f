"""Learning curves of fp32 and bf16-autocast training side by side, over seeds (issue 18).

Reads DIR/fp32-s<seed>/metrics.parquet and DIR/bf16-s<seed>/metrics.parquet (runs of
`posym train --preset quick --task number --seed S --precision float32|bfloat16 --out DIR/fp32-sS|bf16-sS`),
keeps the checkpoint steps that both precisions of a seed have reached, and writes one row per (seed, step):
test acc, test loss, validation acc and train loss of each, and their differences. The verdict
compares, at every step, the largest |acc(bf16) - acc(fp32)| over seeds with the seed spread of
fp32 (max - min of acc over the seeds at that step): "within seed spread" when the first never
exceeds the second by more than 0.01 at any common step.

    python scripts/precision_compare.py DIR [--out docs/results/precision_quick_number.parquet]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

from posym import io

COLUMNS = {"acc": "acc", "loss": "loss", "val_acc": "val_acc", "train_loss": "train_loss"}


def curves(root: Path) -> pd.DataFrame:
    """One row per (seed, step) both precisions of the seed reached, with <metric>_fp32,
    <metric>_bf16 and d_<metric> = bf16 - fp32."""
    parts = []
    seeds = sorted(int(m.group(1)) for p in root.glob("fp32-s*") if (m := re.fullmatch(r"fp32-s(\d+)", p.name)))
    for seed in seeds:
        runs = {p: root / f"{p}-s{seed}" / "metrics.parquet" for p in ("fp32", "bf16")}
        if not all(path.is_file() for path in runs.values()):
            continue
        fp32, bf16 = (
            pd.read_parquet(runs[p]).drop_duplicates("step", keep="last").set_index("step")[list(COLUMNS)]
            for p in ("fp32", "bf16")
        )
        both = fp32.merge(bf16, left_index=True, right_index=True, suffixes=("_fp32", "_bf16"))
        for name in COLUMNS:
            both[f"d_{name}"] = both[f"{name}_bf16"] - both[f"{name}_fp32"]
        parts.append(both.reset_index().assign(seed=seed))
    if not parts:
        raise SystemExit(f"no seed in {root} has both fp32-s<seed> and bf16-s<seed> metrics")
    table = pd.concat(parts, ignore_index=True)
    return table[["seed", "step", *[c for c in table if c not in ("seed", "step")]]]


def verdict(table: pd.DataFrame) -> pd.DataFrame:
    """Per step reached by every seed: max |d_acc| over seeds and the fp32 seed spread of acc."""
    seeds = table.seed.nunique()
    full = table.groupby("step").filter(lambda g: len(g) == seeds)
    return (
        full.groupby("step")
        .agg(
            max_abs_d_acc=("d_acc", lambda d: d.abs().max()),
            fp32_spread=("acc_fp32", lambda a: a.max() - a.min()),
            mean_acc_fp32=("acc_fp32", "mean"),
            mean_acc_bf16=("acc_bf16", "mean"),
        )
        .reset_index()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/results/precision_quick_number.parquet"))
    args = parser.parse_args()
    table = curves(args.root)
    io.write_parquet(args.out, table)
    summary = verdict(table)
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    within = bool((summary.max_abs_d_acc <= summary.fp32_spread + 0.01).all())
    print(
        f"seeds {sorted(int(s) for s in table.seed.unique())}, common steps up to {int(summary.step.max())}: bf16 "
        + ("within" if within else "NOT within")
        + " the fp32 seed spread (+0.01) at every step"
    )


if __name__ == "__main__":
    main()
