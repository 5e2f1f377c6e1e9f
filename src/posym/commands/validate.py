"""`posym validate` and `--step best`: checkpoint selection by validation accuracy. The authors'
trainer keeps its best checkpoint by validation accuracy, so the "max-accuracy step" of the analyses is chosen on the val split, never
on the test split the results are reported on.

`validation_table(run_dir)` gives one row per checkpoint: step, val_acc, val_loss, val_acc_hop1..H,
val_n and source. Runs trained with `val_size` > 0 recorded these at every checkpoint (posym.json
metrics, source "recorded"); for other runs (trained before val_size existed, or with 0) they are
computed here from the checkpoints on the first `n` val-split samples (default: the whole split,
2,400; source "computed") and cached in RUN_DIR/validation.parquet, so a second call only
evaluates checkpoints added since. `best_step` is the earliest step with the highest val_acc (as
the Hugging Face Trainer, which replaces its best checkpoint only on a strict improvement).
"""

from __future__ import annotations

from pathlib import Path

from posym import io
from posym.models import validation_table
from posym.runs import RunDir


def run_validation(run_dir, *, n: int | None = None, device: str = "cpu", progress=None) -> dict:
    """`posym validate`: the validation table, with test accuracy beside it, the best step by
    validation and the best step by test (for comparison only); writes RUN_DIR/validation.json."""
    run_dir = Path(run_dir)
    table = validation_table(run_dir, n=n, device=device, progress=progress)
    test = io.read_parquet(RunDir(run_dir).metrics).drop_duplicates("step", keep="last")[["step", "acc"]]
    table = table.merge(test, on="step", how="left")
    best = int(table[table.val_acc == table.val_acc.max()].step.min())
    best_test = int(table[table.acc == table.acc.max()].step.min())
    result = {
        **io.manifest({"run_dir": str(run_dir), "n": n}),
        "best_step": best,
        "best_val_acc": float(table.set_index("step").val_acc[best]),
        "test_acc_at_best": float(table.set_index("step").acc[best]),
        "best_test_step": best_test,
        "rows": table.to_dict("records"),
    }
    io.write_json(RunDir(run_dir).validation_json, result)
    return result
