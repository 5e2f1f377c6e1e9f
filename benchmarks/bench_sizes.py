"""What each size of `posym llm-study`'s bench stage costs (issue 50: which cut would bring the whole default
study inside ~20 minutes): the whole-answer judge (`llm_bench.local_correct`) on SmolLM2-135M, one thread, on
the Appendix H prompts of the first run of every size of Table 3 (`llm_bench.PAPER_TABLE3`'s columns: 12, 32, 100, 300;
the default study asks the first two, `StudyConfig.bench_sizes`) and both tasks, with their token counts.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_sizes.py     # -> docs/benchmarks/bench_sizes.json

Per size: tokens of each prompt, seconds per prompt (mean over the prompts judged) and the size's share of the
stage (every size is asked the same number of prompts: runs x questions x tasks).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import benchmark_header  # noqa: E402

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "bench_sizes.json"
MODEL = "smollm2-135m"


def main() -> None:
    import torch

    from posym import io, models
    from posym.commands import llm_bench
    from posym.commands.llm_study import StudyConfig
    from posym.prompts import bench_prompts

    torch.set_num_threads(1)
    load = os.getloadavg()
    loaded = models.load(MODEL)
    config = StudyConfig()
    table3 = sorted(next(iter(llm_bench.PAPER_TABLE3.values())))  # Table 3's columns
    llm_bench.local_correct(loaded, bench_prompts("number", table3[0], 1, seed=0)[0])  # warm-up
    sizes = {}
    for size in table3:
        tokens, seconds = [], []
        for task in ("number", "letter"):
            for prompt in bench_prompts(task, size, config.bench_n, seed=0):
                tokens.append(len(loaded.tokenizer(prompt.text).input_ids))
                start = time.perf_counter()
                llm_bench.local_correct(loaded, prompt)
                seconds.append(time.perf_counter() - start)
        sizes[str(size)] = {
            "prompts": len(seconds),
            "tokens_mean": round(sum(tokens) / len(tokens), 1),
            "seconds_per_prompt": round(sum(seconds) / len(seconds), 3),
        }
    total = sum(s["seconds_per_prompt"] for s in sizes.values())
    for s in sizes.values():
        s["share_of_stage"] = round(s["seconds_per_prompt"] / total, 3)
    io.write_json(
        OUTPUT,
        {
            **benchmark_header(1, load),
            "model": MODEL,
            "how": "llm_bench.local_correct per prompt, one torch thread, the first run (seed 0) of each of Table 3's "
            "sizes, bench_n questions of both tasks; share = the size's seconds per prompt over the sum (the stage "
            "asks every size the same count)",
            "bench_sizes": table3,
            "sizes": sizes,
        },
    )
    print(OUTPUT, sizes)


if __name__ == "__main__":
    main()
