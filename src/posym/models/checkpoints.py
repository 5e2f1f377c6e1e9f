"""posym runs' checkpoints as models: a checkpoint's posym.json (`read_checkpoint_meta`), which checkpoint
a run directory and step name (`resolve_checkpoint`), loading one with its task config and RoPE variant
(`load_checkpoint`), saving one (`save_model`). Which step `--step best` names is
`posym.models.selection`'s; where a run keeps what is `posym.runs`' (`RunDir`, `list_checkpoints`).

A load of a posym spec walks spec -> here -> `posym.models.files.check_checkpoint` -> the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posym.configs import from_dict, to_dict
from posym.core.model import ModelConfig
from posym.core.rope import apply_variant
from posym.core.tasks import TaskConfig
from posym.errors import PosymError
from posym.io import atomic_path, read_json_object, write_json
from posym.models.files import check_checkpoint
from posym.models.weights import check_finite, from_pretrained
from posym.runs import CHECKPOINT_META, CHECKPOINTS, RunDir, checkpoint_step, list_checkpoints


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
        return path, parent if RunDir(parent).config.is_file() and path.parent.name == CHECKPOINTS else None
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
    dtype = dtype if dtype is not None else torch.float32
    check_checkpoint(ckpt, dtype)
    model = from_pretrained(
        GPTJForCausalLM,
        ckpt,
        use_safetensors=True,
        local_files_only=True,
        attn_implementation=attn_implementation,
        dtype=dtype,
    )
    check_finite(model, ckpt)
    model.to(device).eval()

    # read_checkpoint_meta's read, spelled here so that the walk of a load leaves this module once (io, configs)
    meta = read_json_object(ckpt / CHECKPOINT_META) if (ckpt / CHECKPOINT_META).is_file() else None
    task_config = model_config = None
    if meta is not None:
        task_config = from_dict(TaskConfig, meta.get("task"), where=f"{ckpt / CHECKPOINT_META}: task")
        model_config = from_dict(ModelConfig, meta.get("model"), where=f"{ckpt / CHECKPOINT_META}: model")
        apply_variant(model, model_config)  # RoPE variants live in posym.json, not in config.json
    info = {
        "path": ckpt,
        "run_dir": run_dir,
        "step": meta.get("step") if meta else checkpoint_step(ckpt.name),
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
