"""`posym llm-scores`, `posym llm-bench`, `posym kv-policy`, `posym kv-eval`, `posym convert`: real models (any format) and chat endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posym.cli import app, parse_head_pairs, parse_list, progress_bar
from posym.cli.options import (
    EMBEDDED_HELP,
    AblationMode,
    AttributionMethod,
    AttributionMetric,
    LengthFormat,
    Device,
    Dtype,
    Exactness,
    Focus,
    KVPolicyName,
    OnOffBoth,
    RandomMatch,
    StudyStage,
    Task,
    announce,
    budget_option,
    device_of,
    device_option,
    list_option,
    n_option,
    path_argument,
    values,
)
from posym.core.paper import TAU
from posym.errors import PosymError
from posym.runs import KV_EVAL_MARKER, OUTPUTS, STUDY_MARKER

# ---- commands: llm-scores / llm-bench -----------------------------------------------------------


@app.command("llm-scores")
def llm_scores_cmd(
    path: Path = path_argument(
        "The model: " + EMBEDDED_HELP + ", a .gguf file (or a directory holding one), a "
        "Hugging Face directory (config.json, *.safetensors, a tokenizer) or a posym "
        "checkpoint; RoPE models only."
    ),
    prompts: str = typer.Option(
        "binding",
        help="Prompt set: 'binding' (Alice likes red ...), 'number' or "
        "'letter' (1-hop tasks of Appendix H), or a JSONL file with one "
        '{"text": ..., "focus": ...} object per line.',
    ),
    text: Optional[str] = typer.Option(None, help="Score this single text instead of a prompt set."),
    n: int = n_option(20, "How many prompts to draw from a built-in set."),
    size: int = typer.Option(12, min=1, help="Target-window size of the number/letter prompts."),
    query: Focus = typer.Option(
        Focus.last,
        help="Query position: the last token, or name (the final token of "
        "the name asked about, for binding prompts or JSONL 'focus').",
    ),
    heads: Optional[list[str]] = list_option(
        None, "Heads to score per RoPE frequency plane, as LAYER.HEAD, e.g. 0.1,5.3.", item="L.H"
    ),
    tau: float = typer.Option(
        TAU, help="Temperature of the swap weights (1e-4: the swap that moves most attention dominates)."
    ),
    exclude_keys: Optional[str] = typer.Option(
        None,
        help="Also score with these key positions left out of "
        "the swaps, e.g. 0 (the attention sink), or 'auto' (positions "
        "that are the top key of at least half the rows); written "
        "beside the plain scores.",
    ),
    epsilon: float = typer.Option(
        1e-12,
        help="Weigh only the swaps carrying all but EPSILON of the swap "
        "weights: each score lies within 2 * EPSILON of weighing every swap.",
    ),
    exact: Exactness = typer.Option(
        Exactness.pruned,
        help="pruned (the EPSILON bound) or dense (weigh every swap: the reference, O(n^2) per head and query).",
    ),
    seed: int = typer.Option(0, help="Seed of the built-in prompt sets."),
    budget: Optional[int] = budget_option(),
    device: Device = device_option(),
    dtype: Dtype = typer.Option(Dtype.float32, help="Weight precision."),
    allow_pickle: bool = typer.Option(
        False,
        help="Accept pickle weights (pytorch_model.bin) when there is no safetensors file; only for files you trust.",
    ),
    details: int = typer.Option(
        8,
        min=0,
        help="Prompts whose attention rows and heaviest swaps at the query are written to details.parquet "
        "while the model is loaded, for posym explore (0: none; explore then loads the model itself).",
    ),
    out: Optional[Path] = typer.Option(None, help="Output directory (default runs/llm-scores/<model>)."),
) -> None:
    """Positional and symbolic score of every head of a real model, per-layer summaries and figures."""
    from posym import io, models
    from posym import prompts as prompt_sets
    from posym.commands import llm_scores

    io.check_output(out, inputs=[path, prompts], is_dir=True, owns=OUTPUTS["llm-scores"])
    query, dtype, exact = str(query), str(dtype), str(exact)
    loaded = models.load(path, device=str(device), dtype=dtype, allow_pickle=allow_pickle)
    if text is None and prompts in ("number", "letter") and 4 * (size + 9) > loaded.max_positions:
        raise PosymError(
            f"--size {size} makes {prompts} prompts of at least {4 * (size + 9):,} tokens (three worked "
            f"examples and the puzzle), more than the {loaded.max_positions:,} positions of {loaded.name}"
        )
    chosen = prompt_sets.llm_prompts(prompts, text=text, n=n, size=size, seed=seed)
    out = io.check_output(
        out or Path("runs") / "llm-scores" / loaded.name,
        inputs=[path, prompts],
        is_dir=True,
        owns=OUTPUTS["llm-scores"],
    )
    heads = ",".join(values(heads, option="--heads")) or None
    print(announce(path, None, query))
    settings = {
        "model_dir": str(path),
        "checkpoint": str(path),
        "step": None,
        "prompts": prompts,
        "text": text,
        "n": n,
        "size": size,
        "query": query,
        "queries": query,
        "heads": heads,
        "tau": tau,
        "epsilon": epsilon,
        "exact": exact,
        "exclude_keys": exclude_keys,
        "seed": seed,
        "dtype": dtype,
        "details": details,
    }
    excluded = exclude_keys if exclude_keys in (None, "auto") else parse_list(exclude_keys, int)
    bar, advance = progress_bar(len(chosen) * (1 if exclude_keys is None else 2), "scoring prompts")
    with bar:
        result = llm_scores.write_scores(
            loaded,
            chosen,
            out,
            query=query,
            heads=parse_head_pairs(heads),
            tau=tau,
            epsilon=epsilon,
            exact=exact,
            exclude_keys=excluded,
            details=details,
            budget=budget and budget << 20,
            settings=settings,
            progress=advance,
            owns=OUTPUTS["llm-scores"],
        )
    print(f"pearson r(s_pos, s_sym) over heads = {result['pearson_r']:.3f}; wrote {out}")
    if "excluded_keys" in result:
        print(f"excluding keys {result['excluded_keys']}: {result['label_changes']} heads change label")


@app.command("attribute")
def attribute_cmd(
    path: Path = path_argument(
        "The model: " + EMBEDDED_HELP + ", a .gguf file (or a directory holding one) or a "
        "Hugging Face directory; RoPE models only."
    ),
    fmt: LengthFormat = typer.Option(
        LengthFormat.kv_code, "--format", help="Length task: the prompt format of posym llm-study's length families."
    ),
    factors: list[str] = list_option(["1"], "Prompt lengths as multiples of the base length, e.g. 1,16.", item="F"),
    n: int = n_option(50, "Prompts per length (also the mean-ablation reference set)."),
    method: AttributionMethod = typer.Option(
        AttributionMethod.atp_star,
        help="atp (one forward + one backward pass) or atp* (AtP* GradDrop magnitudes beside AtP's signed "
        "estimate; about L/2 more backward passes).",
    ),
    metric: AttributionMetric = typer.Option(
        AttributionMetric.margin,
        help="margin (answer logit minus the clean run's best other token's) or logprob (the answer's).",
    ),
    mode: AblationMode = typer.Option(
        AblationMode.mean,
        help="mean (each head's output -> its mean over the prompts of that length at each position) or zero.",
    ),
    batch_size: int = typer.Option(4, min=1, max=4096, help="Prompts per forward/backward pass."),
    seed: int = typer.Option(0, help="Seed of the prompts."),
    device: Device = device_option(),
    dtype: Dtype = typer.Option(Dtype.float32, help="Weight precision."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default runs/attribute/<model>)."),
) -> None:
    """Every head's estimated effect of its ablation on a length task (AtP / AtP*), per prompt and head."""
    from posym import io, models
    from posym.commands import attribute

    io.check_output(out, inputs=[path], is_dir=True, owns=OUTPUTS["attribute"])
    factor_list = values(factors, int, option="--factors")
    if not factor_list or min(factor_list) < 1 or max(factor_list) > 64:
        raise PosymError(f"--factors must lie in 1..64, got {factor_list}")
    fmt, method, metric, mode, dtype = str(fmt), str(method), str(metric), str(mode), str(dtype)
    if mode == "mean" and n < 2:
        raise PosymError("mean-ablation needs at least 2 prompts per length (--n 2 or more)")
    loaded = models.load(path, device=str(device), dtype=dtype)
    prompts = attribute.length_prompts(loaded, fmt, factor_list, n, seed=seed)
    out = io.check_output(out or Path("runs") / "attribute" / loaded.name, is_dir=True, owns=OUTPUTS["attribute"])
    settings = {
        "model": str(path),
        "format": fmt,
        "factors": factor_list,
        "n": n,
        "method": method,
        "metric": metric,
        "mode": mode,
        "seed": seed,
        "dtype": dtype,
    }
    bar, advance = progress_bar(n * len(factor_list), f"{method} over prompts")
    with bar:
        summary = attribute.write_attribution(
            loaded,
            prompts,
            out,
            mode=mode,
            method=method,
            metric=metric,
            batch_size=batch_size,
            settings=settings,
            progress=advance,
        )
    for factor, top in summary["top_heads"].items():
        print(f"{factor}x: largest {method} heads {', '.join(top)}")
    print(f"wrote {out}")


@app.command("llm-bench")
def llm_bench_cmd(
    path: Optional[Path] = path_argument(
        "A local model (" + EMBEDDED_HELP + ", a .gguf file, a Hugging Face directory); "
        "omit it to query an endpoint with --base-url.",
        default=None,
    ),
    base_url: Optional[str] = typer.Option(
        None, help="OpenAI-compatible API base, e.g. https://api.openai.com/v1 (posym appends /chat/completions)."
    ),
    model_name: Optional[str] = typer.Option(None, help="Model name sent to the endpoint."),
    api_key_env: Optional[str] = typer.Option(
        None, help="Name of the environment variable that holds the API key (the key itself is never written anywhere)."
    ),
    timeout: float = typer.Option(60.0, help="Seconds to wait for one endpoint reply."),
    retries: int = typer.Option(3, help="Extra attempts after a timeout or an HTTP 408/429/5xx reply."),
    task: list[str] = list_option(["number,letter"], "Tasks.", choices=Task),
    sizes: Optional[list[str]] = list_option(
        None, "Target-window sizes (default: all of Appendix H, 12,16,24,32,48,64,80,100,150,200,300)."
    ),
    runs: int = typer.Option(5, min=1, help="Runs per task and size; run r draws fresh data with seed r."),
    n: int = n_option(20, "Questions per run."),
    markers: OnOffBoth = typer.Option(
        OnOffBoth.off,
        help="Prompt variant: off (plain Appendix H prompts), on "
        "(every target-window token tagged with its place, e.g. n@3) or both, side "
        "by side.",
    ),
    device: Device = device_option(" (local model only)"),
    dtype: Dtype = typer.Option(Dtype.float32, help="Weight precision (local model only)."),
    allow_pickle: bool = typer.Option(False, help="Accept pickle weights (pytorch_model.bin) you trust."),
    workers: int = typer.Option(
        0,
        min=0,
        help="Processes a local model on the CPU answers in: 0 forks one one-thread process per CPU, 1 answers "
        "here, N >= 2 forks N (the same answers up to float rounding). An endpoint is asked from this process.",
    ),
    out: Optional[Path] = typer.Option(None, help="Output directory (default runs/llm-bench/<model>)."),
) -> None:
    """Appendix H accuracy (1-hop number/letter tasks, 3 worked examples) with the paper's Table 3 beside."""
    from posym import io
    from posym.commands import llm_bench

    io.check_output(out, inputs=[path], is_dir=True, owns=OUTPUTS["llm-bench"])
    markers, dtype = str(markers), str(dtype)
    variants = llm_bench.MARKER_CHOICES[markers]
    task_list = values(task, option="--task", choices=Task)
    size_list = values(sizes, int, option="--sizes") or list(llm_bench.BENCH_SIZES)
    judge, label, processes = llm_bench.make_judge(
        path,
        base_url=base_url,
        model_name=model_name,
        api_key_env=api_key_env,
        timeout_s=timeout,
        retries=retries,
        device=str(device),
        dtype=dtype,
        allow_pickle=allow_pickle,
        workers=workers,
    )
    out = io.check_output(
        out or Path("runs") / "llm-bench" / label, inputs=[path], is_dir=True, owns=OUTPUTS["llm-bench"]
    )
    settings = {
        "model": label,
        "tasks": task_list,
        "sizes": size_list,
        "runs": runs,
        "n": n,
        "markers": markers,
        "base_url": base_url and llm_bench.shown_url(base_url),
        "dtype": dtype,
    }  # no user:password in llm_bench.json
    bar, advance = progress_bar(len(task_list) * len(size_list) * len(variants) * runs * n, "asking questions")
    with bar:
        table = llm_bench.write_bench(
            judge,
            out,
            label=label,
            tasks=task_list,
            sizes=size_list,
            runs=runs,
            n=n,
            settings=settings,
            markers=variants,
            progress=advance,
            workers=processes,
        )
    print(table)


@app.command("llm-study")
def llm_study_cmd(
    path: Optional[Path] = path_argument(
        "The model (default smollm2-135m): " + EMBEDDED_HELP + " or any model spec "
        "posym loads (a .gguf file, a Hugging Face directory); RoPE models only.",
        default=None,
    ),
    out: Optional[Path] = typer.Option(
        None,
        help="Output directory (default runs/llm-study/<model>); re-running "
        "with the same directory skips the finished stages.",
    ),
    config: Optional[Path] = typer.Option(None, help="YAML file of StudyConfig fields (see OUT/study.yaml)."),
    stages: Optional[list[str]] = list_option(
        None,
        "Stages to run (default all the config runs, in study order: ablation only with ablation_ks set).",
        choices=StudyStage,
    ),
    reuse_ablations: Optional[Path] = typer.Option(
        None,
        help="An earlier study's causal/calibration_points.parquet: the causal stage takes its real ablations "
        "again where they are of the same head sets, prompts and weights (a null with more draws then costs "
        "the attribution passes only).",
    ),
    device: Device = device_option(),
) -> None:
    """The lens of 2511.11579 and 2605.31558 on one real model, then what a head type predicts on a
    length task: nine resumable stages and report.html."""
    from posym import configs, io, models
    from posym.commands import llm_study

    io.check_output(out, inputs=[path, config, reuse_ablations], is_dir=True, marker=STUDY_MARKER)
    if reuse_ablations is not None and not reuse_ablations.is_file():
        raise PosymError(f"--reuse-ablations {io.quote(reuse_ablations)} is not a file")
    settings = configs.from_file_and_flags(
        llm_study.StudyConfig,
        io.read_yaml(config) if config else {},
        {},
        where=str(config or "study config"),
        options={},
    )
    chosen = values(stages, option="--stages", choices=StudyStage)
    if stages is not None and not chosen:  # --stages '' used to run every stage
        raise PosymError(f"--stages names no stage; give one or more of {', '.join(llm_study.STAGES)}")
    only = [stage for stage in llm_study.STAGES if stage in chosen] or None
    spec = path or "smollm2-135m"
    device = device_of(device)
    loaded = models.load(spec, device=device)
    out = io.check_output(
        out or Path("runs") / "llm-study" / loaded.name, inputs=[path, config], is_dir=True, marker=STUDY_MARKER
    )
    steps = llm_study.stage_steps(settings)
    bar, advance = progress_bar(sum(steps[s] for s in only or llm_study.study_stages(settings)), "llm-study")
    with bar:
        timings = llm_study.run_study(
            loaded,
            out,
            settings,
            settings={
                "model": str(spec),
                "device": device,
                "reuse_ablations": reuse_ablations and str(reuse_ablations),
            },
            progress=advance,
            only=only,
            reuse_ablations=reuse_ablations,
        )
    for stage, seconds in timings.items():
        print(f"{stage:12s} {seconds if seconds == 'done' else f'{seconds:.1f} s'}")
    print(f"wrote {out / 'report.html'}")


ATLAS_OPTIONS = {
    "n_binding": "--n",
    "needle_lengths": "--lengths",
    "needle_depths": "--depths",
    "windows": "--windows",
    "sink": "--sink",
    "quantile": "--quantile",
    "seed": "--seed",
    "causal": "--causal",
}
"""The AtlasConfig field each `posym atlas` option sets (errors name the option, not the YAML file)."""


@app.command("atlas")
def atlas_cmd(
    path: Optional[Path] = path_argument(
        "The model (default smollm2-135m): " + EMBEDDED_HELP + " or any model spec "
        "posym loads (a .gguf file, a Hugging Face directory); RoPE models only.",
        default=None,
    ),
    out: Optional[Path] = typer.Option(None, help="Output directory (default runs/atlas/<model>)."),
    config: Optional[Path] = typer.Option(
        None, help="YAML file of AtlasConfig fields (see OUT/atlas.yaml); the options below override it."
    ),
    n: Optional[int] = typer.Option(
        None, "--n", min=1, help="Binding prompts on which s_pos and s_sym are scored (default 20)."
    ),
    lengths: Optional[list[str]] = list_option(
        None, "Token lengths of the needle-in-a-haystack prompts (default 256,512,1024)."
    ),
    depths: Optional[list[str]] = list_option(None, "Needle depths in [0, 1] (default 0.1,0.5,0.9).", item="D"),
    windows: Optional[list[str]] = list_option(
        None,
        "Recent-window sizes of the streaming score (default 64,256; "
        "the first one defines the non-streaming heads and the export).",
    ),
    sink: Optional[int] = typer.Option(None, min=1, help="Keys at the start a streaming cache keeps (default 4)."),
    quantile: Optional[float] = typer.Option(
        None,
        help="Quantile of the non-streaming score above which a KV "
        "head is marked full attention in full_attention_mask.tsv (default 0.5).",
    ),
    kv_table: Optional[Path] = typer.Option(
        None,
        help="A layer x KV-head table of another tool (e.g. DuoAttention's "
        "full_attention_heads.tsv) to cross-tabulate with posym's labels.",
    ),
    seed: Optional[int] = typer.Option(None, help="Seed of every prompt set (default 0)."),
    causal: Optional[bool] = typer.Option(
        None,
        help="Also run the causal check of the frequency story: the needle accuracy with the slowest RoPE planes "
        "of the top symbolic, positional and retrieval heads zeroed, against random planes and layer-matched "
        "random heads (one forward pass per prompt and condition: off by default, docs/atlas.md).",
    ),
    figures: bool = typer.Option(
        True, help="Draw maps and scatter (PNG + SVG); --no-figures writes the tables and report only."
    ),
    device: Device = device_option(),
) -> None:
    """The head atlas: positional/symbolic scores beside retrieval, streaming, echo, induction,
    previous-token and sink scores of every head, their agreement, the KV-head export, report.md."""
    from posym import configs, io, models
    from posym.commands import atlas

    io.check_output(out, inputs=[path, config, kv_table], is_dir=True, owns=OUTPUTS["atlas"])
    given = io.read_yaml(config) if config else {}
    flags = {
        "n_binding": n,
        "needle_lengths": values(lengths, int, option="--lengths") or None,
        "needle_depths": values(depths, float, option="--depths") or None,
        "windows": values(windows, int, option="--windows") or None,
        "sink": sink,
        "quantile": quantile,
        "seed": seed,
        "causal": causal,
    }
    settings = configs.from_file_and_flags(
        atlas.AtlasConfig, given, flags, where=str(config or "atlas config"), options=ATLAS_OPTIONS
    )
    spec = path or "smollm2-135m"
    device = device_of(device)
    loaded = models.load(spec, device=device)
    out = io.check_output(
        out or Path("runs") / "atlas" / loaded.name, inputs=[path, config, kv_table], is_dir=True, owns=OUTPUTS["atlas"]
    )
    bar, advance = progress_bar(5 if settings.causal else 4, "atlas")
    with bar:
        summary = atlas.write_atlas(
            loaded,
            out,
            settings,
            settings={"model": str(spec), "device": device},
            compare=kv_table,
            figures=figures,
            progress=advance,
            owns=OUTPUTS["atlas"],
        )
    recall = summary["needle_recall"]
    print(
        f"needle recall {recall['recalled']}/{recall['n']}; {summary['full_attention_kv_heads']} of "
        f"{summary['kv_heads']} KV heads marked full attention; {summary['timings']['total']:.1f} s; wrote {out}"
    )


# ---- commands: kv-policy ------------------------------------------------------------------------


@app.command("kv-policy")
def kv_policy_cmd(
    path: Path = path_argument(
        "The model whose KV heads the policy covers (its config: layers, heads, KV heads, sliding windows): "
        + EMBEDDED_HELP
        + ", a .gguf file or a Hugging Face directory."
    ),
    out: Path = typer.Option(..., help="Output directory: full_attention_heads.tsv and config.json."),
    table: Optional[Path] = typer.Option(
        None,
        help="Head table, one row per (layer, head), Parquet or CSV: posym score's, llm-scores' heads.parquet, "
        "atlas's atlas.parquet (s_pos/s_sym, sink-free where present; retrieval; non_streaming_w*).",
    ),
    where: Optional[list[str]] = list_option(
        None,
        "Keep the head table's rows where COLUMN=VALUE (e.g. variant=sink-free for a table holding several "
        "variants or prompt sets).",
        item="COLUMN=VALUE",
    ),
    kv_table: Optional[Path] = typer.Option(
        None, help="A layer x KV-head grid (DuoAttention's full_attention_heads.tsv) the duo policy ranks by."
    ),
    policy: KVPolicyName = typer.Option(
        KVPolicyName.posym,
        help="posym (positional heads streamed first), retrieval (atlas score), duo (the grid or the "
        "non-streaming proxy), random (matched to posym, or to duo given only --kv-table, on layer or on "
        "layer type: --match), streaming (every head), full (none).",
    ),
    streaming: float = typer.Option(
        0.5, min=0.0, max=1.0, help="Fraction of KV heads that keep only sink + recent keys (the budget)."
    ),
    sink: int = typer.Option(4, min=0, help="Keys at the start a streaming KV head keeps (sink_size)."),
    recent: int = typer.Option(256, min=1, help="Recent keys a streaming KV head keeps (recent_size)."),
    seed: int = typer.Option(0, help="Seed of the random policy's draw."),
    match: RandomMatch = typer.Option(
        RandomMatch.layer,
        help="What the random policy keeps of the policy it matches: each layer's count of streaming KV heads "
        "(layer), or each layer type's (type: windowed and global layers apart; the only match that leaves a "
        "choice on a model with one KV head per layer).",
    ),
) -> None:
    """A head-aware KV-cache policy from any head table, written as DuoAttention's full_attention_heads.tsv
    (1 = full cache, 0 = sink + recent window) and config.json (sink_size, recent_size, what made it)."""
    from posym import io
    from posym.commands import kv_policy

    io.check_output(out, inputs=[path, table, kv_table], is_dir=True, owns=OUTPUTS["kv-policy"])
    record = kv_policy.write_kv_policy(
        kv_policy.model_config(path),
        out,
        policy=policy.value,
        streaming=streaming,
        table_path=table,
        kv_table=kv_table,
        sink=sink,
        recent=recent,
        seed=seed,
        match=match.value,
        where=values(where, option="--where"),
        settings={"model": str(path)},
    )
    kept = ", ".join(f"{float(v):.1%} at {int(n):,}" for n, v in record["kept_fraction"].items())
    print(
        f"{policy.value}: {record['kv_heads'] - record['full_kv_heads']} of {record['kv_heads']} KV heads "
        f"streaming (sink {sink}, recent {recent}); KV kept {kept} tokens; wrote {out}"
    )


# ---- commands: kv-eval --------------------------------------------------------------------------


@app.command("kv-eval")
def kv_eval_cmd(
    path: Path = path_argument(
        "The model whose KV policies are evaluated: " + EMBEDDED_HELP + ", a .gguf file or a Hugging Face directory."
    ),
    out: Path = typer.Option(
        ..., help="Output directory; re-running with the same directory and config skips the finished stages."
    ),
    config: Optional[Path] = typer.Option(None, help="YAML file of KVEvalConfig fields (see OUT/kv_eval.yaml)."),
    table: Optional[Path] = typer.Option(
        None,
        help="Head table (Parquet, one row per (layer, head)) the policies rank: atlas.parquet, or any table "
        "with s_pos/s_sym (retrieval, non_streaming_w* for those policies); default: posym atlas's labels "
        "computed for the model.",
    ),
    device: Device = device_option(),
) -> None:
    """Accuracy against kept-KV fraction of head-aware KV-cache policies at equal budget (posym labels,
    retrieval, DuoAttention proxy, layer-matched random, streaming, full) on the length task, multi-key
    needles and variable tracking at 1x-16x: per-prompt and summary tables, paired tests, a figure."""
    from posym import configs, io, models
    from posym.commands import kv_eval

    io.check_output(out, inputs=[path, config, table], is_dir=True, marker=KV_EVAL_MARKER)
    settings = configs.from_file_and_flags(
        kv_eval.KVEvalConfig,
        io.read_yaml(config) if config else {},
        {},
        where=str(config or "kv-eval config"),
        options={},
    )
    device = device_of(device)
    loaded = models.load(path, device=device)
    bar, advance = progress_bar(kv_eval.plan(loaded, settings, table), "kv-eval")
    with bar:
        record = kv_eval.run_kv_eval(
            loaded,
            out,
            settings,
            table=table,
            settings={"model": str(path), "device": device, "table": str(table) if table else None},
            progress=advance,
        )
    print(
        f"{record['forwards']} policy runs over {', '.join(settings.tasks)} at {len(settings.factors)} lengths; "
        f"{record['prompts']:,} prompt rows; wrote {out}"
    )


# ---- commands: convert --------------------------------------------------------------------------


@app.command("convert")
def convert_cmd(
    path: Path = path_argument(
        "The model to convert: " + EMBEDDED_HELP + ", a .gguf file (or a directory holding one) "
        "or any model posym loads."
    ),
    out: Path = typer.Option(..., help="New Hugging Face directory (must not exist or be empty)."),
) -> None:
    """Write a plain Hugging Face directory (config.json, float32 model.safetensors, tokenizer) that any tool
    reads with from_pretrained, e.g. from a GGUF file (dequantized once, loaded in seconds afterwards)."""
    from posym import io
    from posym.commands.convert import convert

    io.check_output(out, inputs=[path], is_dir=True)
    print(f"wrote {convert(path, out)}")
