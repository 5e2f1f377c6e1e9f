"""Step 3 of a load (GGUF files): the model in a GGUF file, dequantized by transformers once per process,
and once per machine into the cache.

A GGUF file is read and dequantized once per process (`_GGUF_MODELS`; later loads copy the model in
memory). The first load of a GGUF file (an embedded model, or a file named by its path) writes its
dequantized float32 weights and tokenizer into posym's cache (`posym.runs.cache_dir`) as a Hugging Face
directory (`dequantized_entry`; `posym convert`'s layout, `write_hf`), which every later process reads
instead of the GGUF file (seconds instead of minutes; bit-identical weights, the same token ids);
POSYM_DEQUANTIZED_CACHE=0 turns it off. `gguf_model` is the step's entry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path

from posym.errors import PosymError
from posym.io import atomic_path, file_sha256, read_json_object, write_json
from posym.models.weights import pretrained, tokenizer_loader, weights_digest
from posym.runs import cache_dir

# parses every metadata field twice and dequantizes in numpy); later loads copy the model in memory.
_GGUF_MODELS: dict = {}
PROCESS_COPY_MAX = 2 << 30
"""Bytes of weights up to which a GGUF model is also kept in the process for later loads (each load then
holds two copies); a larger one (Qwen2.5-Coder-1.5B: about 6 GB in float32) is handed over alone, so
peak memory is one copy, and a later load in the same process reads it again (from its dequantized copy
on disk, seconds, when the cache is on)."""
_GGUF_TOKENIZERS: dict = {}


def _gguf_key(path: Path) -> tuple:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def gguf_model(path: Path, dtype, attn_implementation: str | None, *, cached: bool = False):
    """(a fresh copy of the model in a GGUF file, a loader of its tokenizer): read once per process (see
    _GGUF_MODELS; a model over PROCESS_COPY_MAX bytes is not kept), and with `cached` from its dequantized copy in the cache (`dequantized_entry`), which
    the first read writes."""
    import copy

    key = (*_gguf_key(path), dtype, attn_implementation)
    entry = dequantized_entry(path) if cached else None
    if key not in _GGUF_MODELS:
        model = _read_dequantized(entry, attn_implementation) if entry is not None else None
        if model is None:
            # the copy holds float32, what transformers dequantizes to; other dtypes are cast from it
            import torch

            model = _read_gguf(path, torch.float32 if entry is not None else dtype, attn_implementation)
            # what save_pretrained writes into the copy's config (a GGUF config has none): the model's
            # `identity` is then the same read from the GGUF file, from its copy, or with the cache off
            model.config.architectures = [type(model).__name__]
            if entry is not None:
                _write_dequantized(entry, path, model, _gguf_tokenizer(path)())
        _GGUF_MODELS.clear()  # one model at a time: a second file replaces the first
        model = model.to(dtype).eval()
        if _weight_bytes(model) <= PROCESS_COPY_MAX:
            _GGUF_MODELS[key] = model
            model = copy.deepcopy(model)
    else:
        model = copy.deepcopy(_GGUF_MODELS[key])
    tokenizer = _gguf_tokenizer(path, entry if entry is not None and (entry / DEQUANTIZED_META).is_file() else None)
    return model, tokenizer


def _weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def _read_gguf(path: Path, dtype, attn_implementation: str | None):
    """The model in a GGUF file, dequantized by transformers (tens of seconds: see _GGUF_MODELS)."""
    from transformers import AutoModelForCausalLM
    from transformers import modeling_gguf_pytorch_utils as gguf_loader

    bar = gguf_loader.tqdm  # its per-tensor bar ignores disable_progress_bar and garbles posym's own bars
    gguf_loader.tqdm = functools.partial(bar, disable=True)
    try:
        model = pretrained(
            AutoModelForCausalLM,
            path.parent,
            gguf_file=path.name,
            dtype=dtype,
            attn_implementation=attn_implementation,
        )
    except (ValueError, KeyError, IndexError, TypeError, OSError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PosymError(f"cannot load the GGUF model {path}: {first}") from None
    finally:
        gguf_loader.tqdm = bar
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # transformers marks GGUF models as quantized (save_pretrained refuses them)
        if not all(p.dtype.is_floating_point for p in model.parameters()):
            raise PosymError(
                f"transformers kept {path} quantized (GGUF matmul kernels are installed); posym "
                "needs plain weights: load it where the `kernels` package is absent"
            )
        quantizer.remove_quantization_config(model)  # the weights are plain dequantized tensors
    return model.eval()


def _gguf_tokenizer(path: Path, entry: Path | None = None):
    """A loader of the tokenizer a GGUF file carries (read once per process; from the dequantized copy
    `entry` when there is one, since building it from the GGUF's vocabulary takes up to a minute)."""

    def read():
        key = _gguf_key(path)
        if key not in _GGUF_TOKENIZERS:
            _GGUF_TOKENIZERS.clear()
            _GGUF_TOKENIZERS[key] = tokenizer_loader(entry)() if entry is not None else _read_gguf_tokenizer(path)
        return _GGUF_TOKENIZERS[key]

    return read


def _read_gguf_tokenizer(path: Path):
    """The tokenizer transformers builds from a GGUF file's vocabulary."""
    return tokenizer_loader(path.parent, gguf_file=path.name)()


# ---- the dequantized copies of the embedded models ------------------------------------------------
# transformers dequantizes a GGUF file in numpy and builds its tokenizer from the vocabulary on every
# load: 45 s for smollm2-135m and 137 s for gemma3-270m on 2 loaded cores, against a few seconds from
# safetensors. So the first load of an embedded model writes a Hugging Face directory of its float32
# weights and tokenizer into the cache (`posym convert`'s layout), and later processes read that.

DEQUANTIZED_FORMAT = 1
"""The layout of a dequantized copy; with the GGUF file's sha256 and the versions of the libraries that
dequantize it, part of the copy's name, so a change of any of them writes a new copy."""
DEQUANTIZED_ENV = "POSYM_DEQUANTIZED_CACHE"
"""Environment variable: 0 reads the embedded models' GGUF files every time and writes no copy."""
DEQUANTIZED_META = "dequantized.json"
"""The file of a copy that says what it was made from and holds its weights' digest (`identity`)."""
DEQUANTIZED_SLACK = 256 << 20
"""Bytes of free disk a copy needs beyond its weights (the tokenizer, config, the filesystem)."""


def dequantized_entry(path: Path) -> Path:
    """The cache directory of the dequantized copy of the GGUF file at `path` (it may not exist yet):
    cache_dir()/dequantized/<file stem>-<16 hex digits of the file's sha256, DEQUANTIZED_FORMAT and the
    transformers, torch and gguf versions>. The file is hashed once per process (about a second for
    gemma3-270m's 253 MB)."""
    key = (*_gguf_key(path), str(cache_dir()))
    if key not in _ENTRIES:
        _ENTRIES[key] = _entry_name(path)
    return _ENTRIES[key]


_ENTRIES: dict = {}


def _entry_name(path: Path) -> Path:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("transformers", "torch", "gguf"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    what = {"format": DEQUANTIZED_FORMAT, "gguf_sha256": file_sha256(path), **versions}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "dequantized" / f"{path.stem}-{digest}"


def _read_dequantized(entry: Path, attn_implementation: str | None):
    """The float32 model of a dequantized copy, or None: absent, or damaged (unreadable, or its weights'
    digest not the one recorded when it was written: then removed, with a line on stderr)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    if not (entry / DEQUANTIZED_META).is_file():
        shutil.rmtree(entry, ignore_errors=True)  # not a copy (a whole one has its meta file): written anew
        return None
    try:
        recorded = read_json_object(entry / DEQUANTIZED_META).get("digest")
        model = pretrained(
            AutoModelForCausalLM,
            entry,
            dtype=torch.float32,
            attn_implementation=attn_implementation,
            use_safetensors=True,
        )
        if _weights_digest(model) != recorded:
            raise PosymError("its weights are not the ones written")
    except Exception as exc:  # noqa: BLE001 (anything wrong with posym's own copy, safetensors' errors too: read anew)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(
            f"posym: the dequantized copy {entry} is damaged ({reason}); reading the GGUF file again", file=sys.stderr
        )
        shutil.rmtree(entry, ignore_errors=True)
        return None
    return model.eval()


def _weights_digest(model) -> str:
    return weights_digest(model, model.config.model_type)


def _write_dequantized(entry: Path, path: Path, model, tokenizer) -> None:
    """Write the dequantized copy of `path` at `entry` (atomically: whole or absent), unless the disk
    lacks room for it (a line on stderr says so; the model is used all the same)."""
    import shutil

    size = _weight_bytes(model) + DEQUANTIZED_SLACK
    existing = next(p for p in (entry, *entry.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < size:
        print(
            f"posym: not caching the dequantized weights of {path.name} ({size / 2**30:.1f} GiB needed, "
            f"{free / 2**30:.1f} GiB free in {existing}); its next load reads the GGUF file again",
            file=sys.stderr,
        )
        return
    print(f"posym: caching the dequantized weights of {path.name} in {entry} (once)", file=sys.stderr)
    try:
        with atomic_path(entry, is_dir=True) as tmp:
            write_hf(model, tokenizer, tmp)
            write_json(tmp / DEQUANTIZED_META, {"source": str(path), "digest": _weights_digest(model)})
    except PosymError:  # another process wrote the copy meanwhile, or the cache is not writable
        pass


def write_hf(model, tokenizer, directory: Path) -> None:
    """A Hugging Face directory of `model` (config.json, model.safetensors) and its tokenizer (if not
    None) in `directory` (`posym convert`'s output and the dequantized copies)."""
    model.save_pretrained(directory, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
