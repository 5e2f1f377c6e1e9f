"""`posym convert`: any model spec posym reads (`posym.models.load`: the embedded models, a GGUF file, a
Hugging Face directory, a posym run) written as a plain Hugging Face directory (config.json, float32
safetensors, the tokenizer) that other tools read.
"""

from __future__ import annotations

import os
from pathlib import Path

from posym.errors import PosymError
from posym.io import atomic_path, manifest, write_json
from posym.models import LoadedModel, load, write_hf


def _new_dir(out: str | os.PathLike) -> Path:
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PosymError(f"{out} already exists and is not an empty directory")
    return out


def save_hf(loaded: LoadedModel, out: str | os.PathLike, *, spec: str | os.PathLike | None = None) -> Path:
    """Write a loaded model as a plain Hugging Face directory at `out` (a new or empty directory):
    config.json, model.safetensors (its dtype; GGUF weights dequantized), the tokenizer if it has one,
    and conversion.json (source, versions). Written to a temporary sibling and renamed, so `out` is
    whole or absent."""
    out = _new_dir(out)
    tokenizer = loaded.tokenizer if loaded.has_tokenizer else None
    with atomic_path(out, is_dir=True) as tmp:
        write_hf(loaded.model, tokenizer, tmp)
        settings = {
            "spec": str(spec or loaded.source.path),
            "source": str(loaded.source.path),
            "model_type": loaded.model_type,
        }
        write_json(tmp / "conversion.json", {**settings, **manifest(settings)})
    return out


def convert(spec: str | os.PathLike, out: str | os.PathLike) -> Path:
    """`posym convert`: load any model spec (typically a GGUF file or smollm2-135m) and `save_hf` it."""
    return save_hf(load(spec), _new_dir(out), spec=spec)  # the output is checked before the long load
