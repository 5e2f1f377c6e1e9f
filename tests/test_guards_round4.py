"""Issue 55 (reliability, round four): the newest features under hostile input. Each test failed before its
fix; docs/reliability.md ("Round four") lists them. Bad input: exit 2, one `posym: error:` line, no traceback,
nothing written or replaced."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import cli, one_line

GRID = "layer\tkv_head_0\tkv_head_1\n0\t0.9\t0.1\n1\t0.2\t0.7\n"
"""A user's layer x KV-head table, as another tool writes it."""


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from tiny_llms import save_model, tokenizer

    return save_model(tmp_path_factory.mktemp("round4") / "llama", "llama", tokenizer())


# ---- data loss: every path a command reads is an input of the overwrite guard ------------------------------------


@pytest.mark.parametrize("given_out", [True, False], ids=["--out", "default out"])
def test_atlas_never_overwrites_its_kv_table(llama, tmp_path, capsys, monkeypatch, given_out):
    out = tmp_path / "runs" / "atlas" / "llama" if not given_out else tmp_path / "atlas"
    out.mkdir(parents=True)
    table = out / "full_attention_heads.tsv"
    table.write_text(GRID)
    monkeypatch.chdir(tmp_path)
    argv = ["atlas", llama, "--kv-table", table, "--device", "cpu"]
    code, err = cli(capsys, monkeypatch, *argv, *(["--out", out] if given_out else []))
    one_line(code, err, "would overwrite an input of this command", "full_attention_heads.tsv")
    assert table.read_text() == GRID and sorted(p.name for p in out.iterdir()) == ["full_attention_heads.tsv"]


# ---- unbounded counts and lengths: one table of bounds (posym.resources.BOUNDS), flags and YAML alike -------------

HUGE = 10**12
ATLAS_COUNTS = [  # (flags, YAML fields, the start of the message)
    pytest.param(["--n", HUGE], {}, "--n 1,000,000,000,000 is more than the 100,000 posym allows", id="--n"),
    pytest.param(["--seed", -1], {}, "--seed must be at least 0, got -1", id="--seed -1"),
    pytest.param(["--lengths", 10**9], {}, "--lengths 1,000,000,000 is more than the 1,048,576", id="--lengths"),
    pytest.param(["--lengths", 500_000], {}, "needle_lengths asks for 500,000 tokens, more than", id="--lengths 5e5"),
    pytest.param([], {"draws": 10**9}, "atlas.yaml: draws 1,000,000,000 is more than", id="draws"),
    pytest.param([], {"repeats": 10**9}, "atlas.yaml: repeats 1,000,000,000 is more than", id="repeats"),
    pytest.param([], {"repeats": 1000}, "repeat_period x repeats asks for", id="repeats 1000"),
    pytest.param([], {"needle_words": 4000}, "needle_words 4000 is more than the", id="needle_words"),
    pytest.param(
        [], {"stream_length": HUGE}, "atlas.yaml: stream_length 1,000,000,000,000 is more", id="stream_length"
    ),
    pytest.param([], {"recall_prompts": 90_000}, "recall_prompts 90,000 asks for at least", id="recall_prompts"),
    pytest.param([], {"n_binding": HUGE}, "atlas.yaml: n_binding 1,000,000,000,000 is more", id="n_binding"),
]


@pytest.mark.parametrize("flags, fields, message", ATLAS_COUNTS)
def test_every_atlas_count_and_length_is_bounded_before_any_work(
    llama, tmp_path, capsys, monkeypatch, flags, fields, message
):
    from posym import io, resources

    monkeypatch.setattr(resources, "machine_memory", lambda device: 2**26)  # 64 MiB: the same answer on any machine
    io.write_yaml(tmp_path / "atlas.yaml", {"needle_lengths": [48], "stream_length": 48, "windows": [8], **fields})
    out = tmp_path / "out"
    code, err = cli(capsys, monkeypatch, "atlas", llama, "--config", tmp_path / "atlas.yaml", *flags, "--out", out)
    one_line(code, err, message)
    assert not out.exists()


STUDY_COUNTS = [
    pytest.param({"n_binding": HUGE}, "n_binding 1,000,000,000,000 is more than the 100,000", id="n_binding"),
    pytest.param({"bench_runs": 10**9}, "bench_runs 1,000,000,000 is more than the 1,000", id="bench_runs"),
    pytest.param({"gap_prompts": HUGE}, "gap_prompts 1,000,000,000,000 is more than", id="gap_prompts"),
    pytest.param({"seed": -1}, "seed must be at least 0", id="seed"),
]


@pytest.mark.parametrize("fields, message", STUDY_COUNTS)
def test_every_study_count_is_bounded_before_any_work(llama, tmp_path, capsys, monkeypatch, fields, message):
    from posym import io

    io.write_yaml(tmp_path / "study.yaml", fields)
    out = tmp_path / "out"
    code, err = cli(capsys, monkeypatch, "llm-study", llama, "--config", tmp_path / "study.yaml", "--out", out)
    one_line(code, err, "study.yaml: " + message)
    assert not out.exists()


def test_llm_scores_binding_count_is_bounded(llama, tmp_path, capsys, monkeypatch):
    code, err = cli(capsys, monkeypatch, "llm-scores", llama, "--n", HUGE, "--out", tmp_path / "out")
    one_line(code, err, "--n 1,000,000,000,000 is more than the 100,000 posym allows")
    assert not (tmp_path / "out").exists()


# ---- half-written output sets: written into a temporary directory, then renamed (posym.io.output_set) ------------

SMALL_ATLAS = dict(
    n_binding=3,
    frequency_prompts=2,
    needle_lengths=[64],
    needle_depths=[0.5],
    stream_length=64,
    stream_prompts=1,
    windows=[8],
    sink=2,
    repeat_period=10,
    repeats=3,
    repeat_prompts=1,
    draws=10,
)


def _fail_on(monkeypatch, module, name: str, target: str):
    """Make `module.name` (a writer) raise ENOSPC when it writes a path ending in `target`."""
    import errno

    real = getattr(module, name)

    def writer(path, *args, **kwargs):
        if str(path).endswith(target):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(module, name, writer)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())} if directory.exists() else {}


def test_atlas_writes_its_tables_as_one_set(llama, tmp_path, capsys, monkeypatch):
    from posym import io

    io.write_yaml(tmp_path / "atlas.yaml", SMALL_ATLAS)
    out = tmp_path / "out"
    argv = ["atlas", llama, "--config", tmp_path / "atlas.yaml", "--no-figures", "--out", out]
    _fail_on(monkeypatch, io, "write_text", "full_attention_heads.tsv")
    code, err = cli(capsys, monkeypatch, *argv)
    one_line(code, err, "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atlas.yaml"]  # no table, no temporary
    monkeypatch.undo()
    assert cli(capsys, monkeypatch, *argv)[0] == 0
    before = _files(out)
    assert "full_attention_heads.tsv" in before and "summary.json" in before
    _fail_on(monkeypatch, io, "write_json", "summary.json")  # the last file: every table before it is new
    code, err = cli(capsys, monkeypatch, *argv, "--seed", 1)
    one_line(code, err, "No space left on device")
    assert _files(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["atlas.yaml", "out"]


def test_llm_scores_writes_its_tables_as_one_set(llama, tmp_path, capsys, monkeypatch):
    from posym.commands import llm_scores

    out = tmp_path / "out"
    argv = ["llm-scores", llama, "--n", 2, "--details", 1, "--device", "cpu", "--out", out]
    assert cli(capsys, monkeypatch, *argv, "--exclude-keys", "0")[0] == 0
    before = _files(out)
    assert "scores_excluded.parquet" in before
    _fail_on(monkeypatch, llm_scores, "write_json", "summary.json")
    code, err = cli(capsys, monkeypatch, *argv, "--seed", 1)
    one_line(code, err, "No space left on device")
    assert _files(out) == before and [p.name for p in tmp_path.iterdir()] == ["out"]
    monkeypatch.undo()
    assert cli(capsys, monkeypatch, *argv, "--seed", 1)[0] == 0  # the earlier set's own files may go
    assert "scores_excluded.parquet" not in _files(out) and _files(out)["heads.parquet"] != before["heads.parquet"]


# ---- secrets: masked in URLs, in partial echoes, and a key given as a variable name ----------------------------

KEY = "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"


class _Echo:
    """A local endpoint answering 401 with `body(path, authorization)`; records each request's path."""

    def __init__(self, body):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer, self.paths = self, []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.paths.append(self.path)
                data = body(self.path, self.headers.get("Authorization", "")).encode()
                self.send_response(401)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_token_in_the_base_urls_query_is_sent_but_never_shown(tmp_path, capsys, monkeypatch):
    with _Echo(lambda path, auth: f"no access for {path}") as server:
        code, err = cli(
            capsys,
            monkeypatch,
            "llm-bench",
            "--base-url",
            f"{server.url}?api_key={KEY}",
            "--model-name",
            "m",
            "--retries",
            0,
            "--out",
            tmp_path / "out",
        )
        assert server.paths == [f"/v1/chat/completions?api_key={KEY}"]  # the path first, then the query
    one_line(code, err, "HTTP 401", "?api_key=***")
    assert KEY[8:16] not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "echo",
    [
        lambda auth: f"invalid key {auth[7:-1]}!",  # all but the last character
        lambda auth: f"invalid key {auth[7:20]}****{auth[30:]}",  # starred in the middle
        lambda auth: f"invalid key {auth[7:].upper()}",  # case changed
    ],
    ids=["cut", "starred", "upper"],
)
def test_a_near_complete_echo_of_the_key_is_masked(monkeypatch, echo):
    from posym.commands import llm_bench
    from posym.errors import PosymError

    monkeypatch.setenv("ROUND4_KEY", KEY)
    with _Echo(lambda path, auth: echo(auth)) as server:
        endpoint = llm_bench.Endpoint(server.url, "m", "ROUND4_KEY", timeout_s=5, retries=0)
        with pytest.raises(PosymError) as caught:
            llm_bench.chat(endpoint, "hello")
    message = str(caught.value)
    assert "HTTP 401" in message and "***" in message
    for start in range(len(KEY) - 8):  # no 9 characters of the key in a row, in any case
        assert KEY[start : start + 9].lower() not in message.lower(), message


def test_a_key_given_as_the_variable_name_is_not_printed(tmp_path, capsys, monkeypatch):
    code, err = cli(
        capsys,
        monkeypatch,
        "llm-bench",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model-name",
        "m",
        "--api-key-env",
        KEY,
        "--out",
        tmp_path / "out",
    )
    one_line(code, err, "--api-key-env takes the name of an environment variable", "not shown")
    assert KEY[:9] not in err and KEY[-9:] not in err


# ---- tracebacks that are now one line ------------------------------------------------------------------------


@pytest.mark.parametrize("exists", [False, True], ids=["new directory", "existing directory"])
def test_a_full_disk_while_taking_the_lock_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, exists):
    import errno
    import os

    from posym import io
    from posym.errors import PosymError

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    directory = tmp_path / "out"
    if exists:
        directory.mkdir()
    monkeypatch.setattr(io.os, "pwrite", full)
    with pytest.raises(PosymError, match="cannot lock .*: No space left on device"):
        with io.locked(directory):
            pytest.fail("the body ran without a lock")
    monkeypatch.undo()
    assert (sorted(p.name for p in directory.iterdir()) == []) if exists else not directory.exists()


@pytest.fixture(scope="module")
def scores(llama, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scores") / "scores"
    mp = pytest.MonkeyPatch()
    from cli_runner import run_posym

    assert run_posym(mp, "llm-scores", llama, "--n", 2, "--details", 1, "--device", "cpu", "--out", out) == 0
    mp.undo()
    return out


def test_a_lone_surrogate_in_prompt_text_is_one_line(llama, tmp_path, capsys, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "Alice likes \\ud800 tea and Bob likes coffee. Alice likes"}\n')
    code, err = cli(capsys, monkeypatch, "llm-scores", llama, "--prompts", prompts, "--out", tmp_path / "a")
    one_line(code, err, "line 1", "lone surrogate (U+D800)")
    code, err = cli(capsys, monkeypatch, "llm-scores", llama, "--text", "Alice \udcff likes", "--out", tmp_path / "b")
    one_line(code, err, "lone surrogate (U+DCFF at character 7)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]


def test_explore_max_mb_inf_or_nan_is_one_line(scores, tmp_path, capsys, monkeypatch):
    for value in ("inf", "nan", "1e300"):
        code, err = cli(capsys, monkeypatch, "explore", scores, "--max-mb", value, "--out", tmp_path / "e.html")
        one_line(code, err, "--max-mb must be a number of MB in (0, 10,000]")
    assert not list(tmp_path.iterdir())


def test_explore_on_a_table_missing_a_column_is_one_line(scores, tmp_path, capsys, monkeypatch):
    import shutil

    import pandas as pd

    copy = tmp_path / "scores"
    shutil.copytree(scores, copy)
    pd.read_parquet(copy / "heads.parquet").drop(columns="s_pos").to_parquet(copy / "heads.parquet")
    code, err = cli(capsys, monkeypatch, "explore", copy, "--out", tmp_path / "e.html")
    one_line(code, err, "heads.parquet lacks the column 's_pos'")
    assert not (tmp_path / "e.html").exists()


def test_explore_with_a_model_that_cannot_load_is_an_error(scores, tmp_path, capsys, monkeypatch):
    code, err = cli(capsys, monkeypatch, "explore", scores, "--model", tmp_path / "nope", "--out", tmp_path / "e.html")
    one_line(code, err, "--model ", "does not exist")
    assert not (tmp_path / "e.html").exists()


# ---- silent cases that are now errors -------------------------------------------------------------------------


def test_llm_scores_text_and_prompts_together_is_an_error(llama, tmp_path, capsys, monkeypatch):
    code, err = cli(
        capsys, monkeypatch, "llm-scores", llama, "--text", "Alice likes tea", "--prompts", "number", "--out", tmp_path
    )
    one_line(code, err, "--text and --prompts number both say which prompts to score")
    assert not list(tmp_path.iterdir())


STUDY = {"n_binding": 2, "n_bench": 2, "frequency_prompts": 1, "lengths": [64], "bench_sizes": [12], "ablation_ks": [1]}
"""A small study config (stage 1 only is run)."""


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"ablation_ks": [1, 100_000]}, "ablation_ks reach 100,000 heads, more than the model's 8"),
        ({"exclude_keys": [0, 5000]}, "exclude_keys 5000 is not a key of every prompt: key positions lie in 0.."),
        ({"exclude_keys": [-1]}, "exclude_keys must be at least 0, got -1"),
    ],
    ids=["ablation_ks", "exclude_keys past the query", "exclude_keys negative"],
)
def test_study_values_the_model_cannot_take_are_refused_before_any_stage(
    llama, tmp_path, capsys, monkeypatch, fields, message
):
    from posym import io

    io.write_yaml(tmp_path / "study.yaml", {**STUDY, **fields})
    out = tmp_path / "out"
    code, err = cli(capsys, monkeypatch, "llm-study", llama, "--config", tmp_path / "study.yaml", "--out", out)
    one_line(code, err, message)
    assert not out.exists()


def test_llm_study_stages_empty_is_an_error(llama, tmp_path, capsys, monkeypatch):
    code, err = cli(capsys, monkeypatch, "llm-study", llama, "--stages", "", "--out", tmp_path / "out")
    one_line(code, err, "--stages names no stage; give one or more of scores, profile")
    assert not (tmp_path / "out").exists()


def test_a_study_without_its_manifest_is_not_resumed_on_any_model(llama, tmp_path, capsys, monkeypatch):
    from tiny_llms import save_model, tokenizer

    from posym import io

    other = save_model(tmp_path / "other", "llama", tokenizer(), seed=1)
    io.write_yaml(tmp_path / "cfg.yaml", STUDY)  # not study.yaml: that would make tmp_path a study
    out = tmp_path / "out"
    argv = ["--config", tmp_path / "cfg.yaml", "--stages", "scores", "--device", "cpu", "--out", out]
    assert cli(capsys, monkeypatch, "llm-study", llama, *argv)[0] == 0
    (out / "manifest.json").unlink()
    before = _files(out / "scores")
    code, err = cli(capsys, monkeypatch, "llm-study", other, *argv)
    one_line(code, err, "holds finished stages but no manifest.json")
    assert _files(out / "scores") == before


def test_a_path_is_never_shown_as_a_python_repr(tmp_path, capsys, monkeypatch):
    code, err = cli(capsys, monkeypatch, "atlas", "--kv-table", tmp_path / "nope.tsv", "--out", tmp_path / "o")
    one_line(code, err, "nope.tsv' is not a file")  # io.quote shortens a long path in the middle
    assert "PosixPath" not in err


# ---- numerically fragile heads: flagged in the score tables and the explorer ----------------------------------


def test_low_mass_is_a_column_of_the_tables_and_a_map_of_the_explorer(scores, tmp_path):
    import pandas as pd
    from browser import page_data

    from posym.commands import explore

    rows, heads = pd.read_parquet(scores / "scores.parquet"), pd.read_parquet(scores / "heads.parquet")
    assert rows.low_mass.dtype == bool and heads.low_mass.between(0, 1).all()
    explore.explore([scores], tmp_path / "e.html", details=False)
    s = page_data(tmp_path / "e.html")["sets"][0]
    assert "low_mass" in s["maps"] and s["steps"]["low_mass"] == 1e-4


def test_reuse_ablations_must_be_calibration_points(llama, tmp_path, capsys, monkeypatch):
    """--reuse-ablations: a missing file, or a Parquet table that is not a causal stage's calibration
    points, is one line and exit 2, before the study's directory is made."""
    import pandas as pd

    from posym import io

    io.write_yaml(tmp_path / "cfg.yaml", STUDY)  # not study.yaml: that would make tmp_path a study
    out = tmp_path / "out"
    code, err = cli(capsys, monkeypatch, "llm-study", llama, "--reuse-ablations", tmp_path / "no.parquet", "--out", out)
    one_line(code, err, "--reuse-ablations")
    assert "is not a file" in err and not out.exists()
    pd.DataFrame({"layer": [0], "head": [1]}).to_parquet(tmp_path / "heads.parquet")
    argv = ["--config", tmp_path / "cfg.yaml", "--stages", "scores", "--reuse-ablations", tmp_path / "heads.parquet"]
    code, err = cli(capsys, monkeypatch, "llm-study", llama, *argv, "--out", out)
    one_line(code, err, "not a causal stage's calibration_points.parquet")
    assert not out.exists()
