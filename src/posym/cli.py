"""The `posym` command line: a thin Typer layer over the library modules.

Every command turns user mistakes (`PosymError`) into one line on stderr and exit code 2.
Heavy imports happen inside the commands so that `posym --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posym.errors import PosymError

app = typer.Typer(
    name="posym",
    help="Positional versus symbolic attention heads in RoPE transformers (arXiv 2605.31558).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


# ---- commands: data (tasks) -------------------------------------------------------------------


@app.command("data")
def data_command(
    task: str = typer.Option("number", help="Which task: 'number' (positional) or 'letter' (symbolic)."),
    n: int = typer.Option(1000, "--n", help="How many sequences to write."),
    seed: int = typer.Option(0, help="Random seed; the same seed, split and config give the same data."),
    split: str = typer.Option("train", help="Which split's random stream: train, val or test."),
    fmt: str = typer.Option("parquet", "--format", help="File format: parquet, jsonl or npz."),
    out: Path = typer.Option(..., help="Output file; its manifest is written next to it as OUT.manifest.json."),
    target_size: Optional[int] = typer.Option(None, help="Target-window tokens (paper: 8)."),
    pretarget_size: Optional[int] = typer.Option(None, help="Pre-target-window tokens (paper: 8)."),
    max_hops: Optional[int] = typer.Option(None, help="Hops run 1..max-hops in equal shares (paper: 4)."),
    alphabet_size: Optional[int] = typer.Option(
        None, help="Symbols (number task, paper 120) or letters (letter task, paper 8)."),
    int_range: Optional[int] = typer.Option(
        None, help="Offsets 1..R (number task, paper 16) or numbers 1..R in target pairs (letter task, paper 8)."),
    extra_target: int = typer.Option(
        0, help="Length extension: extra target-window tokens before the effective target window."),
) -> None:
    """Generate a number- or letter-task dataset (with a JSON manifest) for training or evaluation."""
    from rich.progress import Progress

    from posym import tasks

    knobs = dict(target_size=target_size, pretarget_size=pretarget_size, max_hops=max_hops,
                 alphabet_size=alphabet_size, int_range=int_range, extra_target=extra_target)
    config = tasks.task_config(task, **{k: v for k, v in knobs.items() if v is not None})
    with Progress(transient=True) as bar:
        job = bar.add_task(f"{task} task, {split}", total=n)
        path = tasks.save_dataset(config, n, seed, split, out, fmt,
                                  progress=lambda k: bar.advance(job, k))
    print(f"wrote {n} {task}-task sequences to {path} (manifest {tasks.manifest_path(path)})")

# ---- commands: train / eval (model, train) ------------------------------------------------------

# ---- commands: score (scores) -------------------------------------------------------------------

# ---- commands: dynamics / geometry --------------------------------------------------------------

# ---- commands: theory / lengthgen ---------------------------------------------------------------

# ---- commands: llm-scores / llm-bench -----------------------------------------------------------


def _progress_bar(total: int, what: str):
    """A rich progress bar over `total` steps; returns (context manager, advance callback)."""
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task(what, total=total)
    return bar, lambda k=1: bar.advance(task, k)


@app.command("llm-scores")
def llm_scores_cmd(
    model_dir: Path = typer.Argument(..., help="Local Hugging Face model directory (config.json, "
                                     "*.safetensors and a tokenizer); RoPE models only."),
    prompts: str = typer.Option("binding", help="Prompt set: 'binding' (Alice likes red ...), 'number' or "
                                "'letter' (1-hop tasks of Appendix H), or a JSONL file with one "
                                '{"text": ..., "focus": ...} object per line.'),
    text: Optional[str] = typer.Option(None, help="Score this single text instead of a prompt set."),
    n: int = typer.Option(20, help="How many prompts to draw from a built-in set."),
    size: int = typer.Option(12, help="Target-window size of the number/letter prompts."),
    query: str = typer.Option("last", help="Query position: 'last' token, or 'name' (the final token of "
                              "the name asked about, for binding prompts or JSONL 'focus')."),
    heads: Optional[str] = typer.Option(None, help="Heads to score per RoPE frequency plane, as "
                                        "LAYER.HEAD,... e.g. 0.1,5.3."),
    tau: float = typer.Option(1e-4, help="Temperature of the swap weights (1e-4: the swap that moves "
                              "most attention dominates)."),
    seed: int = typer.Option(0, help="Seed of the built-in prompt sets."),
    device: str = typer.Option("auto", help="cpu, cuda, or auto (cuda when available)."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16 weights."),
    allow_pickle: bool = typer.Option(False, help="Accept pickle weights (pytorch_model.bin) when there "
                                      "is no safetensors file; only for files you trust."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default runs/llm-scores/<model>)."),
) -> None:
    """Positional and symbolic score of every head of a real model, per-layer summaries and figures."""
    from posym import llm

    loaded = llm.load_model(model_dir, device=device, dtype=dtype, allow_pickle=allow_pickle)
    chosen = llm.prompt_set(prompts, text=text, n=n, size=size, seed=seed)
    out = out or Path("runs") / "llm-scores" / loaded.name
    settings = {"model_dir": str(model_dir), "prompts": prompts, "text": text, "n": n, "size": size,
                "query": query, "heads": heads, "tau": tau, "seed": seed, "dtype": dtype}
    bar, advance = _progress_bar(len(chosen), "scoring prompts")
    with bar:
        result = llm.write_scores(loaded, chosen, out, query=query, heads=llm.parse_heads(heads), tau=tau,
                                  settings=settings, progress=advance)
    print(f"pearson r(s_pos, s_sym) over heads = {result['pearson_r']:.3f}; wrote {out}")


@app.command("llm-bench")
def llm_bench_cmd(
    model_dir: Optional[Path] = typer.Argument(None, help="Local Hugging Face model directory; omit it "
                                               "to query an endpoint with --base-url."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible API base, e.g. "
                                           "https://api.openai.com/v1 (posym appends /chat/completions)."),
    model_name: Optional[str] = typer.Option(None, help="Model name sent to the endpoint."),
    api_key_env: Optional[str] = typer.Option(None, help="Name of the environment variable that holds "
                                              "the API key (the key itself is never written anywhere)."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for one endpoint reply."),
    retries: int = typer.Option(3, help="Extra attempts after a timeout or an HTTP 408/429/5xx reply."),
    tasks: str = typer.Option("number,letter", help="Comma-separated tasks."),
    sizes: Optional[str] = typer.Option(None, help="Comma-separated target-window sizes (default: all "
                                        "of Appendix H, 12,16,24,32,48,64,80,100,150,200,300)."),
    runs: int = typer.Option(5, help="Runs per task and size; run r draws fresh data with seed r."),
    n: int = typer.Option(20, help="Questions per run."),
    device: str = typer.Option("auto", help="cpu, cuda, or auto (local model only)."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16 (local model only)."),
    allow_pickle: bool = typer.Option(False, help="Accept pickle weights (pytorch_model.bin) you trust."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default runs/llm-bench/<model>)."),
) -> None:
    """Appendix H accuracy (1-hop number/letter tasks, 3 worked examples) with the paper's Table 3 beside."""
    from posym import llm

    judge, label = llm.make_judge(model_dir, base_url=base_url, model_name=model_name,
                                  api_key_env=api_key_env, timeout_s=timeout, retries=retries,
                                  device=device, dtype=dtype, allow_pickle=allow_pickle)
    task_list = llm.parse_list(tasks, str)
    size_list = llm.parse_list(sizes, int) if sizes else list(llm.BENCH_SIZES)
    out = out or Path("runs") / "llm-bench" / label
    settings = {"model": label, "tasks": task_list, "sizes": size_list, "runs": runs, "n": n,
                "base_url": base_url, "dtype": dtype}
    bar, advance = _progress_bar(len(task_list) * len(size_list) * runs * n, "asking questions")
    with bar:
        table = llm.write_bench(judge, out, label=label, tasks=task_list, sizes=size_list, runs=runs, n=n,
                                settings=settings, progress=advance)
    print(table)


# ---- commands: run / report / sweep -------------------------------------------------------------


def main() -> None:
    """Console-script entry point: run the app, answering bad input with one line and exit 2."""
    try:
        app(standalone_mode=False)
    except PosymError as exc:
        print(f"posym: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("posym: aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # click usage errors (bad option values) are user errors too
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
