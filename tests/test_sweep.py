"""posym sweep: strict YAML, the grid, aggregation against a plain loop, failures, one local Ray run."""

import itertools
import json
import os
import statistics

import pandas as pd
import pytest
import yaml
from cli_runner import run_posym

from posym import io
from posym.commands import sweep
from posym.errors import PosymError

TINY_TRAIN = {
    "max_steps": 4,
    "checkpoint_every": 2,
    "eval_size": 16,
    "val_size": 16,
    "model": {"n_layer": 1, "n_embd": 16},
}


def test_yaml_keys_are_strict(tmp_path):
    path = tmp_path / "s.yaml"
    for text, message in [
        ("seed: [0]\n", "unknown key 'seed'"),
        ("rope_base: [500]\n", "unknown key 'rope_base'"),
        ("seeds: 3\n", "must be a list"),
        ("seeds: []\n", "non-empty"),
        ("dynamics: yes please\n", "true or false"),
        ("train: [1]\n", "train must be a mapping"),
    ]:
        path.write_text(text)
        with pytest.raises(PosymError, match=message):
            sweep.load_sweep(path)
    path.write_text("train: {max_stepz: 3}\n")
    with pytest.raises(PosymError, match="unknown key 'max_stepz'"):
        sweep.trials(sweep.load_sweep(path))  # train keys fail before any trial starts
    for text, message in [
        ("rotary_dims: [null, 64]\n", "same trial twice: rotary_dims"),  # quick: head dim 64
        ("rope_bands: [null, [[1, 32]]]\n", "same trial twice: rope_bands"),  # 32 planes
        ("nope_from: [8, null]\n", "same trial twice: nope_from"),  # 8 layers
        ("rope_bands: [[1, 8]]\n", "must be a list"),  # one nesting level short
        ("rope_bands: [[[0, 8]]]\n", "1 <= first <= last <= 32"),
        ("rope_bands: [[[1, 8], [1, 8]]]\n", "1 band \\(every layer\\) or 8"),
        ("nope_from: [9]\n", "layer index in 0..8"),
        ("nope_from: [0, 0]\n", "without repeats"),
    ]:
        path.write_text(text)
        with pytest.raises(PosymError, match=message):
            sweep.trials(sweep.load_sweep(path))


def test_example_files_are_valid():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples"
    grid = sweep.trials(sweep.load_sweep(examples / "sweep.yaml"))
    assert len(grid) == 2 * 3 * 1 * 2
    assert {t["rotary_dim"] for t in grid} == {64, 32} and {t["rope_base"] for t in grid} == {10000.0}
    bands = sweep.trials(sweep.load_sweep(examples / "rope_bands.yaml"))
    assert [t["name"] for t in bands[:4]] == [
        "number-quick-rot64-base10000-seed0",
        "number-quick-rot64-base10000-nope0-seed0",
        "number-quick-rot64-base10000-band1-8-seed0",
        "number-quick-rot64-base10000-band25-32-seed0",
    ]
    assert len(bands) == 2 * 4 and {t["config"]["max_steps"] for t in bands} == {1000}


def test_rope_band_grid_against_layer_bands():
    """Every combination of the RoPE axes, compared through posym.core.rope.layer_bands (the reference):
    trials are pairwise different models, and every combination is one of them."""
    from posym.core.model import ModelConfig
    from posym.core.rope import layer_bands

    bands, nopes = [None, [[1, 8]], [[1, 4], [5, 8]]], [None, 0, 1]
    config = sweep.SweepConfig(
        tasks=["number"], seeds=[0], rope_bands=bands, nope_from=nopes, train={"model": {"n_layer": 2}}
    )
    grid = sweep.trials(config)
    effective = [layer_bands(ModelConfig(**t["config"]["model"])) for t in grid]
    assert len({repr(e) for e in effective}) == len(grid) == 3 * 3 - 2  # with nope_from 0 every band is NoPE
    for b, n in itertools.product(bands, nopes):
        model = ModelConfig(n_layer=2, n_embd=64, rope_bands=b, nope_from=n)
        assert layer_bands(model) in effective
    names = [t["name"].removeprefix("number-quick-rot64-base10000").removesuffix("-seed0") for t in grid]
    assert names == ["", "-nope0", "-nope1", "-band1-8", "-band1-8-nope1", "-band1-4_5-8", "-band1-4-nope1"]
    assert [(t["rope_bands"], t["nope_from"]) for t in grid][:3] == [("all", 2), ("none", 0), ("all", 1)]


def test_grid():
    config = sweep.SweepConfig(
        tasks=["letter"],
        seeds=[3, 4],
        presets=["quick", "seed"],
        rotary_dims=[None, 8],
        rope_bases=[500.0],
        train={"max_steps": 9, "model": {"n_layer": 2}},
    )
    grid = sweep.trials(config)
    assert len(grid) == 2 * 2 * 2
    names = [t["name"] for t in grid]
    assert names[:4] == [
        "letter-quick-rot64-base500-seed3",
        "letter-quick-rot64-base500-seed4",
        "letter-quick-rot8-base500-seed3",
        "letter-quick-rot8-base500-seed4",
    ]
    assert "letter-seed-rot16-base500-seed3" in names  # the seed preset has 8 heads of 16 dims
    for t in grid:
        c = t["config"]
        assert (c["seed"], c["max_steps"], c["model"]["n_layer"], c["preset"]) == (t["seed"], 9, 2, t["preset"])
        assert c["model"]["rotary_dim"] in (None, 8) and c["model"]["rope_base"] == t["rope_base"] == 500.0


def test_aggregate_matches_loop():
    rows = pd.DataFrame(
        [
            {
                "task": "number",
                "preset": "quick",
                "rotary_dim": 64,
                "rope_base": 1e4,
                "rope_bands": "all",
                "nope_from": 8,
                "seed": s,
                "status": "ok",
                "acc": a,
                "acc_hop1": h,
            }
            for s, a, h in [(0, 0.9, 1.0), (1, 0.7, 0.5), (2, 0.2, 0.25)]
        ]
        + [
            {
                "task": "number",
                "preset": "quick",
                "rotary_dim": 64,
                "rope_base": 1e4,
                "rope_bands": "all",
                "nope_from": 8,
                "seed": 3,
                "status": "failed",
                "acc": None,
                "acc_hop1": None,
            },
            {
                "task": "letter",
                "preset": "quick",
                "rotary_dim": 64,
                "rope_base": 1e4,
                "rope_bands": "all",
                "nope_from": 8,
                "seed": 0,
                "status": "ok",
                "acc": 1.0,
                "acc_hop1": 1.0,
            },
        ]
    )
    table = sweep.aggregate(rows).set_index("task")
    ok = [(0.9, 1.0), (0.7, 0.5), (0.2, 0.25)]
    assert table.loc["number", "n_seeds"] == 3  # the failed trial is not averaged
    assert table.loc["number", "acc_mean"] == pytest.approx(statistics.mean(a for a, _ in ok))
    assert table.loc["number", "acc_std"] == pytest.approx(statistics.stdev(a for a, _ in ok))
    assert table.loc["number", "acc_hop1_std"] == pytest.approx(statistics.stdev(h for _, h in ok))
    assert table.loc["letter", "n_seeds"] == 1 and pd.isna(table.loc["letter", "acc_std"])


def test_failed_trial_is_a_row(tmp_path):
    trial = sweep.trials(sweep.SweepConfig(tasks=["number"], seeds=[0], train=TINY_TRAIN))[0]
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "x").write_text("x")
    row = sweep.run_trial(trial, str(tmp_path / "occupied"), False, 4, 1)
    assert row["status"] == "failed" and "already exists and is not empty" in row["error"]
    assert row["name"] == trial["name"] and "acc" not in row


def test_a_second_sweep_into_the_same_out_is_refused(tmp_path, monkeypatch, capsys):
    """While one sweep holds OUT (here: its lock, held by this test), another is refused with one line
    naming the holder, before any trial starts or any table is written."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"tasks": ["number"], "seeds": [0], "train": TINY_TRAIN}))
    out = tmp_path / "out"
    with io.locked(out):
        assert run_posym(monkeypatch, "sweep", path, "--out", out) == 2
        assert sorted(p.name for p in out.iterdir()) == [io.LOCK]
    err = capsys.readouterr().err
    assert f"{out} is in use by posym process {os.getpid()}" in err


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config=sweep.LOCAL_RAY)
    yield ray
    ray.shutdown()


def test_two_trials_on_local_ray(local_ray, tmp_path, monkeypatch, capsys):
    """Two trials on local Ray, one forced to fail; the other finishes and is aggregated; a re-run
    after fixing the cause runs only the failed one (the first is skipped by its done-file)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tasks": ["number"],
                "seeds": [0, 1],
                "rope_bases": [500.0],
                "rope_bands": [[[1, 4]]],
                "train": TINY_TRAIN,
                "dynamics": True,
                "n_prompts": 3,
            }
        )
    )
    out = tmp_path / "out"
    blocker = out / "trials" / "number-quick-rot16-base500-band1-4-seed1" / "junk"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a run")
    assert run_posym(monkeypatch, "sweep", path, "--out", out, "--max-concurrent", 1) == 2
    captured = capsys.readouterr()
    assert (
        "trial number-quick-rot16-base500-band1-4-seed1 failed" in captured.out
        and "1 of 2 trials failed" in captured.err
    )
    rows = pd.read_parquet(out / "trials.parquet")
    assert rows.status.tolist() == ["ok", "failed"]
    assert rows.step[0] == 4 and 0 <= rows.acc[0] <= 1 and 0 <= rows.frac_symbolic[0] <= 1
    table = pd.read_parquet(out / "aggregate.parquet")
    assert table.n_seeds.tolist() == [1] and table.acc_mean[0] == rows.acc[0]
    assert (out / "aggregate.png").is_file() and (out / "aggregate.svg").is_file()
    assert (
        json.loads((out / "sweep.json").read_text())["failed"][0]["name"] == "number-quick-rot16-base500-band1-4-seed1"
    )

    trial_dir = out / "trials" / "number-quick-rot16-base500-band1-4-seed0"
    model = yaml.safe_load((trial_dir / "config.yaml").read_text())["model"]
    assert (model["rope_base"], model["rope_bands"]) == (500.0, [[1, 4]])
    assert (rows.rope_bands[0], rows.nope_from[0]) == ("1-4", 1)
    first = trial_dir / "checkpoints" / "step-00000004" / "model.safetensors"
    stamp = first.stat().st_mtime_ns
    blocker.unlink()
    result = sweep.run_sweep(sweep.load_sweep(path), out)
    assert first.stat().st_mtime_ns == stamp  # the finished trial was not rerun
    assert result["failed"] == [] and result["table"].n_seeds.tolist() == [2]
    rows = pd.read_parquet(out / "trials.parquet")
    assert rows.status.tolist() == ["ok", "ok"]
    assert result["table"].acc_mean[0] == pytest.approx(rows.acc.mean())
