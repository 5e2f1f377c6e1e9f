"""Theorem 3.2 with Definition 3.1's discrepancy read as the MAXIMUM gap over inputs (the paper's
wording) and as the MINIMUM (posym's Delta, what Lemma F.1 needs): which lengths break the bounds.

For each length n = 1..N (query at position n) and each construction of `posym theory`'s Fig. 5A
(T_Index on frequency ID 2, theta = 0.866; T_Retrieval on ID 42, theta = 0.0027, 8 letters), the
largest and the smallest top-1 minus top-2 logit gap over the inputs of `posym.core.theory`: T_Index on
every (query token, pointed-to token), T_Retrieval on every valid input where there are at most
`--limit`, else `--samples` random ones plus the hardest (so its max is a lower bound of the true
max: a row that breaks the bound with it breaks it for certain). Writes a small Parquet table
(committed as docs/results/theorem32_max_vs_min.parquet; tests/test_results_tables.py reads it).

    python scripts/theorem32_max_vs_min.py [--max-n 64] [--out docs/results/theorem32_max_vs_min.parquet]
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch

from posym import io
from posym.core.constructions import index_head, retrieval_head
from posym.core.tasks import TaskConfig
from posym.core.theory import (
    check_length,
    frequency_angle,
    hardest_inputs,
    index_bound,
    index_inputs,
    retrieval_bound,
    retrieval_inputs,
)

INDEX_ID, RETRIEVAL_ID, LETTERS = 2, 42, 8


def rows(max_n: int, *, limit: int, samples: int, seed: int = 0) -> list[dict]:
    """One row per (head, n): theta, bound, symbols (T_Index: offsets 1..R = max(16, max_n), as
    `posym.core.theory.discrepancy_curve`; T_Retrieval: letters), gap_max, delta (the min), correct,
    inputs, input_set, ok_max, ok_min (the gap within Theorem 3.2's bound)."""
    th_i, th_r = frequency_angle(INDEX_ID), frequency_angle(RETRIEVAL_ID)
    num = TaskConfig("number", int_range=max(16, max_n))
    let = TaskConfig("letter", alphabet_size=LETTERS)
    out = []
    for n in range(1, max_n + 1):
        ids = index_inputs(num, n, seed)
        stats = check_length(index_head(num, th_i), num, ids)
        out.append(
            {
                "head": "index",
                "n": n,
                "theta": th_i,
                "bound": index_bound(th_i, n),
                "symbols": num.int_range,
                "input_set": "exhaustive",
                **_row(stats, len(ids)),
            }
        )
        ids, full = retrieval_inputs(let, n, th_r, limit=limit, samples=samples, seed=seed + n)
        ids = ids if full else torch.cat([ids, hardest_inputs(let, n, th_r)])
        stats = check_length(retrieval_head(let, th_r), let, ids)
        out.append(
            {
                "head": "retrieval",
                "n": n,
                "theta": th_r,
                "bound": retrieval_bound(th_r, LETTERS, n),
                "symbols": LETTERS,
                "input_set": "exhaustive" if full else "sampled+hardest",
                **_row(stats, len(ids)),
            }
        )
    for r in out:
        r["ok_max"], r["ok_min"] = r["gap_max"] <= r["bound"] + 1e-12, r["delta"] <= r["bound"] + 1e-12
    return out


def _row(stats: dict, inputs: int) -> dict:
    return {"gap_max": stats["gap_max"], "delta": stats["delta"], "correct": stats["correct"], "inputs": inputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-n", type=int, default=64)
    parser.add_argument("--limit", type=int, default=100_000, help="enumerate T_Retrieval inputs up to this many")
    parser.add_argument("--samples", type=int, default=20_000, help="else this many random ones (+ the hardest)")
    parser.add_argument("--out", default="docs/results/theorem32_max_vs_min.parquet")
    args = parser.parse_args()
    table = pd.DataFrame(rows(args.max_n, limit=args.limit, samples=args.samples))
    io.write_parquet(args.out, table)
    for head, g in table.groupby("head"):
        print(f"{head}: max breaks the bound at n = {g[~g.ok_max].n.tolist()}; min at n = {g[~g.ok_min].n.tolist()}")


if __name__ == "__main__":
    main()
