"""Tiny configurations of whole-pipeline commands, shared by the tests that run them
(importable from any test in tests/):  from tiny_runs import PIPELINE, TRAIN_2HOP
"""

TRAIN_2HOP = {
    "task": {"target_size": 4, "pretarget_size": 3, "max_hops": 2, "alphabet_size": 4, "int_range": 7},
    "model": {"n_layer": 2, "n_head": 1, "n_embd": 32, "dropout": 0.1, "n_positions": 64},
    "lr": 3e-3,
    "warmup_steps": 3,
    "max_steps": 96,
    "batch_size": 8,
    "checkpoint_every": 16,
    "eval_size": 24,
    "eval_batch_size": 12,
    "threads": 1,
    "device": "cpu",
}
"""A `posym train --config` file's content: a 2-layer model on a 2-hop number task (8 tokens) with
dropout, so that resuming needs the RNG; 96 steps with 11 checkpoints take ~2 s, long enough to kill a
process in the middle (the reliability and guard tests)."""

PIPELINE = {
    "train": {
        "max_steps": 12,
        "checkpoint_every": 6,
        "eval_size": 48,
        "val_size": 48,
        "model": {"n_layer": 2, "n_embd": 32},
    },
    "dynamics_prompts": 4,
    "geometry_prompts": 4,
    "lengthgen": {"lengths": [17, 34], "factors": [1, 2], "n": 16},
    "theory": {"n0": [4], "samples": 200, "task_samples": 40, "curve_max_n": 8, "curve_freq_ids": [2]},
}
"""A `posym run --config` file's content: every stage on toy sizes (one task: ~20 s on 2 cores,
most of it the worker processes' imports); checkpoints 0, 1, 2, 4, 6, 12."""


def train_tiny(
    directory,
    task: str = "number",
    *,
    steps: int,
    every: int,
    eval_size: int = 64,
    batch_size: int = 32,
    model: dict | None = None,
    task_overrides: dict | None = None,
    **train,
):
    """A tiny `quick`-preset run trained into `directory`/run (2 layers x 1 head, width 32 unless
    `model` says otherwise; val_size = eval_size unless given); returns the run directory."""
    from posym.commands.train import resolve_config, train as train_run

    overrides = {
        "max_steps": steps,
        "checkpoint_every": every,
        "eval_size": eval_size,
        "val_size": eval_size,
        "batch_size": batch_size,
        "model": {"n_layer": 2, "n_embd": 32, **(model or {})},
        **train,
    }
    if task_overrides:
        overrides["task"] = task_overrides
    return train_run(resolve_config("quick", task, overrides=overrides), directory / "run", progress=False)
