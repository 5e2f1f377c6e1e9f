"""posym.commands.data and `posym data`: save/load round trips in every format, manifests and hashes, bad
input, the CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_tasks import assert_same

import posym
from posym.commands.data import load_dataset, manifest_path, save_dataset
from posym.core.tasks import encode, follow_chain, generate, task_config
from posym.errors import PosymError


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "npz"])
def test_save_and_load_round_trip(tmp_path, fmt):
    c = task_config("letter", extra_target=3)
    path = save_dataset(c, 500, seed=4, split="test", out=tmp_path / f"d.{fmt}", fmt=fmt)
    config, samples = load_dataset(path)
    assert config == c
    assert_same(samples, generate(c, 500, seed=4, split="test"))
    meta = json.loads(manifest_path(path).read_text())
    assert (meta["seed"], meta["split"], meta["n"], meta["format"]) == (4, "test", 500, fmt)
    assert len(meta["content_hash"]) == 64 and "numpy" in meta["versions"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"d.{fmt}", f"d.{fmt}.manifest.json"]
    meta["content_hash"] = "0" * 64
    manifest_path(path).write_text(json.dumps(meta))
    with pytest.raises(PosymError, match="content hash"):
        load_dataset(path)


def test_save_rejects_bad_input(tmp_path):
    c = task_config("number")
    with pytest.raises(PosymError, match="format must be one of"):
        save_dataset(c, 5, 0, "train", tmp_path / "x", fmt="csv")
    (tmp_path / "file").write_text("")
    with pytest.raises(PosymError, match="cannot create directory"):
        save_dataset(c, 5, 0, "train", tmp_path / "file" / "x.npz", fmt="npz")
    with pytest.raises(PosymError, match="does not exist"):
        load_dataset(tmp_path / "missing.parquet")
    path = save_dataset(c, 5, 0, "train", tmp_path / "d.jsonl", fmt="jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[2]["chain"] = rows[2]["chain"][:-1]  # one chain position short of its hop count
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(PosymError, match="cannot read dataset"):
        load_dataset(path)


def test_cli_writes_both_formats(tmp_path):
    import pandas as pd
    from typer.testing import CliRunner

    from posym.cli import app

    runner = CliRunner()
    out = tmp_path / "n.jsonl"
    result = runner.invoke(
        app,
        [
            "data",
            "--task",
            "number",
            "--n",
            "40",
            "--seed",
            "9",
            "--split",
            "val",
            "--format",
            "jsonl",
            "--out",
            str(out),
            "--target-size",
            "6",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    c = task_config("number", target_size=6)
    expected = generate(c, 40, seed=9, split="val")
    assert len(rows) == 40 and set(rows[0]) == {"input_ids", "answer", "hops", "chain", "text"}
    for row, ids, answer in zip(rows, expected.input_ids.tolist(), expected.answer.tolist()):
        assert row["input_ids"] == ids and row["answer"] == answer
        assert row["chain"] == follow_chain(c, ids)[1] and encode(c, row["text"]) == ids
    out = tmp_path / "l.parquet"
    result = runner.invoke(app, ["data", "--task", "letter", "--n", "30", "--out", str(out), "--extra-target", "5"])
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["input_ids", "answer", "hops", "chain", "text"]
    assert len(frame) == 30 and len(frame.input_ids[0]) == 22
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "l.parquet",
        "l.parquet.manifest.json",
        "n.jsonl",
        "n.jsonl.manifest.json",
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "word"], "'word' is not one of 'number', 'letter'"),
        (["--n", "-3"], "Invalid value for '--n': Input should be greater than or equal to 1"),
        (["--format", "csv"], "'csv' is not one of 'parquet', 'jsonl', 'npz'"),
        (["--split", "dev"], "'dev' is not one of 'train', 'val', 'test'"),
        (["--task", "letter", "--alphabet-size", "4"], "needs max_hops"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, args, message):
    # a real process (the exit code and stderr a shell sees), with the interpreter and posym of this test run
    source = str(Path(posym.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "posym", "data", "--out", str(tmp_path / "x.parquet"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posym: error: ") and message in lines[0], proc.stderr
    assert list(tmp_path.iterdir()) == []
