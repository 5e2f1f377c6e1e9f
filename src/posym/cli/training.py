"""`posym data`, `posym train`, `posym eval`: the tasks as files and GPT-J training."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posym.cli import app, checkpoint_step, progress_bar
from posym.cli.options import (
    Device,
    Dtype,
    Format,
    OnOff,
    Preset,
    Split,
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
from posym.errors import PosymError
from posym.runs import RUN_FILES

# ---- commands: data (tasks) -------------------------------------------------------------------


@app.command("data")
def data_command(
    task: Task = typer.Option(Task.number, help="Which task: number (positional) or letter (symbolic)."),
    n: int = n_option(1000, "How many sequences to write."),
    seed: int = typer.Option(0, help="Random seed; the same seed, split and config give the same data."),
    split: Split = typer.Option(Split.train, help="Which split's random stream."),
    fmt: Format = typer.Option(Format.parquet, "--format", help="File format."),
    out: Path = typer.Option(..., help="Output file; its manifest is written next to it as OUT.manifest.json."),
    target_size: Optional[int] = typer.Option(None, help="Target-window tokens (paper: 8)."),
    pretarget_size: Optional[int] = typer.Option(None, help="Pre-target-window tokens (paper: 8)."),
    max_hops: Optional[int] = typer.Option(None, help="Hops run 1..max-hops in equal shares (paper: 4)."),
    alphabet_size: Optional[int] = typer.Option(
        None, help="Symbols (number task, paper 120) or letters (letter task, paper 8)."
    ),
    int_range: Optional[int] = typer.Option(
        None, help="Offsets 1..R (number task, paper 16) or numbers 1..R in target pairs (letter task, paper 8)."
    ),
    extra_target: int = typer.Option(
        0, help="Length extension: extra target-window tokens before the effective target window."
    ),
    markers: OnOff = typer.Option(
        OnOff.off,
        help="Slot markers: on tags every target-window token with its "
        "place in the window as its own token (n@3); positions and answers are unchanged.",
    ),
) -> None:
    """Generate a number- or letter-task dataset (with a JSON manifest) for training or evaluation."""

    from posym import io
    from posym.commands import data as datasets
    from posym.core.tasks import task_config

    io.check_output(out)
    knobs = dict(
        target_size=target_size,
        pretarget_size=pretarget_size,
        max_hops=max_hops,
        alphabet_size=alphabet_size,
        int_range=int_range,
        extra_target=extra_target,
    )
    task, split, fmt = str(task), str(split), str(fmt)
    config = task_config(task, markers=markers == OnOff.on, **{k: v for k, v in knobs.items() if v is not None})
    bar, advance = progress_bar(n, f"{task} task, {split}")
    with bar:
        path = datasets.save_dataset(config, n, seed, split, out, fmt, progress=advance)
    print(f"wrote {n} {task}-task sequences to {path} (manifest {datasets.manifest_path(path)})")


# ---- commands: train / eval (model, train) ------------------------------------------------------


@app.command("train")
def train_command(
    preset: Preset = typer.Option(
        Preset.quick,
        help="Starting point: quick (minutes on a CPU), paper (the "
        "paper's 12 layers x 1 head, 6,000 steps), authors (paper with the authors' effective embedding dropout 0) "
        "or seed (6 layers x 8 heads).",
    ),
    task: Task = typer.Option(Task.number, help="Task to learn: number (positional) or letter (symbolic)."),
    out: Optional[Path] = typer.Option(None, help="New run directory (must not exist or be empty)."),
    config: Optional[Path] = typer.Option(
        None,
        "--config",
        help="YAML file overriding any field of the "
        "preset (e.g. 'lr: 3e-4' or 'model: {n_layer: 4}'); unknown keys are errors.",
    ),
    seed: Optional[int] = typer.Option(
        None, help="Seed of initialisation, dropout and data (default: the preset's, 0)."
    ),
    train_steps: Optional[int] = typer.Option(
        None, "--train-steps", min=1, help="Optimizer steps (default: the preset's)."
    ),
    device: Optional[Device] = typer.Option(
        None, help="auto (cuda when available), cpu or cuda (default: the --config file's, else auto)."
    ),
    precision: Optional[Dtype] = typer.Option(
        None,
        help="float32 (default, exact) or bfloat16 (forward and loss "
        "under bfloat16 autocast; docs/results.md compares them).",
    ),
    threads: Optional[int] = typer.Option(
        None, min=1, help="torch CPU threads (default: the --config file's, else torch's default)."
    ),
    resume: Optional[Path] = typer.Option(
        None,
        help="Continue this run directory from its latest checkpoint "
        "with its own config.yaml (only --device, --threads, --stop-at and "
        "--progress are allowed: where it runs, not what it computes).",
    ),
    stop_at: Optional[int] = typer.Option(
        None,
        help="Stop after a checkpoint at this step, keeping the "
        "schedule of the full run; --resume continues it (train in pieces).",
    ),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Train a GPT-J on a multi-hop task, saving checkpoints, metrics.parquet and train.log in a run directory."""
    from posym import io
    from posym.commands import train

    io.check_output(out, inputs=[config], is_dir=True, owns=RUN_FILES)
    if resume is not None:
        given = [
            name
            for name, value in (
                ("--out", out),
                ("--config", config),
                ("--seed", seed),
                ("--train-steps", train_steps),
                ("--precision", precision),
            )
            if value is not None
        ]
        if given:
            raise PosymError(f"--resume continues a run with its own config; drop {', '.join(given)}")
        run_dir = train.train(
            None,
            resume,
            resume=True,
            progress=progress,
            stop_at=stop_at,
            device=device and str(device),
            threads=threads,
        )
    else:
        if out is None:
            raise PosymError("give the new run directory with --out (or --resume RUN_DIR)")
        flags = {
            "seed": seed,
            "max_steps": train_steps,
            "device": device and str(device),
            "precision": precision and str(precision),
            "threads": threads,
        }
        cfg = train.resolve_config(str(preset), str(task), config, {k: v for k, v in flags.items() if v is not None})
        run_dir = train.train(cfg, out, progress=progress, stop_at=stop_at)
    print(f"run directory: {run_dir}")


@app.command("eval")
def eval_command(
    path: Path = path_argument(),
    step: Optional[str] = step_option(),
    task: Optional[Task] = typer.Option(None, help="Task to evaluate on (default: the checkpoint's own task config)."),
    n: int = n_option(2000, "Test sequences per evaluation."),
    extra_target: Optional[list[str]] = list_option(
        ["0"], "Extra target-window tokens before the effective window (length generalization)."
    ),
    seed: int = typer.Option(0, help="Seed of the test data."),
    split: Split = typer.Option(Split.test, help="Split to draw the data from."),
    device: Device = device_option(),
    out: Optional[Path] = typer.Option(None, help="Also write the results as JSON to this file."),
) -> None:
    """Accuracy (overall and per hop count) and loss of one checkpoint on a task, optionally at longer lengths."""
    from rich.console import Console
    from rich.table import Table

    from posym import io
    from posym.commands import eval as eval_command

    io.check_output(out, inputs=[path])
    device = device_of(device)
    rows = eval_command.evaluate_checkpoint(
        path,
        step=checkpoint_step(path, step, device),
        task=task and str(task),
        n=n,
        seed=seed,
        split=str(split),
        extra_targets=values(extra_target, int, option="--extra-target") or [0],
        device=device,
    )
    print(announce(rows[0]["checkpoint"], rows[0].get("step"), "last (the answer token)"))
    table = Table(title=f"{rows[0]['task']} task, {rows[0]['checkpoint']}")
    keys = [k for k in rows[0] if k in ("extra_target", "seq_len", "loss") or k.startswith("acc")]
    for key in keys:
        table.add_column(key.replace("acc_", "").replace("extra_target", "extra"), justify="right")
    for row in rows:
        table.add_row(*(f"{row[k]:.4f}" if isinstance(row[k], float) else str(row[k]) for k in keys))
    Console().print(table)
    if out is not None:
        settings = {
            "checkpoint": rows[0]["checkpoint"],
            "step": rows[0].get("step"),
            "queries": "last",
            "n": n,
            "split": str(split),
        }
        io.write_json(out, {**io.manifest(settings, seed=seed), **settings, "rows": rows})


@app.command("validate")
def validate_command(
    path: Path = path_argument("A posym run directory."),
    n: Optional[int] = typer.Option(
        None,
        "--n",
        min=1,
        help="Val-split samples for checkpoints that recorded none (default: the whole split, 2,400).",
    ),
    device: Device = device_option(),
) -> None:
    """Validation accuracy of every checkpoint (recorded in training, else computed and cached in
    PATH/validation.parquet) and the best step by validation, which `--step best` selects."""
    from posym.commands import validate
    from posym.models import list_checkpoints

    total = len(list_checkpoints(path)) if Path(path).is_dir() else 0
    bar, advance = progress_bar(total, "validating checkpoints")
    with bar:
        result = validate.run_validation(path, n=n, device=device_of(device), progress=lambda step: advance())
    print(
        f"best step by validation: {result['best_step']} (val acc {result['best_val_acc']:.4f}, "
        f"test acc {result['test_acc_at_best']:.4f}); best step by test: {result['best_test_step']}; "
        f"wrote {Path(path) / 'validation.json'}"
    )
