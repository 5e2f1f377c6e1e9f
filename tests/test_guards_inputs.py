"""Reliability, round three, inputs and counts (docs/reliability.md, "Round three: inputs and counts"): cases a
second adversarial pass found past the first round-three fixes (tests/test_guards.py), one test per case.

- `posym data` streams its rows to the file in bounded memory; an n whose rows the disk cannot hold is refused.
- Every count option of ablate, finetune, lengthgen and theory goes through the one range check.
- A model whose config.json describes more weights than its files hold, or than memory holds, is refused before
  transformers builds it; config.json values of the wrong type are one line.
- Every JSON and YAML posym reads goes through the bounded readers of `posym.io` (an endpoint's reply too).
- `--base-url` credentials are never written to llm-bench's files.
Bad-input cases run `posym` in-process (tests/cli_runner.py) and check: exit 2, one `posym: error:` line, no
traceback, nothing written.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from cli_runner import cli, one_line
from tiny_runs import TRAIN_2HOP

from posym import io, resources
from posym.commands import data as datasets
from posym.commands import llm_bench
from posym.commands.train import resolve_config, train
from posym.core.tasks import SAMPLE_FIELDS, TaskConfig, generate
from posym.models import list_checkpoints

SRC = Path(__file__).resolve().parents[1] / "src" / "posym"
TRAIN = {**TRAIN_2HOP, "max_steps": 16, "checkpoint_every": 8}  # 16 steps


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    io.write_yaml(root / "train.yaml", TRAIN)
    train(resolve_config("quick", "number", root / "train.yaml"), root / "run", progress=False)
    return root / "run"


@pytest.fixture
def llama(tmp_path) -> Path:
    from tiny_llms import save_model, tokenizer

    return save_model(tmp_path / "llama", "llama", tokenizer(), positions=64)


# ---- posym data: streamed, bounded by the disk ----------------------------------------------------------------


_PEAKS = """
import json, sys, tracemalloc
from pathlib import Path
from posym import resources
from posym.commands import data as datasets
from posym.core.tasks import TaskConfig

fmt, out = sys.argv[1], Path(sys.argv[2])
config = TaskConfig()
datasets.CHUNK_BYTES = 50 * resources.sequence_bytes(config)  # chunks of 50 rows
datasets.save_dataset(config, 1, 0, "train", out / f"warm.{fmt}", fmt)  # imports outside the count
peaks = []
for n in (200, 2_000):
    tracemalloc.start()
    datasets.save_dataset(config, n, 0, "train", out / f"{n}.{fmt}", fmt)
    peaks.append(tracemalloc.get_traced_memory()[1])
    tracemalloc.stop()
print(json.dumps(peaks))
"""


@pytest.mark.parametrize("fmt", datasets.FORMATS)
def test_posym_data_streams_its_rows_in_bounded_memory(tmp_path, fmt):
    """Ten times the rows, about the same peak memory (numpy arrays and Python objects, as tracemalloc sees
    them): the rows are written chunk by chunk. It used to hold every chunk until the end (16 GB in 74 s for
    --n 10^12). Measured in a process of its own: tracemalloc counts every thread's allocations, and in a
    worker shared with the rest of the suite it once read 9 MB against 1.1 MB (passing alone)."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAKS, fmt, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    small, large = json.loads(done.stdout)
    assert large < 2 * small, (small, large)


@pytest.mark.parametrize("fmt", datasets.FORMATS)
def test_a_streamed_file_holds_exactly_the_generated_rows(tmp_path, monkeypatch, fmt):
    """Chunks of 7 rows (a last partial chunk) read back equal to one generate() call, hash included."""
    config = TaskConfig(task="letter")
    monkeypatch.setattr(datasets, "CHUNK_BYTES", 7 * resources.sequence_bytes(config), raising=False)
    n = 53
    out = datasets.save_dataset(config, n, 3, "test", tmp_path / f"d.{fmt}", fmt)
    loaded_config, samples = datasets.load_dataset(out)
    expected = generate(config, n, 3, "test")
    assert loaded_config == config
    for name in SAMPLE_FIELDS:
        assert np.array_equal(getattr(samples, name), getattr(expected, name)), name
    assert io.read_json(datasets.manifest_path(out))["content_hash"] == datasets.content_hash(expected)
    empty = datasets.save_dataset(config, 0, 3, "test", tmp_path / f"e.{fmt}", fmt)
    assert len(datasets.load_dataset(empty)[1].answer) == 0


def test_posym_data_beyond_the_free_disk_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(resources, "free_disk", lambda directory: 10 * 2**20, raising=False)  # 10 MiB free
    code, err = cli(capsys, monkeypatch, "data", "--n", 100_000, "--format", "npz", "--out", tmp_path / "d.npz")
    one_line(
        code, err, "--n 100,000 asks for at least", "free disk space", "use at most 26,214"
    )  # 400 bytes a row: spooled, then archived
    assert not list(tmp_path.iterdir())


# ---- count options of ablate, finetune, lengthgen, theory ----------------------------------------------------

HUGE = 10**12
COUNTS = [  # argv with {run}, {tmp}; the option named in the error
    pytest.param(["ablate", "{run}", "--heads", "0", "--n", HUGE], "--n", id="ablate-n"),
    pytest.param(
        ["ablate", "{run}", "--heads", "0", "--n", 4, "--label-prompts", HUGE],
        "--label-prompts",
        id="ablate-label-prompts",
    ),
    pytest.param(["finetune", "{run}", "--n", HUGE], "--n", id="finetune-n"),
    pytest.param(["lengthgen", "{run}", "--lengths", "8,32", "--n", HUGE], "--n", id="lengthgen-n"),
    pytest.param(
        ["lengthgen", "{run}", "--lengths", "8,32", "--n", 4, "--head-prompts", HUGE],
        "--head-prompts",
        id="lengthgen-head-prompts",
    ),
    pytest.param(["theory", "--n0", "8", "--samples", HUGE], "--samples", id="theory-samples"),
]


@pytest.mark.parametrize("argv, option", COUNTS)
def test_every_count_option_goes_through_the_range_check(run, tmp_path, capsys, monkeypatch, argv, option):
    args = [a.format(run=run) if isinstance(a, str) else a for a in argv]
    code, err = cli(capsys, monkeypatch, *args, "--out", tmp_path / "out")
    one_line(code, err, f"{option} 1,000,000,000,000 asks for at least", "GiB", "use at most")
    assert not list(tmp_path.iterdir())


def test_ablate_factors_without_the_training_length_are_refused_first(run, tmp_path, capsys, monkeypatch):
    code, err = cli(
        capsys,
        monkeypatch,
        "ablate",
        run,
        "--heads",
        "0",
        "--n",
        4,
        "--factors",
        "2",
        "--label-prompts",
        2,
        "--out",
        tmp_path / "out",
    )
    one_line(code, err, "--factors must include 1")
    code, err = cli(
        capsys,
        monkeypatch,
        "ablate",
        run,
        "--heads",
        "0",
        "--n",
        4,
        "--factors",
        "1,9",
        "--label-prompts",
        2,
        "--out",
        tmp_path / "out",
    )  # 72 tokens: past the 64 positions
    one_line(code, err, "length 72 exceeds the model's position table of 64")
    assert not list(tmp_path.iterdir())


# ---- config.json: the model it describes, checked before the build -------------------------------------------


def _edit_config(model: Path, **change) -> None:
    path = model / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))


def _never_built(monkeypatch):
    from posym import models

    def build(*args, **kwargs):
        raise AssertionError("transformers was asked to build the model")

    monkeypatch.setattr(models.weights, "pretrained", build)


@pytest.mark.parametrize(
    "change",
    [{"num_hidden_layers": 100_000}, {"hidden_size": 10**6, "head_dim": 250_000}, {"intermediate_size": 10**7}],
    ids=["layers", "width", "feed-forward"],
)
def test_a_config_json_describing_more_than_its_weights_is_refused_before_the_build(
    llama, tmp_path, capsys, monkeypatch, change
):
    """100,000 layers over a 2-layer file used to build for minutes (1 GB and growing after 120 s)."""
    _edit_config(llama, **change)
    _never_built(monkeypatch)
    code, err = cli(capsys, monkeypatch, "llm-scores", llama, "--text", "a b c d", "--out", tmp_path / "o")
    one_line(code, err, f"{llama}: its config.json describes a model of about", "but the file holds 59,104")
    assert not (tmp_path / "o").exists()


def test_a_model_larger_than_memory_is_refused_before_the_build(llama, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(resources, "machine_memory", lambda device: 100_000)  # its 58,208 float32 weights: 233 KB
    _never_built(monkeypatch)
    code, err = cli(capsys, monkeypatch, "llm-scores", llama, "--text", "a b c d", "--out", tmp_path / "o")
    one_line(code, err, "its config.json describes a model of about", "GiB of cpu memory here")


def test_a_posym_checkpoint_config_json_with_more_layers_is_refused_before_the_build(
    run, tmp_path, capsys, monkeypatch
):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(list_checkpoints(run)[-1][1], ckpt)
    _edit_config(ckpt, n_layer=100_000)
    _never_built(monkeypatch)
    code, err = cli(capsys, monkeypatch, "eval", ckpt, "--n", 4)
    one_line(code, err, "its config.json describes a model of about")


@pytest.mark.parametrize(
    "change, words",
    [
        ({"rms_norm_eps": -1}, "Field 'rms_norm_eps' expected float"),
        ({"rope_parameters": {"rope_theta": "abc", "rope_type": "default"}}, "cannot load the model in"),
        ({"model_type": ["llama"]}, "model_type must be a string, got ['llama']"),
    ],
    ids=["eps-an-integer", "rope-theta-a-string", "model-type-a-list"],
)
def test_config_json_values_of_the_wrong_type_are_one_line(llama, tmp_path, capsys, monkeypatch, change, words):
    _edit_config(llama, **change)
    code, err = cli(capsys, monkeypatch, "llm-scores", llama, "--text", "a b c d", "--out", tmp_path / "o")
    one_line(code, err, words)
    assert not (tmp_path / "o").exists()


# ---- one bounded reader for JSON and YAML --------------------------------------------------------------------


def test_every_json_and_yaml_read_goes_through_the_bounded_readers():
    """No module but posym.io calls json.load(s) or a yaml loader: nesting is bounded and a RecursionError never
    escapes (the trainer state, dataset files, done-files, study tables and endpoint replies used json.loads)."""
    calls = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "io.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            func = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and (
                    (func.value.id == "json" and func.attr in ("load", "loads"))
                    or (func.value.id == "yaml" and "load" in func.attr)
                )
            ):
                calls.append(f"{path.relative_to(SRC)}:{node.lineno} {func.value.id}.{func.attr}")
    assert calls == []


@pytest.mark.parametrize("name", ["tokenizer_config.json", "tokenizer.json"])
def test_a_tokenizer_file_nested_100000_deep_is_one_line(llama, tmp_path, capsys, monkeypatch, name):
    """transformers reads these with its own json.load: a RecursionError traceback of ~80 lines."""
    (llama / name).write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    code, err = cli(capsys, monkeypatch, "llm-scores", llama, "--text", "a b c d", "--out", tmp_path / "o")
    one_line(code, err, f"{llama / name} nests lists or objects more than 64 levels deep")


class _Endpoint:
    """A local OpenAI-style endpoint answering every question with `content`, or with raw `body` bytes."""

    def __init__(self, content="7", body=None):
        payload = body or json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_an_endpoint_reply_nested_100000_deep_is_a_bad_reply_not_a_recursion_error():
    from posym.errors import PosymError

    with _Endpoint(body=b"[" * 100_000 + b"]" * 100_000) as server:
        endpoint = llm_bench.Endpoint(f"http://127.0.0.1:{server.port}/v1", "m", None, timeout_s=5.0, retries=0)
        with pytest.raises(PosymError, match="the reply is not an OpenAI-style chat completion"):
            llm_bench.chat(endpoint, "hi")


def test_base_url_credentials_never_reach_llm_bench_files(tmp_path, capsys, monkeypatch):
    """Not even through the manifest's config hash (a hash over a password lets anyone holding the file test
    guesses offline): the run with user:password in --base-url records the same hash as the run without."""
    hashes = []
    with _Endpoint() as server:
        for name, authority in (("secret", "user:hunter2@"), ("plain", "")):
            code, err = cli(
                capsys,
                monkeypatch,
                "llm-bench",
                "--base-url",
                f"http://{authority}127.0.0.1:{server.port}/v1",
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
                tmp_path / name,
            )
            assert code == 0, err
            assert not [p for p in (tmp_path / name).rglob("*") if p.is_file() and b"hunter2" in p.read_bytes()]
            hashes.append(io.read_json(tmp_path / name / "manifest.json")["config_hash"])
    assert hashes[0] == hashes[1]
