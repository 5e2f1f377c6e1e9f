"""Reliability, round two (docs/reliability.md, "Outputs, interrupts, damaged inputs, locks"): one test per case.

- Outputs never replace what they must not: device nodes, fifos, sockets and directories (made inside
  temporary directories; nothing here writes to a real device node), and any output that is or lies
  inside an input of the command.
- Ctrl-C: posym runs in its own process group (`python -m posym`, start_new_session) and gets SIGINT:
  exit 130 and one line saying what was kept.
- Damaged or inconsistent inputs, impossible configs, and a real full disk (a small tmpfs, as root):
  exit 2 and one line, nothing created.
- The llm-bench endpoint client against a real local HTTP server; the lock of an output directory.
Bad-input cases run `posym` in-process (tests/cli_runner.py): the checks come before any heavy work.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_runner import cli, one_line
from safetensors.torch import load_file
from tiny_runs import TRAIN_2HOP

from posym import io, models
from posym.commands import llm_bench, llm_study
from posym.commands.llm_study import report as study_report
from posym.commands.train import resolve_config, train
from posym.core import tasks
from posym.errors import PosymError
from posym.models import list_checkpoints, load_checkpoint

ENV = {
    **os.environ,
    "OMP_WAIT_POLICY": "PASSIVE",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
}
TRAIN = TRAIN_2HOP  # 96 steps, 11 checkpoints, ~2 s


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A 16-step run whose every checkpoint keeps its trainer state, and its config file."""
    root = tmp_path_factory.mktemp("guards")
    io.write_yaml(root / "train.yaml", {**TRAIN, "max_steps": 16, "checkpoint_every": 8, "keep_trainer_state": True})
    io.write_yaml(root / "full.yaml", TRAIN)
    train(resolve_config("quick", "number", root / "train.yaml"), root / "run", progress=False)
    return root


def snapshot(root: Path) -> dict:
    """Every file under `root` with its bytes (to prove that a refused command changed nothing)."""
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- outputs that must not be replaced ---------------------------------------------------------------------


def _special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / kind
    if kind == "device":
        try:  # the null device's numbers, but a node of our own inside the temporary directory
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text("a file\n")
    return path


SPECIAL = [  # (argv, with OUT the special path; its kind; words of the error)
    pytest.param(["score", "{run}", "--out", "{out}"], "device", "is a character device", id="score-device"),
    pytest.param(["data", "--n", "5", "--out", "{out}"], "fifo", "is a fifo", id="data-fifo"),
    pytest.param(["eval", "{run}", "--n", "8", "--out", "{out}"], "socket", "is a socket", id="eval-socket"),
    pytest.param(["data", "--n", "5", "--out", "{out}"], "directory", "is a directory", id="data-directory"),
    pytest.param(["dynamics", "{run}", "--out", "{out}"], "file", "is a regular file", id="dynamics-over-a-file"),
]


@pytest.mark.parametrize("argv, kind, words", SPECIAL)
def test_output_over_a_device_fifo_socket_or_directory_is_refused(
    runs, tmp_path, capsys, monkeypatch, argv, kind, words
):
    out = _special(tmp_path, kind)
    mode = os.lstat(out).st_mode
    code, err = cli(capsys, monkeypatch, *(a.format(run=runs / "run", out=out) for a in argv))
    one_line(code, err, words)
    assert os.lstat(out).st_mode == mode  # still the node it was
    assert sorted(p.name for p in tmp_path.iterdir()) == [kind]  # no OUT.json sidecar, no temporary


def _step(runs: Path) -> Path:
    return list_checkpoints(runs / "run")[-1][1]


INSIDE = [  # (argv; {run} the run, {ckpt} its latest checkpoint, {prompts} a prompt file)
    pytest.param(["score", "{run}", "--out", "{ckpt}/model.safetensors"], id="score-over-the-weights"),
    pytest.param(["eval", "{ckpt}", "--n", "8", "--out", "{ckpt}/config.json"], id="eval-over-config.json"),
    pytest.param(["score", "{run}", "--out", "{run}/metrics.parquet"], id="score-over-metrics"),
    pytest.param(["data", "--n", "5", "--out", "{run}/config.yaml"], id="data-over-the-run-config"),
    pytest.param(["score", "{run}", "--prompts", "{prompts}", "--out", "{prompts}"], id="score-over-prompts"),
    pytest.param(["geometry", "{ckpt}", "--out", "{ckpt}"], id="geometry-into-the-checkpoint"),
    pytest.param(["dynamics", "{run}", "--out", "{run}/checkpoints/x"], id="dynamics-into-checkpoints"),
]


@pytest.mark.parametrize("argv", INSIDE)
def test_output_that_is_or_lies_inside_an_input_is_refused(runs, tmp_path, capsys, monkeypatch, argv):
    prompts = runs / "prompts.jsonl"
    prompts.write_text('{"input_ids": [1, 2, 3, 4]}\n')
    before = snapshot(runs)
    code, err = cli(capsys, monkeypatch, *(a.format(run=runs / "run", ckpt=_step(runs), prompts=prompts) for a in argv))
    one_line(code, err, "would overwrite", "an input of this command")
    assert snapshot(runs) == before


def test_outputs_beside_inputs_are_allowed(runs, tmp_path):
    run, ckpt = runs / "run", _step(runs)
    for path, is_dir in [
        (run / "analysis", True),
        (run / "scores.parquet", False),
        (ckpt / "ablation", True),
        (tmp_path / "new" / "s.parquet", False),
    ]:
        assert io.check_output(path, inputs=[run, ckpt], is_dir=is_dir) == path


# ---- Ctrl-C ----------------------------------------------------------------------------------------------


def start(args, cwd: Path) -> subprocess.Popen:
    """`python -m posym ARGS` leading its own process group (so that SIGINT reaches every process of it)."""
    # SIGINT and SIGHUP back to their defaults first: a test run started in the background (`pytest &`)
    # inherits SIGINT ignored, one under `nohup` SIGHUP, and posym then (rightly) leaves them ignored
    return subprocess.Popen(
        [sys.executable, "-m", "posym", *map(str, args)],
        cwd=cwd,
        env=ENV,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_default_signals,
    )


def _default_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def interrupt_when(proc: subprocess.Popen, ready, timeout: float = 180) -> tuple[int, str]:
    """SIGINT to the process group of `proc` once `ready()` holds; (exit code, stderr)."""
    deadline = time.time() + timeout
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"finished before the interrupt: {proc.stderr.read()[-2000:]}"
    os.killpg(proc.pid, signal.SIGINT)
    return answer(proc)


def answer(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    """(exit code, stderr) of a signalled `proc`; one that has not ended `timeout` seconds later is killed
    and the test fails (reading stderr to its end would otherwise wait on it for ever, and so would CI)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"still running {timeout:g} s after the signal; stderr: {err[-2000:]}")
    return proc.returncode, err


def interrupted(code: int, err: str, *needles: str) -> None:
    assert code == 130, (code, err[-2000:])
    assert err.startswith("posym: interrupted: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def test_ctrl_c_during_train_exits_130_says_what_was_kept_and_resume_continues(runs, tmp_path):
    out = tmp_path / "run"
    proc = start(["train", "--config", runs / "full.yaml", "--out", out, "--no-progress"], tmp_path)
    code, err = interrupt_when(proc, lambda: (out / "checkpoints" / "step-00000004").exists())
    kept = list_checkpoints(out)[-1][0]
    interrupted(code, err, f"kept checkpoints up to step {kept} in {out}", f"posym train --resume {out}")
    assert not (out / io.LOCK).exists() and not [p for p in out.rglob(".*")]  # no lock, no temporaries
    train(None, out, resume=True, progress=False)  # as the line says (in-process: one process start less)
    assert list_checkpoints(out)[-1][0] == TRAIN["max_steps"]


def test_ctrl_c_during_score_exits_130_and_leaves_nothing(runs, tmp_path):
    out = tmp_path / "scores" / "s.parquet"
    proc = start(["score", runs / "run", "--n", 100000, "--batch-size", 1, "--out", out], tmp_path)
    code, err = interrupt_when(proc, lambda: out.parent.is_dir() and any(out.parent.iterdir()))  # the temporary
    interrupted(code, err, "nothing half-written is left", "starts it again")
    assert not list(out.parent.iterdir())


@pytest.mark.slow
def test_ctrl_c_during_run_exits_130_stops_every_worker_and_rerun_resumes(tmp_path):
    from tiny_runs import PIPELINE

    io.write_yaml(tmp_path / "tiny.yaml", {**PIPELINE, "tasks": ["number"]})
    out = tmp_path / "main"
    command = ["run", "--config", tmp_path / "tiny.yaml", "--out", out, "--workers", 2]
    proc = start(command, tmp_path)
    family: set[int] = set()

    def ready() -> bool:
        family.update(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _in_group(p, proc.pid))
        return (out / "number" / "checkpoints" / "step-00000006").exists()

    code, err = interrupt_when(proc, ready)
    interrupted(
        code,
        err,
        f"finished stages (and the checkpoints of any training) in {out}",
        "re-running the same command resumes",
    )
    time.sleep(1)
    assert not [pid for pid in family if Path(f"/proc/{pid}").exists() and _in_group(Path(f"/proc/{pid}"), proc.pid)]
    rerun = subprocess.run(
        [sys.executable, "-m", "posym", *map(str, command)],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert (out / "pipeline.json").is_file()


def _in_group(proc_dir: Path, pgid: int) -> bool:
    """Whether the process of /proc/PID is a live member of process group `pgid`."""
    try:
        fields = (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid


# ---- damaged or inconsistent inputs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [{"n_layer": 3}, {"n_layer": 1}, {"n_embd": 64}, {"vocab_size": 40}],
    ids=["more-layers", "fewer-layers", "wider", "larger-vocabulary"],
)
def test_config_json_that_disagrees_with_the_weights_is_one_line(runs, tmp_path, capsys, monkeypatch, change):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(_step(runs), ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(PosymError, match="config.json of .* does not match its weights"):
        load_checkpoint(ckpt)
    code, err = cli(capsys, monkeypatch, "score", ckpt, "--n", 2, "--out", tmp_path / "s.parquet")
    one_line(code, err, "does not match its weights")


def test_posym_json_that_is_a_list_is_one_line(runs, tmp_path, capsys, monkeypatch):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(_step(runs), ckpt)
    (ckpt / "posym.json").write_text("[1, 2, 3]\n")
    code, err = cli(capsys, monkeypatch, "score", ckpt, "--out", tmp_path / "s.parquet")
    one_line(code, err, "posym.json must hold a JSON object, not a list")


DAMAGE = {  # file of the latest checkpoint -> how it is damaged
    "trainer_state.json": lambda p: p.write_text('{"step": 16, "param_gr'),
    "trainer_state.safetensors": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "model.safetensors": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_resume_from_a_damaged_checkpoint_names_the_file_and_the_newest_intact_one(
    runs, tmp_path, capsys, monkeypatch, name
):
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    latest = list_checkpoints(run)[-1][1]
    DAMAGE[name](latest / name)
    code, err = cli(capsys, monkeypatch, "train", "--resume", run, "--no-progress")
    one_line(code, err, f"{latest.relative_to(run) / name} is damaged", "the newest intact checkpoint is step-00000008")
    shutil.move(latest, tmp_path / latest.name)  # as the message offers
    code, err = cli(capsys, monkeypatch, "train", "--resume", run, "--no-progress")
    assert code == 0, err
    assert [s for s, _ in list_checkpoints(run)][-1] == 16 and load_checkpoint(run)[1]["step"] == 16


def test_resume_without_any_intact_trainer_state_says_so(runs, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    for _, ckpt in list_checkpoints(run)[:-1]:
        (ckpt / "trainer_state.safetensors").unlink()  # as keep_trainer_state: false leaves them
    DAMAGE["trainer_state.safetensors"](list_checkpoints(run)[-1][1] / "trainer_state.safetensors")
    code, err = cli(capsys, monkeypatch, "train", "--resume", run, "--no-progress")
    one_line(code, err, "is damaged", "cannot continue exactly")


@pytest.mark.parametrize("command", ["dynamics", "report"])
def test_truncated_metrics_parquet_is_one_line(runs, tmp_path, capsys, monkeypatch, command):
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    metrics = run / "metrics.parquet"
    metrics.write_bytes(metrics.read_bytes()[: metrics.stat().st_size // 2])
    code, err = cli(capsys, monkeypatch, command, run, "--out", tmp_path / "out")
    one_line(code, err, f"{metrics} is damaged")


PROMPTS = {  # a prompt file's bytes -> words of the error
    "null-ids": (b'{"input_ids": null}\n', 'must be a JSON object with an "input_ids" list'),
    "400-digit-id": (b'{"input_ids": [1, 2, ' + b"9" * 400 + b"]}\n", "input_ids holds an integer out of range"),
    "not-utf8": (b'{"input_ids": [1, 2, 3]}\n\xff\xfe\n', "is not UTF-8 text"),
}


@pytest.mark.parametrize("name", list(PROMPTS))
def test_bad_prompt_files_are_one_line(runs, tmp_path, capsys, monkeypatch, name):
    data, words = PROMPTS[name]
    (tmp_path / "p.jsonl").write_bytes(data)
    code, err = cli(
        capsys, monkeypatch, "score", runs / "run", "--prompts", tmp_path / "p.jsonl", "--out", tmp_path / "s.parquet"
    )
    one_line(code, err, words)


@pytest.fixture
def small_disk(tmp_path):
    """A real 400 KiB tmpfs (root only): writes fail with ENOSPC from the kernel, not from a patch."""
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_real_full_disk_during_train_is_one_line_and_leaves_whole_checkpoints(runs, small_disk, capsys, monkeypatch):
    run = small_disk / "run"
    code, err = cli(capsys, monkeypatch, "train", "--config", runs / "full.yaml", "--out", run, "--no-progress")
    one_line(code, err, "No space left on device")
    assert not [p for p in small_disk.rglob(".*")]  # no temporary, no lock
    for _, ckpt in list_checkpoints(run):
        load_file(ckpt / "model.safetensors")  # what is visible is whole


# ---- config values, checked before anything is created ---------------------------------------------------------

LAUGHS = "model:\n  n_layer:\n    - &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"    - &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi")
)
CONFIGS = [  # (YAML text, words of the error)
    pytest.param("lr: .nan\n", "lr must be a finite number", id="lr-nan"),
    pytest.param("lr: .inf\n", "lr must be a finite number", id="lr-inf"),
    pytest.param("model: {n_embd: 10000000}\n", "GiB to train", id="n_embd-absurd"),
    pytest.param("model: {n_layer: 100000}\n", "GiB to train", id="n_layer-absurd"),
    pytest.param("model: {n_positions: 4}\n", "model.n_positions (4) must cover the task's 17-token", id="n_positions"),
    pytest.param("threads: 100000\n", "threads: 100000 is more than this machine's", id="threads"),
    pytest.param(LAUGHS, "model.n_layer must be an integer", id="billion-laughs"),
    pytest.param(
        "lr: 0.001\nmax_steps: 10\nlr: 0.1\n", "key 'lr' appears twice in one mapping (line 3)", id="duplicate-key"
    ),
]


VALUES = [  # values that passed validation and crashed later (round three)
    pytest.param("eps: -1\n", "eps (AdamW's epsilon) must be positive", id="eps"),
    pytest.param("model: {initializer_range: -1}\n", "model.initializer_range", id="initializer_range"),
    pytest.param("model: {layer_norm_epsilon: 0}\n", "model.layer_norm_epsilon must be positive", id="layer_norm_eps"),
    pytest.param("seed: 100000000000000000000000\n", "seed must be an integer in 0..4,294,967,295", id="seed"),
    pytest.param("max_steps: 1000000000000000000000\n", "max_steps must be at most", id="max_steps"),
    pytest.param("eval_size: 100000000000\n", "GiB to train", id="eval_size"),
]


@pytest.mark.parametrize("text, words", CONFIGS + VALUES)
def test_impossible_configs_are_one_line_before_anything_is_created(tmp_path, capsys, monkeypatch, text, words):
    (tmp_path / "c.yaml").write_text(text)
    code, err = cli(capsys, monkeypatch, "train", "--config", tmp_path / "c.yaml", "--out", tmp_path / "out" / "run")
    one_line(code, err, words)
    assert not (tmp_path / "out").exists()


def test_impossible_pipeline_config_creates_nothing(tmp_path, capsys, monkeypatch):
    io.write_yaml(tmp_path / "p.yaml", {"train": {"model": {"n_layer": 100000}}})
    code, err = cli(capsys, monkeypatch, "run", "--config", tmp_path / "p.yaml", "--out", tmp_path / "main")
    one_line(code, err, "GiB to train")
    assert not (tmp_path / "main").exists()


def test_a_start_that_fails_before_its_first_checkpoint_blocks_nothing(runs, tmp_path, monkeypatch):
    import posym.commands.train as train_module

    def broken(*args, **kwargs):
        raise PosymError("evaluation failed")

    config = train_module.resolve_config("quick", "number", runs / "full.yaml")
    monkeypatch.setattr(train_module, "evaluate", broken)
    with pytest.raises(PosymError, match="evaluation failed"):
        train_module.train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    monkeypatch.undo()
    train_module.train(config, tmp_path / "run", progress=False, stop_at=1)  # the same command, not blocked


# ---- the endpoint client of llm-bench ----------------------------------------------------------------------------

KEY = "sk-secret-0123456789"


class Endpoint:
    """A local HTTP server replying to every POST with (status, reason, body), optionally one byte every
    `trickle` seconds."""

    def __init__(self, status=200, reason="OK", body=b"", trickle=0.0):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    self.send_response(status, reason)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    for k in range(0, len(body), 1 if trickle else len(body) or 1):
                        self.wfile.write(body[k : k + 1] if trickle else body)
                        self.wfile.flush()
                        time.sleep(trickle)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        outer.endpoint = llm_bench.Endpoint(self.url, "m", "POSYM_TEST_KEY", timeout_s=1.0, retries=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def chat_reply(content) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


@pytest.mark.parametrize(
    "reason, body",
    [(f"bad key {KEY}", b"{}"), ("Unauthorized", b"x" * 190 + KEY.encode() + b"y" * 50)],
    ids=["in-the-reason-phrase", "near-character-200-of-the-body"],
)
def test_the_api_key_never_leaks_into_an_error(monkeypatch, reason, body):
    monkeypatch.setenv("POSYM_TEST_KEY", KEY)
    with Endpoint(401, reason, body) as server, pytest.raises(PosymError) as caught:
        llm_bench.chat(server.endpoint, "hi")
    message = str(caught.value)
    assert "HTTP 401" in message and "***" in message and KEY[:6] not in message, message


def test_the_timeout_bounds_the_whole_reply(monkeypatch):
    monkeypatch.setenv("POSYM_TEST_KEY", KEY)
    with Endpoint(body=chat_reply("A" * 40), trickle=0.25) as server:  # 10 s of bytes, 0.25 s apart
        began = time.monotonic()
        with pytest.raises(PosymError, match=r"no reply \(no whole reply within 1 s\)"):
            llm_bench.chat(server.endpoint, "hi")
        assert time.monotonic() - began < 5  # a per-read timeout would wait for all 10 s


@pytest.mark.parametrize(
    "content, answer",
    [
        ("```\nE\n```", "E"),
        ("```text\nE```", "E"),
        (7, "7"),
        ([{"type": "text", "text": "E"}, {"type": "text", "text": "2 more"}], "E2"),
        ("A" * 20_000_000, "A" * tasks.MAX_STORED),
    ],
    ids=["fenced", "fenced-with-language", "number", "list-of-parts", "20-MB"],
)
def test_common_reply_shapes_are_parsed_and_stored_bounded(monkeypatch, content, answer):
    monkeypatch.setenv("POSYM_TEST_KEY", KEY)
    with Endpoint(body=chat_reply(content)) as server:
        server.endpoint.timeout_s = 30.0
        assert tasks.reply_answer(llm_bench.chat(server.endpoint, "hi")) == answer


# ---- one process per output directory ------------------------------------------------------------------------


def test_a_second_process_on_a_locked_directory_is_refused_with_the_holders_pid(runs, tmp_path, capsys, monkeypatch):
    from tiny_runs import PIPELINE

    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    with io.locked(run):  # flock: a second open of the lock conflicts even inside this process
        code, err = cli(capsys, monkeypatch, "train", "--resume", run, "--no-progress")
        one_line(code, err, f"{run} is in use by posym process {os.getpid()}")
    io.write_yaml(tmp_path / "tiny.yaml", {**PIPELINE, "tasks": ["number"]})
    with io.locked(tmp_path / "main"):
        code, err = cli(capsys, monkeypatch, "run", "--config", tmp_path / "tiny.yaml", "--out", tmp_path / "main")
        one_line(code, err, f"is in use by posym process {os.getpid()}")
    assert not (tmp_path / "main").exists()  # the lock's directory goes with it when left empty


def test_a_stale_lock_of_a_dead_process_is_taken_over(runs, tmp_path, capsys, monkeypatch):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    (run / io.LOCK).write_text(f"{int(dead.stdout)} {io._HOST}\n")  # what a SIGKILLed train leaves
    code, err = cli(capsys, monkeypatch, "train", "--resume", run, "--no-progress")
    assert code == 0, err
    assert not (run / io.LOCK).exists()


@pytest.mark.slow
def test_a_second_train_process_on_one_run_is_refused(runs, tmp_path):
    io.write_yaml(tmp_path / "long.yaml", {**TRAIN, "max_steps": 100_000, "checkpoint_every": 50_000})
    out = tmp_path / "run"
    first = start(["train", "--config", tmp_path / "long.yaml", "--out", out, "--no-progress"], tmp_path)
    try:
        while not (out / "checkpoints" / "step-00000001").exists() and first.poll() is None:
            time.sleep(0.01)
        second = subprocess.run(
            [sys.executable, "-m", "posym", "train", "--resume", out],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert first.poll() is None  # still training: the refusal below met a live holder
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.wait(timeout=60)
    one_line(second.returncode, second.stderr, f"{out} is in use by posym process {first.pid}")
    assert first.returncode == 130


# ==== round three (issue 31): nothing deleted, no secret printed, no remote code, every count bounded ====


def _ablate(run: Path, tmp_path: Path, save: Path) -> list:
    return [
        "ablate",
        run,
        "--heads",
        "0",
        "--mode",
        "zero",
        "--factors",
        "1",
        "--n",
        4,
        "--label-prompts",
        2,
        "--save",
        save,
        "--out",
        tmp_path / "ablation",
    ]


@pytest.mark.parametrize("target", ["unrelated-directory", "the-run-itself"])
def test_ablate_save_never_deletes_a_non_empty_directory(runs, tmp_path, capsys, monkeypatch, target):
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    if target == "the-run-itself":
        save = run
    else:
        save = tmp_path / "mine"
        (save / "notes").mkdir(parents=True)
        (save / "notes" / "thesis.tex").write_text("two years of work\n")
    before = snapshot(tmp_path)
    code, err = cli(capsys, monkeypatch, *_ablate(run, tmp_path, save))
    one_line(code, err, f"--save {save} already exists and is not an empty directory")
    assert snapshot(tmp_path) == before and not (tmp_path / "ablation").exists()


def test_directory_outputs_refuse_foreign_files_and_accept_their_own(runs, tmp_path, capsys, monkeypatch):
    from posym.runs import OUTPUTS

    out = tmp_path / "analysis"
    out.mkdir()
    (out / "dynamics.json").write_text("{}")  # a previous run of the same command: fine
    assert io.check_output(out, is_dir=True, owns=OUTPUTS["dynamics"]) == out
    (out / "paper.pdf").write_text("%PDF")  # anything else: refused
    code, err = cli(capsys, monkeypatch, "dynamics", runs / "run", "--out", out)
    one_line(code, err, "already holds files this command does not write (first: 'paper.pdf')")
    with pytest.raises(PosymError, match="already exists and is not an empty directory"):  # the writer refuses too
        with io.atomic_path(out, is_dir=True) as tmp:
            (tmp / "x").write_text("x")
    assert sorted(p.name for p in out.iterdir()) == ["dynamics.json", "paper.pdf"]


def test_outputs_never_name_the_lock_and_the_lock_is_never_replaced(runs, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    with io.locked(run) as lock:
        held = lock.read_bytes()
        code, err = cli(capsys, monkeypatch, "data", "--n", 2, "--out", lock)
        one_line(code, err, "is one of posym's own control files")
        assert lock.read_bytes() == held
    mine = tmp_path / "elsewhere"
    with io.locked(mine) as lock:  # a file put over the lock while it is held is not deleted at the end
        (mine / "user.txt").write_text("the user's\n")
        os.replace(mine / "user.txt", lock)
    assert lock.read_text() == "the user's\n"
    for name in ("validation.parquet", "validation.json"):  # `--step best` reads them: part of the run
        code, err = cli(capsys, monkeypatch, "data", "--n", 2, "--out", run / name)
        one_line(code, err, "would overwrite an input of this command")


class _Recorder(Endpoint):
    """An Endpoint that records the Authorization header of every request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        seen = self.seen = []
        handler = self.httpd.RequestHandlerClass
        original = handler.do_POST

        def do_post(request):
            seen.append(request.headers.get("Authorization"))
            original(request)

        handler.do_POST = do_post


def test_a_key_file_saved_on_windows_works_and_broken_keys_never_leak(monkeypatch):
    with _Recorder(body=chat_reply("E")) as server:
        monkeypatch.setenv("POSYM_TEST_KEY", KEY + "\r\n")  # trailing CR LF: stripped, the key works
        assert llm_bench.chat(server.endpoint, "hi") == "E" and server.seen == [f"Bearer {KEY}"]
        for bad in (KEY[:8] + "\n" + KEY[8:], KEY[:8] + "\r" + KEY[8:], "sk-ключ-0123456789"):
            monkeypatch.setenv("POSYM_TEST_KEY", bad)
            with pytest.raises(PosymError, match="holds a character an HTTP header cannot carry") as caught:
                llm_bench.chat(server.endpoint, "hi")
            assert "sk-" not in str(caught.value) and "0123" not in str(caught.value)
        assert len(server.seen) == 1  # the broken keys were never sent


def test_an_endpoint_echoing_the_key_gets_it_masked(monkeypatch):
    monkeypatch.setenv("POSYM_TEST_KEY", KEY)
    with Endpoint(body=chat_reply(f"{KEY} is your key")) as server:
        reply = llm_bench.chat(server.endpoint, "hi")
    assert reply == "*** is your key"  # and so never in bench.parquet's predicted column


BENCH_OPTIONS = [  # (extra llm-bench arguments, words of the error)
    pytest.param(["--retries", "-1"], "--retries must lie in 0..100", id="retries-negative"),
    pytest.param(["--timeout", "-1"], "--timeout must be a number of seconds", id="timeout-negative"),
    pytest.param(["--timeout", "nan"], "--timeout must be a number of seconds", id="timeout-nan"),
    pytest.param(["--timeout", "inf"], "--timeout must be a number of seconds", id="timeout-inf"),
    pytest.param(["--base-url", "http://127.0.0.1:99999/v1"], "is not a usable URL", id="port-out-of-range"),
    pytest.param(["--base-url", "http:///v1"], "names no host", id="no-host"),
    pytest.param(
        ["--base-url", "http://user:hunter2@127.0.0.1:1/v1", "--retries", "0", "--timeout", "2"],
        "endpoint http://127.0.0.1:1/v1/chat/completions failed",
        id="credentials-in-the-url",
    ),
]


@pytest.mark.parametrize("extra, words", BENCH_OPTIONS)
def test_llm_bench_options_and_urls_are_checked(tmp_path, capsys, monkeypatch, extra, words):
    argv = [
        "llm-bench",
        "--base-url",
        "http://127.0.0.1:1/v1",
        "--model-name",
        "m",
        "--n",
        1,
        "--runs",
        1,
        "--sizes",
        12,
        "--task",
        "letter",
        "--out",
        tmp_path / "out",
    ]
    for option, value in zip(extra[::2], extra[1::2]):  # replace the option's value, or add it
        if option in argv:
            argv[argv.index(option) + 1] = value
        else:
            argv += [option, value]
    code, err = cli(capsys, monkeypatch, *argv)
    one_line(code, err, words)
    assert "hunter2" not in err and not (tmp_path / "out").exists()


def test_tokenizer_auto_map_never_runs_the_directorys_code(tmp_path, monkeypatch):
    import builtins

    model = tmp_path / "model"
    model.mkdir()
    ran = tmp_path / "ran"
    (model / "evil.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\nclass EvilTokenizer:\n    pass\n")
    (model / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}})
    )
    monkeypatch.setattr(builtins, "input", lambda *a: "y")  # a user answering transformers' [y/N] prompt
    with pytest.raises(PosymError, match="cannot load the tokenizer"):
        models.tokenizer_loader(model)()
    assert not ran.exists()


def test_every_from_pretrained_goes_through_the_one_loader():
    """`posym.models.weights.pretrained` (trust_remote_code=False) is the only caller of transformers' from_pretrained."""
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "posym"
    calls = []
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_pretrained":
                function = node
                while not isinstance(function, ast.FunctionDef):
                    function = parents[function]
                remote = {k.arg: k.value for k in node.keywords}.get("trust_remote_code")
                calls.append((str(path.relative_to(src)), function.name, getattr(remote, "value", None)))
    assert calls == [("models/weights.py", "pretrained", False)]


def _raw_gguf(path: Path, fields: list, tensors: list = ()) -> Path:
    """A GGUF file written byte by byte: fields (key, type id, payload bytes), tensors (name, dims) of float32
    zeros, 32-byte aligned."""
    import math
    import struct

    def text(value: str) -> bytes:
        return struct.pack("<Q", len(value.encode())) + value.encode()

    data = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(fields))
    for key, kind, payload in fields:
        data += text(key) + struct.pack("<I", kind) + payload
    offset = 0
    for name, dims in tensors:
        data += text(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        data += struct.pack("<IQ", 0, offset)
        offset += -(-math.prod(dims) * 4 // 32) * 32
    path.write_bytes(data + b"\0" * (-len(data) % 32) + b"\0" * offset)
    return path


def _gguf_fields(**sizes) -> list:
    import struct

    fields = [("general.architecture", 8, struct.pack("<Q", 5) + b"llama")]
    return fields + [(f"llama.{k}", 4, struct.pack("<I", v)) for k, v in sizes.items()]


_SMALL = dict(block_count=1, embedding_length=8, feed_forward_length=16, context_length=16)
_NESTED = b"".join(__import__("struct").pack("<IQ", 9, 1) for _ in range(5000)) + __import__("struct").pack("<IQ", 4, 0)
GGUFS = {  # name -> (fields, tensors, words of the error)
    "only-the-architecture": (_gguf_fields(), [], "holds no tensors (only metadata)"),
    "sizes-but-no-blocks": (
        _gguf_fields(**{**_SMALL, "block_count": 2}),
        [("token_embd.weight", [8, 16])],
        "declares 2 blocks",
    ),
    "huge-feed-forward": (
        _gguf_fields(**{**_SMALL, "feed_forward_length": 10**9}),
        [("token_embd.weight", [8, 16]), ("blk.0.attn_q.weight", [8, 8])],
        "metadata describes",
    ),
    "nested-arrays": (_gguf_fields() + [("x.nested", 9, _NESTED)], [], "header is truncated or corrupt"),
    "alignment-zero": (
        _gguf_fields() + [("general.alignment", 4, (0).to_bytes(4, "little"))],
        [],
        "general.alignment must be a positive integer",
    ),
    "alignment-string": (
        _gguf_fields() + [("general.alignment", 8, (2).to_bytes(8, "little") + b"32")],
        [],
        "general.alignment must be a positive integer",
    ),
}


@pytest.mark.parametrize("name", list(GGUFS))
def test_a_gguf_file_without_its_weights_is_refused_before_anything_is_built(tmp_path, capsys, monkeypatch, name):

    def build(*args, **kwargs):
        raise AssertionError("transformers was asked to build the model")

    monkeypatch.setattr(models.cache, "gguf_model", build)
    fields, tensors, words = GGUFS[name]
    path = _raw_gguf(tmp_path / "m.gguf", fields, tensors)
    code, err = cli(capsys, monkeypatch, "llm-scores", path, "--text", "a b c d", "--out", tmp_path / "out")
    one_line(code, err, words)
    assert not (tmp_path / "out").exists()


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("where", ["prompts", "config.json", "posym.json", "yaml"])
def test_deep_nesting_is_one_line(runs, tmp_path, capsys, monkeypatch, where):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(_step(runs), ckpt)
    argv = ["score", ckpt, "--n", 2, "--out", tmp_path / "s.parquet"]
    if where == "prompts":
        (tmp_path / "p.jsonl").write_text('{"input_ids": ' + DEEP + "}\n")
        argv += ["--prompts", tmp_path / "p.jsonl"]
    elif where == "yaml":
        (tmp_path / "c.yaml").write_text("model: " + "[" * 20_000 + "]" * 20_000 + "\n")
        argv = ["train", "--config", tmp_path / "c.yaml", "--out", tmp_path / "new"]
    else:
        (ckpt / where).write_text('{"a": ' + DEEP + "}")
    code, err = cli(capsys, monkeypatch, *argv)
    one_line(code, err, "levels deep")


COUNTS = [  # (argv with {run}, {ckpt}, {tmp}; words of the error)
    pytest.param(["eval", "{ckpt}", "--n", 10**12], "--n 1,000,000,000,000 asks for at least", id="eval-n"),
    pytest.param(["score", "{run}", "--n", 10**12, "--out", "{tmp}/s.parquet"], "asks for at least", id="score-n"),
    pytest.param(["dynamics", "{run}", "--n", 10**12, "--out", "{tmp}/d"], "asks for at least", id="dynamics-n"),
    pytest.param(["geometry", "{run}", "--n", 10**12, "--out", "{tmp}/g"], "asks for at least", id="geometry-n"),
    pytest.param(["data", "--n", 10**12, "--out", "{tmp}/d.parquet"], "--n 1,000,000,000,000 asks", id="data-n"),
    pytest.param(
        ["data", "--n", 1, "--extra-target", 10**12, "--out", "{tmp}/d.parquet"],
        "--extra-target 1,000,000,000,000 asks",
        id="data-extra-target",
    ),
    pytest.param(
        [
            "llm-bench",
            "--base-url",
            "http://127.0.0.1:1/v1",
            "--model-name",
            "m",
            "--n",
            10**12,
            "--runs",
            1,
            "--sizes",
            12,
            "--out",
            "{tmp}/b",
        ],
        "--n 1,000,000,000,000 asks",
        id="llm-bench-n",
    ),
    pytest.param(
        [
            "llm-bench",
            "--base-url",
            "http://127.0.0.1:1/v1",
            "--model-name",
            "m",
            "--n",
            1,
            "--runs",
            1,
            "--sizes",
            10**12,
            "--out",
            "{tmp}/b",
        ],
        "--size 1,000,000,000,000 asks",
        id="llm-bench-size",
    ),
]


@pytest.mark.parametrize("argv, words", COUNTS)
def test_every_count_option_is_bounded_by_a_memory_estimate(runs, tmp_path, capsys, monkeypatch, argv, words):
    args = [a.format(run=runs / "run", ckpt=_step(runs), tmp=tmp_path) if isinstance(a, str) else a for a in argv]
    code, err = cli(capsys, monkeypatch, *args)
    one_line(code, err, words, "GiB", "use at most")
    assert not list(tmp_path.iterdir())


def test_llm_scores_size_and_n_are_bounded(tmp_path, capsys, monkeypatch):
    from tiny_llms import save_model, tokenizer

    model = save_model(tmp_path / "llama", "llama", tokenizer(), positions=64)
    code, err = cli(
        capsys, monkeypatch, "llm-scores", model, "--prompts", "number", "--size", 10**8, "--out", tmp_path / "o"
    )
    one_line(code, err, "--size 100000000 makes number prompts of at least", "positions of llama")
    code, err = cli(
        capsys,
        monkeypatch,
        "llm-scores",
        model,
        "--prompts",
        "letter",
        "--size",
        4,
        "--n",
        10**12,
        "--out",
        tmp_path / "o",
    )
    one_line(code, err, "--n 1,000,000,000,000 is more than the 100,000 posym allows")  # resources.BOUNDS (issue 55)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "change, words",
    [
        ({"vocab_size": "64"}, "vocab_size must be a positive integer, got '64'"),
        ({"n_head": 0}, "n_head must be a positive integer, got 0"),
    ],
    ids=["vocab_size-a-string", "no-heads"],
)
def test_config_json_sizes_are_checked(runs, tmp_path, capsys, monkeypatch, change, words):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(_step(runs), ckpt)
    (ckpt / "config.json").write_text(json.dumps({**json.loads((ckpt / "config.json").read_text()), **change}))
    code, err = cli(capsys, monkeypatch, "score", ckpt, "--n", 2, "--out", tmp_path / "s.parquet")
    one_line(code, err, words)


def test_a_llm_config_json_with_zero_heads_is_one_line(tmp_path, capsys, monkeypatch):
    from tiny_llms import save_model, tokenizer

    model = save_model(tmp_path / "llama", "llama", tokenizer(), positions=64)
    (model / "config.json").write_text(
        json.dumps({**json.loads((model / "config.json").read_text()), "num_attention_heads": 0})
    )
    code, err = cli(capsys, monkeypatch, "llm-scores", model, "--text", "a b c", "--out", tmp_path / "o")
    one_line(code, err, "num_attention_heads must be a positive integer, got 0")


@pytest.mark.parametrize("run_files", ["validation.parquet", "metrics.parquet"])
def test_damaged_run_tables_are_one_line_for_step_best(runs, tmp_path, capsys, monkeypatch, run_files):
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    table = run / run_files
    if not table.exists():
        io.write_parquet(table, __import__("pandas").DataFrame({"step": [0], "val_n": [8], "val_acc": [0.5]}))
    table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])
    code, err = cli(capsys, monkeypatch, "validate", run, "--n", 8)
    one_line(code, err, f"{table} is damaged")
    if run_files == "validation.parquet":  # --step best reads the cache (not metrics.parquet)
        code, err = cli(capsys, monkeypatch, "eval", run, "--step", "best", "--n", 8)
        one_line(code, err, f"{table} is damaged")


@pytest.mark.parametrize("content", ["not json", "{}", "[]"], ids=["not-json", "empty-object", "a-list"])
def test_a_damaged_theory_json_is_one_line_in_report(tmp_path, capsys, monkeypatch, content):
    theory = tmp_path / "theory"
    theory.mkdir()
    (theory / "theory.json").write_text(content)
    code, err = cli(capsys, monkeypatch, "report", theory, "--out", tmp_path / "report")
    one_line(code, err, str(theory))
    assert not (tmp_path / "report").exists()


def test_a_malicious_pickle_with_allow_pickle_is_one_line(tmp_path, capsys, monkeypatch):
    import torch
    from tiny_llms import save_model, tokenizer

    model = save_model(tmp_path / "llama", "llama", tokenizer(), positions=64, pickle=True)
    ran = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {ran}",))

    torch.save({"model.embed_tokens.weight": Evil()}, model / "pytorch_model.bin")  # torch.save pickles it
    code, err = cli(
        capsys, monkeypatch, "llm-scores", model, "--allow-pickle", "--text", "a b c", "--out", tmp_path / "o"
    )
    one_line(code, err, "restricted unpickler refused them")
    assert not ran.exists()


def test_outputs_honour_the_umask(runs, tmp_path, capsys, monkeypatch):
    old = os.umask(0o022)
    try:
        monkeypatch.setattr(io, "_UMASK", 0o022)
        run = tmp_path / "run"
        train(resolve_config("quick", "number", runs / "train.yaml"), run, progress=False, stop_at=1)
        code, err = cli(
            capsys,
            monkeypatch,
            "ablate",
            run,
            "--heads",
            "0",
            "--mode",
            "zero",
            "--factors",
            "1",
            "--n",
            4,
            "--label-prompts",
            2,
            "--save",
            tmp_path / "pruned",
            "--out",
            tmp_path / "abl",
        )
        assert code == 0, err
    finally:
        os.umask(old)
    checked = [*(run / "checkpoints").rglob("*"), tmp_path / "pruned", *(tmp_path / "pruned").iterdir()]
    assert any(p.name == "model.safetensors" for p in checked)
    for path in [run / "checkpoints", *checked]:
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path


@pytest.mark.slow
def test_sigterm_is_answered_as_ctrl_c(runs, tmp_path):
    out = tmp_path / "run"
    proc = start(["train", "--config", runs / "full.yaml", "--out", out, "--no-progress"], tmp_path)
    deadline = time.time() + 180
    while not (out / "checkpoints" / "step-00000004").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)
    code, err = answer(proc)
    assert code == 143 and err.startswith("posym: terminated: kept checkpoints up to step") and err.count("\n") == 1, (
        err
    )
    assert not (out / io.LOCK).exists() and not [p for p in out.rglob(".*")]


@pytest.mark.parametrize("signum, word", [(signal.SIGTERM, "terminated"), (signal.SIGHUP, "hung up")])
def test_sigterm_or_sighup_during_score_is_one_line_and_leaves_nothing(runs, tmp_path, signum, word):
    # a kill and a closed terminal (ssh dropped) are answered as a Ctrl-C: one line, exit 128 + the signal
    out = tmp_path / "scores" / "s.parquet"
    proc = start(["score", runs / "run", "--n", 100000, "--batch-size", 1, "--out", out], tmp_path)
    deadline = time.time() + 180
    while not (out.parent.is_dir() and any(out.parent.iterdir())) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    os.killpg(proc.pid, signum)
    code, err = answer(proc)
    assert code == 128 + signum, err
    assert err.startswith(f"posym: {word}: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert not list(out.parent.iterdir())


def _run_code(code: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c code ARGS` with the stop signals at their defaults (not SIGHUP ignored, as under `nohup`:
    posym would rightly leave it so), its output captured."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
        check=False,
        preexec_fn=_default_signals,
    )


_SWALLOWED = """
import signal, time
from posym import io
io.handle_signals()

class Garbage:
    def __del__(self):  # the signal's handler runs here, where Python swallows what it raises
        signal.raise_signal(signal.SIGTERM)

try:
    Garbage()
    deadline = time.time() + 10
    while time.time() < deadline:
        time.sleep(0.001)
    print("ran on")
except io.Signalled as exc:
    io.answered()  # as posym.cli.main does
    print("stopped", exc.signum, io._RECEIVED)
"""


def test_a_signal_swallowed_inside_a_finalizer_is_delivered_again():
    """A stop signal whose handler ran inside a `__del__` raised its Signalled where Python swallows it:
    `posym score` then scored on after a SIGTERM (once, in a clean-clone `.ci/run`). The unraisable hook delivers it again,
    and it is raised in the main code as the first signal, with nothing printed about the finalizer."""
    done = _run_code(_SWALLOWED)
    assert done.stdout.split() == ["stopped", str(int(signal.SIGTERM)), f"[{int(signal.SIGTERM)}]"], done
    assert "Exception ignored" not in done.stderr, done.stderr


_SWALLOWED_BY_CODE = """
import signal, time
from posym import io
io.handle_signals()
try:
    signal.raise_signal(signal.SIGHUP)
except BaseException:  # a library that swallows everything, or a C call that clears any error
    pass
try:
    deadline = time.time() + 10
    while time.time() < deadline:
        time.sleep(0.001)
    print("ran on")
except io.Signalled as exc:
    io.answered()  # as posym.cli.main does
    print("stopped", exc.signum, io._RECEIVED)
"""


def test_a_signal_swallowed_without_a_trace_is_delivered_again_once_its_exception_is_freed():
    """No unraisable hook sees a Signalled that code catches and drops; freed before posym answered it,
    it is delivered again (half a second later) and raised as the first signal."""
    done = _run_code(_SWALLOWED_BY_CODE)
    assert done.stdout.split() == ["stopped", str(int(signal.SIGHUP)), f"[{int(signal.SIGHUP)}]"], done
    assert "Exception ignored" not in done.stderr, done.stderr


def test_a_signal_freed_after_posym_answered_it_is_not_delivered_again():
    code = _SWALLOWED_BY_CODE.replace("    pass", "    io.answered()")
    done = _run_code(code)
    assert done.stdout.split() == ["ran", "on"], done


_REPLACED_BY_AN_IMPORT = """
import signal, sys
from posym import io
from posym.cli import app, main

@app.command("cut-import")
def cut_import(kept: bool = False):
    # what a C extension's import does when the signal's handler runs inside it (pandas' pd_parser.c,
    # once in a clean-clone .ci/run): the Signalled is lost and the import answers with its own error
    def body():
        try:
            signal.raise_signal(signal.SIGHUP)
        except BaseException:
            raise ImportError("pd_parser.c could not import module pandas") from None
    if kept:
        with io.interruptible(lambda: "the command's own line"):
            body()
    body()

sys.argv = ["posym", "cut-import"] + sys.argv[1:]
main()
"""


@pytest.mark.parametrize("kept", [False, True])
def test_an_error_a_signal_caused_is_answered_as_the_signal(kept):
    """An exception that comes after a stop signal (the signal cut an import short) is the signal's effect:
    one line and exit 128 + the signal, the command's own line where it has one, never a traceback."""
    done = _run_code(_REPLACED_BY_AN_IMPORT, *(["--kept"] if kept else []))
    assert done.returncode == 128 + signal.SIGHUP, done.stderr
    line = "posym: hung up: " + ("the command's own line" if kept else "every file written so far is whole")
    assert done.stderr.startswith(line) and done.stderr.count("\n") == 1, done.stderr


def test_minor_cases_are_one_line_or_work(runs, tmp_path, capsys, monkeypatch):
    # a newline in a path: the error stays one line
    code, err = cli(capsys, monkeypatch, "score", tmp_path / "no\nsuch", "--out", tmp_path / "s.parquet")
    one_line(code, err, "no\\nsuch")
    # a raw U+2028 inside a JSON string of a prompt file is part of the string, not a line break
    (tmp_path / "p.jsonl").write_text('{"input_ids": [1, 2, 3, 4], "note": "a\u2028b"}\n', encoding="utf-8")
    code, err = cli(
        capsys, monkeypatch, "score", runs / "run", "--prompts", tmp_path / "p.jsonl", "--out", tmp_path / "s.parquet"
    )
    assert code == 0, err
    # bare `posym`: the help on stdout, one error line
    capsys.readouterr()
    code = __import__("cli_runner").run_posym(monkeypatch)
    captured = capsys.readouterr()
    assert code == 2 and captured.out.startswith("Usage: ") and "COMMAND [ARGS]" in captured.out
    assert captured.err.startswith("posym: error: give a command") and captured.err.count("\n") == 1


def test_non_utf8_bytes_in_out_are_one_line_before_the_work(tmp_path):
    out = os.fsencode(tmp_path) + b"/d\xff.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "posym", "data", "--n", "2", "--out", out], env=ENV, capture_output=True, timeout=120
    )
    one_line(done.returncode, done.stderr.decode("utf-8", "replace"), "is not UTF-8 text", "d\\xff.parquet")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["eval", "score"])
def test_nan_weights_are_named_as_such(runs, tmp_path, capsys, monkeypatch, command):
    from safetensors.torch import save_file

    ckpt = tmp_path / "ckpt"
    shutil.copytree(_step(runs), ckpt)
    weights = load_file(ckpt / "model.safetensors")
    name = sorted(weights)[0]
    weights[name][0] = float("nan")
    save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    argv = ["eval", ckpt, "--n", 8] if command == "eval" else ["score", ckpt, "--n", 2, "--out", tmp_path / "s.parquet"]
    code, err = cli(capsys, monkeypatch, *argv)
    one_line(code, err, f"the weights of {ckpt} hold NaN or infinite values")


def test_options_that_had_no_effect_are_refused(runs, tmp_path, capsys, monkeypatch):
    from tiny_llms import save_model, tokenizer

    (tmp_path / "p.jsonl").write_text('{"input_ids": [1, 2]}\n')
    code, err = cli(
        capsys, monkeypatch, "score", runs / "run", "--prompts", tmp_path / "p.jsonl", "--out", tmp_path / "s.parquet"
    )
    one_line(code, err, "a prompt needs at least 3 tokens", "got 2")
    code, err = cli(
        capsys,
        monkeypatch,
        "score",
        runs / "run",
        "--task",
        "letter",
        "--prompts",
        tmp_path / "p.jsonl",
        "--out",
        tmp_path / "s.parquet",
    )
    one_line(code, err, "--task draws the task's test prompts and --prompts reads a file")
    model = save_model(tmp_path / "llama", "llama", tokenizer(), positions=64)
    for keys in ("-1", "500"):
        code, err = cli(
            capsys,
            monkeypatch,
            "llm-scores",
            model,
            "--text",
            "alice likes red and bob likes blue",
            "--exclude-keys",
            keys,
            "--out",
            tmp_path / "o",
        )
        one_line(code, err, f"--exclude-keys {keys} is not a key of every prompt")
    assert not (tmp_path / "o").exists() and not (tmp_path / "s.parquet").exists()


# ---- round three, part A (issue 31, items 1, 2, 3, 5, 6, 11, 13, 14): what the first pass left open ----


def test_a_study_resumed_with_another_model_is_refused_by_its_weights(tmp_path, monkeypatch):
    """llm-study compares the model's identity (`models.identity`: its config and a digest of its weights),
    not the spec string: another model under the same path, or one given without a name, is refused; the
    same model under another spec continues."""
    from test_llm_study import TINY
    from tiny_llms import save_model, tokenizer

    from posym import configs, models

    config = configs.from_dict(llm_study.StudyConfig, TINY)
    monkeypatch.setitem(llm_study.STAGE_WORK, "bench", lambda loaded, config, out, progress: None)  # the resume check
    monkeypatch.setattr(llm_study, "build_study_report", lambda out: None)  # is what this test is about
    path, out = tmp_path / "model", tmp_path / "study"
    words = tokenizer()
    save_model(path, "llama", words)
    first = models.load(path)
    llm_study.run_study(first, out, config, settings={"model": str(path)}, only=["bench"])
    before = snapshot(out)
    shutil.rmtree(path)
    save_model(path, "llama", words, seed=1)  # another model where the first one was
    for settings in ({"model": str(path)}, {}):
        with pytest.raises(PosymError, match=f"{out} holds a study of model .weights [0-9a-f]+., not of model"):
            llm_study.run_study(models.load(path), out, config, settings=settings, only=["bench"])
        assert snapshot(out) == before
    shutil.copytree(out, tmp_path / "again")
    timings = llm_study.run_study(
        first, tmp_path / "again", config, settings={"model": "another/spec/of/it"}, only=["bench"]
    )
    assert timings == {"bench": "done"}


_SIGNALS = """
import os, signal, sys, time
from pathlib import Path
from posym import io
from posym import models
from posym.commands import llm_bench
from posym.commands import llm_study
from posym.commands.llm_study import report as study_report
from posym.cli import app, main

@app.command("probe")
def probe(out: Path, more: int) -> None:
    with io.locked(out):
        try:
            with io.interruptible(lambda: "kept what was finished"):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
        finally:  # the cleanup after the SIGTERM, while `more` Ctrl-Cs arrive
            for _ in range(more):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            (out / "cleaned").write_text("yes")

sys.argv = ["posym", "probe", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("more", [1, 2], ids=["a-second-signal-is-noted", "a-third-stops-at-once"])
def test_signals_during_the_cleanup_neither_cut_it_short_nor_change_the_line(tmp_path, more):
    """`kill` then Ctrl-C (or Ctrl-C twice): the second signal arrives while posym unwinds from the first. It
    used to be raised there: the lock's cleanup cut short and the command's line replaced by the generic
    one with exit 130. Now it is noted, the cleanup ends, the line and exit 143 are the first signal's; a
    third stops posym at once with one line."""
    out = tmp_path / "out"
    # SIGINT back to its default (`_default_signals`, as `start` does): a test run started in the background
    # inherits it ignored, posym then leaves it ignored, and the probe's Ctrl-Cs would never arrive
    done = subprocess.run(
        [sys.executable, "-c", _SIGNALS, str(out), str(more)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_default_signals,
    )
    assert done.returncode == 143, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    if more == 1:
        assert done.stderr == "posym: terminated: kept what was finished\n"
        assert sorted(p.name for p in out.iterdir()) == ["cleaned"]  # the lock released, the cleanup whole
    else:
        assert done.stderr == f"posym: terminated: {io.STOPPED}\n"


_B64_KEY = "sk-Ab9/cD+ef0123456789=="  # base64 characters, as many providers' keys have


@pytest.mark.parametrize(
    "spell",
    [
        lambda k: json.dumps({"error": f"bad key {k}"}).replace("/", "\\/"),  # PHP's json_encode
        lambda k: '{"error": "bad key ' + "".join(f"\\u{ord(c):04X}" for c in k) + '"}',  # every character escaped
        lambda k: "no such route /v1?key=" + __import__("urllib.parse").parse.quote(k, safe="").lower(),  # URL-encoded
    ],
    ids=["slash-escaped-json", "unicode-escaped-json", "url-encoded"],
)
def test_the_api_key_is_masked_in_every_spelling_of_it(monkeypatch, spell):
    """An endpoint echoing the key JSON-escaped or URL-encoded got past the mask (it matched the key as it is)."""
    monkeypatch.setenv("POSYM_TEST_KEY", _B64_KEY)
    body = spell(_B64_KEY)
    with Endpoint(401, "Unauthorized", body.encode()) as server, pytest.raises(PosymError) as caught:
        llm_bench.chat(server.endpoint, "hi")
    message = str(caught.value)
    assert "***" in message and "ef0123" not in message.lower() and "0065\\u0066" not in message.lower(), message
    with Endpoint(body=json.dumps({"choices": [{"message": {"content": spell(_B64_KEY)}}]}).encode()) as server:
        reply = llm_bench.chat(server.endpoint, "hi")  # the answer bench.parquet stores
    assert "***" in reply and "ef0123" not in reply.lower() and "0065\\u0066" not in reply.lower(), reply


@pytest.mark.parametrize(
    "name", ["stages/study-scores.done.json", "study.yaml", "manifest.json", "scores/heads.parquet"]
)
def test_outputs_never_name_a_done_file_or_a_study_file(tmp_path, capsys, monkeypatch, name):
    """A forged done-file makes a re-run skip its stage, and a study's study.yaml and tables are what a resume
    compares and reads: an output naming them is refused like one naming the lock (it was written)."""
    out = tmp_path / "study"
    for path, text in [
        ("study.yaml", "seed: 0\n"),
        ("manifest.json", "{}"),
        ("stages/study-scores.done.json", "{}"),
        ("scores/heads.parquet", "PAR1"),
    ]:
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(text)
    before = snapshot(tmp_path)
    code, err = cli(capsys, monkeypatch, "data", "--n", 2, "--out", out / name)
    one_line(
        code,
        err,
        *(
            ["is one of posym's own control files (the done-file"]
            if name.endswith(".done.json")
            else ["would overwrite", "an input of this command"]
        ),
    )
    assert snapshot(tmp_path) == before
    code, err = cli(capsys, monkeypatch, "data", "--n", 2, "--out", tmp_path / "elsewhere" / "stages" / "x.done.json")
    one_line(code, err, "is one of posym's own control files")  # wherever the stages folder is


def test_a_replaced_directory_output_never_takes_foreign_files_with_it(tmp_path):
    """`atomic_path(DIR, is_dir=True, replace=True)` (train's checkpoints, finetune's OUT/models/NAME) replaced
    DIR whatever it held; now only by a newer version of itself: every old entry must be in the new one."""
    saved = tmp_path / "models" / "none"
    saved.mkdir(parents=True)
    (saved / "config.json").write_text("{}")  # an earlier save: replaced
    with io.atomic_path(saved, is_dir=True, replace=True) as tmp:
        (tmp / "config.json").write_text('{"new": 1}')
        (tmp / "model.safetensors").write_text("weights")
    assert (saved / "config.json").read_text() == '{"new": 1}'
    (saved / "thesis.tex").write_text("two years of work\n")  # someone else's file: the write is refused
    with pytest.raises(PosymError, match="holds 'thesis.tex', which the new none does not"):
        with io.atomic_path(saved, is_dir=True, replace=True) as tmp:
            (tmp / "config.json").write_text('{"newer": 1}')
            (tmp / "model.safetensors").write_text("weights")
    assert (saved / "thesis.tex").read_text() == "two years of work\n" and (
        saved / "config.json"
    ).read_text() == '{"new": 1}'
    assert sorted(p.name for p in saved.parent.iterdir()) == ["none"]  # no temporary left


def test_every_read_of_a_posym_output_goes_through_the_guarded_readers():
    """Parquet tables are read only by `io.read_parquet`, JSON files only by `io.read_json(_object)` (a damaged
    file is one line naming it): llm-study's report and resume, sweep's done-files and trial metrics read
    theirs raw (truncated file: ArrowInvalid traceback). No raw read remains: `posym data`'s reading back
    of its own Parquet output (commands/data.py) goes through `io.read_parquet(..., arrow=True)`, and the
    trainer state and the cache stamp of an assembled model through the bounded JSON reader."""
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "posym"
    raw = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "io.py":
            continue
        tree = ast.parse(path.read_text())
        guarded = {
            alias.asname or alias.name
            for node in ast.walk(tree)  # `from posym.io import read_parquet`
            if isinstance(node, ast.ImportFrom) and node.module == "posym.io"
            for alias in node.names
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            owner = getattr(getattr(node.func, "value", None), "id", None)
            if (
                name in ("read_parquet", "read_table", "ParquetFile")
                and owner != "io"
                and not (owner is None and name in guarded)
            ):
                raw.append((str(path.relative_to(src)), node.lineno, f"{owner}.{name}"))
            if name == "loads" and owner == "json" and "read_text" in ast.dump(node):
                raw.append((str(path.relative_to(src)), node.lineno, "json.loads(read_text)"))
    assert raw == []


@pytest.mark.parametrize("damage", ["truncated-table", "json-list", "another-shape", "not-utf8-settings"])
def test_a_damaged_study_output_is_one_line_in_its_report(tmp_path, damage):
    """The report of `posym llm-study` (rebuilt on every resume) read its stage outputs raw: a truncated
    heads.parquet, a sinks.json holding a list, a table without posym's columns, a study.yaml that is not
    UTF-8 were tracebacks. Each is one line naming the file (or the folder) now; nothing is written."""
    import pandas as pd

    from posym.stages import mark_done

    out = tmp_path / "study"
    (out / "scores").mkdir(parents=True)
    (out / "study.yaml").write_text("seed: 0\n")
    io.write_parquet(out / "scores" / "heads.parquet", pd.DataFrame({"x": [1.0]}))
    io.write_json(out / "scores" / "sinks.json", {"binding-last": [0]})
    mark_done(out, study_report.JOB, "scores", 1.0)
    heads = out / "scores" / "heads.parquet"
    if damage == "truncated-table":
        heads.write_bytes(heads.read_bytes()[:40])
        words = f"{heads} is damaged"
    elif damage == "json-list":
        (out / "scores" / "sinks.json").write_text("[]")
        words = "sinks.json must hold a JSON object, not a list"
    elif damage == "another-shape":
        words = "holds a stage output that is not what posym llm-study writes there"
    else:
        (out / "study.yaml").write_bytes(b"seed: \xff\n")
        words = "study.yaml is damaged (not UTF-8 text"
    before = snapshot(tmp_path)
    with pytest.raises(PosymError, match=re.escape(words)):
        study_report.build_study_report(out)
    assert snapshot(tmp_path) == before


def test_a_damaged_sweep_done_file_is_one_line(tmp_path):
    from posym.commands import sweep

    done = tmp_path / "stages" / "t0-trial.done.json"
    done.parent.mkdir()
    for text, words in [("{}", "holds no table row"), ("[1]", "must hold a JSON object"), ("{", "is not valid JSON")]:
        done.write_text(text)
        with pytest.raises(PosymError, match=re.escape(words)):
            sweep._done_row(done)


def test_resume_keeps_a_train_log_that_is_not_utf8(runs, tmp_path):
    """train.log only informs: `train --resume` of a run whose log holds bytes that are not UTF-8 raised
    UnicodeDecodeError (a traceback); now it reads what it can and continues."""
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    (run / "train.log").write_bytes(b"step 0 \xff\xfe\n")
    assert train(None, run, resume=True, progress=False) == run  # (the run is finished: nothing to train)
    assert (run / "train.log").read_bytes().startswith(b"step 0 ")
