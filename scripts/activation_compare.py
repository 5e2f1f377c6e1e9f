"""Fig. 5B's letter divergence against the MLP activation: exact `gelu` (the authors') vs `gelu_new`.

Issue 18 lists `gelu_new` (GPT-J's default, posym's paper preset) instead of the authors' exact
`gelu` as an untested explanation of why our letter models reach 0.61 at 850 tokens, not >= 0.9.
This compares, at one training step, the paper-preset letter runs with `gelu_new` (RUNS/paper-s<seed>/
letter, every seed present) with a run that differs only in the activation (RUNS/gelu-s<seed>/letter:
`posym train --preset paper --task letter --seed S --config gelu.yaml --stop-at STEP`, gelu.yaml =
the paper runs' checkpoint_every 250 plus `model: {activation: gelu}`; the schedule stays 6,000
steps, so its checkpoint at STEP is the very point of the gelu_new runs' schedule). Each checkpoint
answers the same 480 questions at every length (the paper protocol, `posym lengthgen`); the table has
one row per (activation, seed, length, hop) with the test accuracy the checkpoint recorded.

    python scripts/activation_compare.py RUNS [--step 2500] [--lengths 68,256,512,850] [--n 480]
        [--out docs/results/activation_letter.parquet]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import pandas as pd  # noqa: E402

from posym import io  # noqa: E402
from posym.commands.lengthgen import run_lengthgen  # noqa: E402
from posym.configs import to_dict  # noqa: E402
from posym.core.lengthgen import LengthGenConfig  # noqa: E402
from posym.models import list_checkpoints, read_checkpoint_meta  # noqa: E402

RUNS = {"gelu_new": "paper", "gelu": "gelu"}
"""Activation -> the prefix of its runs' directories under RUNS (<prefix>-s<seed>/letter)."""


def runs(root: Path) -> list[tuple[str, int, Path]]:
    """(activation, seed, run directory) of every letter run present."""
    found = []
    for activation, prefix in RUNS.items():
        for path in sorted(root.glob(f"{prefix}-s*/letter")):
            match = re.fullmatch(rf"{prefix}-s(\d+)", path.parent.name)
            if match:
                found.append((activation, int(match[1]), path))
    return found


def compare(root: Path, step: int, lengths: list[int], n: int) -> pd.DataFrame:
    parts = []
    for activation, seed, run in runs(root):
        at = dict(list_checkpoints(run)).get(step)
        if at is None:
            print(f"{run}: no checkpoint at step {step}, left out")
            continue
        config, out = LengthGenConfig(lengths=lengths, protocol="paper", n=n), run / f"lengthgen-step{step}"
        done = out / "lengthgen.json"  # an earlier call with the same settings: reuse its table
        if done.is_file() and io.read_json_object(done)["config"] == json.loads(json.dumps(to_dict(config))):
            table = pd.read_parquet(out / "lengthgen.parquet")
        else:
            table = run_lengthgen(run, config, out, step=step)["table"]
        table.insert(0, "activation", activation)
        table.insert(1, "seed", seed)
        table["test_acc"] = read_checkpoint_meta(at)["metrics"]["acc"]
        parts.append(table)
        print(
            f"{activation} seed {seed} step {step}: "
            + ", ".join(f"{r.length}: {r.acc:.3f}" for r in table[table.hop == 0].itertuples())
        )
    return pd.concat(parts, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--step", type=int, default=2500)
    parser.add_argument("--lengths", default="68,256,512,850")
    parser.add_argument("--n", type=int, default=480)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "activation_letter.parquet")
    args = parser.parse_args()
    table = compare(args.runs, args.step, [int(x) for x in args.lengths.split(",")], args.n)
    io.write_parquet(args.out, table)
    print(table[table.hop == 0].pivot_table(index="length", columns=["activation", "seed"], values="acc").round(3))


if __name__ == "__main__":
    main()
