"""Issue 53's evaluation, printed from the committed tables of `posym kv-eval` (docs/results/kv-eval-*/).

The block of docs/results.md between `<!-- kv-eval:begin -->` and `<!-- kv-eval:end -->` (`--write FILE`
rewrites it): per model, task and length, the accuracy of every policy at each budget with its Wilson 95%
interval and kept-KV fraction, the random draws' median and range, and the exact McNemar test of each
ranked policy against the full cache and the randomization p among the draws (both Holm over the table).
Nothing is computed here that the tables do not hold: tests/test_kv_eval.py checks the block against this
script's output and the tables against `kv_eval.summarize` / `kv_eval.accuracy_tests` of the per-prompt rows.

    python scripts/kv_eval_block.py [--write docs/results.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from posym.runs import output_file

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- kv-eval:begin -->", "<!-- kv-eval:end -->"
RUNS = {"SmolLM2-135M-Instruct": ROOT / "docs" / "results" / "kv-eval-smollm2"}
RANKED = ("posym", "retrieval", "duo")
"""The policies that rank heads (random and streaming are their controls)."""


def _p(value: float) -> str:
    return "-" if pd.isna(value) else (f"{value:.3f}" if value >= 0.001 else f"{value:.1e}")


def block() -> str:
    lines = [BEGIN]
    for model, run in RUNS.items():
        summary = pd.read_parquet(output_file(run, "kv-eval", "summary"))
        tests = pd.read_parquet(output_file(run, "kv-eval", "tests")).set_index(["task", "factor", "budget", "policy"])
        draws = int(summary.draws.max())
        lines += [
            "",
            f"**{model}** (docs/results/{run.name}/; {int(summary.n.max())} prompts a cell, {draws} random draws "
            f"matched on layer; Holm over the {len(tests)} rows of tests.parquet):",
            "",
            "| task | tokens | budget | kept KV | full | posym | retrieval | duo | random median [min, max] | "
            "streaming |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for (task, factor, length), cell in summary.groupby(["task", "factor", "length"], sort=True):
            at = {(r.budget, r.policy): r for r in cell.itertuples()}
            full = at[(0.0, "full")]
            for budget in sorted(b for b in cell.budget.unique() if 0 < b < 1):
                shown = []
                for policy in RANKED:
                    r = at[(budget, policy)]
                    shown.append(f"{r.accuracy:.2f} [{r.lo:.2f}, {r.hi:.2f}]")
                rnd = at[(budget, "random")]
                stream = at[(1.0, "streaming")]
                lines.append(
                    f"| {task} | {length:,} | {budget:.2f} | {rnd.kept_fraction:.2f} | {full.accuracy:.2f} | "
                    + " | ".join(shown)
                    + f" | {rnd.draw_median:.2f} [{rnd.draw_min:.2f}, {rnd.draw_max:.2f}] | {stream.accuracy:.2f} |"
                )
        lines += [
            "",
            "Tests of the ranked policies (exact McNemar against the full cache; randomization p of the accuracy "
            "among the random draws, whose floor is 1 / (draws + 1)):",
            "",
            "| task | tokens | budget | policy | vs full (b / c) | Holm p | MDE | rank among draws p | Holm p |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for (task, factor, budget, policy), r in tests.iterrows():
            if policy not in RANKED:
                continue
            lines.append(
                f"| {task} | {int(r.length):,} | {budget:.2f} | {policy} | {r.diff_full:+.2f} "
                f"({int(r.b_full)} / {int(r.c_full)}) | {_p(r.p_full_holm)} | {r.mde_full:.2f} | "
                f"{_p(r.p_random)} | {_p(r.p_random_holm)} |"
            )
    return "\n".join([*lines, "", END])


def write(path: Path) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"{path} has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    path.write_text(head + block() + rest.split(END, 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="rewrite the kv-eval block of this Markdown file")
    args = parser.parse_args()
    if args.write:
        write(args.write)
    else:
        print(block())


if __name__ == "__main__":
    main()
