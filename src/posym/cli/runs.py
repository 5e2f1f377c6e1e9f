"""`posym run`, `report`, `sweep`, `ablate`, `finetune`: whole studies and interventions."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posym.cli import app, checkpoint_step
from posym.cli.options import (
    EMBEDDED_HELP,
    AblationMode,
    Device,
    Preset,
    Task,
    announce,
    device_of,
    device_option,
    list_option,
    n_option,
    path_argument,
    step_option,
    values,
)
from posym.core.paper import GAMMA
from posym.errors import PosymError
from posym.runs import OUTPUTS, PIPELINE_MARKER

# ---- commands: run / report / sweep -------------------------------------------------------------


@app.command("run")
def run_command(
    preset: Optional[Preset] = typer.Option(
        None,
        help="Training preset: quick (the default; minutes for "
        "everything on 2 CPU cores), seed or paper (the paper's study; hours "
        "on a CPU, use --device cuda).",
    ),
    task: Optional[list[str]] = list_option(None, "Tasks to run (default: both).", choices=Task),
    out: Path = typer.Option(
        Path("runs/main"),
        help="Output directory: one run directory per task, theory/, "
        "report/ and stages/ (done-files). Re-running the same command continues it.",
    ),
    device: Optional[Device] = typer.Option(
        None,
        help="auto (cuda when available), cpu or cuda for training "
        "and the analyses (default: the --config file's, else auto).",
    ),
    config: Optional[Path] = typer.Option(
        None,
        "--config",
        help="YAML file of pipeline settings (preset, tasks, "
        "seed, train overrides, dynamics_prompts, geometry_prompts, lengthgen, "
        "theory, workers); unknown keys are errors.",
    ),
    workers: Optional[int] = typer.Option(
        None, help="Jobs run side by side in separate processes (default: one per job up to the number of CPU cores)."
    ),
    bench: Optional[Path] = typer.Option(
        None, help="An llm-bench output directory whose Table 3 the report should include."
    ),
) -> None:
    """The whole study: train each task, then dynamics, geometry, length generalization, the theory checks
    and an HTML report; prints a summary table. Finished stages are never recomputed."""
    import time

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from posym import io
    from posym.commands import report
    from posym.commands import run as pipeline

    io.check_output(out, inputs=[config, bench], is_dir=True, marker=PIPELINE_MARKER)
    flags = {
        "preset": preset and str(preset),
        "tasks": values(task, option="--task", choices=Task) or None,
        "device": device and str(device),
        "workers": workers,
    }
    cfg = pipeline.resolve_pipeline(config, {k: v for k, v in flags.items() if v is not None})
    console = Console()
    start = time.perf_counter()
    with Live(console=console, transient=True, refresh_per_second=2) as live:

        def show(lines: list[str]) -> None:
            live.update(f"[bold]posym run[/] {time.perf_counter() - start:5.0f} s\n" + "\n".join(lines))

        result = pipeline.run_pipeline(cfg, out, bench=bench, status=show)
    table = Table(title=f"posym run ({cfg.preset} preset), {result['wall_seconds']:.0f} s")
    for column in (
        "task",
        "step",
        "acc",
        "acc per hop",
        "positional layers",
        "symbolic layers",
        "length generalization",
    ):
        table.add_column(column, justify="left" if "layers" in column or "length" in column else "right")
    for s in result["summary"]:
        table.add_row(
            s["task"],
            str(s["step"]),
            f"{s['acc']:.3f}",
            " / ".join(f"{v:.3f}" for v in s["acc_hops"].values()),
            s["positional"] or "n/a",
            s["symbolic"] or "n/a",
            report.lengthgen_headline(s["lengthgen"]),
        )
    console.print(table)
    console.print(f"report: {result['report']}")


@app.command("report")
def report_command(
    paths: list[Path] = typer.Argument(
        ...,
        help="Directories to report on: posym run directories (with their "
        "analysis/ and lengthgen/), a posym theory output and/or a posym llm-bench output.",
    ),
    out: Optional[Path] = typer.Option(
        None, help="Output directory for report.html and figures/ (default: report/ beside the first directory)."
    ),
    title: str = typer.Option("posym report", help="Title of the page."),
) -> None:
    """One self-contained HTML page (figures inline, opens offline) with the analogues of the paper's
    Fig. 2, 4B, 5A/B, 6, 7, 8 and Tables 1 and 3, plus every figure as PNG and SVG."""
    from posym import io
    from posym.commands import report

    io.check_output(out, inputs=paths, is_dir=True, owns=OUTPUTS["report"])
    html_path = report.build_report(paths, out or Path(paths[0]).resolve().parent / "report", title=title)
    print(f"report: {html_path}")


@app.command("explore")
def explore_command(
    paths: list[Path] = typer.Argument(
        ...,
        metavar="TABLES...",
        help="Score tables: an llm-scores output, an llm-study output, a posym run output, a training run "
        "directory or a posym score Parquet file (beside its .json sidecar).",
    ),
    out: Path = typer.Option(Path("explorer.html"), help="The HTML file to write (one self-contained file)."),
    details: bool = typer.Option(
        True,
        "--details/--no-details",
        help="Attention rows and heaviest swaps: read from the tables where they hold them (llm-scores' "
        "details.parquet), else recomputed from the model the tables name (--no-details: never load a model).",
    ),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        metavar="MODEL",
        help="Use this model instead of the one the "
        "tables name: " + EMBEDDED_HELP + ", a .gguf file or a model directory (e.g. "
        "for an llm-study output without manifest.json).",
    ),
    detail_prompts: int = typer.Option(
        8, min=0, help="Prompts per head set that get attention rows and swaps (at each of their queries)."
    ),
    top: int = typer.Option(8, min=1, help="Heaviest swaps shown per head, prompt and query."),
    device: Device = device_option(" for the model's forward passes"),
    title: Optional[str] = typer.Option(None, help="Title of the page."),
    max_mb: Optional[float] = typer.Option(
        None,
        "--max-mb",
        help="Limit on the file's size in MB (default 25: posym.explorer.MAX_MB): attention rows "
        "and swaps of the prompts past it are left out (the page says so); maps and per-prompt scores "
        "over it are an error.",
    ),
) -> None:
    """An offline HTML head explorer: layer x head maps; per head its attention row, heaviest swaps,
    per-plane scores, margin vs length and per-prompt scores."""
    from posym import io
    from posym.commands import explore

    io.check_output(out, inputs=[*paths, model])
    result = explore.explore(
        paths,
        out,
        details=details,
        model=model,
        detail_prompts=detail_prompts,
        top=top,
        device=device_of(device),
        title=title,
        **({} if max_mb is None else {"max_mb": max_mb}),
    )
    print(
        f"explorer: {result['path']} ({result['bytes'] / 1e6:.2f} MB of at most {result['limit'] / 1e6:g} MB; "
        f"{result['sets']} head sets, {result['heads']} heads, {result['prompts']} prompts, attention rows "
        f"of {result['detail_prompts']})"
    )
    if result["dropped"]:
        print(f"the size limit left out the attention rows of {result['dropped']} prompts (--max-mb)")


@app.command("sweep")
def sweep_command(
    config: Path = typer.Argument(
        ...,
        help="Sweep YAML: tasks, seeds, presets, rotary_dims, rope_bases, rope_bands, "
        "nope_from, train overrides, dynamics, n_prompts, cpus_per_trial, num_cpus (see examples/sweep.yaml).",
    ),
    address: Optional[str] = typer.Option(
        None,
        help="Address of an existing Ray cluster (e.g. 'auto' or "
        "'ray://host:10001'); default: start a local Ray instance.",
    ),
    out: Path = typer.Option(
        Path("runs/sweep"),
        help="Output directory: trials/<name> run directories, "
        "trials.parquet, aggregate.parquet, aggregate.png/svg, sweep.json.",
    ),
    max_concurrent: Optional[int] = typer.Option(
        None, help="Trials running at once (default: as many as Ray's CPUs allow)."
    ),
) -> None:
    """Train a grid of runs (tasks x seeds x presets x RoPE settings) with Ray and aggregate final accuracy
    per hop (and pure-head fractions) as mean and std over seeds. Finished trials are not rerun."""
    import importlib

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    try:
        importlib.import_module("ray")  # the [sweep] extra
    except ImportError:
        raise PosymError("posym sweep runs on Ray, which is not installed: pip install 'posym-rope[sweep]'") from None
    from posym import io
    from posym.commands import sweep

    io.check_output(out, inputs=[config], is_dir=True, owns=OUTPUTS["sweep"])
    cfg = sweep.load_sweep(config)
    console = Console()
    with Progress(console=console, transient=True) as bar:
        job = bar.add_task("trials", total=len(sweep.trials(cfg)))

        def advance(row: dict) -> None:
            if row["status"] != "ok":
                console.print(f"[red]trial {row['name']} failed:[/] {row['error']}")
            bar.advance(job)

        result = sweep.run_sweep(cfg, out, address=address, max_concurrent=max_concurrent, progress=advance)
    table = result["table"]
    view = Table(title=f"{result['trials']} trials, {len(result['failed'])} failed: mean ± std over seeds")
    columns = [c[:-5] for c in table.columns if c.endswith("_mean")]
    for column in ["task", "preset", "rotary_dim", "rope_base", "n_seeds", *columns]:
        view.add_column(column.replace("acc_", ""), justify="right")
    for r in table.to_dict("records"):
        view.add_row(
            r["task"],
            r["preset"],
            str(r["rotary_dim"]),
            f"{r['rope_base']:g}",
            str(r["n_seeds"]),
            *(f"{r[c + '_mean']:.3f} ± {r[c + '_std']:.3f}" for c in columns),
        )
    console.print(view)
    console.print(f"wrote {out}/trials.parquet, aggregate.parquet, aggregate.png/svg, sweep.json")
    if result["failed"]:
        raise PosymError(f"{len(result['failed'])} of {result['trials']} trials failed (see {out}/trials.parquet)")


# ---- commands: ablate / finetune -----------------------------------------------------------------

_HEADS_HELP = (
    "Heads to intervene on, one condition per repetition: positional, symbolic or mixed (labels "
    "from the checkpoint's own scores at hop queries, gamma --gamma), each (every layer on its own) "
    "or indices L.H,L.H (L = all heads of layer L; commas join heads within one condition)."
)


def _condition_table(table, title: str, extra: dict | None = None):
    """A rich table: one row per condition, accuracy per hop at the training length and per length."""
    from rich.table import Table

    keys = [c for c in ("condition", "mode") if c in table.columns]
    hops = sorted(c for c in table.columns if c.startswith("acc_hop"))
    lengths = sorted(table["length"].unique())
    view = Table(
        title=title, caption=f"hopK: accuracy at the training length {lengths[0]}; @L: all-hop accuracy at L tokens"
    )
    for col in [
        *keys,
        "heads",
        *(h.replace("acc_", "") for h in hops),
        *(f"@{k}" for k in lengths),
        *(extra or {}).get("columns", []),
    ]:
        view.add_column(col, justify="left" if col in ("condition", "mode", "heads") else "right")
    for key, rows in table.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        by_length = rows.set_index("length")
        first = by_length.loc[lengths[0]]
        more = (extra or {}).get("rows", {}).get(key[0], ["-"] * len((extra or {}).get("columns", [])))
        names = str(first["heads"]).split()
        view.add_row(
            *map(str, key),
            " ".join(names) if len(names) <= 3 else f"{len(names)} heads",
            *(f"{first[h]:.3f}" for h in hops),
            *(f"{by_length.loc[k, 'acc']:.3f}" for k in lengths),
            *more,
        )
    return view


@app.command("ablate")
def ablate_command(
    path: Path = path_argument(),
    heads: list[str] = typer.Option(..., "--heads", metavar="HEADS", help=_HEADS_HELP),
    mode: list[str] = list_option(
        ["zero,mean"], "zero (head output := 0) and/or mean (:= its mean output on train data).", choices=AblationMode
    ),
    step: Optional[str] = step_option(),
    factors: list[str] = list_option(
        ["1,2,4"],
        "Lengths to evaluate, as multiples of the training length (extra target-window tokens, as posym lengthgen).",
    ),
    n: int = n_option(1000, "Test sequences per length."),
    gamma: float = typer.Option(GAMMA, help="Purity threshold of the positional/symbolic labels (paper: 0.1)."),
    label_prompts: int = typer.Option(100, min=1, help="Test prompts the labels are scored on."),
    seed: int = typer.Option(0, help="Seed of the test data, the label prompts and the mean-ablation data."),
    save: Optional[Path] = typer.Option(
        None,
        help="Also save the pruned model (one --heads, one --mode) as a plain "
        "GPT-J checkpoint: zero = out_proj columns zeroed, mean = also folded into "
        "the layer's MLP output bias.",
    ),
    device: Device = device_option(),
    out: Optional[Path] = typer.Option(
        None, help="Output directory for ablation.parquet/json/png/svg (default: PATH/ablation)."
    ),
) -> None:
    """Ablate heads (zero or mean) and compare accuracy per hop and across lengths with the intact model."""
    from rich.console import Console
    from rich.status import Status
    from transformers.utils import logging as hf_logging

    from posym import io
    from posym.commands.ablate import run_ablation

    hf_logging.disable_progress_bar()
    out = io.check_output(out or Path(path) / "ablation", inputs=[path], is_dir=True, owns=OUTPUTS["ablate"])
    io.check_output(save, inputs=[path], is_dir=True, option="--save")
    device = device_of(device)
    with Status("scoring heads") as status:
        result = run_ablation(
            path,
            heads,
            out,
            modes=tuple(values(mode, option="--mode", choices=AblationMode)),
            step=checkpoint_step(path, step, device),
            factors=values(factors, int, option="--factors"),
            n=n,
            seed=seed,
            n_prompts=label_prompts,
            gamma=gamma,
            save=save,
            device=device,
            progress=lambda text: status.update(f"evaluating {text}"),
        )
    console = Console()
    console.print(announce(result["checkpoint"], result["step"], f"{result['queries']} (the labels)"))
    console.print(_condition_table(result["table"], f"{result['task']} task, step {result['step']}: ablation"))
    for spec in result["skipped"]:
        console.print(f"no head is labelled {spec!r} at gamma {gamma}: condition skipped")
    if "saved" in result:
        console.print(f"pruned model: {result['saved']}")
    console.print(f"wrote {out}/ablation.parquet, ablation.json, ablation.png/svg")


@app.command("finetune")
def finetune_command(
    path: Path = path_argument(),
    freeze: list[str] = typer.Option(
        ["none"],
        "--freeze",
        metavar="HEADS",
        help="Heads kept frozen, one fine-tune "
        "per repetition: none (train everything, the reference) or any --heads value "
        "of posym ablate.",
    ),
    train_steps: int = typer.Option(
        300, "--train-steps", min=1, help="Fine-tuning optimizer steps per condition (linear decay from --lr to 0)."
    ),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate (default: the run's)."),
    step: Optional[str] = step_option(),
    factors: list[str] = list_option(["1,2,4"], "Lengths to evaluate, as multiples of the training length."),
    n: int = n_option(1000, "Test sequences per length."),
    gamma: float = typer.Option(GAMMA, help="Purity threshold of the positional/symbolic labels."),
    seed: int = typer.Option(0, help="Seed of the test data and the label prompts."),
    save_models: bool = typer.Option(False, help="Also save each fine-tuned model under OUT/models/."),
    device: Device = device_option(),
    out: Optional[Path] = typer.Option(None, help="Output directory (default: PATH/finetune)."),
) -> None:
    """Continue training with chosen heads frozen (their q/k/v rows and out_proj columns never change) and
    compare accuracy, length generalization, steps/s and trainable parameters across conditions."""
    from rich.console import Console
    from rich.status import Status
    from transformers.utils import logging as hf_logging

    from posym import io
    from posym.commands.finetune import run_finetune

    hf_logging.disable_progress_bar()
    out = io.check_output(out or Path(path) / "finetune", inputs=[path], is_dir=True, owns=OUTPUTS["finetune"])
    device = device_of(device)
    with Status("scoring heads") as status:
        result = run_finetune(
            path,
            freeze,
            out,
            step=checkpoint_step(path, step, device),
            steps=train_steps,
            lr=lr,
            factors=values(factors, int, option="--factors"),
            n=n,
            seed=seed,
            gamma=gamma,
            save_models=save_models,
            device=device,
            progress=lambda text: status.update(text),
        )
    costs = {
        k: [f"{c['steps_per_s']:.1f}", f"{c['trainable_params']:,}", str(c["frozen_unchanged"])]
        for k, c in result["costs"].items()
    }
    extra = {"columns": ["steps/s", "trainable", "frozen unchanged"], "rows": costs}
    console = Console()
    console.print(announce(result["checkpoint"], result["step"], f"{result['queries']} (the labels)"))
    console.print(
        _condition_table(
            result["table"], f"{result['task']} task, from step {result['step']}: +{train_steps} steps", extra
        )
    )
    for spec in result["skipped"]:
        console.print(f"no head is labelled {spec!r} at gamma {gamma}: condition skipped")
    console.print(f"wrote {out}/finetune.parquet, finetune.json, finetune.png/svg")
