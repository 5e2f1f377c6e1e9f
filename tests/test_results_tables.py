"""The committed tables behind docs/results.md's issue-18 section, read back: columns, ranges, the
claims the text makes from them, and a few rows recomputed with the code that wrote them."""

from pathlib import Path

import pandas as pd
import pytest

from posym.core.constructions import index_head
from posym.core.tasks import TaskConfig
from posym.core.theory import check_length, frequency_angle, index_bound, index_inputs

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def test_theorem32_max_vs_min_table():
    table = pd.read_parquet(RESULTS / "theorem32_max_vs_min.parquet")
    assert {"head", "n", "theta", "bound", "symbols", "input_set", "gap_max", "delta", "correct", "inputs",
            "ok_max", "ok_min"} <= set(table.columns)
    for head in ("index", "retrieval"):
        assert table[table["head"] == head].n.tolist() == list(range(1, 65))
    assert (table.delta <= table.gap_max).all() and (table.delta > 0).all() and (table.correct == 1.0).all()
    assert (table.ok_max == (table.gap_max <= table.bound + 1e-12)).all()
    # the claims of docs/results.md: with the minimum (posym's Delta) both bounds hold at every length;
    # with the maximum T_Index breaks at n = 8-12 and 29-56, T_Retrieval at every length 1..64
    assert table.ok_min.all()
    index, retrieval = table[table["head"] == "index"], table[table["head"] == "retrieval"]
    assert index[~index.ok_max].n.tolist() == [*range(8, 13), *range(29, 57)]
    assert retrieval[~retrieval.ok_max].n.tolist() == list(range(1, 65))
    assert (index.input_set == "exhaustive").all()
    # recomputed: T_Index on every input at two lengths, one inside and one outside the failures
    num = TaskConfig("number", int_range=64)
    theta = frequency_angle(2)
    for n in (10, 57):
        stats = check_length(index_head(num, theta), num, index_inputs(num, n, 0))
        row = index[index.n == n].iloc[0]
        assert (row.gap_max, row.delta) == pytest.approx((stats["gap_max"], stats["delta"]), abs=1e-9)
        assert row.bound == pytest.approx(index_bound(theta, n))


def test_precision_table():
    table = pd.read_parquet(RESULTS / "precision_quick_number.parquet")
    metrics = ("acc", "loss", "val_acc", "train_loss")
    assert {"seed", "step", *(f"{m}_{p}" for m in metrics for p in ("fp32", "bf16")), *(f"d_{m}" for m in metrics)} \
        <= set(table.columns)
    assert sorted(table.seed.unique()) == [0, 1, 2]
    for m in metrics:  # train_loss is NaN at step 0 (no step taken yet)
        pd.testing.assert_series_equal(table[f"d_{m}"], table[f"{m}_bf16"] - table[f"{m}_fp32"], check_names=False)
    for column in ("acc_fp32", "acc_bf16", "val_acc_fp32", "val_acc_bf16"):
        assert table[column].between(0, 1).all()
    # every seed starts from the same weights in both precisions: step 0 is identical
    first = table[table.step == 0]
    assert len(first) == 3 and (first.d_acc == 0).all() and (first.d_loss == 0).all()
    # the claim of docs/results.md: at every step all seeds reached, bf16's largest accuracy
    # difference from fp32 stays within fp32's seed spread + 0.01
    reached = table.groupby("step").filter(lambda g: len(g) == 3)
    by_step = reached.groupby("step").agg(d=("d_acc", lambda d: d.abs().max()),
                                          spread=("acc_fp32", lambda a: a.max() - a.min()))
    assert (by_step.d <= by_step.spread + 0.01).all()
