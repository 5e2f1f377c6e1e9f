"""`posym eval`: accuracy (overall and per hop count) and loss of one checkpoint on a task, optionally at
longer lengths (extra target-window tokens, batches bounded as `posym lengthgen` bounds them).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from posym.core.lengthgen import LengthGenConfig, batch_size
from posym.core.tasks import task_config
from posym.core.train import evaluate
from posym.errors import PosymError
from posym.models import load_checkpoint
from posym.resources import check_count, sequence_bytes


def evaluate_checkpoint(
    path: str | Path,
    *,
    step: int | None = None,
    task: str | None = None,
    n: int = 2000,
    extra_targets: list[int] = (0,),
    seed: int = 0,
    split: str = "test",
    device: str = "cpu",
) -> list[dict]:
    """`evaluate` one checkpoint on its own task config (or the paper's `task`) per extra_target.

    Each row: checkpoint, step, task, extra_target, seq_len and the `evaluate` metrics.
    """
    model, info = load_checkpoint(path, step=step, device=device)
    if task is not None:
        base = task_config(task)
    elif info["task_config"] is not None:
        base = info["task_config"]
    else:
        raise PosymError(f"{info['path']} has no posym.json with its task; pass --task number or --task letter")
    rows = []
    for extra in extra_targets:
        cfg = dataclasses.replace(base, extra_target=extra)
        if cfg.vocab_size > model.config.vocab_size:
            raise PosymError(
                f"the {cfg.task} task needs {cfg.vocab_size} token ids but the model has {model.config.vocab_size}"
            )
        if cfg.seq_len > model.config.n_positions:
            raise PosymError(
                f"sequences of {cfg.seq_len} tokens exceed the model's {model.config.n_positions} positions"
            )
        check_count("--n", n, sequence_bytes(cfg), what=f"{cfg.seq_len}-token test sequence")
        # the batch rule of posym lengthgen: bounded tokens per forward pass keep long lengths in memory
        metrics = evaluate(model, cfg, n, seed, split, batch_size(cfg.seq_len, LengthGenConfig.max_tokens))
        rows.append(
            {
                "checkpoint": str(info["path"]),
                "step": info["step"],
                "task": cfg.task,
                "extra_target": extra,
                "seq_len": cfg.seq_len,
                **metrics,
            }
        )
    return rows
