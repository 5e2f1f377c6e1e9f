"""`posym llm-scores`, `posym llm-bench`: real Hugging Face models and chat endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posym.cli import app, parse_head_pairs, progress_bar
from posym.cli.options import (Device, Dtype, Exactness, Focus, OnOffBoth, Task, announce, device_option, list_option,
                               n_option, path_argument, values)


# ---- commands: llm-scores / llm-bench -----------------------------------------------------------


@app.command("llm-scores")
def llm_scores_cmd(
    path: Path = path_argument("Local Hugging Face model directory (config.json, *.safetensors and a "
                               "tokenizer); RoPE models only."),
    prompts: str = typer.Option("binding", help="Prompt set: 'binding' (Alice likes red ...), 'number' or "
                                "'letter' (1-hop tasks of Appendix H), or a JSONL file with one "
                                '{"text": ..., "focus": ...} object per line.'),
    text: Optional[str] = typer.Option(None, help="Score this single text instead of a prompt set."),
    n: int = n_option(20, "How many prompts to draw from a built-in set."),
    size: int = typer.Option(12, help="Target-window size of the number/letter prompts."),
    query: Focus = typer.Option(Focus.last, help="Query position: the last token, or name (the final token of "
                                "the name asked about, for binding prompts or JSONL 'focus')."),
    heads: Optional[list[str]] = list_option(None, "Heads to score per RoPE frequency plane, as LAYER.HEAD, "
                                             "e.g. 0.1,5.3.", item="L.H"),
    tau: float = typer.Option(1e-4, help="Temperature of the swap weights (1e-4: the swap that moves "
                              "most attention dominates)."),
    epsilon: float = typer.Option(1e-12, help="Weigh only the swaps carrying all but EPSILON of the swap "
                                  "weights: each score lies within 2 * EPSILON of weighing every swap."),
    exact: Exactness = typer.Option(Exactness.pruned, help="pruned (the EPSILON bound) or dense (weigh every "
                                    "swap: the reference, O(n^2) per head and query)."),
    seed: int = typer.Option(0, help="Seed of the built-in prompt sets."),
    device: Device = device_option(),
    dtype: Dtype = typer.Option(Dtype.float32, help="Weight precision."),
    allow_pickle: bool = typer.Option(False, help="Accept pickle weights (pytorch_model.bin) when there "
                                      "is no safetensors file; only for files you trust."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default runs/llm-scores/<model>)."),
) -> None:
    """Positional and symbolic score of every head of a real model, per-layer summaries and figures."""
    from posym import io, loading
    from posym.commands import llm

    io.check_output(out, inputs=[path, prompts], is_dir=True)
    query, dtype, exact = str(query), str(dtype), str(exact)
    loaded = loading.load_hf_model(path, device=str(device), dtype=dtype, allow_pickle=allow_pickle)
    chosen = llm.llm_prompts(prompts, text=text, n=n, size=size, seed=seed)
    out = out or Path("runs") / "llm-scores" / loaded.name
    heads = ",".join(values(heads, option="--heads")) or None
    print(announce(path, None, query))
    settings = {"model_dir": str(path), "checkpoint": str(path), "step": None, "prompts": prompts, "text": text,
                "n": n, "size": size, "query": query, "queries": query, "heads": heads, "tau": tau, "epsilon": epsilon,
                "exact": exact, "seed": seed,
                "dtype": dtype}
    bar, advance = progress_bar(len(chosen), "scoring prompts")
    with bar:
        result = llm.write_scores(loaded, chosen, out, query=query, heads=parse_head_pairs(heads), tau=tau,
                                  epsilon=epsilon, exact=exact, settings=settings, progress=advance)
    print(f"pearson r(s_pos, s_sym) over heads = {result['pearson_r']:.3f}; wrote {out}")


@app.command("llm-bench")
def llm_bench_cmd(
    path: Optional[Path] = path_argument("Local Hugging Face model directory; omit it to query an endpoint "
                                         "with --base-url.", default=None),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible API base, e.g. "
                                           "https://api.openai.com/v1 (posym appends /chat/completions)."),
    model_name: Optional[str] = typer.Option(None, help="Model name sent to the endpoint."),
    api_key_env: Optional[str] = typer.Option(None, help="Name of the environment variable that holds "
                                              "the API key (the key itself is never written anywhere)."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for one endpoint reply."),
    retries: int = typer.Option(3, help="Extra attempts after a timeout or an HTTP 408/429/5xx reply."),
    task: list[str] = list_option(["number,letter"], "Tasks.", choices=Task),
    sizes: Optional[list[str]] = list_option(None, "Target-window sizes (default: all of Appendix H, "
                                             "12,16,24,32,48,64,80,100,150,200,300)."),
    runs: int = typer.Option(5, min=1, help="Runs per task and size; run r draws fresh data with seed r."),
    n: int = n_option(20, "Questions per run."),
    markers: OnOffBoth = typer.Option(OnOffBoth.off, help="Prompt variant: off (plain Appendix H prompts), on "
                                      "(every target-window token tagged with its place, e.g. n@3) or both, side "
                                      "by side."),
    device: Device = device_option(" (local model only)"),
    dtype: Dtype = typer.Option(Dtype.float32, help="Weight precision (local model only)."),
    allow_pickle: bool = typer.Option(False, help="Accept pickle weights (pytorch_model.bin) you trust."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default runs/llm-bench/<model>)."),
) -> None:
    """Appendix H accuracy (1-hop number/letter tasks, 3 worked examples) with the paper's Table 3 beside."""
    from posym import io
    from posym.commands import bench

    io.check_output(out, inputs=[path], is_dir=True)
    markers, dtype = str(markers), str(dtype)
    variants = bench.MARKER_CHOICES[markers]
    task_list = values(task, option="--task", choices=Task)
    size_list = values(sizes, int, option="--sizes") or list(bench.BENCH_SIZES)
    judge, label = bench.make_judge(path, base_url=base_url, model_name=model_name,
                                    api_key_env=api_key_env, timeout_s=timeout, retries=retries,
                                    device=str(device), dtype=dtype, allow_pickle=allow_pickle)
    out = out or Path("runs") / "llm-bench" / label
    settings = {"model": label, "tasks": task_list, "sizes": size_list, "runs": runs, "n": n,
                "markers": markers, "base_url": base_url, "dtype": dtype}
    bar, advance = progress_bar(len(task_list) * len(size_list) * len(variants) * runs * n, "asking questions")
    with bar:
        table = bench.write_bench(judge, out, label=label, tasks=task_list, sizes=size_list, runs=runs, n=n,
                                  settings=settings, markers=variants, progress=advance)
    print(table)
