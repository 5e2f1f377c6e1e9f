"""Reliability across posym (docs/reliability.md lists every case and the test that proves it).

- Crash safety: `posym train`, `dynamics`, `lengthgen`, `run` and `sweep` run as real processes and
  get SIGKILL (their whole process group) at fixed points (right after a file appears, i.e. inside the
  write sequence that follows); no process of theirs lives on, every file left visible is complete,
  no done-file stands beside incomplete outputs, and re-running ends with the uninterrupted results.
- Bad input: each case runs the installed `posym` console script and must answer with exit code 2,
  one stderr line starting "posym: error:", no traceback, and write nothing.
- A disk that fills up mid-write (simulated with ENOSPC in-process): one-line error, no final file,
  no temporary left behind; a training run resumes exactly after it.
- No unpickling: no loader calls torch.load on safetensors models; pickle-only directories are
  refused (posym.core.model always, posym.commands.llm_scores unless allow_pickle, then with weights_only=True).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file
from tiny_runs import TRAIN_2HOP

from posym import io
from posym import models
from posym.commands.train import resolve_config, train
from posym.errors import PosymError
from posym.models import list_checkpoints, load_checkpoint

SRC = Path(__file__).resolve().parents[1] / "src" / "posym"
_SCRIPT = Path(sys.executable).with_name("posym")
POSYM = (
    [str(_SCRIPT)]
    if _SCRIPT.is_file()
    else ([shutil.which("posym")] if shutil.which("posym") else [sys.executable, "-m", "posym.cli"])
)
"""The installed console script (next to this Python, else on PATH, else the module)."""
ENV = {
    **os.environ,
    "OMP_WAIT_POLICY": "PASSIVE",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}

TRAIN = {**TRAIN_2HOP, "val_size": 24}
DYNAMICS = ["--n", "8"]
LENGTHGEN = ["--protocol", "paper", "--lengths", "8,24,64", "--n", "32"]


# ---- fixtures: a trained run, its uninterrupted analyses, broken model directories --------------


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Path:
    """One directory of inputs: a reference run and every malformed model / prompt / config file."""
    from tiny_llms import save_model, tokenizer

    z = tmp_path_factory.mktemp("zoo")
    io.write_yaml(z / "train.yaml", TRAIN)
    run = train(resolve_config("quick", "number", z / "train.yaml"), z / "run", progress=False)

    last = list_checkpoints(run)[-1][1]
    (z / "empty").mkdir()
    shutil.copytree(last, z / "corrupt")  # a header that promises more bytes than the file holds
    (z / "corrupt" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{truncated")
    shutil.copytree(last, z / "bad-config")
    (z / "bad-config" / "config.json").write_text("{not json")
    shutil.copytree(last, z / "gptj-pickle")
    torch.save(load_file(z / "gptj-pickle" / "model.safetensors"), z / "gptj-pickle" / "pytorch_model.bin")
    (z / "gptj-pickle" / "model.safetensors").unlink()

    words = tokenizer()
    save_model(z / "gpt2", "gpt2", words)
    save_model(z / "llama-short", "llama", words, positions=16)
    save_model(z / "llama-pickle", "llama", words, pickle=True)
    shutil.copytree(z / "llama-short", z / "llama-corrupt")
    (z / "llama-corrupt" / "model.safetensors").write_bytes(b"garbage")
    shutil.copytree(z / "llama-short", z / "bert")
    config = json.loads((z / "bert" / "config.json").read_text())
    (z / "bert" / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))

    (z / "a-file").write_text("not a directory\n")
    prompts = {
        "bad-json": '{"input_ids": [1, 2, 3',
        "non-integer": '{"input_ids": [1, 2.5, 3, 4]}',
        "outside-vocab": '{"input_ids": [1, 2, 3, 99999]}',
        "query-range": '{"input_ids": [1, 2, 3, 4], "queries": [9]}',
        "long": json.dumps({"input_ids": [1, 2, 3] * 30}),
    }
    for name, line in prompts.items():
        (z / f"{name}.jsonl").write_text(line + "\n")
    (z / "unknown.yaml").write_text("model: {n_layr: 2}\n")
    (z / "typed.yaml").write_text("lr: fast\n")
    (z / "impossible.yaml").write_text("task: {max_hops: 6, pretarget_size: 2}\n")
    return z


def lengthgen_into(zoo: Path, out: Path) -> None:
    """`posym lengthgen RUN --out OUT` with LENGTHGEN's settings, in-process."""
    from posym.commands.lengthgen import run_lengthgen
    from posym.core.lengthgen import LengthGenConfig

    run_lengthgen(zoo / "run", LengthGenConfig(protocol="paper", lengths=[8, 24, 64], n=32), out)


@pytest.fixture(scope="module")
def reference(zoo) -> Path:
    """Uninterrupted dynamics and lengthgen outputs of the zoo's run."""
    from posym.commands.dynamics import run_dynamics

    run_dynamics(zoo / "run", zoo / "dynamics", n_prompts=8)
    lengthgen_into(zoo, zoo / "lengthgen")
    return zoo


def posym(args, cwd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*POSYM, *map(str, args)], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300, **kw
    )


def start(args, cwd) -> subprocess.Popen:
    """`posym ARGS` in the background, leading its own process group (so that a kill reaches its workers)."""
    return subprocess.Popen(
        [*POSYM, *map(str, args)],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


# ---- bad input: the installed console script, exit 2, one line, nothing written ---------------------


def case(name: str, argv: list[str], message: str):
    """One bad input: `posym ARGV` must fail with `message` in its one error line."""
    return pytest.param(argv, message, id=name)


def slow(name: str, argv: list[str], message: str):
    """A case left out of the default run (marked slow): each costs a process start with torch imports."""
    return pytest.param(argv, message, marks=pytest.mark.slow, id=name)


BAD_INPUT = [
    # (case, argv with {z} = the zoo; outputs are relative, so they would land in the case's own cwd)
    slow("missing model directory", ["score", "{z}/missing", "--out", "s.parquet"], "does not exist"),
    slow("empty model directory", ["score", "{z}/empty", "--out", "s.parquet"], "holds no model"),
    case(
        "corrupt safetensors (posym checkpoint)",
        ["eval", "{z}/corrupt", "--n", "8", "--out", "e.json"],
        "cannot load the model",
    ),
    case(
        "corrupt safetensors (llm)",
        ["llm-scores", "{z}/llama-corrupt", "--n", "1", "--out", "o"],
        "cannot load the model",
    ),
    case("corrupt config.json", ["geometry", "{z}/bad-config", "--out", "o"], "is not valid JSON"),
    case("non-RoPE model", ["llm-scores", "{z}/gpt2", "--n", "1", "--out", "o"], "rotary position embeddings"),
    slow("unsupported architecture", ["llm-scores", "{z}/bert", "--n", "1", "--out", "o"], "'bert' model"),
    case(
        "pickle-only posym checkpoint",
        ["score", "{z}/gptj-pickle", "--out", "s.parquet"],
        "never loads pickled weights",
    ),
    slow("pickle-only llm", ["llm-scores", "{z}/llama-pickle", "--n", "1", "--out", "o"], "--allow-pickle"),
    slow(
        "prompt longer than the position table",
        ["score", "{z}/run", "--prompts", "{z}/long.jsonl", "--out", "s.parquet"],
        "90 tokens exceed the model's 64 positions",
    ),
    case(
        "prompts: bad JSON",
        ["score", "{z}/run", "--prompts", "{z}/bad-json.jsonl", "--out", "s.parquet"],
        "line 1 is not valid JSON",
    ),
    slow(
        "prompts: non-integer ids",
        ["score", "{z}/run", "--prompts", "{z}/non-integer.jsonl", "--out", "s.parquet"],
        "input_ids must be a list of integers",
    ),
    slow(
        "prompts: ids outside the vocabulary",
        ["score", "{z}/run", "--prompts", "{z}/outside-vocab.jsonl", "--out", "s.parquet"],
        "token ids must lie in 0..11",
    ),
    slow(
        "prompts: query out of range",
        ["score", "{z}/run", "--prompts", "{z}/query-range.jsonl", "--out", "s.parquet"],
        "query positions must lie in 2..3",
    ),
    case(
        "unknown preset", ["train", "--preset", "huge", "--out", "r"], "'huge' is not one of 'quick', 'seed', 'paper'"
    ),
    case(
        "unknown preset (run)",
        ["run", "--preset", "huge", "--out", "r"],
        "'huge' is not one of 'quick', 'seed', 'paper'",
    ),
    case("unknown config key", ["train", "--config", "{z}/unknown.yaml", "--out", "r"], "unknown key 'n_layr'"),
    case("mistyped config value", ["train", "--config", "{z}/typed.yaml", "--out", "r"], "lr must be a number"),
    case("impossible task config", ["train", "--config", "{z}/impossible.yaml", "--out", "r"], "max_hops=6 needs"),
    case(
        "impossible task flags",
        ["data", "--task", "letter", "--alphabet-size", "40", "--out", "d.parquet"],
        "at most 26 letters",
    ),
    case("output path not writable", ["data", "--n", "5", "--out", "{z}/a-file/d.parquet"], "cannot create directory"),
    # the same failures reached through other commands
    slow("empty llm directory", ["llm-scores", "{z}/empty", "--n", "1", "--out", "o"], "no config.json"),
    slow("non-RoPE model (score)", ["score", "{z}/gpt2", "--out", "s.parquet"], "not a GPT-J model"),
    slow(
        "prompt longer than the position table (llm)",
        ["llm-scores", "{z}/llama-short", "--text", "Alice likes red. " * 8, "--out", "o"],
        "only 16 positions",
    ),
    slow(
        "length beyond the position table",
        ["lengthgen", "{z}/run", "--protocol", "paper", "--lengths", "8,100", "--out", "o"],
        "exceeds the model's position table",
    ),
    slow(
        "output path not writable after the work",
        ["score", "{z}/run", "--n", "2", "--out", "{z}/a-file/s.parquet"],
        "cannot create directory",
    ),
]


def assert_clean_error(result, cwd: Path, message: str) -> None:
    err = result.stderr
    assert result.returncode == 2, (result.returncode, err[-2000:])
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1 and err.startswith("posym: error: "), err
    assert message in err, err
    assert not any(cwd.rglob("*")), sorted(cwd.rglob("*"))  # nothing written, not even temporaries


@pytest.mark.parametrize("argv, message", BAD_INPUT)
def test_bad_input_is_one_line_exit_2_nothing_written(zoo, tmp_path, argv, message):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    assert_clean_error(posym([a.format(z=zoo) for a in argv], cwd), cwd, message)
    assert (zoo / "a-file").read_text() == "not a directory\n"


# ---- crash safety: SIGKILL at fixed points, then re-run ----------------------------------------------


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children, their children, ...), read from Linux /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # the process ended while we looked
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie has stopped running: it writes nothing more)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_when(proc: subprocess.Popen, path: Path, delay: float = 0.0, timeout: float = 900.0, before_kill=None) -> None:
    """SIGKILL the process group of `proc` (from `start`) `delay` seconds after `path` appears; fail if
    it finished first, or if `path` is not there within `timeout` seconds (a guard against a hang only:
    killed before its kill point, a test would check a state it did not ask for; under load the sweep's
    Ray start and first trial took over the 120 s this once was, and its test failed on a state before
    the first trial's done-file). Returns once every process it had started is gone, wherever it moved
    (Ray's workers lead their own sessions): none may live on and keep writing into the output.
    `before_kill(pids)`, if given, looks at the live processes first."""
    deadline = time.time() + timeout
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(delay)
    assert proc.poll() is None, f"the process ended before the kill point {path.name}: {proc.stderr.read()[-2000:]}"
    if not path.exists():
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the kill point {path} did not appear within {timeout:.0f} s")
    family = descendants(proc.pid)
    if before_kill is not None:
        before_kill(family)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 3  # SIGKILL needs no cooperation: ms, even on loaded cores
    while time.time() < deadline and any(running(pid) for pid in family):
        time.sleep(0.05)
    assert not [pid for pid in family if running(pid)], "processes of the killed command live on"


def assert_complete(directory: Path) -> list[str]:
    """Every visible file under `directory` is whole (reads back); returns the visible names.

    Names starting with "." are the temporaries of interrupted atomic writes, never final names."""
    seen = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if path.is_dir() or any(part.startswith(".") for part in rel.parts):
            continue
        seen.append(str(rel))
        data = path.read_bytes()
        if path.suffix == ".parquet":
            pd.read_parquet(path)
        elif path.suffix == ".json":
            json.loads(data)
        elif path.suffix == ".yaml":
            yaml.safe_load(data)
        elif path.suffix == ".safetensors":
            load_file(path)
        elif path.suffix == ".png":
            assert data.endswith(b"IEND\xaeB`\x82"), rel
        elif path.suffix == ".svg":
            assert data.rstrip().endswith(b"</svg>"), rel
    return seen


def assert_same_tables(out: Path, reference: Path) -> None:
    names = sorted(p.name for p in reference.glob("*.parquet"))
    assert names and names == sorted(p.name for p in out.glob("*.parquet"))
    for name in names:
        pd.testing.assert_frame_equal(pd.read_parquet(out / name), pd.read_parquet(reference / name))


KILL_TRAIN = [  # (file whose appearance triggers the kill, seconds after it)
    pytest.param("checkpoints/step-00000004", 0.0, id="after-checkpoint"),  # before its metrics.parquet / log
    pytest.param("config.yaml", 0.0, id="first-checkpoint", marks=pytest.mark.slow),  # in step 0's evaluation
    pytest.param("checkpoints/step-00000048", 0.05, id="mid-run", marks=pytest.mark.slow),  # between steps
]


@pytest.mark.parametrize("point, delay", KILL_TRAIN)
def test_train_killed_then_resumed_equals_uninterrupted(zoo, tmp_path, point, delay):
    run = tmp_path / "run"
    proc = start(
        [
            "train",
            "--preset",
            "quick",
            "--task",
            "number",
            "--config",
            zoo / "train.yaml",
            "--out",
            run,
            "--no-progress",
        ],
        tmp_path,
    )
    kill_when(proc, run / point, delay)
    for _, checkpoint in list_checkpoints(run):
        load_checkpoint(checkpoint)  # every visible checkpoint is a whole, loadable model
    assert "checkpoints/step-00000096/model.safetensors" not in assert_complete(run)

    resumed = posym(["train", "--resume", run, "--no-progress"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    reference = zoo / "run"
    assert [s for s, _ in list_checkpoints(run)] == [s for s, _ in list_checkpoints(reference)]
    for (_, a), (_, b) in zip(list_checkpoints(run), list_checkpoints(reference)):
        wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
        assert all(torch.equal(wa[k], wb[k]) for k in wb), a.name
    drop = ["time"]  # wall-clock stamps are the one thing a re-run may change
    pd.testing.assert_frame_equal(
        pd.read_parquet(run / "metrics.parquet").drop(columns=drop),
        pd.read_parquet(reference / "metrics.parquet").drop(columns=drop),
    )
    assert not [p.name for p in [*run.iterdir(), *(run / "checkpoints").iterdir()] if p.name.startswith(".")]


def test_train_killed_between_last_checkpoint_and_metrics_resumes_complete(zoo, tmp_path, monkeypatch):
    """The narrowest window, hit deterministically: the final checkpoint is on disk, metrics.parquet
    not yet rewritten (a BaseException stands in for SIGKILL; nothing may catch it)."""
    import posym.commands.train as train_module

    class Killed(BaseException):
        pass

    original = io.write_parquet

    def write_parquet(path, frame):
        if frame.step.max() == TRAIN["max_steps"]:
            raise Killed
        return original(path, frame)

    monkeypatch.setattr(train_module.io, "write_parquet", write_parquet)
    run = tmp_path / "run"
    with pytest.raises(Killed):
        train(resolve_config("quick", "number", zoo / "train.yaml"), run, progress=False)
    monkeypatch.setattr(train_module.io, "write_parquet", original)
    assert pd.read_parquet(run / "metrics.parquet").step.max() < TRAIN["max_steps"]
    train(None, run, resume=True, progress=False)
    drop = ["time"]
    pd.testing.assert_frame_equal(
        pd.read_parquet(run / "metrics.parquet").drop(columns=drop),
        pd.read_parquet(zoo / "run" / "metrics.parquet").drop(columns=drop),
    )


@pytest.mark.parametrize("point", ["fig6_entropy.png", pytest.param("dynamics.parquet", marks=pytest.mark.slow)])
def test_dynamics_killed_leaves_only_whole_files_and_reruns_identically(reference, tmp_path, point):
    from posym.commands.dynamics import run_dynamics

    out = tmp_path / "analysis"
    kill_when(start(["dynamics", reference / "run", "--out", out, *DYNAMICS], tmp_path), out / point)
    assert point in assert_complete(out) and "dynamics.json" not in assert_complete(out)
    run_dynamics(reference / "run", out, n_prompts=8)  # what `posym dynamics` runs, without a new process
    assert_same_tables(out, reference / "dynamics")
    assert_complete(out)


@pytest.mark.parametrize("point", ["lengthgen.parquet", pytest.param("fig5b.png", marks=pytest.mark.slow)])
def test_lengthgen_killed_leaves_only_whole_files_and_reruns_identically(reference, tmp_path, point):
    out = tmp_path / "lengthgen"
    kill_when(start(["lengthgen", reference / "run", "--out", out, *LENGTHGEN], tmp_path), out / point)
    assert point in assert_complete(out) and "lengthgen.json" not in assert_complete(out)
    lengthgen_into(reference, out)
    assert_same_tables(out, reference / "lengthgen")
    assert_complete(out)


# `posym run`: one task on toy sizes, 2 worker processes (the train/dynamics/... chain and theory)
RUN_STAGE_FILES = {
    "dynamics": "analysis/dynamics.json",
    "geometry": "analysis/geometry.json",
    "lengthgen": "lengthgen/lengthgen.json",
    "discrepancy": "discrepancy/discrepancy.json",
}
"""Per task stage: the file it writes last (under the task's run directory)."""


@pytest.fixture(scope="module")
def run_reference(tmp_path_factory) -> Path:
    """An uninterrupted `posym run` of the tiny configuration (number task only) and its config file."""
    from tiny_runs import PIPELINE

    root = tmp_path_factory.mktemp("pipeline")
    io.write_yaml(root / "tiny.yaml", {**PIPELINE, "tasks": ["number"]})
    done = posym(["run", "--config", root / "tiny.yaml", "--out", root / "main", "--workers", 2], root)
    assert done.returncode == 0, done.stderr[-2000:]
    return root


def assert_done_means_complete(out: Path) -> None:
    """A stage's done-file exists only beside its complete outputs (the file each stage writes last,
    every checkpoint up to max_steps, one metrics row per checkpoint)."""
    from posym.stages import is_done

    if is_done(out, "number", "train"):
        steps = [s for s, _ in list_checkpoints(out / "number")]
        assert steps[-1] == yaml.safe_load((out / "number" / "config.yaml").read_text())["max_steps"]
        assert pd.read_parquet(out / "number" / "metrics.parquet").step.tolist() == steps
    for stage, name in RUN_STAGE_FILES.items():
        assert not is_done(out, "number", stage) or (out / "number" / name).is_file(), stage
    assert not is_done(out, "theory", "theory") or (out / "theory" / "theory.json").is_file()


KILL_RUN = [  # (the file whose appearance triggers the kill, a file the killed stage would write)
    pytest.param("stages/number-train.done.json", "stages/number-dynamics.done.json", id="in-dynamics"),
    pytest.param(
        "number/checkpoints/step-00000006", "stages/number-train.done.json", id="in-train", marks=pytest.mark.slow
    ),
    pytest.param("report", "pipeline.json", id="in-report", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("point, unfinished", KILL_RUN)
def test_run_killed_then_rerun_equals_uninterrupted(run_reference, tmp_path, point, unfinished):
    out, reference = tmp_path / "main", run_reference / "main"
    command = ["run", "--config", run_reference / "tiny.yaml", "--out", out, "--workers", 2]
    kill_when(start(command, tmp_path), out / point)
    visible = assert_complete(out)
    assert_done_means_complete(out)
    assert unfinished not in visible and "pipeline.json" not in visible  # pipeline.json: last, after the report
    for _, checkpoint in list_checkpoints(out / "number"):
        load_checkpoint(checkpoint)

    rerun = posym(command, tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert_complete(out)
    assert_done_means_complete(out)
    tables = sorted(str(p.relative_to(reference)) for p in reference.rglob("*.parquet"))
    # 18: lengthgen now also writes head_retention.parquet and head_groups.parquet (16 before)
    assert len(tables) == 18 and tables == sorted(str(p.relative_to(out)) for p in out.rglob("*.parquet"))
    for name in tables:
        drop = ["time"] if name.endswith("metrics.parquet") else []  # wall-clock stamps of training
        pd.testing.assert_frame_equal(
            pd.read_parquet(out / name).drop(columns=drop),
            pd.read_parquet(reference / name).drop(columns=drop),
            obj=name,
        )
    assert [s for s, _ in list_checkpoints(out / "number")] == [s for s, _ in list_checkpoints(reference / "number")]
    for (_, a), (_, b) in zip(list_checkpoints(out / "number"), list_checkpoints(reference / "number")):
        wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wb), a.name
    assert sorted(p.name for p in (out / "report" / "figures").iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in (reference / "report" / "figures").iterdir()
    )
    assert (out / "report" / "report.html").stat().st_size > 0
    summary = [
        json.dumps(json.loads((d / "pipeline.json").read_text())["summary"]).replace(str(d), "OUT")
        for d in (out, reference)
    ]  # as text: a NaN (retention of a zero accuracy) equals itself
    assert summary[0] == summary[1]


def trials_at_nice_0(pids: set[int]) -> None:
    """The Ray worker running a trial has nice 0 (sweep.LOCAL_RAY): Ray's own default, 15, starved the
    trials of any machine with other work on it."""
    nice = {}
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while we looked
            continue
        if command.startswith(b"ray::_ray_trial"):
            nice[pid] = int(fields[16])  # field 19 of proc(5), counted from the state (field 3)
    assert nice and set(nice.values()) == {0}, nice


# `posym sweep`: two trials of the zoo's 96-step training on local Ray, one at a time
def test_sweep_killed_then_rerun_skips_finished_trials_and_equals_uninterrupted(tmp_path):
    from posym.commands import sweep

    path = tmp_path / "sweep.yaml"
    io.write_yaml(path, {"tasks": ["number"], "seeds": [0, 1], "train": TRAIN, "num_cpus": 1})
    config = sweep.load_sweep(path)
    grid = sweep.trials(config)
    out = tmp_path / "sweep"
    first, second = (out / "trials" / t["name"] for t in grid)
    command = ["sweep", path, "--out", out, "--max-concurrent", 1]
    kill_when(start(command, tmp_path), second / "checkpoints" / "step-00000008", before_kill=trials_at_nice_0)
    assert_complete(out)
    done = [sweep.done_path(out, t["name"], sweep.SWEEP_JOB) for t in grid]
    assert done[0].is_file() and not done[1].is_file() and not (out / "trials.parquet").exists()
    # the second trial's worker died with the sweep: it did not train on to the end unwatched
    assert list_checkpoints(second)[-1][0] < TRAIN["max_steps"]
    finished = {p: p.stat().st_mtime_ns for p in [done[0], *first.rglob("*")]}

    rerun = posym(command, tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert finished == {p: p.stat().st_mtime_ns for p in [done[0], *first.rglob("*")]}  # not redone
    assert_complete(out)

    # the reference: the same trials in a plain loop, in this process, without Ray
    threads = torch.get_num_threads()
    try:
        rows = pd.DataFrame(
            [sweep.run_trial(t, str(tmp_path / "loop" / t["name"]), False, config.n_prompts, 1) for t in grid]
        )
    finally:
        torch.set_num_threads(threads)  # run_trial sets the trial's thread count
    assert rows.status.tolist() == ["ok", "ok"]
    table = pd.read_parquet(out / "trials.parquet")
    # columns: the settings, then the rest by name, whichever rows came from done-files (sorted JSON keys)
    assert list(table.columns) == [*sweep.TRIAL_KEYS, *sorted(set(table.columns) - set(sweep.TRIAL_KEYS))]
    drop = ["seconds"]  # wall-clock
    pd.testing.assert_frame_equal(table.drop(columns=drop), rows.drop(columns=drop), check_like=True)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "aggregate.parquet"), sweep.aggregate(rows))
    for t in grid:
        a, b = (list_checkpoints(d / t["name"])[-1][1] for d in (out / "trials", tmp_path / "loop"))
        wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
        assert all(torch.equal(wa[k], wb[k]) for k in wb), t["name"]


# ---- a disk that fills up mid-write (ENOSPC, simulated in-process) -------------------------------------


def enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def half_then_enospc(original):
    """A writer that writes half of its first argument's output, then fails with ENOSPC."""

    def write(self, data, *args, **kwargs):
        original(self, data[: len(data) // 2], *args, **kwargs)
        enospc()

    return write


def test_enospc_mid_write_leaves_no_file_and_one_line(tmp_path, monkeypatch):
    from pathlib import PosixPath

    monkeypatch.setattr(PosixPath, "write_text", half_then_enospc(PosixPath.write_text))
    target = tmp_path / "out" / "table.json"
    with pytest.raises(PosymError) as caught:
        io.write_json(target, {"rows": list(range(1000))})
    assert "No space left on device" in str(caught.value) and "\n" not in str(caught.value)
    assert not any((tmp_path / "out").iterdir())  # neither the file nor its temporary


def cli(argv, capsys, monkeypatch) -> tuple[int, str]:
    """`posym ARGV` in-process (the ENOSPC patches live in this process): (exit code, stderr)."""
    from cli_runner import run_posym

    return run_posym(monkeypatch, *argv), capsys.readouterr().err


class _FullDisk:
    """A file whose every write puts half its bytes out, then fails with ENOSPC."""

    def __init__(self, file):
        self.file = file

    def write(self, data):
        self.file.write(data[: len(data) // 2])
        enospc()

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "npz"])
def test_enospc_in_posym_data_is_one_line_exit_2(tmp_path, capsys, monkeypatch, fmt):
    from posym.commands import data as datasets

    # posym data streams every format through the files it opens (Parquet and the npz archive on file objects)
    monkeypatch.setattr(datasets, "open", lambda *args, **kwargs: _FullDisk(open(*args, **kwargs)), raising=False)
    code, err = cli(["data", "--n", "40", "--format", fmt, "--out", tmp_path / f"d.{fmt}"], capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and err.startswith("posym: error: cannot write"), err
    assert "No space left on device" in err and not list(tmp_path.iterdir())


def test_enospc_while_streaming_scores(zoo, tmp_path, capsys, monkeypatch):
    import pyarrow.parquet as pq

    calls = []
    original = pq.ParquetWriter.write_table

    def write_table(self, table, *args, **kwargs):  # the first batch lands, the second finds the disk full
        calls.append(len(table))
        if len(calls) > 1:
            enospc()
        return original(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    out = tmp_path / "scores" / "s.parquet"
    code, err = cli(["score", zoo / "run", "--n", "4", "--batch-size", "1", "--out", out], capsys, monkeypatch)
    assert len(calls) == 2 and code == 2 and err.count("\n") == 1, err
    assert "No space left on device" in err and not list(out.parent.iterdir())


def test_enospc_during_a_checkpoint_then_resume_is_exact(zoo, tmp_path, monkeypatch):
    import posym.commands.train as train_module

    original = train_module._save_trainer_state

    def save(directory, optimizer, step, config_hash):
        if step == 32:
            enospc()
        return original(directory, optimizer, step, config_hash)

    monkeypatch.setattr(train_module, "_save_trainer_state", save)
    config = resolve_config("quick", "number", zoo / "train.yaml")
    run = tmp_path / "run"
    with pytest.raises(PosymError, match="No space left on device"):
        train(config, run, progress=False)
    assert [s for s, _ in list_checkpoints(run)] == [0, 1, 2, 4, 8, 16]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    monkeypatch.setattr(train_module, "_save_trainer_state", original)
    train(None, run, resume=True, progress=False)
    a, b = list_checkpoints(run)[-1][1], list_checkpoints(zoo / "run")[-1][1]
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wb)


# ---- no unpickling ----------------------------------------------------------------------------------------


def test_no_module_unpickles():
    """Source check: no pickle import, every torch.load is weights_only, every np.load refuses pickles."""
    for path in sorted(SRC.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(import|from)\s+(c?pickle|dill|joblib)\b", text, re.M), path.name
        assert "torch.load(" not in text, path.name
        for call in re.findall(r"np\.load\([^)]*\)", text):
            assert "allow_pickle=False" in call, (path.name, call)


def test_loaders_never_call_torch_load_on_safetensors_models(zoo, monkeypatch):

    def refuse(*args, **kwargs):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", refuse)
    load_checkpoint(zoo / "run")
    models.load(zoo / "llama-short", device="cpu")
    with pytest.raises(PosymError, match="never loads pickled weights, because unpickling"):
        load_checkpoint(zoo / "gptj-pickle")
    with pytest.raises(PosymError, match="only has pickle weights.*--allow-pickle"):
        models.load(zoo / "llama-pickle", device="cpu")


def test_allow_pickle_uses_the_restricted_unpickler(zoo, monkeypatch):

    seen = []
    original = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    models.load(zoo / "llama-pickle", device="cpu", allow_pickle=True)
    assert seen and all(flag is True for flag in seen)
