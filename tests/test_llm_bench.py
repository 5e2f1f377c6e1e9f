"""posym.commands.llm_bench and the llm-bench command: Appendix H prompts, the local and endpoint judges, Table 3.

Models are tiny random-init Hugging Face directories (tests/tiny_llms.py). The endpoint client is
exercised against a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_llms import run_cli, save_model, tokenizer

from posym import models as model_specs
from posym import prompts as prompt_sets
from posym.commands import llm_bench
from posym.core import tasks
from posym.errors import PosymError


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    words = tokenizer()
    return {kind: save_model(root / kind, kind, words) for kind in ("llama", "gptj")}


# ---- prompts ----------------------------------------------------------------------------------


def _cases(prompt):
    """(puzzle line, answer) of the three worked examples and the puzzle of a prompt's text."""
    blocks = prompt.text.split("\n\n")
    assert len(blocks) == 5 and blocks[-1].startswith("Puzzle: ") and blocks[-1].endswith("Answer:")
    cases = [(b.split("\n")[0].split(": ")[1], b.split("Answer: ")[1]) for b in blocks[1:4]]
    return cases + [(blocks[-1].split("\n")[0].split(": ")[1], prompt.answer)]


@pytest.mark.parametrize("markers", [False, True])
@pytest.mark.parametrize("task", ["number", "letter"])
def test_bench_prompts_answer_is_the_one_hop_target(task, markers):
    """Re-solve every puzzle and worked example from its text alone (the obvious reference); marked
    prompts tag exactly the target window with places 0..23 and otherwise equal the plain ones."""
    plain = prompt_sets.bench_prompts(task, 24, 10, seed=2)
    for k, prompt in enumerate(prompt_sets.bench_prompts(task, 24, 10, seed=2, markers=markers)):
        assert ("tagged with @" in prompt.text) == markers and prompt.meta["markers"] == markers
        for (line, answer), (plain_line, plain_answer) in zip(_cases(prompt), _cases(plain[k])):
            tokens = line.split()
            assert len(tokens) == 24 + 8 + 1 and answer == plain_answer
            if markers:
                assert [t.split("@")[1] for t in tokens[:24]] == [str(i) for i in range(24)]
                assert not any("@" in t for t in tokens[24:])
                tokens = [t.split("@")[0] for t in tokens]
                assert " ".join(tokens) == plain_line
            if task == "number":
                expected = tokens[len(tokens) - 1 - int(tokens[-1])]
                if markers:  # the instruction's rule: the tag @(24 + 8) minus n
                    assert line.split()[24 + 8 - int(tokens[-1])] == f"{expected}@{24 + 8 - int(tokens[-1])}"
            else:
                (expected,) = [t for t in tokens[:-1] if t[0] == tokens[-1][1]]
            assert expected == answer


# ---- judges: local model and OpenAI-compatible endpoint ---------------------------------------


def _argmax_loop(model, ids, steps):
    """Greedy decoding written out: re-run the whole sequence, append the argmax, `steps` times."""
    for _ in range(steps):
        with torch.no_grad():
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)  # [1, T + 1]
    return ids


def test_whole_answer_judge_matches_the_argmax_loop(models):
    """local_correct = first word of the argmax loop's len(answer) + 1 tokens == the whole answer."""
    loaded = model_specs.load(models["gptj"], device="cpu")
    for prompt in prompt_sets.bench_prompts("letter", 12, 3, seed=1) + prompt_sets.bench_prompts(
        "number", 12, 2, seed=2
    ):
        target = llm_bench.answer_tokens(loaded.tokenizer, prompt.text, prompt.answer)
        assert loaded.tokenizer.decode(target).strip() == prompt.answer
        ids = model_specs.tokenize(loaded, prompt.text)
        reply = loaded.tokenizer.decode(_argmax_loop(loaded.model, ids, len(target) + 1)[0, ids.shape[1] :].tolist())
        correct, predicted = llm_bench.local_correct(loaded, prompt)
        assert predicted == tasks.reply_answer(reply)
        assert correct == (tasks.reply_answer(reply).lower() == prompt.answer.lower())


def test_first_token_matches_are_not_correct(monkeypatch):
    """'e3' split as ' e' + '3': a reply 'e5' shares the first token but is wrong; 'e3x' is wrong too."""
    prompt = prompt_sets.Prompt("Answer:", "e3")
    monkeypatch.setattr(llm_bench, "answer_tokens", lambda tok, text, answer: [1, 2])
    for reply, expected in [(" e3", True), (" E3.", True), (" e5", False), (" e3x", False), (" e", False)]:
        monkeypatch.setattr(llm_bench, "greedy_reply", lambda loaded, text, n, reply=reply: reply)
        assert llm_bench.local_correct(type("Loaded", (), {"tokenizer": None})(), prompt)[0] is expected, reply


def test_bench_summary_table_and_screening():
    frame = pd.DataFrame(
        {
            "task": ["letter"] * 8 + ["number"] * 2,
            "size": [16] * 8 + [12] * 2,
            "variant": ["plain"] * 6 + ["marked"] * 2 + ["plain"] * 2,
            "run": [0, 0, 0, 1, 1, 1, 0, 0, 0, 0],
            "correct": [1, 1, 1, 1, 0, 0, 1, 1, 1, 0],
        }
    )
    summary = llm_bench.bench_summary(frame).set_index(["task", "size", "variant"])
    assert summary.loc[("letter", 16, "plain"), "acc_mean"] == pytest.approx((1 + 1 / 3) / 2)
    assert summary.loc[("letter", 16, "plain"), "acc_std"] == pytest.approx(np.std([1, 1 / 3], ddof=1))
    assert np.isnan(summary.loc[("number", 12, "plain"), "acc_std"])  # one run: no sample std
    assert summary.loc[("letter", 16, "plain"), "per_run"] == 3 and summary.loc[("number", 12, "plain"), "runs"] == 1
    assert summary.loc[("letter", 16, "marked"), "acc_mean"] == 1.0
    screen = llm_bench.screening(summary.reset_index())  # the marked 1.0 does not count
    assert screen["passes"] is False and screen["accuracy"] == pytest.approx(2 / 3)
    table = llm_bench.bench_table(summary.reset_index(), "tiny")
    assert "| 12 | plain | 0.50 |  | 0.98 / 0.96 | 0.55 / 0.87 | 0.40 / 0.92 |" in table  # one run: the mean alone
    assert "| 16 | plain |  | 0.67 ± 0.47 |" in table
    assert "| 16 | marked |  | 1.00 |  |  |  |" in table
    assert "fails (reported, not applied)" in table


class _Server:
    """A local OpenAI-compatible chat/completions server answering with a tiny model's greedy token.

    mode: "model" (answer), "sleep" (reply after `delay` s), "500", "401" (the error body echoes the
    Authorization header, so a leak of the key into posym's message would show).
    """

    def __init__(self, loaded, mode="model", delay=0.0):
        outer = self
        self.loaded, self.mode, self.delay, self.hits = loaded, mode, delay, 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                outer.hits += 1
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": "not found"})
                if outer.mode == "401":
                    return self._send(401, {"error": f"bad key {self.headers.get('Authorization')}"})
                if outer.mode == "500":
                    return self._send(500, {"error": "boom"})
                if outer.mode == "sleep":
                    time.sleep(outer.delay)
                text = body["messages"][0]["content"]
                ids = model_specs.tokenize(outer.loaded, text)
                with torch.no_grad():
                    token = int(outer.loaded.model(input_ids=ids).logits[0, -1].argmax())
                reply = outer.loaded.tokenizer.decode([token])
                self._send(200, {"choices": [{"message": {"role": "assistant", "content": reply + "."}}]})

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_endpoint_bench_equals_local_bench(models, tmp_path, capsys, monkeypatch):
    """The same tiny model answers through HTTP and locally: identical predictions, both via the CLI."""
    loaded = model_specs.load(models["llama"], device="cpu")
    server = _Server(loaded)
    monkeypatch.setenv("TINY_KEY", "sk-secret-123")
    common = ["--sizes", "12,16", "--runs", 2, "--n", 3]
    try:
        code, out, err = run_cli(
            [
                "llm-bench",
                "--base-url",
                server.url,
                "--model-name",
                "tiny/llama",
                "--api-key-env",
                "TINY_KEY",
                "--out",
                tmp_path / "http",
                *common,
            ],
            capsys,
            monkeypatch,
        )
    finally:
        server.close()
    assert code == 0, err
    code, out, err = run_cli(
        ["llm-bench", models["llama"], "--device", "cpu", "--out", tmp_path / "local", *common], capsys, monkeypatch
    )
    assert code == 0, err
    http = pd.read_parquet(tmp_path / "http" / "bench.parquet")
    local = pd.read_parquet(tmp_path / "local" / "bench.parquet")
    assert len(local) == 2 * 2 * 2 * 3 and server.hits == len(http)
    assert http.predicted.tolist() == local.predicted.tolist()
    assert http.correct.tolist() == local.correct.tolist()
    for name in ("summary.parquet", "table.md", "bench.png", "bench.svg", "manifest.json"):
        assert (tmp_path / "local" / name).is_file() and (tmp_path / "http" / name).is_file()
    assert "GPT-5.4 (paper)" in (tmp_path / "local" / "table.md").read_text()
    for path in (tmp_path / "http").iterdir():
        assert b"sk-secret-123" not in path.read_bytes()


@pytest.mark.parametrize("mode,expect,hits", [("401", "HTTP 401", 1), ("500", "HTTP 500", 3), ("sleep", "no reply", 3)])
def test_endpoint_errors_are_clear_and_keep_the_key_secret(models, mode, expect, hits, monkeypatch):
    server = _Server(model_specs.load(models["llama"], device="cpu"), mode=mode, delay=1.0)
    monkeypatch.setenv("TINY_KEY", "sk-secret-123")
    endpoint = llm_bench.Endpoint(server.url, "tiny", "TINY_KEY", timeout_s=0.3, retries=2, backoff_s=0.01)
    try:
        with pytest.raises(PosymError) as caught:
            llm_bench.chat(endpoint, "Alice likes")
    finally:
        time.sleep(0.05 if mode != "sleep" else 1.0)  # let sleeping handlers finish before shutdown
        server.close()
    message = str(caught.value)
    assert expect in message and "sk-secret-123" not in message
    assert f"after {hits} attempt" in message and server.hits == hits


def test_endpoint_goes_through_the_environments_proxy_unless_no_proxy_names_it(monkeypatch):
    """HTTP_PROXY carries the request (absolute URL, the proxy's credentials as Proxy-Authorization, the
    API key still for the endpoint) to a host only the proxy knows; NO_PROXY sends it straight there."""
    seen = []

    class Proxy(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(
                (
                    self.path,
                    self.headers.get("Host"),
                    self.headers.get("Proxy-Authorization"),
                    self.headers.get("Authorization"),
                )
            )
            data = json.dumps({"choices": [{"message": {"content": "via proxy"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://user:p%40ss@127.0.0.1:{proxy.server_address[1]}")
    monkeypatch.setenv("TINY_KEY", "sk-secret-123")
    try:
        endpoint = llm_bench.Endpoint("http://llm.example.invalid:8000/v1", "tiny", "TINY_KEY", timeout_s=5, retries=0)
        assert llm_bench.chat(endpoint, "Alice likes") == "via proxy"
        assert seen == [
            (
                "http://llm.example.invalid:8000/v1/chat/completions",
                "llm.example.invalid:8000",
                "Basic " + base64.b64encode(b"user:p@ss").decode(),
                "Bearer sk-secret-123",
            )
        ]
        # the proxy is bypassed for a host NO_PROXY names: the request goes to that host itself
        direct = f"http://127.0.0.1:{proxy.server_address[1]}/v1"
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there: a bypass is the only way
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        assert (
            llm_bench.chat(llm_bench.Endpoint(direct, "tiny", None, timeout_s=5, retries=0), "Alice likes")
            == "via proxy"
        )
        assert seen[-1][:3] == ("/v1/chat/completions", direct[7:-3], None)
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_markers_both_runs_the_variants_side_by_side(models, tmp_path, capsys, monkeypatch):
    args = ["llm-bench", models["gptj"], "--device", "cpu", "--sizes", "12", "--runs", 1, "--n", 2]
    code, out, err = run_cli([*args, "--markers", "both", "--out", tmp_path / "both"], capsys, monkeypatch)
    assert code == 0, err
    rows = pd.read_parquet(tmp_path / "both" / "bench.parquet")
    assert len(rows) == 2 * 2 * 2 and rows.variant.tolist() == ["plain", "plain", "marked", "marked"] * 2
    plain = rows[rows.variant == "plain"].reset_index()
    assert plain.answer.tolist() == rows[rows.variant == "marked"].answer.tolist()  # the same puzzles
    code, _, err = run_cli([*args, "--out", tmp_path / "off"], capsys, monkeypatch)
    assert code == 0, err
    off = pd.read_parquet(tmp_path / "off" / "bench.parquet")
    assert off.predicted.tolist() == plain.predicted.tolist()  # --markers off is the plain half
    assert "| 12 | marked |" in (tmp_path / "both" / "table.md").read_text()
    assert "| 12 | marked |" not in (tmp_path / "off" / "table.md").read_text()
    code, _, err = run_cli([*args, "--markers", "maybe"], capsys, monkeypatch)
    assert code == 2 and "'--markers'" in err and "'maybe' is not one of 'off', 'on', 'both'" in err


def test_endpoint_needs_its_key_variable(monkeypatch, capsys):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    code, _, err = run_cli(
        ["llm-bench", "--base-url", "http://127.0.0.1:9/v1", "--model-name", "m", "--api-key-env", "NO_SUCH_KEY_VAR"],
        capsys,
        monkeypatch,
    )
    assert code == 2 and "NO_SUCH_KEY_VAR" in err


def test_answer_tokens_fall_back_when_the_join_merges_tokens():
    """A word tokenizer that fuses a word ending in ':' with the next word: the answer is encoded alone."""

    class Fused:
        def __call__(self, text, add_special_tokens=True):
            words = text.replace(": ", ":").split()
            return type("Encoding", (), {"input_ids": [sum(map(ord, w)) * 10 + len(w) for w in words]})()

    [b] = Fused()("b").input_ids
    assert len(Fused()("Answer: b").input_ids) == 1  # the join fused prompt end and answer
    assert llm_bench.answer_tokens(Fused(), "Answer:", "b") == [b]
    assert llm_bench.answer_tokens(Fused(), "Answer", "b") == [b]  # clean join: the token after the prompt


def test_bench_splits_its_questions_over_forked_workers_with_the_same_rows(models):
    """run_bench(workers=2) asks every question in a forked worker (not this process) and returns the rows of
    the one-process loop, in its order; the whole-answer judge of a local model gives the same predictions."""
    import os
    import time

    def where_asked(prompt):  # slow enough that both workers take questions
        time.sleep(0.05)
        return True, str(os.getpid())

    where = llm_bench.run_bench(where_asked, sizes=[12], runs=2, n=3, workers=2)
    assert len(where) == 12 and str(os.getpid()) not in set(where.predicted) and where.predicted.nunique() == 2
    loaded = model_specs.load(models["gptj"], device="cpu")
    judge = lambda p: llm_bench.local_correct(loaded, p)  # noqa: E731
    one, two = (llm_bench.run_bench(judge, sizes=[12], runs=2, n=2, workers=w) for w in (1, 2))
    assert one.equals(two) and one.predicted.nunique() > 1  # a tiny random model's replies differ by prompt


def test_the_bench_sizes_record_is_of_todays_default_sizes():
    """docs/benchmarks/bench_sizes.json (benchmarks/bench_sizes.py; docs/results.md's cost paragraph and
    StudyConfig.bench_sizes' docstring): one entry per default bench size and for Table 3's sizes 100 and
    300, the options the default leaves out for their cost; longer prompts at larger sizes, each share its
    seconds over the sizes' sum."""
    from pathlib import Path

    from posym.commands.llm_study import StudyConfig

    record = json.loads((Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "bench_sizes.json").read_text())
    sizes = StudyConfig().bench_sizes + [100, 300]
    assert record["bench_sizes"] == sizes and set(record["sizes"]) == {str(s) for s in sizes}
    # the docstring's "0.22 and 0.62 of the four-size stage"
    assert (record["sizes"]["100"]["share_of_stage"], record["sizes"]["300"]["share_of_stage"]) == (0.222, 0.621)
    rows = [record["sizes"][str(s)] for s in sizes]
    assert all(a["tokens_mean"] < b["tokens_mean"] for a, b in zip(rows, rows[1:]))
    total = sum(r["seconds_per_prompt"] for r in rows)
    assert all(r["share_of_stage"] == round(r["seconds_per_prompt"] / total, 3) for r in rows)
    assert all(r["prompts"] == 2 * StudyConfig().bench_n for r in rows)
