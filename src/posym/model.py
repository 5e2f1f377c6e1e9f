"""The GPT-J model posym trains and analyses: config, construction, checkpoints and loading.

A posym model is a plain Hugging Face `GPTJForCausalLM` (the paper's authors used the same class),
so every checkpoint directory loads with `GPTJForCausalLM.from_pretrained` and nothing here is
needed to read it back. What posym adds next to the weights of a checkpoint is `posym.json` (step,
task config, model config and the test metrics at that step) and, for resuming, the trainer state
(`trainer_state.safetensors` + `trainer_state.json`, written by `posym.train`).

Checkpoint directories are named `step-%08d` under `<run>/checkpoints/`; anything else there (for
example the temporary directory of a checkpoint being written) is ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posym.errors import PosymError

CHECKPOINTS = "checkpoints"
CHECKPOINT_META = "posym.json"
_CHECKPOINT_RE = re.compile(r"^step-(\d{8})$")


@dataclass
class ModelConfig:
    """Shape of a GPT-J decoder (the paper: 12 layers x 1 head, width 128, rotary on all dims)."""

    n_layer: int = 12
    """Number of transformer blocks (layers)."""
    n_head: int = 1
    """Attention heads per layer; the paper uses one so that each layer is one analysable head."""
    n_embd: int = 128
    """Width of the residual stream; each head has n_embd / n_head dimensions."""
    rotary_dim: int | None = None
    """Head dimensions that RoPE rotates (even, <= head dim); None rotates all of them, as the paper."""
    rope_base: float = 10000.0
    """RoPE base (frequencies base^(-2(k-1)/rotary_dim)); GPT-J hard-codes 10,000, so another base is a
    posym variant (posym.rope) that plain transformers loading ignores."""
    rope_bands: list[list[int]] | None = None
    """RoPE variant: inclusive [first, last] frequency IDs (1 = fastest) that rotate, one band for every
    layer or one per layer; other planes get no rotation. None rotates every plane (see posym.rope)."""
    nope_from: int | None = None
    """RoPE variant: layers with index >= nope_from get no rotation at all (NoPE); None = RoPE everywhere."""
    n_positions: int = 8192
    """Longest sequence the rotary table covers; RoPE has no learned positions, so this is free and
    only bounds length-generalization experiments (the paper goes to ~5,000 tokens)."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of n_embd."""
    activation: str = "gelu_new"
    """MLP activation (a `transformers.activations` name); GPT-J's default is the tanh GELU `gelu_new`."""
    dropout: float = 0.1
    """Dropout on embeddings, attention probabilities and residual branches (training only)."""
    layer_norm_epsilon: float = 1e-5
    """LayerNorm epsilon."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of linear and embedding weights."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "n_positions", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise PosymError(f"model.{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise PosymError(f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})")
        rot = self.resolved_rotary_dim
        if rot < 2 or rot % 2 or rot > self.head_dim:
            raise PosymError(
                f"model.rotary_dim must be an even number between 2 and the head dimension {self.head_dim}, got {rot}"
            )
        from posym.rope import check_variant

        check_variant(self)
        if not 0.0 <= self.dropout < 1.0:
            raise PosymError(f"model.dropout must be in [0, 1), got {self.dropout}")
        from transformers.activations import ACT2FN

        if self.activation not in ACT2FN:
            raise PosymError(f"model.activation {self.activation!r} is not a transformers activation name")

    @property
    def head_dim(self) -> int:
        """Dimensions per head."""
        return self.n_embd // self.n_head

    @property
    def resolved_rotary_dim(self) -> int:
        """Rotated dimensions per head (rotary_dim, or the whole head when it is None)."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim


def gptj_config(config: ModelConfig, vocab_size: int):
    """The `transformers.GPTJConfig` of a posym model with `vocab_size` tokens (PAD = id 0)."""
    from transformers import GPTJConfig

    if vocab_size < 2:
        raise PosymError(f"vocab_size must be at least 2, got {vocab_size}")
    return GPTJConfig(
        vocab_size=vocab_size,
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        # Always explicit: GPT-J's "None" path rotates n_embd dims and breaks with several heads.
        rotary_dim=config.resolved_rotary_dim,
        n_inner=config.mlp_ratio * config.n_embd,
        activation_function=config.activation,
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        layer_norm_epsilon=config.layer_norm_epsilon,
        initializer_range=config.initializer_range,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        tie_word_embeddings=False,
    )


def build_model(config: ModelConfig, vocab_size: int, seed: int, *, attn_implementation: str = "sdpa"):
    """A freshly initialised `GPTJForCausalLM` (float32, train mode); same seed, same weights.

    The global torch RNG is left untouched (initialisation runs in a forked RNG), so building a
    model never changes the dropout stream of a training run.
    """
    import torch
    from transformers import GPTJForCausalLM

    hf_config = gptj_config(config, vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPTJForCausalLM(hf_config)
    try:
        model.set_attn_implementation(attn_implementation)
    except ValueError:  # transformers < 5.2x has no SDPA path for GPT-J: keep eager (same maths)
        model.set_attn_implementation("eager")
    from posym.rope import apply_variant

    apply_variant(model, config)
    return model.train()


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
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raise PosymError(f"{path} is not valid JSON") from None


def resolve_checkpoint(path: str | Path, step: int | str | None = None, *, device: str = "cpu") -> tuple[Path, Path | None]:
    """(checkpoint directory, run directory or None) for a run dir + step or a checkpoint dir.

    step "best" is the run's best checkpoint by validation accuracy (`posym.checkpoints.best_step`,
    evaluating on `device` the checkpoints that recorded none)."""
    path = Path(path)
    if not path.exists():
        raise PosymError(f"{path} does not exist")
    if not path.is_dir():
        raise PosymError(f"{path} is not a directory (expected a run or checkpoint directory)")
    if (path / "config.json").is_file():
        if step == "best":
            raise PosymError(f"--step best needs a run directory; {path} is a single checkpoint")
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
    if step == "best":
        from posym.checkpoints import best_step

        step = best_step(path, device=device)
    by_step = dict(checkpoints)
    if step not in by_step:
        steps = ", ".join(str(s) for s, _ in checkpoints)
        raise PosymError(f"{path} has no checkpoint at step {step}; available steps: {steps}")
    return by_step[step], path


def resolve_device(device: str) -> str:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU is a PosymError."""
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise PosymError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PosymError("--device cuda was asked for but torch sees no CUDA GPU")
    return device


def from_pretrained(loader, path: str | Path, **kwargs: Any) -> Any:
    """`loader.from_pretrained(path, **kwargs)`, a broken weights file (bad safetensors header, truncated or
    missing tensors) answered with one PosymError line naming `path` (shared by posym.model and posym.llm)."""
    from safetensors import SafetensorError

    try:
        return loader.from_pretrained(path, **kwargs)
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PosymError(f"cannot load the model in {path}: {first}") from None


def load_model(
    path: str | Path,
    *,
    step: int | str | None = None,
    device: str = "cpu",
    dtype: Any = None,
    attn_implementation: str = "eager",
) -> tuple[Any, dict]:
    """Load a posym (or any GPT-J) checkpoint in eval mode: (model, info).

    `path` is a checkpoint directory (a `save_pretrained` directory) or a run directory (then
    `step` picks the checkpoint, default the latest; "best" the best by validation accuracy). Eager
    attention is the default because the analyses read attention probabilities and need the exact,
    float32-logit reference kernel.
    info = {"path", "run_dir", "step", "task_config" (TaskConfig or None), "model_config"
    (ModelConfig or None), "metrics" (dict or None)}.
    """
    import torch
    from transformers import GPTJForCausalLM

    from transformers.utils import logging as hf_logging

    from posym.configs import from_dict

    hf_logging.disable_progress_bar()  # a per-file "Loading weights" bar is noise for tiny models
    ckpt, run_dir = resolve_checkpoint(path, step, device=device)
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
        from posym.tasks import TaskConfig

        task_config = from_dict(TaskConfig, meta.get("task"), where=f"{ckpt / CHECKPOINT_META}: task")
        model_config = from_dict(ModelConfig, meta.get("model"), where=f"{ckpt / CHECKPOINT_META}: model")
        from posym.rope import apply_variant

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
