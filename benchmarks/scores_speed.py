"""Speed of the exact head scores: fast path vs. re-running the layer per swap (the reference).

Paper preset GPT-J (12 layers x 1 head, width 128, full rotary), 100 number-task test prompts,
hop queries (every pointer token on the chain). The reference (tests/reference_scores.py) re-runs
the model once per swap; it is timed on a subset of (prompt, query, layer) jobs and extrapolated
per swap to the full set (stated in the output). Both paths are compared on that subset.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/scores_speed.py [--subset 3] [--checkpoints 13]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

from posym.core.model import ModelConfig, build_model  # noqa: E402
from posym.core.scores import score_model, task_prompts  # noqa: E402
from posym.core.tasks import task_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100, help="prompts per checkpoint (paper: 100)")
    parser.add_argument("--subset", type=int, default=3, help="(prompt, query, layer) jobs timed on the reference")
    parser.add_argument("--checkpoints", type=int, default=13, help="checkpoints to score (paper: 0..6000 every 500)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from reference_scores import reference_model_scores

    task = task_config("number")
    model = build_model(ModelConfig(), task.vocab_size, seed=0, attn_implementation="eager").eval()
    with torch.no_grad():  # peaked attention, so that the comparison below is not between all-ones
        for layer in model.transformer.h:
            layer.attn.q_proj.weight.mul_(20.0)
            layer.attn.k_proj.weight.mul_(20.0)
    ids, hops = task_prompts(task, args.prompts, 0, queries="hops")
    layers = model.config.n_layer
    swaps = sum(math.comb(q, 2) for qs in hops for q in qs) * layers

    score_model(model, ids[:2], hops[:2])  # warm-up (first-call allocations)
    start = time.perf_counter()
    frame = score_model(model, ids, hops)
    fast = time.perf_counter() - start

    jobs = [(0, hops[0][0], layers - 1), (1, hops[1][-1], 0), (2, hops[2][0], layers // 2)][: args.subset]
    start = time.perf_counter()
    worst, ref_swaps = 0.0, 0
    for prompt, query, layer in jobs:
        ref = reference_model_scores(model, ids[prompt], query, layer)[0]
        ref_swaps += ref["n_swaps"]
        row = frame[(frame["prompt"] == prompt) & (frame["query"] == query) & (frame["layer"] == layer)].iloc[0]
        worst = max(worst, *(abs(row[c] - ref[c]) for c in ("s_pos", "s_sym", "entropy")))
    per_swap = (time.perf_counter() - start) / ref_swaps
    reference = per_swap * swaps

    models = [build_model(ModelConfig(), task.vocab_size, seed=s).eval() for s in range(args.checkpoints)]
    start = time.perf_counter()
    for m in models:
        score_model(m, ids, hops)
    many = time.perf_counter() - start

    print(f"model: paper preset GPT-J, {layers} layers x 1 head, width 128; {len(ids)} prompts, "
          f"{sum(map(len, hops))} hop queries, {swaps:,} swaps, {len(frame)} score rows")
    print(f"fast path: {fast:.3f} s for all prompts ({fast / len(ids) * 1e3:.2f} ms per prompt)")
    print(f"reference: {per_swap * 1e3:.2f} ms per swap (timed on {len(jobs)} jobs, {ref_swaps} swaps), "
          f"extrapolated {reference:.0f} s for all prompts")
    print(f"speed ratio: {reference / fast:,.0f}x (goal >= 300x); the reference re-runs all {layers} layers per "
          f"swap, so against re-running one layer alone the ratio is at least {reference / layers / fast:,.0f}x")
    print(f"max |fast - reference| on the timed jobs (float32 model): {worst:.2e} (bound 1e-4)")
    print(f"{args.checkpoints} checkpoints x {len(ids)} prompts: {many:.1f} s on {args.threads} threads (goal <= 60 s)")
    print(f"peak resident memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
