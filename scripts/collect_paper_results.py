"""Collect the small tables of the paper-scale study into docs/results/paper/, one Parquet file per kind.

`scripts/paper_seeds.sh RUNS` trains and analyses RUNS/<preset>-s<seed>/<task>; its checkpoints stay
outside the repository, and this script copies what docs/results.md quotes into committed tables, each
with `preset`, `seed` and `task` columns (one row set per run that has the output):

    training.parquet      test accuracy (overall, per hop), losses and wall-clock time per checkpoint
    validation.parquet    validation accuracy per checkpoint and the best step by validation (posym validate)
    dynamics.parquet      every head's scores per checkpoint and query mode (hops, last, target, inner)
    composition.parquet   head labels and prompt purity at the max-accuracy and last step, both gammas, per role
    purity_counts.parquet cumulative purity counts per step (Fig. 7)
    geometry.parquet      per-head frequency IDs under every weighting, uniform baseline, planes (last checkpoint)
    qk_plane.parquet      Fig. 4B: one prompt's queries and keys of layer 1 on its dominant plane (last checkpoint)
    lengthgen.parquet     accuracy per length at the last ("last") and best-by-validation ("best") checkpoint
    discrepancy.parquet   the discrepancy summary per length (last checkpoint)
    theory.parquet, theory_bounds.parquet   `posym theory` (RUNS/theory, Fig. 5A; no seed: the constructions
                          are deterministic): per (head, n0) summary, and Delta against Theorem 3.2's bound per n

Runs still training are left out; runs without an output are left out of that table (the table's seeds say what is present). Rerun after
every finished piece of the study; the tables are rewritten atomically.

    python scripts/collect_paper_results.py RUNS [--out docs/results/paper] [--keep]

With --keep, the rows already in --out of runs not found under RUNS stay (a run found again replaces
its rows): a later session on a fresh machine adds its seeds to the committed ones without the
checkpoints of the earlier seeds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from paper_variants import VARIANTS  # noqa: E402

from posym.io import write_json, write_parquet  # noqa: E402

RUN = re.compile(r"(?P<preset>[a-z0-9]+)-s(?P<seed>\d+)")
TABLES = {  # kind -> path of the run's own table, relative to the run directory
    "training": "metrics.parquet",
    "dynamics": "analysis/dynamics.parquet",
    "composition": "analysis/composition.parquet",
    "purity_counts": "analysis/purity_counts.parquet",
    "geometry": "analysis/frequency.parquet",
    "qk_plane": "analysis/qk_plane.parquet",
    "discrepancy": "discrepancy/discrepancy.parquet",
}
LENGTHGEN = {"last": "lengthgen/lengthgen.parquet", "best": "lengthgen-best/lengthgen.parquet"}
THEORY = {"theory": "theory/theory.parquet", "theory_bounds": "theory/discrepancy.parquet"}  # relative to RUNS


def finished(run: Path, final_step: int = 0) -> bool:
    """Whether the run's training reached its schedule's last step (its metrics hold a row of max_steps),
    or `final_step` when that is set (a variant compared before its schedule ends)."""
    end = final_step or yaml.safe_load((run / "config.yaml").read_text())["max_steps"]
    return (run / "metrics.parquet").is_file() and pd.read_parquet(run / "metrics.parquet").step.max() >= end


def runs(root: Path, presets=("paper", "seed")) -> list[tuple[dict, Path]]:
    """({preset, seed, task}, run directory) for every finished RUNS/<preset>-s<seed>/<task> of `presets`
    (paper, seed, or a variant of scripts/paper_variants.py); a run still training is left out (its tables
    would mix a partial schedule into the seeds' mean ± std)."""
    found = []
    for directory in sorted(root.iterdir()):
        match = RUN.fullmatch(directory.name)
        if match is None or not directory.is_dir() or match["preset"] not in presets:
            continue
        variant = VARIANTS.get(match["preset"])
        for task in ("number", "letter"):
            run = directory / task
            if (run / "config.yaml").is_file():
                if finished(run, variant.final_step if variant else 0):
                    found.append(({"preset": match["preset"], "seed": int(match["seed"]), "task": task}, run))
                else:
                    print(f"{run}: training not finished, left out")
    return found


def _tagged(frame: pd.DataFrame, keys: dict, **extra) -> pd.DataFrame:
    """The run's keys (and extra columns) first; a table's own column of the same name (lengthgen's task) gives way."""
    frame = frame.drop(columns=[c for c in (*keys, *extra) if c in frame])
    return frame.assign(**keys, **extra)[[*keys, *extra, *frame.columns]]


def collect(root: Path, presets=("paper", "seed")) -> dict[str, pd.DataFrame]:
    """Every table kind, concatenated over the runs of `presets` that have it."""
    parts: dict[str, list[pd.DataFrame]] = {kind: [] for kind in (*TABLES, "validation", "lengthgen")}
    for keys, run in runs(root, presets):
        for kind, relative in TABLES.items():
            if (run / relative).is_file():
                frame = pd.read_parquet(run / relative)
                if kind == "training":  # a resumed run appends; the last row of a step is the kept one
                    frame = frame.drop_duplicates("step", keep="last")
                parts[kind].append(_tagged(frame, keys))
        if (run / "validation.json").is_file():
            validation = json.loads((run / "validation.json").read_text())
            frame = pd.DataFrame(validation["rows"]).drop(columns=["source"], errors="ignore")
            parts["validation"].append(_tagged(frame, keys, best_step=validation["best_step"]))
        for checkpoint, relative in LENGTHGEN.items():
            if (run / relative).is_file():
                parts["lengthgen"].append(_tagged(pd.read_parquet(run / relative), keys, checkpoint=checkpoint))
    tables = {kind: pd.concat(frames, ignore_index=True) for kind, frames in parts.items() if frames}
    if not {"paper", "seed"} & set(presets):  # variants only: the theory tables are docs/results/paper's own
        return tables
    return tables | {
        kind: pd.read_parquet(root / relative) for kind, relative in THEORY.items() if (root / relative).is_file()
    }


def keep_absent(tables: dict[str, pd.DataFrame], out: Path) -> dict[str, pd.DataFrame]:
    """`tables` with the rows of out/<kind>.parquet whose run (preset, seed, task) `tables` lacks put back
    before them; a kind collected now from no run keeps its committed rows as they are."""
    merged = dict(tables)
    for path in sorted(out.glob("*.parquet")) if out.is_dir() else []:
        kind = path.stem
        if kind in THEORY or kind not in (*TABLES, "validation", "lengthgen"):
            continue
        old = pd.read_parquet(path)
        if kind not in tables:
            merged[kind] = old
            continue
        keys = ["preset", "seed", "task"]
        found = set(tables[kind][keys].itertuples(index=False, name=None))
        kept = old[[run not in found for run in old[keys].itertuples(index=False, name=None)]]
        merged[kind] = pd.concat([kept, tables[kind]], ignore_index=True)
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="the RUNS directory of scripts/paper_seeds.sh")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "paper")
    parser.add_argument(
        "--presets",
        default="paper,seed",
        help="comma-separated: paper, seed or variants of "
        f"scripts/paper_variants.py ({', '.join(v for v in VARIANTS if v != 'paper')})",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the rows in --out of runs not found under RUNS (earlier seeds)"
    )
    args = parser.parse_args()
    if not args.runs.is_dir():
        sys.exit(f"{args.runs} is not a directory")
    presets = tuple(args.presets.split(","))
    unknown = [p for p in presets if p != "seed" and p not in VARIANTS]
    if unknown:
        sys.exit(f"unknown preset(s) {', '.join(unknown)}; choose among seed, {', '.join(VARIANTS)}")
    tables = collect(args.runs, presets)
    if args.keep:
        tables = keep_absent(tables, args.out)
    if not tables:
        sys.exit(f"no run under {args.runs} has outputs yet")
    present = {}
    for kind, frame in tables.items():
        write_parquet(args.out / f"{kind}.parquet", frame)
        if kind in THEORY:
            print(f"{kind}: {len(frame)} rows from {THEORY[kind]}")
            continue
        present[kind] = sorted(
            {f"{p}-s{s}/{t}" for p, s, t in frame[["preset", "seed", "task"]].itertuples(index=False)}
        )
        print(f"{kind}: {len(frame)} rows from {', '.join(present[kind])}")
    write_json(args.out / "runs.json", {"runs": present, "theory": sorted(set(tables) & set(THEORY))})


if __name__ == "__main__":
    main()
