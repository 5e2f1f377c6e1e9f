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
