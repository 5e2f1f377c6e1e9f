"""Tiny random-init Hugging Face models with a word-level tokenizer, for the llm and bench tests.

Importable from any test in tests/ (pytest puts this folder on sys.path):
    from tiny_llms import SIZES, run_cli, save_model, tokenizer

Every model directory holds a word-level tokenizer trained in-process on the prompts the tests use
(binding prompts and Appendix H prompts up to target size max(SIZES)), so nothing is downloaded.
"""

from __future__ import annotations

import torch
from cli_runner import run_posym

from posym import prompts as prompt_sets
from posym.core.tasks import task_config, token_names
from posym.prompts import bench_prompts, binding_prompts

SIZES = (12, 16)


def tokenizer():
    """A word-level fast tokenizer whose vocabulary covers every word of the test prompts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [p.text + " " + p.answer for p in binding_prompts(50)]
    for task in ("number", "letter"):
        corpus += [p.text for p in bench_prompts(task, 12, 1)]
        extra = {"int_range": max(SIZES) + 8} if task == "number" else {}
        corpus.append(" ".join(token_names(task_config(task, target_size=max(SIZES), **extra))[1:]))
    corpus += [
        " ".join(prompt_sets.FILLER),
        " ".join(
            prompt_sets.KEYS + prompt_sets.OWNERS + prompt_sets.OBJECTS + prompt_sets.VARIABLES + prompt_sets.MARKERS
        ),
    ]
    for fmt in prompt_sets.FORMATS:  # the length families' own words (posym.prompts)
        core = prompt_sets.LengthFamily(fmt, markers=True).core(0, 0)
        corpus.append(" ".join([core.prefix, *core.facts, *core.question, core.answer, *map(str, range(100))]))
    stale = prompt_sets.LengthFamily("kv-code:competing=2:chat").core(0, 0)  # "old", "was" and the chat reply
    corpus.append(" ".join([*stale.facts, *stale.question, "Answer with one word."]))
    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.decoder = decoders.WordPiece()
    raw.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="[EOS]")


def model_config(kind: str, vocab: int, positions: int):
    """A 2-layer, 4-head config of `kind`: llama, qwen2, neox, gptj (RoPE) or gpt2 (no RoPE)."""
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


def save_model(path, kind: str, tokenizer, *, positions: int = 512, seed: int = 0, pickle: bool = False):
    """A random-init model of `kind` and `tokenizer` saved as a Hugging Face directory at `path`."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config(kind, len(tokenizer), positions))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if pickle:  # a legacy directory: the same weights as pytorch_model.bin only
        weights = path / "model.safetensors"
        torch.save(load_file(weights), path / "pytorch_model.bin")
        weights.unlink()
    return path


def run_cli(args, capsys, monkeypatch) -> tuple[int, str, str]:
    """Run `posym ARGS` in-process: (exit code, stdout, stderr)."""
    code = run_posym(monkeypatch, *args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
