"""posym.commands.validate: validation accuracy recorded in training equals the one computed from the
checkpoints, the best step is the earliest maximum on validation (not test), and `--step best`
selects it in the commands that take --step."""

import json
import shutil

import pandas as pd
import pytest
from cli_runner import run_posym
from tiny_runs import train_tiny

from posym.commands import validate as checkpoints
from posym import models
from posym.core.tasks import SPLIT_SIZES
from posym.errors import PosymError
from posym.models import CHECKPOINT_META, list_checkpoints, resolve_checkpoint


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("ckpt"), "number", steps=40, every=20, eval_size=40)


def _strip_validation(run, into):
    """A copy of `run` as a run from before val_size: no val_* metrics in any posym.json."""
    shutil.copytree(run, into)
    for _, path in list_checkpoints(into):
        meta = json.loads((path / CHECKPOINT_META).read_text())
        meta["metrics"] = {k: v for k, v in meta["metrics"].items() if not k.startswith("val_")}
        (path / CHECKPOINT_META).write_text(json.dumps(meta))
    return into


def test_computed_validation_equals_recorded_and_is_cached(tiny_run, tmp_path):
    recorded = models.validation_table(tiny_run)
    assert (recorded.source == "recorded").all() and not (tiny_run / models.VALIDATION).exists()
    legacy = _strip_validation(tiny_run, tmp_path / "legacy")
    computed = models.validation_table(legacy, n=40)
    assert (computed.source == "computed").all()
    columns = [c for c in recorded if c.startswith("val_acc")]
    pd.testing.assert_frame_equal(recorded[columns], computed[columns])
    assert computed.val_loss.to_numpy() == pytest.approx(recorded.val_loss.to_numpy(), abs=1e-5)
    # cached: a second call evaluates nothing (a progress callback would be called per evaluation)
    calls = []
    again = models.validation_table(legacy, n=40, progress=calls.append)
    assert calls == [] and (again.source == "computed").all()
    pd.testing.assert_frame_equal(again[columns], computed[columns])
    # another n is another evaluation
    models.validation_table(legacy, n=8, progress=calls.append)
    assert calls == [s for s, _ in list_checkpoints(legacy)]


def test_best_step_is_the_earliest_validation_maximum_not_the_test_one(tiny_run, tmp_path):
    run = _strip_validation(tiny_run, tmp_path / "run")
    steps = [s for s, _ in list_checkpoints(run)]  # 0, 1, 2, 4, 8, 16, 20, 40
    val = {s: 0.1 for s in steps} | {8: 0.7, 16: 0.9, 20: 0.9, 40: 0.8}
    frame = pd.DataFrame(
        {
            "step": steps,
            "val_acc": [val[s] for s in steps],
            "val_loss": 1.0,
            "val_n": SPLIT_SIZES["val"],
            "source": "computed",
        }
    )
    frame.to_parquet(run / models.VALIDATION)
    assert models.best_step(run) == 16
    metrics = pd.read_parquet(run / "metrics.parquet")
    metrics["acc"] = [1.0 if s == 40 else 0.0 for s in metrics.step]  # test says 40
    metrics.to_parquet(run / "metrics.parquet")
    result = checkpoints.run_validation(run)
    assert (result["best_step"], result["best_test_step"], result["test_acc_at_best"]) == (16, 40, 0.0)
    assert resolve_checkpoint(run, models.resolve_step(run, "best"))[0].name == "step-00000016"
    assert models.resolve_step(run, 20) == 20 and models.resolve_step(run, None) is None


def test_step_best_in_commands(tiny_run, tmp_path, monkeypatch, capsys):
    best = models.best_step(tiny_run)
    out = tmp_path / "eval.json"
    assert run_posym(monkeypatch, "eval", tiny_run, "--step", "best", "--n", "8", "--out", out) == 0
    assert json.loads(out.read_text())["rows"][0]["step"] == best  # eval --out: manifest + rows
    assert (
        run_posym(
            monkeypatch,
            "lengthgen",
            tiny_run,
            "--step",
            "best",
            "--protocol",
            "paper",
            "--lengths",
            "17",
            "--n",
            "8",
            "--out",
            tmp_path / "lg",
        )
        == 0
    )
    assert json.loads((tmp_path / "lg" / "lengthgen.json").read_text())["step"] == best
    assert run_posym(monkeypatch, "validate", tiny_run) == 0
    assert f"best step by validation: {best}" in capsys.readouterr().out


def test_bad_steps_are_posym_errors(tiny_run, monkeypatch, capsys):
    assert models.parse_step(None) is None and models.parse_step("best") == "best"
    assert models.parse_step("250") == 250
    for bad in ("latest", "-1"):
        with pytest.raises(PosymError, match="--step"):
            models.parse_step(bad)
    single = list_checkpoints(tiny_run)[-1][1]
    with pytest.raises(PosymError, match="needs a run directory"):
        models.resolve_step(single, "best")
    assert run_posym(monkeypatch, "eval", tiny_run, "--step", "lastest") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posym: error: --step") and "\n" not in err
    with pytest.raises(PosymError, match="val split"):
        models.validation_table(tiny_run, n=10**6)
