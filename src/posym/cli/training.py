"""`posym data`, `posym train`, `posym eval`: the tasks as files and GPT-J training."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posym.cli import app, progress_bar
from posym.errors import PosymError


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
    markers: bool = typer.Option(False, help="Slot markers: every target-window token carries its place in "
                                 "the window as its own token (n@3); positions and answers are unchanged."),
) -> None:
    """Generate a number- or letter-task dataset (with a JSON manifest) for training or evaluation."""

    from posym import io
    from posym.commands import datasets
    from posym.core import tasks

    io.check_output(out)
    knobs = dict(target_size=target_size, pretarget_size=pretarget_size, max_hops=max_hops,
                 alphabet_size=alphabet_size, int_range=int_range, extra_target=extra_target)
    config = tasks.task_config(task, markers=markers, **{k: v for k, v in knobs.items() if v is not None})
    bar, advance = progress_bar(n, f"{task} task, {split}")
    with bar:
        path = datasets.save_dataset(config, n, seed, split, out, fmt, progress=advance)
    print(f"wrote {n} {task}-task sequences to {path} (manifest {datasets.manifest_path(path)})")

# ---- commands: train / eval (model, train) ------------------------------------------------------


@app.command("train")
def train_command(
    preset: str = typer.Option("quick", help="Starting point: 'quick' (minutes on a CPU), 'paper' (12 layers "
                               "x 1 head, 6,000 steps, SPEC 2) or 'seed' (6 layers x 8 heads)."),
    task: str = typer.Option("number", help="Task to learn: 'number' (positional) or 'letter' (symbolic)."),
    out: Optional[Path] = typer.Option(None, help="New run directory (must not exist or be empty)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file overriding any field of the "
                                          "preset (e.g. 'lr: 3e-4' or 'model: {n_layer: 4}'); unknown keys are errors."),
    seed: Optional[int] = typer.Option(None, help="Seed of initialisation, dropout and data (default: the preset's, 0)."),
    steps: Optional[int] = typer.Option(None, help="Optimizer steps (default: the preset's)."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or auto (default: auto)."),
    resume: Optional[Path] = typer.Option(None, help="Continue this run directory from its latest checkpoint "
                                          "with its own config.yaml (other options are not allowed)."),
    stop_at: Optional[int] = typer.Option(None, help="Stop after a checkpoint at this step, keeping the "
                                          "schedule of the full run; --resume continues it (train in pieces)."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Train a GPT-J on a multi-hop task, saving checkpoints, metrics.parquet and train.log in a run directory."""
    from posym import io
    from posym.commands import train

    io.check_output(out, inputs=[config], is_dir=True)
    if resume is not None:
        given = [name for name, value in (("--out", out), ("--config", config), ("--seed", seed),
                                          ("--steps", steps), ("--device", device)) if value is not None]
        if given:
            raise PosymError(f"--resume continues a run with its own config; drop {', '.join(given)}")
        run_dir = train.train(None, resume, resume=True, progress=progress, stop_at=stop_at)
    else:
        if out is None:
            raise PosymError("give the new run directory with --out (or --resume RUN_DIR)")
        flags = {"seed": seed, "max_steps": steps, "device": device}
        cfg = train.resolve_config(preset, task, config, {k: v for k, v in flags.items() if v is not None})
        run_dir = train.train(cfg, out, progress=progress, stop_at=stop_at)
    print(f"run directory: {run_dir}")


@app.command("eval")
def eval_command(
    path: Path = typer.Argument(..., help="A run directory (uses its latest checkpoint unless --step) or one "
                                "checkpoint directory."),
    step: Optional[int] = typer.Option(None, help="Checkpoint step to evaluate in a run directory."),
    task: Optional[str] = typer.Option(None, help="Task to evaluate on (default: the checkpoint's own task config)."),
    n: int = typer.Option(2000, "--n", help="Test sequences per evaluation."),
    extra_target: Optional[list[int]] = typer.Option(None, help="Extra target-window tokens before the "
                                                     "effective window (length generalization); repeat for several."),
    seed: int = typer.Option(0, help="Seed of the test data."),
    split: str = typer.Option("test", help="Split to draw the data from: train, val or test."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    out: Optional[Path] = typer.Option(None, help="Also write the results as JSON to this file."),
) -> None:
    """Accuracy (overall and per hop count) and loss of one checkpoint on a task, optionally at longer lengths."""
    from rich.console import Console
    from rich.table import Table

    from posym import io
    from posym.commands import train

    io.check_output(out, inputs=[path])
    rows = train.evaluate_checkpoint(path, step=step, task=task, n=n, extra_targets=extra_target or [0],
                                     seed=seed, split=split, device=device)
    table = Table(title=f"{rows[0]['task']} task, {rows[0]['checkpoint']}")
    keys = [k for k in rows[0] if k in ("extra_target", "seq_len", "loss") or k.startswith("acc")]
    for key in keys:
        table.add_column(key.replace("acc_", "").replace("extra_target", "extra"), justify="right")
    for row in rows:
        table.add_row(*(f"{row[k]:.4f}" if isinstance(row[k], float) else str(row[k]) for k in keys))
    Console().print(table)
    if out is not None:
        io.write_json(out, rows)
