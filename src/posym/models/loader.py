"""A model spec to a `LoadedModel`: the one loader, which walks the steps of a load in order, each once.

    load(spec) -> spec.resolve            a Source: embedded name, GGUF file, HF directory, posym run
               -> checkpoints.load_checkpoint (posym runs: its files checked, then its weights)
               -> files.check             config.json / safetensors headers / GGUF header, no weight read
               -> cache.gguf_model        GGUF files: dequantized once per process and once into the cache
               -> weights.read_hf         Hugging Face directories: transformers' from_pretrained

`load` returns a `LoadedModel` (eval mode; SDPA attention where the family has it, since posym reads
queries and keys, never attention weights; the tokenizer is read on first use), `tokenize` encodes a
text prompt, `load_analysable` is what geometry and discrepancy open, `identity` what tells two loaded
models apart. Every model type whose transformers implementation rotates queries and keys with the
standard `apply_rotary_pos_emb` is accepted; `posym.core.qk` checks each layer's rotation against its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posym.core.model import resolve_device
from posym.errors import PosymError
from posym.models import cache, files
from posym.models.checkpoints import load_checkpoint
from posym.models.spec import Source, resolve
from posym.models.weights import TOKENIZER_FILES, check_finite, read_hf, tokenizer_loader, weights_digest
from posym.runs import RunDir

DTYPES = ("float32", "bfloat16", "float64")
"""The weight dtypes `load` takes (torch's names)."""


@dataclass
class LoadedModel:
    """A causal LM ready for scoring: eval mode, on its device, with where it came from."""

    model: Any
    name: str
    model_type: str
    max_positions: int
    device: str
    source: Source | None = None
    info: dict = field(default_factory=dict)
    """posym runs: path, run_dir, step, task_config, model_config, metrics (`posym.models.load_checkpoint`)."""
    _tokenizer: Any = None
    _tokenizer_loader: Any = None

    @property
    def tokenizer(self):
        """The model's tokenizer (read on first use), or a PosymError if it has none."""
        if self._tokenizer is None and self._tokenizer_loader is not None:
            self._tokenizer = self._tokenizer_loader()
            self._tokenizer_loader = None
        if self._tokenizer is None:
            raise PosymError(
                f"{self.name} has no tokenizer, so text prompts cannot be encoded; give token ids "
                'in a prompt file ({"input_ids": [...]} per line)'
            )
        return self._tokenizer

    @property
    def has_tokenizer(self) -> bool:
        return self._tokenizer is not None or self._tokenizer_loader is not None

    def text_ids(self, text: str) -> list[int]:
        """The token ids of `text` under the model's own tokenizer (special tokens as it adds them). Text
        that is not Unicode a tokenizer reads (a lone surrogate, e.g. JSON's "\\ud800") is a PosymError."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PosymError(
                f"a prompt holds a lone surrogate (U+{ord(text[exc.start]):04X} at character {exc.start + 1}), "
                "which is not text a tokenizer can read; fix the prompt"
            ) from None
        return list(self.tokenizer(text).input_ids)


def load(
    spec: str | os.PathLike,
    *,
    step: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    attn_implementation: str | None = None,
    allow_pickle: bool = False,
) -> LoadedModel:
    """Load any model spec (`posym.models.spec`) in eval mode on `device` ('auto' picks cuda if present).

    dtype: float32, bfloat16 or float64. step: a checkpoint of a posym run (an error elsewhere).
    attn_implementation: "eager" (attention weights readable), "sdpa", or None: posym checkpoints eager
    (the tiny GPT-J of the training runs), other models transformers' default (SDPA where the family has
    it: 3.5x faster than eager on a 2,568-token SmolLM2 prompt; scores are the same, read from q and k).
    """
    import torch
    from transformers.utils import logging as hf_logging

    dtypes = {name: getattr(torch, name) for name in DTYPES}
    if dtype not in dtypes:
        raise PosymError(f"dtype must be float32, bfloat16 or float64, got {dtype!r}")
    source = resolve(spec)
    device = resolve_device(device)
    hf_logging.disable_progress_bar()
    if step is not None and source.kind != "posym":
        raise PosymError(f"--step picks a checkpoint of a posym run; {source.path} is a single model")
    if source.kind == "posym":
        model, info = load_checkpoint(
            source.path,
            step=step,
            device=device,
            dtype=dtypes[dtype],
            attn_implementation=attn_implementation or "eager",
        )
        loaded = LoadedModel(model, source.name, "gptj", int(model.config.n_positions), device, source, info)
        if any((info["path"] / name).is_file() for name in TOKENIZER_FILES):
            loaded._tokenizer_loader = tokenizer_loader(info["path"])
        return loaded
    config = files.check(source, dtype=dtypes[dtype], allow_pickle=allow_pickle)
    if source.kind == "gguf":
        # every GGUF file (embedded or named by its path) is read from its dequantized copy in the cache,
        # which is named by the file's sha256 (`dequantized_entry`): a changed file gets a new copy
        cached = os.environ.get(cache.DEQUANTIZED_ENV, "1") != "0"
        model, tokenizer = cache.gguf_model(source.path, dtypes[dtype], attn_implementation, cached=cached)
        check_finite(model, source.path)
    else:
        model, tokenizer = read_hf(source.path, dtypes[dtype], attn_implementation)
    model.eval().to(device)
    max_positions = getattr(model.config, "max_position_embeddings", None) or config.get("n_positions")
    loaded = LoadedModel(model, source.name, model.config.model_type, int(max_positions), device, source)
    loaded._tokenizer_loader = tokenizer
    return loaded


def identity(loaded: LoadedModel) -> dict:
    """What makes two loaded models the same model, whatever spec named them: the architecture, its
    config (paths, dtype and private keys left out) and a digest of the weights (every tensor's name and
    shape and IDENTITY_SAMPLE evenly spaced values of it, as float64). Resumable commands compare it, so
    a study continued with another model is refused even where the path is the same, and the same
    model under another spec (`smollm2-135m` or its GGUF file) continues. About 0.2 s for SmolLM2-135M
    (2 loaded CPU cores), against minutes for any study stage.

    >>> identity(load("smollm2-135m"))  # doctest: +SKIP
    {'name': 'smollm2-135m', 'model_type': 'llama', 'parameters': 134515008, 'digest': '39cef56b131ff190'}
    """
    return {
        "name": loaded.name,
        "model_type": loaded.model_type,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "digest": weights_digest(loaded.model, loaded.model_type),
    }


def tokenize(loaded: LoadedModel, text: str):
    """Token ids of `text` as a [1, T] tensor on the model's device; too long or too short is an error."""
    import torch

    ids = loaded.text_ids(text)
    if len(ids) > loaded.max_positions:
        raise PosymError(f"a prompt has {len(ids)} tokens but {loaded.name} has only {loaded.max_positions} positions")
    if len(ids) < 3:
        raise PosymError(f"a prompt needs at least 3 tokens to swap two keys before the query: {text!r}")
    return torch.tensor([ids], device=loaded.device)  # [1, T]


def load_analysable(
    path,
    *,
    step: int | None = None,
    device: str = "cpu",
    out=None,
    default: str = "analysis",
    attn_implementation: str | None = None,
) -> tuple:
    """(LoadedModel, out_dir) for any model spec: a posym run or checkpoint (its task config and step
    in `loaded.info`; default out_dir RUN_DIR/`default`, one of `ANALYSES`), smollm2-135m, a GGUF file
    or a Hugging Face directory (`out` required). `attn_implementation` as in `load` ("sdpa" is faster where nothing
    reads attention weights)."""
    loaded = load(path, step=step, device=device, attn_implementation=attn_implementation)
    if out is None:
        if loaded.info.get("run_dir") is None:
            raise PosymError("give --out: only a posym run directory has a default output directory")
        out = RunDir(loaded.info["run_dir"]).output(default)
    return loaded, Path(out)
