"""Speed of the exact head scores: posym's one-forward-pass path against two brute forces, in one run.

Paper preset GPT-J (12 layers x 1 head, width 128, full rotary), --prompts number-task test prompts,
hop queries (every pointer token on the chain), every layer. Baselines, both computing the definition:
- batched brute force (the strongest honest baseline): per prompt and layer l, every swap (i, j) of
  the prompt's keys becomes one row of a batch whose residual vectors entering layer l are exchanged
  at i and j; the batch runs through layers 0..l once and every hop query q > j reads its attention
  row from it (one forward of the swapped input per swap, batched). Timed on the first
  --brute-prompts prompts; the ratio is per prompt (posym's time per prompt over all of them).
- per-swap whole-model rerun (weaker, tests/reference_scores.py): the full 12-layer model once per
  (query, swap); timed on --subset (prompt, query, layer) jobs and extrapolated per swap.
Both are compared with posym's numbers on what they computed. Then --checkpoints models x all
prompts through posym alone. Results go to --json (with date, machine, load average and versions).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/scores_speed.py [--prompts 100] [--subset 3] [--checkpoints 13]
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
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests"), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402
from record import benchmark_header  # noqa: E402
from reference_scores import _scores_from_rows, reference_model_scores  # noqa: E402

from posym.core.model import ModelConfig, build_model  # noqa: E402
from posym.core.paper import TAU  # noqa: E402
from posym.core.scores import score_model, task_prompts  # noqa: E402
from posym.core.tasks import task_config  # noqa: E402
from posym.io import write_json  # noqa: E402


def batched_rows(model, ids: list[int], layer: int, pairs: list[tuple[int, int]]) -> torch.Tensor:
    """Attention of `layer` [len(pairs), T, T] (head 0) with the residual vectors entering it exchanged
    at each pair, one batch row per pair, through layers 0..layer only."""
    t = len(ids)
    perm = torch.arange(t).repeat(len(pairs), 1)  # [swaps, T]
    rows = torch.arange(len(pairs))
    a, b = torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
    perm[rows, a], perm[rows, b] = b, a

    def exchange(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]  # [swaps, T, width]
        hidden = hidden.gather(1, perm[:, :, None].expand_as(hidden))
        return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})

    weights = []
    blocks = model.transformer.h
    handles = [
        blocks[layer].register_forward_pre_hook(exchange, with_kwargs=True),
        blocks[layer].attn.register_forward_hook(lambda module, args, out: weights.append(out[1])),
    ]
    model.transformer.h = torch.nn.ModuleList(blocks[: layer + 1])  # nothing above layer runs
    try:
        with torch.no_grad():
            model.transformer(torch.tensor([ids]).repeat(len(pairs), 1), use_cache=False)
    finally:
        model.transformer.h = blocks
        for handle in handles:
            handle.remove()
    return weights[0][:, 0]  # [swaps, T, T]


def brute_force_prompt(model, ids: list[int], queries: list[int], layer: int, tau: float = TAU) -> dict[int, tuple]:
    """(s_pos, s_sym) per query of one prompt and layer from the batched swapped forwards."""
    last = max(queries)
    pairs = [(i, j) for j in range(last) for i in range(j)]
    clean = batched_rows(model, ids, layer, [(0, 0)])[0].double()  # [T, T]; (0, 0) exchanges nothing
    swapped = batched_rows(model, ids, layer, pairs).double()  # [swaps, T, T]
    out = {}
    for q in queries:
        keep = [k for k, (i, j) in enumerate(pairs) if j < q]
        out[q] = _scores_from_rows(
            clean[q, : q + 1],
            [swapped[k, q, : q + 1] for k in keep],
            [([pairs[k][0]], [pairs[k][1]]) for k in keep],
            tau,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100, help="prompts per checkpoint (paper: 100)")
    parser.add_argument("--brute-prompts", type=int, default=20, help="prompts timed on the batched brute force")
    parser.add_argument("--subset", type=int, default=3, help="(prompt, query, layer) jobs timed on the per-swap rerun")
    parser.add_argument("--checkpoints", type=int, default=13, help="checkpoints to score (paper: 0..6000 every 500)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json", default="docs/benchmarks/scores_speed.json", help="where the results go")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_at_start = os.getloadavg()

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
    index = frame.set_index(["prompt", "query", "layer"])

    start = time.perf_counter()
    brute = {
        (p, q, layer): s
        for p in range(args.brute_prompts)
        for layer in range(layers)
        for q, s in brute_force_prompt(model, ids[p], hops[p], layer).items()
    }
    batched = time.perf_counter() - start
    brute_diff = max(
        abs(index.loc[key, c] - s) for key, pair in brute.items() for c, s in zip(("s_pos", "s_sym"), pair)
    )

    jobs = [(0, hops[0][0], layers - 1), (1, hops[1][-1], 0), (2, hops[2][0], layers // 2)][: args.subset]
    start = time.perf_counter()
    rerun_diff, rerun_swaps = 0.0, 0
    for prompt, query, layer in jobs:
        ref = reference_model_scores(model, ids[prompt], query, layer)[0]
        rerun_swaps += ref["n_swaps"]
        rerun_diff = max(
            rerun_diff, *(abs(index.loc[(prompt, query, layer), c] - ref[c]) for c in ("s_pos", "s_sym", "entropy"))
        )
    per_swap = (time.perf_counter() - start) / rerun_swaps
    rerun = per_swap * swaps

    models = [build_model(ModelConfig(), task.vocab_size, seed=s).eval() for s in range(args.checkpoints)]
    start = time.perf_counter()
    for m in models:
        score_model(m, ids, hops)
    many = time.perf_counter() - start

    figures = {
        "model": f"paper preset GPT-J, {layers} layers x 1 head, width 128 (q/k weights x20: peaked attention)",
        "prompts": len(ids),
        "hop_queries": sum(map(len, hops)),
        "swaps": swaps,
        "score_rows": len(frame),
        "posym_s": fast,
        "posym_ms_per_prompt": fast / len(ids) * 1e3,
        "batched_brute_force_prompts": args.brute_prompts,
        "batched_brute_force_s": batched,
        "batched_over_posym": batched / args.brute_prompts / (fast / len(ids)),
        "max_abs_diff_batched": float(brute_diff),
        "per_swap_rerun_ms_per_swap": per_swap * 1e3,
        "per_swap_rerun_timed_swaps": rerun_swaps,
        "per_swap_rerun_jobs": len(jobs),
        "per_swap_rerun_extrapolated_s": rerun,
        "per_swap_rerun_over_posym": rerun / fast,
        "max_abs_diff_per_swap_rerun": float(rerun_diff),
        "checkpoints": args.checkpoints,
        "checkpoints_x_prompts_s": many,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    write_json(
        args.json,
        {
            **benchmark_header(args.threads, load_at_start),
            "benchmark": "benchmarks/scores_speed.py",
            "settings": vars(args),
            **figures,
        },
    )
    print(f"{figures['model']}; {len(ids)} prompts, {figures['hop_queries']} hop queries, {swaps:,} swaps")
    print(f"posym: {fast:.3f} s for all prompts ({figures['posym_ms_per_prompt']:.2f} ms per prompt)")
    print(
        f"batched brute force (strongest baseline): {batched:.1f} s on {args.brute_prompts} prompts, "
        f"{figures['batched_over_posym']:,.0f}x posym per prompt; "
        f"max |diff| {brute_diff:.1e}"
    )
    print(
        f"per-swap whole-model rerun (weaker): {per_swap * 1e3:.2f} ms per swap on {len(jobs)} jobs, "
        f"extrapolated {rerun:.0f} s, {rerun / fast:,.0f}x posym; max |diff| {rerun_diff:.1e}"
    )
    print(f"{args.checkpoints} checkpoints x {len(ids)} prompts: {many:.1f} s on {args.threads} threads")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
