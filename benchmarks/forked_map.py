"""Does splitting work over forked 1-thread processes beat one process using every thread?

    python benchmarks/forked_map.py            # SmolLM2-135M, 896-token prompts, writes docs/benchmarks/forked_map.json

The same work both ways, in one run: `passes` forwards of one 896-token prompt (the longest length of
llm-study's length task) through the embedded smollm2-135m, first in this process with torch's default
threads, then split over `posym.parallel.forked_map` workers (one per CPU, one thread each). Also checks
that both give the same last-position logits (to float32 rounding).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import benchmark_header  # noqa: E402

import torch  # noqa: E402

from posym import io, models  # noqa: E402
from posym.parallel import cpu_workers, forked_map  # noqa: E402

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "forked_map.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=896)
    args = parser.parse_args()
    load = os.getloadavg()
    model = models.load("smollm2-135m").model
    prompts = [
        torch.randint(100, 4000, (1, args.tokens), generator=torch.Generator().manual_seed(k))
        for k in range(args.passes)
    ]

    def last(ids):
        with torch.no_grad():
            return model(input_ids=ids, logits_to_keep=1).logits[0, -1]

    last(prompts[0])  # warm-up
    threads = torch.get_num_threads()
    start = time.perf_counter()
    here = [last(p) for p in prompts]
    one_process = time.perf_counter() - start
    workers = cpu_workers(0, model)
    start = time.perf_counter()
    there = forked_map(last, prompts, workers=workers)
    forked = time.perf_counter() - start
    diff = max(float((a - b).abs().max()) for a, b in zip(here, there))
    io.write_json(
        OUTPUT,
        {
            **benchmark_header(threads, load),
            "model": "SmolLM2-135M-Instruct (smollm2-135m, float32)",
            "passes": args.passes,
            "tokens": args.tokens,
            "one_process_seconds": round(one_process, 2),
            "one_process_threads": threads,
            "forked_seconds": round(forked, 2),
            "forked_workers": workers,
            "speedup": round(one_process / forked, 3),
            "max_logit_difference": diff,
        },
    )
    print(
        f"{OUTPUT}: one process x {threads} threads {one_process:.1f} s, {workers} forked x 1 thread "
        f"{forked:.1f} s ({one_process / forked:.2f}x), logits differ by {diff:.2g}"
    )


if __name__ == "__main__":
    main()
