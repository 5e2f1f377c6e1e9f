"""Collect the head-level retention of `posym run`'s two models (issue 33, item 5) into docs/results/run/.

`posym run --out RUN` (quick preset, both tasks) writes RUN/<task>/lengthgen/head_retention.parquet and
head_groups.parquet (`posym.commands.lengthgen`: 64 test questions per length, every pointer of the
chain as a query, lengths 17 ... 2,048); this script stacks them with a `task` column (and the
checkpoint `step` on the group rows) into two small committed tables, read back by
tests/test_head_retention_tables.py:

    head_retention.parquet   per task, layer, head and length: margin, attention on the chain key, their
                             retentions (value / value at 17 tokens), the head's scores and label
    head_groups.parquet      per task, group, measure and length: median head retention with its 95%
                             paired prompt-bootstrap interval (groups: the labels and layer-matched random draws)

    python scripts/collect_run_head_retention.py RUN [--out docs/results/run]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pandas as pd  # noqa: E402

from posym.io import write_parquet  # noqa: E402

TASKS = ("number", "letter")


def collect(run: Path) -> dict[str, pd.DataFrame]:
    """The two stacked tables of the run directory `run` (a `posym run --out`)."""
    heads, groups = [], []
    for task in TASKS:
        lengthgen = run / task / "lengthgen"
        if not (lengthgen / "head_groups.parquet").is_file():
            raise SystemExit(f"{lengthgen} holds no head-level retention: run posym run (or posym lengthgen) first")
        step = json.loads((lengthgen / "lengthgen.json").read_text())["step"]
        heads.append(pd.read_parquet(lengthgen / "head_retention.parquet").assign(task=task))
        groups.append(pd.read_parquet(lengthgen / "head_groups.parquet").assign(task=task, step=step))
    first = lambda frame, cols: frame[cols + [c for c in frame.columns if c not in cols]]  # noqa: E731
    return {
        "head_retention": first(pd.concat(heads, ignore_index=True), ["task"]),
        "head_groups": first(pd.concat(groups, ignore_index=True), ["task", "step"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "run")
    args = parser.parse_args()
    for name, table in collect(args.run).items():
        write_parquet(args.out / f"{name}.parquet", table)
        print(f"wrote {args.out / name}.parquet ({len(table)} rows)")


if __name__ == "__main__":
    main()
