"""Everything that touches files on the way in or out of an analysis: one place for paths and formats.

- posym checkpoints and run directories: `<run>/checkpoints/step-%08d/` (a `save_pretrained`
  directory plus `posym.json`: step, task config, model config and the test metrics at that step);
  `list_checkpoints`, `resolve_checkpoint`, `read_checkpoint_meta`, `load_checkpoint`. Anything else
  under checkpoints/ (for example the temporary directory of a checkpoint being written) is ignored.
- Every other model format (the embedded smollm2-135m, GGUF files, Hugging Face directories) and
  the one entry point that opens any of them, posym runs included, is `posym.sources`, built on this.
- Prompt files (JSONL): token prompts for `posym score` / geometry / discrepancy
  (`read_token_prompts`, `score_prompts`; a line may hold "text" for the model's tokenizer instead
  of "input_ids") and text prompts for real models (`read_text_prompts`), both parsed by `jsonl_records`.
- Score tables streamed to Parquet: `write_score_parquet`.
- Layer x KV-head tables of KV-cache tools (DuoAttention's full_attention_heads.tsv): `read_kv_table`.

Nothing here computes a score; the maths lives in `posym.core`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posym.configs import from_dict
from posym.core.model import ModelConfig
from posym.core.rope import apply_variant
from posym.core.qk import check_prompt
from posym.core.scores import COLUMNS, FLOAT_COLUMNS, check_query_mode, queries_for, task_prompts
from posym.core.swaps import resolve_queries
from posym.core.tasks import TaskConfig
from posym.errors import PosymError
from posym.io import atomic_path, parse_json, quote, read_json, read_json_object, write_json
from posym.resources import check_count, check_declared_weights, decoder_weights, sequence_bytes


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


SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "max_position_embeddings", "head_dim", "n_layer", "n_head", "n_embd", "n_positions",
             "rotary_dim")
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


SIZE_NAMES = {"blocks": ("num_hidden_layers", "n_layer", "num_layers"), "width": ("hidden_size", "n_embd", "d_model"),
              "ffn": ("intermediate_size", "n_inner", "ffn_dim"), "vocab": ("vocab_size",)}
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
        value = next((config[k] for k in keys if isinstance(config.get(k), int) and not isinstance(config[k], bool)), None)
        sizes[name] = value
    if sizes["ffn"] is None and sizes["width"] is not None:
        sizes["ffn"] = 4 * sizes["width"]
    if any(value is None for value in sizes.values()):
        return  # an unusual family: transformers' load report still catches a mismatch after the build
    held = _safetensors_weights(directory)
    width = getattr(dtype, "itemsize", 4) if dtype is not None else 4
    check_declared_weights(directory, "its config.json", decoder_weights(**sizes), held, device=device,
                           bytes_per_weight=width)


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
            raise PosymError(f"the weights of {where} hold NaN or infinite values (first: {name}): a diverged "
                             "training or a damaged file; posym cannot score or evaluate them")
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


TRANSFORMERS_JSON = {"model": ("config.json", "generation_config.json"),
                     "tokenizer": ("config.json", "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json",
                                   "added_tokens.json", "chat_template.json")}
"""The JSON files of a model directory that transformers reads for a model and for a tokenizer; `pretrained`
reads each first with posym's bounded reader (`posym.io.read_json`), so nesting past MAX_DEPTH or a file
that is not JSON is one line."""


def from_pretrained(loader, path: str | Path, **kwargs: Any) -> Any:
    """`loader.from_pretrained(path, **kwargs)`, a broken weights file (bad safetensors header, truncated or
    missing tensors, a config.json that disagrees with the weights) answered with one PosymError line naming
    `path` (shared by `load_checkpoint` and `posym.sources.load`)."""
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
            raise PosymError(f"cannot load the model in {path}: its pickle weights hold more than tensors (torch's "
                             f"restricted unpickler refused them: {quote(first)}); posym never runs code from a "
                             "weights file") from None
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
    for kind, what in (("missing_keys", "missing from"), ("unexpected_keys", "unexpected in"),
                       ("mismatched_keys", "of another shape in")):
        keys = sorted(k if isinstance(k, str) else k[0] for k in report.get(kind) or ())
        if keys:
            raise PosymError(f"config.json of {path} does not match its weights: {len(keys)} tensors are {what} the "
                             f"weights file (first: {keys[0]}); was config.json edited or copied from another model?")
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
        raise PosymError(f"{ckpt} has no model.safetensors{pickled}; posym never loads pickled weights, because "
                         "unpickling a file can run arbitrary code")
    model = from_pretrained(GPTJForCausalLM, ckpt, use_safetensors=True, local_files_only=True,
                            attn_implementation=attn_implementation,
                            dtype=dtype if dtype is not None else torch.float32)
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


# ---- prompt files (JSONL) and score tables (Parquet) ---------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, the expected continuation and where to query it."""

    text: str
    answer: str | None = None
    focus: str | None = None  # substring whose LAST occurrence's final token is the 'name' query
    meta: dict = field(default_factory=dict)


def read_text_prompts(path: str | os.PathLike) -> list[Prompt]:
    """Prompts from a JSONL file: one object per line with "text" and optional "answer" and "focus"."""
    path = Path(path)
    prompts = []
    for number, obj in jsonl_records(path):
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise PosymError(f'{path} line {number} must be an object with a "text" string')
        unknown = sorted(set(obj) - {"text", "answer", "focus"})
        if unknown:
            raise PosymError(f"{path} line {number} has unknown key {unknown[0]!r} (text, answer, focus)")
        prompts.append(Prompt(obj["text"], obj.get("answer"), obj.get("focus"), {"set": path.name, "index": number}))
    return prompts


def jsonl_records(path) -> list[tuple[int, object]]:
    """The parsed non-blank lines of a JSONL prompt file, each with its line number (from 1).

    A missing file, a line that is not JSON or a file without records is a PosymError; what a
    record must hold is the caller's to check (`read_token_prompts`, `read_text_prompts`)."""
    path = Path(path)
    if not path.is_file():
        raise PosymError(f"prompt file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PosymError(f"prompt file {path} is not UTF-8 text (byte {exc.start} cannot be decoded)") from None
    records = []
    # lines end at \n only: str.splitlines() would also split at a raw U+2028 inside a JSON string
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        records.append((number, parse_json(line, f"{path} line {number}")))
    if not records:
        raise PosymError(f"prompt file {path} holds no prompts")
    return records


def read_token_prompts(path, model, encode=None) -> list[dict]:
    """A prompt file: one JSON object per line with "input_ids" (or "text", encoded by `encode`, the
    model's tokenizer) and optional "queries" (positions) and "chain" (posym data JSONL); returns
    [{"input_ids", "queries", "chain"}] (None when absent). Every problem is a PosymError naming the line."""
    prompts = []
    for number, record in jsonl_records(path):
        where = f"{path} line {number}"
        if isinstance(record, dict) and record.get("input_ids") is None and isinstance(record.get("text"), str):
            if encode is None:
                raise PosymError(f"{where} is text, but this model has no tokenizer; give \"input_ids\"")
            record = {**record, "input_ids": encode(record["text"])}
        if not isinstance(record, dict) or record.get("input_ids") is None:
            raise PosymError(f"{where} must be a JSON object with an \"input_ids\" list or a \"text\" string")
        fields = {}
        for key in ("input_ids", "queries", "chain"):
            value = record.get(key)
            if value is not None and (not isinstance(value, list) or not all(type(v) is int for v in value)):
                raise PosymError(f"{where}: {key} must be a list of integers")
            if value is not None and not all(-2**63 <= v < 2**63 for v in value):  # beyond any tensor's integers
                raise PosymError(f"{where}: {key} holds an integer out of range ({quote(max(value, key=abs))})")
            fields[key] = value
        if len(fields["input_ids"]) < 3:
            raise PosymError(f"{where}: a prompt needs at least 3 tokens (two keys to swap before the query), got "
                             f"{len(fields['input_ids'])}")
        ids = check_prompt(model, fields["input_ids"], where)
        if fields["queries"] is not None:
            resolve_queries(fields["queries"], len(ids), where)
        prompts.append({**fields, "input_ids": ids.tolist()})
    return prompts


def write_score_parquet(path, frames, sidecar: dict) -> int:
    """Stream score DataFrames into one Parquet file (temp name, renamed at the end) and write the
    JSON sidecar `path`.json; returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(c, pa.float64() if c in FLOAT_COLUMNS else pa.int64()) for c in COLUMNS])
    rows = 0
    with atomic_path(path) as tmp:
        with pq.ParquetWriter(tmp, schema) as writer:
            for frame in frames:
                writer.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False))
                rows += len(frame)
    write_json(f"{path}.json", {**sidecar, "rows": rows})
    return rows


def score_prompts(model, *, task_config=None, n_prompts=100, seed=0, prompts_file=None, queries=None, encode=None):
    """(input_ids, per-prompt queries) for `posym score`, geometry and discrepancy: test-split task
    samples or a prompt file (text lines encoded by `encode`, the model's tokenizer).

    queries: "last", "all", "hops" (needs chains: task samples or a "chain" on every file line) or
    None (a file's own "queries" where given, else the last token).
    """
    check_query_mode(queries)
    if prompts_file is not None:
        records = read_token_prompts(prompts_file, model, encode)
        return [r["input_ids"] for r in records], queries_for(records, queries)
    if task_config is None:
        raise PosymError("give --task or --prompts: the model carries no posym task config")
    check_count("--n", n_prompts, sequence_bytes(task_config), what="prompt")
    return task_prompts(task_config, n_prompts, seed, queries)


KV_TABLE_BYTES = 1 << 24
"""The largest layer x KV-head table `read_kv_table` reads (16 MB: far past any model's heads)."""


def read_kv_table(path: str | os.PathLike):
    """A layer x KV-head table of numbers (one line per layer, values separated by tabs, commas or
    spaces; DuoAttention's full_attention_heads.tsv and `posym atlas`'s own export) as a float64 numpy
    array [layers, kv_heads]; 0/1 masks and true/false are read as numbers too."""
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise PosymError(f"{quote(path)} is not a file")
    if path.stat().st_size > KV_TABLE_BYTES:
        raise PosymError(f"{quote(path)} is larger than {KV_TABLE_BYTES:,} bytes: not a layer x KV-head table")
    words = {"true": 1.0, "false": 0.0}
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        cells = [c for c in re.split(r"[\t, ]+", line.strip()) if c]
        if not cells:
            continue
        try:
            rows.append([words[c.lower()] if c.lower() in words else float(c) for c in cells])
        except ValueError:
            raise PosymError(f"{quote(path)} line {number} holds a value that is not a number: {line.strip()[:60]!r}") from None
    if not rows:
        raise PosymError(f"{quote(path)} holds no table")
    if len({len(r) for r in rows}) != 1:
        raise PosymError(f"{quote(path)} has lines of different lengths; a layer x KV-head table has one value per KV head")
    grid = np.array(rows, dtype=np.float64)  # [layers, kv_heads]
    if not np.isfinite(grid).all():
        raise PosymError(f"{quote(path)} holds NaN or infinite values")
    return grid
