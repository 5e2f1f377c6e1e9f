"""posym.llm and the llm-scores / llm-bench commands on tiny random-init models built in the test.

Every model directory holds a word-level tokenizer trained in-process on the prompts the tests use,
so nothing is downloaded. The endpoint client is exercised against a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest
import torch
from reference_scores import channel_dims, reference_swap_scores

from posym import llm
from posym.cli import main
from posym.errors import PosymError
from posym.tasks import task_config, token_names

SIZES = (12, 16)


# ---- tiny models ------------------------------------------------------------------------------


def _tokenizer():
    """A word-level fast tokenizer whose vocabulary covers every word of the test prompts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [p.text + " " + p.answer for p in llm.binding_prompts(50)]
    for task in ("number", "letter"):
        corpus += [p.text for p in llm.bench_prompts(task, 12, 1)]
        extra = {"int_range": max(SIZES) + 8} if task == "number" else {}
        corpus.append(" ".join(token_names(task_config(task, target_size=max(SIZES), **extra))[1:]))
    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.decoder = decoders.WordPiece()
    raw.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="[EOS]")


def _config(kind: str, vocab: int, positions: int):
    from transformers import GPT2Config, GPTJConfig, GPTNeoXConfig, LlamaConfig, Qwen2Config

    small = dict(vocab_size=vocab, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=positions)
    if kind == "llama":  # grouped-query attention: 4 query heads share 2 key/value heads
        return LlamaConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **small)
    if kind == "qwen2":
        return Qwen2Config(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **small)
    if kind == "neox":  # partial rotary: 4 of 8 head dims rotate, 4 are position-free
        return GPTNeoXConfig(hidden_size=32, intermediate_size=64, rotary_pct=0.5, **small)
    if kind == "gptj":
        return GPTJConfig(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=positions)
    return GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=positions)


def _save(path, kind: str, tokenizer, *, positions: int = 512, seed: int = 0, pickle: bool = False):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(kind, len(tokenizer), positions))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if pickle:  # a legacy directory: the same weights as pytorch_model.bin only
        weights = path / "model.safetensors"
        torch.save(load_file(weights), path / "pytorch_model.bin")
        weights.unlink()
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm")
    tokenizer = _tokenizer()
    dirs = {kind: _save(root / kind, kind, tokenizer) for kind in ("llama", "qwen2", "neox", "gptj", "gpt2")}
    dirs["pickle"] = _save(root / "pickle", "llama", tokenizer, pickle=True)
    dirs["short"] = _save(root / "short", "llama", tokenizer, positions=16)
    dirs["notok"] = _save(root / "notok", "llama", tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dirs["notok"] / name).unlink()
    return dirs


def run_cli(args, capsys, monkeypatch) -> tuple[int, str, str]:
    """Run `posym ARGS` in-process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["posym", *map(str, args)])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---- loading and errors -----------------------------------------------------------------------


@pytest.mark.parametrize("kind,reason", [
    ("gpt2", "rotary position embeddings"),
    ("notok", "no tokenizer"),
    ("pickle", "--allow-pickle"),
])
def test_bad_model_dirs_exit_2(models, kind, reason, capsys, monkeypatch):
    code, _, err = run_cli(["llm-scores", models[kind], "--n", 1], capsys, monkeypatch)
    assert code == 2 and reason in err and err.count("\n") == 1


def test_pickle_weights_load_only_with_flag(models):
    with pytest.raises(PosymError, match="pickle"):
        llm.load_model(models["pickle"], device="cpu")
    legacy = llm.load_model(models["pickle"], device="cpu", allow_pickle=True)
    same = llm.load_model(models["llama"], device="cpu")  # same seed, same weights, safetensors
    for a, b in zip(legacy.model.parameters(), same.model.parameters()):
        assert torch.equal(a, b)


def test_prompt_longer_than_positions_exit_2(models, capsys, monkeypatch):
    code, _, err = run_cli(["llm-scores", models["short"], "--n", 1], capsys, monkeypatch)
    assert code == 2 and "only 16 positions" in err


def test_missing_dir_and_bad_options(models, tmp_path):
    with pytest.raises(PosymError, match="config.json"):
        llm.check_model_dir(tmp_path)
    with pytest.raises(PosymError, match="float32 or bfloat16"):
        llm.load_model(models["llama"], dtype="float16")
    with pytest.raises(PosymError, match="LAYER.HEAD"):
        llm.parse_heads("1-2")
    assert llm.parse_heads("0.1, 5.3") == [(0, 1), (5, 3)]


def test_bfloat16_load(models):
    loaded = llm.load_model(models["qwen2"], device="cpu", dtype="bfloat16")
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


# ---- prompts ----------------------------------------------------------------------------------


def test_binding_prompts_are_consistent_and_seeded():
    prompts = llm.binding_prompts(30, n_facts=5, seed=3)
    assert prompts == llm.binding_prompts(30, n_facts=5, seed=3)
    assert prompts != llm.binding_prompts(30, n_facts=5, seed=4)
    for p in prompts:
        facts, question = p.text.split(" What colour does ")
        pairs = dict(f.split(" likes ") for f in facts.rstrip(".").split(". "))
        assert len(pairs) == 5 and len(set(pairs.values())) == 5
        assert question == f"{p.focus} like? {p.focus} likes" and pairs[p.focus] == p.answer


@pytest.mark.parametrize("task", ["number", "letter"])
def test_bench_prompts_answer_is_the_one_hop_target(task):
    """Re-solve every puzzle and worked example from its text alone (the obvious reference)."""
    for prompt in llm.bench_prompts(task, 24, 10, seed=2):
        blocks = prompt.text.split("\n\n")
        assert len(blocks) == 5 and blocks[-1].startswith("Puzzle: ") and blocks[-1].endswith("Answer:")
        cases = [(b.split("\n")[0].split(": ")[1], b.split("Answer: ")[1]) for b in blocks[1:4]]
        cases.append((blocks[-1].split("\n")[0].split(": ")[1], prompt.answer))
        for line, answer in cases:
            tokens = line.split()
            assert len(tokens) == 24 + 8 + 1
            if task == "number":
                expected = tokens[len(tokens) - 1 - int(tokens[-1])]
            else:
                expected, = [t for t in tokens[:-1] if t[0] == tokens[-1][1]]
            assert expected == answer


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "Alice likes red", "focus": "Alice"}\n\n{"text": "x y z", "answer": "w"}\n')
    first, second = llm.read_jsonl(path)
    assert (first.focus, second.answer) == ("Alice", "w")
    path.write_text('{"txt": "oops"}\n')
    with pytest.raises(PosymError, match="line 1"):
        llm.read_jsonl(path)


def test_name_query_is_final_token_of_the_name(models):
    loaded = llm.load_model(models["llama"], device="cpu")
    prompt = llm.binding_prompts(1, seed=5)[0]
    ids = loaded.tokenizer(prompt.text).input_ids
    position = llm.query_position(loaded, prompt, "name")
    assert loaded.tokenizer.decode([ids[position]]) == prompt.focus
    assert position == len(ids) - 2  # "... Henry likes": the name is second to last
    assert llm.query_position(loaded, prompt, "last") == len(ids) - 1


# ---- the benchmark: local backend and the OpenAI-compatible endpoint ----------------------------


def test_answer_token_and_greedy_match_generate(models):
    """local_correct's argmax equals HF generate's first greedy token (the obvious reference)."""
    loaded = llm.load_model(models["gptj"], device="cpu")
    for prompt in llm.bench_prompts("letter", 12, 3, seed=1):
        target = llm.answer_token(loaded.tokenizer, prompt.text, prompt.answer)
        assert loaded.tokenizer.decode([target]) == prompt.answer
        correct, predicted = llm.local_correct(loaded, prompt)
        ids = llm.encode(loaded, prompt.text)
        greedy = loaded.model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)[0, -1]
        assert predicted == loaded.tokenizer.decode([int(greedy)])
        assert correct == (int(greedy) == target)


def test_bench_summary_table_and_screening():
    frame = pd.DataFrame({
        "task": ["letter"] * 6 + ["number"] * 2, "size": [16] * 6 + [12] * 2,
        "run": [0, 0, 0, 1, 1, 1, 0, 0], "correct": [1, 1, 1, 1, 0, 0, 1, 0],
    })
    summary = llm.bench_summary(frame).set_index(["task", "size"])
    assert summary.loc[("letter", 16), "acc_mean"] == pytest.approx((1 + 1 / 3) / 2)
    assert summary.loc[("letter", 16), "acc_std"] == pytest.approx(np.std([1, 1 / 3]))
    assert summary.loc[("letter", 16), "per_run"] == 3 and summary.loc[("number", 12), "runs"] == 1
    screen = llm.screening(summary.reset_index())
    assert screen["passes"] is False and screen["accuracy"] == pytest.approx(2 / 3)
    table = llm.bench_table(summary.reset_index(), "tiny")
    assert "| 12 | 0.50 ± 0.00 |  | 0.98 / 0.96 | 0.55 / 0.87 | 0.40 / 0.92 |" in table
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
                ids = llm.encode(outer.loaded, text)
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
    loaded = llm.load_model(models["llama"], device="cpu")
    server = _Server(loaded)
    monkeypatch.setenv("TINY_KEY", "sk-secret-123")
    common = ["--sizes", "12,16", "--runs", 2, "--n", 3]
    try:
        code, out, err = run_cli(["llm-bench", "--base-url", server.url, "--model-name", "tiny/llama",
                                  "--api-key-env", "TINY_KEY", "--out", tmp_path / "http", *common],
                                 capsys, monkeypatch)
    finally:
        server.close()
    assert code == 0, err
    code, out, err = run_cli(["llm-bench", models["llama"], "--device", "cpu", "--out", tmp_path / "local",
                              *common], capsys, monkeypatch)
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
    server = _Server(llm.load_model(models["llama"], device="cpu"), mode=mode, delay=1.0)
    monkeypatch.setenv("TINY_KEY", "sk-secret-123")
    endpoint = llm.Endpoint(server.url, "tiny", "TINY_KEY", timeout_s=0.3, retries=2, backoff_s=0.01)
    try:
        with pytest.raises(PosymError) as caught:
            llm.chat(endpoint, "Alice likes")
    finally:
        time.sleep(0.05 if mode != "sleep" else 1.0)  # let sleeping handlers finish before shutdown
        server.close()
    message = str(caught.value)
    assert expect in message and "sk-secret-123" not in message
    assert f"after {hits} attempt" in message and server.hits == hits


def test_endpoint_needs_its_key_variable(monkeypatch, capsys):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    code, _, err = run_cli(["llm-bench", "--base-url", "http://127.0.0.1:9/v1", "--model-name", "m",
                            "--api-key-env", "NO_SUCH_KEY_VAR"], capsys, monkeypatch)
    assert code == 2 and "NO_SUCH_KEY_VAR" in err


# ---- scores on real architectures ---------------------------------------------------------------


@pytest.mark.parametrize("kind,prompts", [("llama", "binding"), ("neox", "number"), ("qwen2", "letter"),
                                          ("gptj", "binding")])
def test_llm_scores_end_to_end(models, kind, prompts, tmp_path, capsys, monkeypatch):
    out = tmp_path / kind
    code, stdout, err = run_cli(["llm-scores", models[kind], "--prompts", prompts, "--n", 2, "--heads", "1.2,0.0",
                                 "--query", "name" if prompts == "binding" else "last", "--device", "cpu",
                                 "--out", out], capsys, monkeypatch)
    assert code == 0, err
    frame = pd.read_parquet(out / "scores.parquet")
    assert len(frame) == 2 * 2 * 4 and frame[["s_pos", "s_sym"]].notna().all().all()
    heads = pd.read_parquet(out / "heads.parquet")
    layers = pd.read_parquet(out / "layers.parquet")
    for layer, rows in heads.groupby("layer"):  # the per-layer medians, recomputed by hand
        got = layers.set_index("layer").loc[layer]
        assert got.median_s_pos == pytest.approx(np.median(rows.s_pos))
        assert got.median_s_sym == pytest.approx(np.median(rows.s_sym))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pearson_r"] == pytest.approx(np.corrcoef(heads.s_pos, heads.s_sym)[0, 1])
    planes = pd.read_parquet(out / "planes.parquet")
    rotary = {"llama": 8, "qwen2": 8, "neox": 4, "gptj": 4}[kind]
    assert len(planes) == 2 * (rotary // 2 + (rotary < 8))  # planes + one position-free channel
    for name in ("heads.png", "heads.svg", "planes.png", "planes.svg"):
        assert (out / name).stat().st_size > 0


@pytest.mark.parametrize("kind", ["llama", "neox", "gptj"])
def test_planes_match_the_loop_reference(models, kind, tmp_path):
    """planes.parquet of llm-scores (heads in two layers, query at the name) is the prompt mean of each
    channel's swap-by-swap reference scores and largest logit; the channels sum to HF's own logits."""
    from posym.scores import head_qk, rotate

    loaded = llm.load_model(models[kind], device="cpu")
    prompts, chosen, tau = llm.binding_prompts(2, seed=7), [(1, 3), (0, 1), (1, 0)], 1e-2
    llm.write_scores(loaded, prompts, tmp_path, query="name", heads=chosen, tau=tau, settings={"seed": 0})
    planes = pd.read_parquet(tmp_path / "planes.parquet")
    expected = []
    for prompt in prompts:
        ids = llm.encode(loaded, prompt.text)
        p = llm.query_position(loaded, prompt, "name")
        with torch.no_grad():
            attentions = loaded.model(input_ids=ids, output_attentions=True).attentions
        for layer, head in chosen:
            qk = head_qk(loaded.model, ids, [layer])[layer]
            d, r = qk.q.shape[-1], qk.cos.shape[-1]

            def rotated(x, at):
                return rotate(x.double(), qk.cos[0, at].double(), qk.sin[0, at].double(), qk.pairing)

            q_rot = rotated(qk.q[0, head, p], p)
            total = torch.zeros(p + 1, dtype=torch.float64)
            for channel, dims in enumerate(channel_dims(qk.pairing, r, d)):
                # swapped[a, b]: this channel's logit of the key of content b placed at position a
                swapped = torch.tensor([[float(qk.scale * (q_rot[dims] * rotated(qk.k[0, head, b], a)[dims]).sum())
                                         for b in range(p + 1)] for a in range(p + 1)], dtype=torch.float64)
                ref = reference_swap_scores(swapped.diagonal(), swapped, tau=tau)
                expected.append({"layer": layer, "head": head, "channel": channel, "s_pos": ref["s_pos"],
                                 "s_sym": ref["s_sym"], "max_logit": float(swapped.diagonal().max())})
                total += swapped.diagonal()
            attn = attentions[layer][0, head, p, : p + 1].double()
            torch.testing.assert_close(torch.softmax(total, 0), attn, atol=1e-6, rtol=0)
    want = pd.DataFrame(expected).groupby(["layer", "head", "channel"]).mean().sort_index()
    got = planes.set_index(["layer", "head", "channel"]).sort_index()
    assert got.index.tolist() == want.index.tolist()
    for column in ("s_pos", "s_sym", "max_logit"):
        assert got[column].tolist() == pytest.approx(want[column].tolist(), abs=1e-9)
    assert got.loc[(1, 3)].frequency_id.tolist() == list(range(1, r // 2 + 1)) + ([0] if d > r else [])


def test_answer_token_falls_back_when_the_join_merges_tokens():
    """A word tokenizer that fuses a word ending in ':' with the next word: the answer is encoded alone."""
    class Fused:
        def __call__(self, text, add_special_tokens=True):
            words = text.replace(": ", ":").split()
            return type("Encoding", (), {"input_ids": [sum(map(ord, w)) * 10 + len(w) for w in words]})()

    [b] = Fused()("b").input_ids
    assert len(Fused()("Answer: b").input_ids) == 1  # the join fused prompt end and answer
    assert llm.answer_token(Fused(), "Answer:", "b") == b
    assert llm.answer_token(Fused(), "Answer", "b") == b  # clean join: the token after the prompt
