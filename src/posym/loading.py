"""Everything that touches files on the way in or out of an analysis: one place for paths and formats.

- posym checkpoints and run directories: `<run>/checkpoints/step-%08d/` (a `save_pretrained`
  directory plus `posym.json`: step, task config, model config and the test metrics at that step);
  `list_checkpoints`, `resolve_checkpoint`, `read_checkpoint_meta`, `load_checkpoint`. Anything else
  under checkpoints/ (for example the temporary directory of a checkpoint being written) is ignored.
- Hugging Face RoPE model directories (safetensors unless the user opts in): `check_model_dir`,
  `load_hf_model` -> `LoadedModel`, `tokenize`; `load_analysable` opens either kind.
- Prompt files (JSONL): token prompts for `posym score` / geometry / discrepancy
  (`read_token_prompts`, `score_prompts`) and text prompts for real models (`read_text_prompts`),
  both parsed by `jsonl_records`.
- Score tables streamed to Parquet: `write_score_parquet`.

Nothing here computes a score; the maths lives in `posym.core`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posym.configs import from_dict
from posym.core.model import ModelConfig, resolve_device
from posym.core.rope import apply_variant
from posym.core.qk import check_prompt
from posym.core.scores import COLUMNS, FLOAT_COLUMNS, check_query_mode, queries_for, task_prompts
from posym.core.swaps import resolve_queries
from posym.core.tasks import TaskConfig
from posym.errors import PosymError
from posym.io import atomic_path, quote, read_json_object, write_json


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


def from_pretrained(loader, path: str | Path, **kwargs: Any) -> Any:
    """`loader.from_pretrained(path, **kwargs)`, a broken weights file (bad safetensors header, truncated or
    missing tensors, a config.json that disagrees with the weights) answered with one PosymError line naming
    `path` (shared by `load_checkpoint` and `load_hf_model`)."""
    from safetensors import SafetensorError
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' multi-line load report; the check below says it in one line
    try:
        model, report = loader.from_pretrained(path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
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
    try:
        hf_config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raise PosymError(f"{ckpt / 'config.json'} is not valid JSON") from None
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


# ---- Hugging Face model directories --------------------------------------------------------------


# Model types whose Hugging Face implementation applies rotary embeddings inside attention.
ROPE_MODEL_TYPES = ("gptj", "gpt_neox", "llama", "mistral", "qwen2")
# Files from which AutoTokenizer can build a tokenizer (fast JSON, SentencePiece, GPT-2 BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


@dataclass
class LoadedModel:
    """A causal LM ready for scoring: eager attention, eval mode, on its device."""

    model: Any
    tokenizer: Any
    name: str
    model_type: str
    max_positions: int
    device: str


def check_model_dir(model_dir: str | os.PathLike, *, allow_pickle: bool = False) -> dict:
    """Validate a model directory without loading weights; return its config.json as a dict."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise PosymError(f"{path} is not a Hugging Face model directory (no config.json)")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PosymError(f"{path / 'config.json'} is not valid JSON: {exc}") from None
    model_type = config.get("model_type")
    if model_type not in ROPE_MODEL_TYPES:
        raise PosymError(
            f"{path} holds a {model_type!r} model, which posym cannot score: head scores need rotary "
            f"position embeddings (RoPE) in one of {', '.join(ROPE_MODEL_TYPES)}"
        )
    if not any(path.glob("*.safetensors")):
        if not any(path.glob("*.bin")):
            raise PosymError(f"{path} has no weights (no *.safetensors file)")
        if not allow_pickle:
            raise PosymError(
                f"{path} only has pickle weights (*.bin); unpickling can run arbitrary code, so posym "
                "reads safetensors only: convert the weights, or pass --allow-pickle if you trust the file"
            )
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise PosymError(f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    return config


def load_hf_model(
    model_dir: str | os.PathLike, *, device: str = "auto", dtype: str = "float32", allow_pickle: bool = False
) -> LoadedModel:
    """Load a local RoPE causal LM and its tokenizer with eager attention (so scores can read it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise PosymError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    config = check_model_dir(model_dir, allow_pickle=allow_pickle)
    device = resolve_device(device)
    safetensors = any(Path(model_dir).glob("*.safetensors"))
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as exc:
        raise PosymError(f"cannot load the tokenizer of {model_dir}: {str(exc).splitlines()[0]}") from None
    # weights_only=True: even with --allow-pickle, torch's restricted unpickler refuses code objects.

    model = from_pretrained(AutoModelForCausalLM, model_dir, dtype=dtypes[dtype], attn_implementation="eager",
                            use_safetensors=safetensors, weights_only=True)
    model.eval().to(device)
    max_positions = getattr(model.config, "max_position_embeddings", None) or config.get("n_positions")
    return LoadedModel(model, tokenizer, Path(model_dir).name, config["model_type"], int(max_positions), device)


def tokenize(loaded: LoadedModel, text: str):
    """Token ids of `text` as a [1, T] tensor on the model's device; too long or too short is an error."""
    import torch

    ids = loaded.tokenizer(text).input_ids
    if len(ids) > loaded.max_positions:
        raise PosymError(
            f"a prompt has {len(ids)} tokens but {loaded.name} has only {loaded.max_positions} positions"
        )
    if len(ids) < 3:
        raise PosymError(f"a prompt needs at least 3 tokens to swap two keys before the query: {text!r}")
    return torch.tensor([ids], device=loaded.device)  # [1, T]


def load_analysable(path, *, step: int | None = None, device: str = "cpu", out=None,
                    attn_implementation: str = "eager") -> tuple:
    """(model, task_config, out_dir, step) for a posym run or checkpoint (its task config, default
    out_dir RUN_DIR/analysis, the loaded step) or a Hugging Face RoPE model directory (None, `out`,
    None; `out` is required there and `step` must be None). `attn_implementation` applies to posym
    checkpoints ("sdpa" is faster where nothing reads attention weights)."""
    path = Path(path)
    config_json = path / "config.json"
    try:
        hf_config = json.loads(config_json.read_text(encoding="utf-8")) if config_json.is_file() else {"model_type": "gptj"}
    except (OSError, json.JSONDecodeError):
        raise PosymError(f"{config_json} is not valid JSON") from None
    kind = hf_config.get("model_type") if isinstance(hf_config, dict) else None
    if kind == "gptj":
        model, info = load_checkpoint(path, step=step, device=device, attn_implementation=attn_implementation)
        task_config, run_dir, step = info["task_config"], info["run_dir"], info["step"]
    else:
        if step is not None or out is None:
            raise PosymError("--step and a default --out only apply to posym run directories; give --out")
        model, task_config, run_dir = load_hf_model(path, device=device).model, None, None
    if out is None:
        if run_dir is None:
            raise PosymError("give --out: only a posym run directory has a default output directory")
        out = Path(run_dir) / "analysis"
    return model, task_config, Path(out), step


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
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except ValueError as exc:  # JSONDecodeError, or an integer beyond Python's digit limit
            raise PosymError(f"{path} line {number} is not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not records:
        raise PosymError(f"prompt file {path} holds no prompts")
    return records


def read_token_prompts(path, model) -> list[dict]:
    """A prompt file: one JSON object per line with "input_ids" and optional "queries" (positions)
    and "chain" (posym data JSONL); returns [{"input_ids", "queries", "chain"}] (None when absent).
    Every problem is a PosymError naming the line."""
    prompts = []
    for number, record in jsonl_records(path):
        where = f"{path} line {number}"
        if not isinstance(record, dict) or record.get("input_ids") is None:
            raise PosymError(f"{where} must be a JSON object with an \"input_ids\" list")
        fields = {}
        for key in ("input_ids", "queries", "chain"):
            value = record.get(key)
            if value is not None and (not isinstance(value, list) or not all(type(v) is int for v in value)):
                raise PosymError(f"{where}: {key} must be a list of integers")
            if value is not None and not all(-2**63 <= v < 2**63 for v in value):  # beyond any tensor's integers
                raise PosymError(f"{where}: {key} holds an integer out of range ({quote(max(value, key=abs))})")
            fields[key] = value
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


def score_prompts(model, *, task_config=None, n_prompts=100, seed=0, prompts_file=None, queries=None):
    """(input_ids, per-prompt queries) for `posym score`: test-split task samples or a prompt file.

    queries: "last", "all", "hops" (needs chains: task samples or a "chain" on every file line) or
    None (a file's own "queries" where given, else the last token).
    """
    check_query_mode(queries)
    if prompts_file is not None:
        records = read_token_prompts(prompts_file, model)
        return [r["input_ids"] for r in records], queries_for(records, queries)
    if task_config is None:
        raise PosymError("give --task or --prompts: the model carries no posym task config")
    return task_prompts(task_config, n_prompts, seed, queries)
