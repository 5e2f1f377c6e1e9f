"""The cost of every head's effect per prompt (AtP, AtP*) against one forward pass of the same prompt, in one run.

Per model (smollm2-135m: 270 heads, gemma3-270m: 72) and length (the kv-code length task's 56-token base
prompts, and the same questions padded with filler to 1,024 tokens): the wall time of one no-grad forward
pass (logits at the last position only, median of REPEATS), of `posym.core.attribution.attribute` on that one
prompt with method atp (median of REPEATS, interleaved with the forward passes) and once with atp*
(zero-ablation, so no reference pass; mean-ablation adds one no-grad forward over its reference set, shared by
every prompt of that length), and at 56 tokens every head ablated alone (`ablation_effects`, once), all in
one process with the same torch threads. Times are the process's CPU seconds (`time.process_time`): on a
machine shared with other jobs, wall time swings with their load (a 56-token forward pass took from 0.05 to
2 s of wall time in one minute here), CPU time of a one-thread process much less; wall seconds are recorded
beside them. -> docs/benchmarks/attribution_speed.json; the ratios are what docs/attribution.md quotes.

    OMP_WAIT_POLICY=PASSIVE nice -n 10 python benchmarks/attribution_speed.py [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

from record import benchmark_header  # noqa: E402

from posym.io import write_json  # noqa: E402

OUT = ROOT / "docs" / "benchmarks" / "attribution_speed.json"
MODELS = ("smollm2-135m", "gemma3-270m")
LONG = 1024
"""The long prompt's length in tokens."""
REPEATS = 3
"""Timed repeats of the forward pass and of AtP (median); AtP* and the exhaustive ablation run once."""


def timed(fn) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one call."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--resume", action="store_true", help="keep the rows of a partial run in the JSON")
    args = parser.parse_args()
    import torch

    from posym.core.attribution import ablation_effects, attribute, layout
    from posym.models import load
    from posym.prompts import Builder, LengthFamily, build

    torch.set_num_threads(args.threads)
    load_at_start = os.getloadavg()
    rows = json.loads(OUT.read_text())["rows"] if args.resume and OUT.exists() else []
    done = {(r["model"], r["tokens"]) for r in rows}
    loaded = {name: load(name) for name in MODELS}
    family = LengthFamily("kv-code", factors=[1])
    for which in ("short", "long"):  # every model's short prompt first: the cheap rows are safe early
        for name in MODELS:
            model = loaded[name].model
            builder = Builder(loaded[name].tokenizer)
            short = build(family, builder, 4, seed=0)[1][0]
            prompt = short if which == "short" else build(family, builder, 4, seed=0, base=LONG)[1][0]
            layers, _, n_head, _ = layout(model)
            heads = [[(l, h)] for l in range(len(layers)) for h in range(n_head)]
            if (name, len(prompt.ids)) in done:
                continue
            ids = torch.tensor([prompt.ids])

            def forward(ids=ids):
                with torch.no_grad():
                    model(input_ids=ids, logits_to_keep=1)

            forward()  # warm-up
            row = {"model": name, "heads": len(heads), "tokens": len(prompt.ids)}
            runs = {"forward": [], "atp": []}
            for _ in range(REPEATS):  # interleaved, so both see the same machine
                runs["forward"].append(timed(forward))
                runs["atp"].append(
                    timed(
                        lambda prompt=prompt: attribute(
                            model, [prompt.ids], [prompt.answer_id], mode="zero", method="atp"
                        )
                    )
                )
            runs["atp*"] = [
                timed(
                    lambda prompt=prompt: attribute(model, [prompt.ids], [prompt.answer_id], mode="zero", method="atp*")
                )
            ]
            if prompt is short:
                runs["exhaustive"] = [
                    timed(lambda: ablation_effects(model, [short.ids], [short.answer_id], heads, mode="zero"))
                ]
            for what, times in runs.items():
                row[f"{what}_s"] = statistics.median(t[0] for t in times)
                row[f"{what}_wall_s"] = statistics.median(t[1] for t in times)
                if what != "forward":
                    row[f"{what}_x_forward"] = round(row[f"{what}_s"] / row["forward_s"], 2)
            print(row, flush=True)
            rows.append(row)
            write_json(OUT, {**benchmark_header(args.threads, load_at_start), "rows": rows})  # after every row
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
