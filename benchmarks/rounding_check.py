"""Why a pruned score may differ from the dense reference by more than its bound: float64 rounding.

The bound of a pruned row (`posym.core.pruning`) is exact arithmetic's. On SmolLM2-135M at 512 tokens,
every query, the largest |pruned - dense| of docs/benchmarks/long_prompts_all_queries.json is at a row
whose bound alone is 4.3e-15 (its `worst_row`). This script takes that row and records, into the same
file under `rounding_check`:

- the batched engine's pruned and dense scores and the per-query loop's (engine="loop"), pruned and dense:
  each engine against its own dense path, and the two dense paths against each other;
- the loop's dense score with the row's clean logits moved by at most one unit in the last place
  (each logit up, down or kept, 4 random draws): how far the exact score itself moves under float64
  rounding of its inputs.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/rounding_check.py     # about a minute on one core
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

import torch
from real_llm import real_text_ids

from posym import models
from posym.core import pruning, swaps
from posym.core.scores import score_model
from posym.io import write_json

JSON = ROOT / "docs" / "benchmarks" / "long_prompts_all_queries.json"
DRAWS = 4


def main() -> None:
    torch.set_num_threads(1)
    result = json.loads(JSON.read_text())
    entry = max(
        (r for r in result["runs"] if r["queries"] == "all" and "worst_row" in r), key=lambda r: r["max_abs_diff"]
    )
    row = entry["worst_row"]
    loaded = models.load("smollm2-135m", dtype="float32")
    ids = real_text_ids(loaded.tokenizer, entry["tokens"])

    def score(**options) -> tuple[float, float, float]:
        frame = score_model(loaded.model, [ids], [row["query"]], layers=[row["layer"]], **options)
        r = frame[frame["head"] == row["head"]].iloc[0]
        return float(r.s_pos), float(r.s_sym), float(r.bound)

    paths = {
        f"{engine}_{exact}": score(engine=engine, exact=exact)
        for engine in ("batched", "loop")
        for exact in ("pruned", "dense")
    }
    reference = paths["loop_dense"]

    def moved(seed: int) -> tuple[float, float]:
        generator = torch.Generator().manual_seed(seed)
        soft_capped = swaps.soft_capped

        def jittered(x, cap):  # the row's clean logits [1, keys] in float64, each moved by <= 1 ulp
            if x.dtype == torch.float64 and x.dim() == 2 and x.shape[-1] == row["query"] + 1:
                step = torch.randint(-1, 2, x.shape, generator=generator)
                x = torch.where(step != 0, torch.nextafter(x, step.to(x.dtype) * torch.inf), x)
            return soft_capped(x, cap)

        pruning.swaps.soft_capped = jittered  # the loop engine's score_rows computes its logits through it
        try:
            s_pos, s_sym, _ = score(engine="loop", exact="dense")
        finally:
            pruning.swaps.soft_capped = soft_capped
        return s_pos - reference[0], s_sym - reference[1]

    def gap(a, b) -> float:
        return max(abs(a[0] - b[0]), abs(a[1] - b[1]))

    check = {
        "row": row,
        "tokens": entry["tokens"],
        "scores": {name: {"s_pos": v[0], "s_sym": v[1], "bound": v[2]} for name, v in paths.items()},
        "batched_pruned_vs_batched_dense": gap(paths["batched_pruned"], paths["batched_dense"]),
        "batched_pruned_vs_loop_dense": gap(paths["batched_pruned"], reference),
        "loop_pruned_vs_loop_dense": gap(paths["loop_pruned"], reference),
        "batched_dense_vs_loop_dense": gap(paths["batched_dense"], reference),
        "loop_dense_moved_by_one_ulp_logits": [dict(zip(("s_pos", "s_sym"), moved(seed))) for seed in range(DRAWS)],
        "how": " ".join(__doc__.split("\n\n")[1:3]).replace("\n", " "),
    }
    result["rounding_check"] = check
    write_json(JSON, result)
    print(json.dumps(check, indent=1))


if __name__ == "__main__":
    main()
