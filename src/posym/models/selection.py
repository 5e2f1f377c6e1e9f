"""Which checkpoint `--step` names: a step number, or `best`, the earliest checkpoint with the highest
validation accuracy (`validation_table`: the val metrics training recorded in each checkpoint's posym.json,
else computed once and kept in RUN/validation.parquet; `best_step`, `resolve_step`, `parse_step`).

Asked by the CLI before a command loads its model, so it sits above the loading steps: a `--step best`
walks here -> `posym.models.checkpoints` for the checkpoints it has to evaluate.
"""

from __future__ import annotations

from pathlib import Path

from posym.core.tasks import SPLIT_SIZES
from posym.core.train import evaluate
from posym.errors import PosymError
from posym.io import read_parquet, write_parquet
from posym.models.checkpoints import load_checkpoint, read_checkpoint_meta
from posym.runs import CHECKPOINTS, VALIDATION, list_checkpoints

BEST = "best"
"""The --step value that selects the best checkpoint by validation accuracy."""


def parse_step(text: str | None) -> int | str | None:
    """A --step value: None, "best" or a non-negative integer step (a PosymError otherwise)."""
    if text is None or text == BEST:
        return text
    try:
        step = int(text)
    except ValueError:
        raise PosymError(f"--step must be a checkpoint step or 'best', got {text!r}") from None
    if step < 0:
        raise PosymError(f"--step must be >= 0, got {step}")
    return step


def _recorded(meta: dict) -> dict | None:
    """The val_* metrics training recorded in a checkpoint's posym.json, or None."""
    metrics = meta.get("metrics") or {}
    if "val_acc" not in metrics:
        return None
    return {k: v for k, v in metrics.items() if k.startswith("val_")}


def validation_table(run_dir, *, n: int | None = None, device: str = "cpu", progress=None):
    """Validation metrics of every checkpoint of `run_dir` (see the module docstring); progress:
    optional callable(step) after each computed checkpoint."""
    import pandas as pd

    run_dir = Path(run_dir)
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise PosymError(f"{run_dir} has no checkpoints/step-* directories (is it a posym run directory?)")
    n = SPLIT_SIZES["val"] if n is None else n
    if not 1 <= n <= SPLIT_SIZES["val"]:
        raise PosymError(f"the val split has {SPLIT_SIZES['val']} samples; n must be 1..{SPLIT_SIZES['val']}, got {n}")
    cache_path = run_dir / VALIDATION
    cached = read_parquet(cache_path) if cache_path.is_file() else pd.DataFrame(columns=["step", "val_n"])
    cached = cached[cached.val_n == n].set_index("step")
    rows, computed = [], False
    for step, path in checkpoints:
        meta = read_checkpoint_meta(path) or {}
        recorded = _recorded(meta)
        if recorded is not None:
            rows.append({"step": step, **recorded, "source": "recorded"})
        elif step in cached.index:
            rows.append({"step": step, **cached.loc[step].to_dict()})
        else:
            model, info = load_checkpoint(path, device=device, attn_implementation="sdpa")
            if info["task_config"] is None:
                raise PosymError(f"{path} has no posym.json task config; cannot evaluate it on the val split")
            # the run's own seed: the val samples training records for runs with val_size > 0
            metrics = evaluate(model, info["task_config"], n, int(meta.get("seed", 0)), "val")
            rows.append({"step": step, **{f"val_{k}": v for k, v in metrics.items()}, "source": "computed"})
            computed = True
            if progress is not None:
                progress(step)
    table = pd.DataFrame(rows)
    table = table[
        ["step", "val_acc", "val_loss"] + sorted(c for c in table if c.startswith("val_acc_hop")) + ["val_n", "source"]
    ]
    if computed:
        write_parquet(cache_path, table[table.source != "recorded"])
    return table


def resolve_step(path, step: int | str | None, *, device: str = "cpu") -> int | None:
    """`step` as the commands take it: "best" becomes the best step of the run directory `path`
    (`best_step`), anything else is returned as it is."""
    if step != BEST:
        return step
    path = Path(path)
    if (path / "config.json").is_file() or not (path / CHECKPOINTS).is_dir():
        raise PosymError(f"--step best needs a run directory with checkpoints; {path} is not one")
    return best_step(path, device=device)


def best_step(run_dir, *, device: str = "cpu") -> int:
    """The earliest checkpoint step with the highest validation accuracy."""
    table = validation_table(run_dir, device=device)
    best = table.val_acc.max()
    return int(table[table.val_acc == best].step.min())
