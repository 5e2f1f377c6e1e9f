"""Training a GPT-J on a multi-hop task: presets, the exact-resume training loop, evaluation.

The loop is the paper's recipe (SPEC section 2): AdamW, linear warmup then linear decay (the
schedule of Hugging Face `get_linear_schedule_with_warmup`, computed here as a pure function of the
step), loss on the last position only. Batch t is train-split samples [t*B, (t+1)*B) (wrapping
around the split), so the data needs no RNG state; dropout draws from torch's global RNG, which
every checkpoint saves. Resuming restores weights, optimizer moments, RNG and step, so a resumed
run ends bit-identical to an uninterrupted one on the same machine.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from posym import io
from posym.configs import from_dict, override, to_dict
from posym.errors import PosymError
from posym.model import (
    CHECKPOINT_META,
    CHECKPOINTS,
    ModelConfig,
    build_model,
    checkpoint_name,
    list_checkpoints,
    read_checkpoint_meta,
    resolve_device,
)
from posym.tasks import SPLIT_SIZES, TaskConfig, generate, task_config

TRAINER_TENSORS = "trainer_state.safetensors"
TRAINER_JSON = "trainer_state.json"


@dataclass
class TrainConfig:
    """Everything that determines a training run (written to `<run>/config.yaml`)."""

    preset: str
    """Name of the preset this config started from (paper, seed, quick); informational."""
    task: TaskConfig
    """The task (number or letter, window sizes, hops, split sizes)."""
    model: ModelConfig
    """The GPT-J shape."""
    lr: float = 1e-4
    """Peak learning rate of AdamW."""
    betas: list[float] = field(default_factory=lambda: [0.95, 0.999])
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 1e-4
    """AdamW decoupled weight decay, applied to weight matrices and embeddings but not to biases or
    LayerNorm parameters (as the Hugging Face Trainer the authors used)."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this value (the Hugging Face Trainer default); null = off."""
    warmup_steps: int = 750
    """Steps of linear warmup from 0 to lr; afterwards lr decays linearly to 0 at max_steps."""
    max_steps: int = 6000
    """Optimizer steps in total."""
    batch_size: int = 192
    """Sequences per optimizer step (the paper: 64 per GPU x 3 GPUs)."""
    checkpoint_every: int = 500
    """Save (and evaluate) every this many steps; steps 0, 1, 2, 4, 8, ... below it and the final step too."""
    eval_size: int = 2000
    """Test-split samples evaluated at every checkpoint (always the same ones)."""
    val_size: int = 0
    """Validation-split samples also evaluated at every checkpoint (columns val_acc, val_loss, ...),
    from which `--step best` picks the checkpoint, as the authors' trainer keeps its best checkpoint by
    validation accuracy (presets paper and seed: the whole split, 2,400); 0 = none (runs from before
    this field; `posym.checkpoints` computes them from the checkpoints)."""
    eval_batch_size: int = 1000
    """Sequences per forward pass during evaluation."""
    seed: int = 0
    """Seed of the initialisation, the dropout stream and the data."""
    device: str = "auto"
    """cpu, cuda or auto (cuda when available)."""
    threads: int | None = None
    """torch CPU threads for training; null keeps torch's default."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """fp32, or bf16: forward and loss under torch.autocast(bfloat16) (weights, AdamW moments and
    evaluation stay fp32; CPUs with AVX-512 BF16/AMX and GPUs); docs/results.md compares the two."""
    keep_trainer_state: bool = False
    """Keep optimizer/RNG state in every checkpoint; by default only the latest keeps it (saves disk)."""

    def __post_init__(self) -> None:
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise PosymError(f"betas must be two numbers in [0, 1), got {self.betas}")
        for name in ("max_steps", "batch_size", "checkpoint_every", "eval_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise PosymError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if not 0 <= self.val_size <= SPLIT_SIZES["val"]:
            raise PosymError(f"val_size must be between 0 and the val split's {SPLIT_SIZES['val']}, got {self.val_size}")
        if self.warmup_steps < 0 or self.lr <= 0 or self.weight_decay < 0:
            raise PosymError("warmup_steps and weight_decay must be >= 0 and lr > 0")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise PosymError(f"grad_clip must be positive or null, got {self.grad_clip}")
        if self.device not in ("cpu", "cuda", "auto"):
            raise PosymError(f"device must be cpu, cuda or auto, got {self.device!r}")
        if self.threads is not None and self.threads < 1:
            raise PosymError(f"threads must be a positive integer or null, got {self.threads}")


def _paper(task: TaskConfig) -> TrainConfig:
    """SPEC section 2: 12 x 1 head, width 128, AdamW 1e-4, 750 warmup, batch 192, 6,000 steps."""
    return TrainConfig(preset="paper", task=task, model=ModelConfig(), val_size=SPLIT_SIZES["val"])


def _seed(task: TaskConfig) -> TrainConfig:
    """The seed summary's GPT-J: 6 layers x 8 heads, width 128, with a faster optimisation."""
    return TrainConfig(
        preset="seed", task=task, model=ModelConfig(n_layer=6, n_head=8, n_embd=128),
        lr=5e-4, betas=[0.9, 0.999], warmup_steps=300, max_steps=4000, batch_size=128,
        checkpoint_every=250, val_size=SPLIT_SIZES["val"],
    )


def _quick(task: TaskConfig) -> TrainConfig:
    """Small enough to train on 2 CPU cores in minutes and still reach >= 95% on every hop.

    Dropout 0.1 (the paper's) matters for the head analysis: without it the number model reaches
    100% with no pure head (every layer mixed; docs/results.md), with it layers 1-2 end positional
    and 3-7 symbolic, as in the paper. It slows the letter task, which gets 3,000 steps (0.85 at
    2,000, 1.00 from 2,750); the number task is at 1.00 by 1,500 of its 1,750.
    """
    steps = 1750 if task.task == "number" else 3000
    return TrainConfig(
        preset="quick", task=task,
        # exact GELU: faster than gelu_new on CPU
        model=ModelConfig(n_layer=8, n_head=1, n_embd=64, activation="gelu", dropout=0.1),
        lr=1e-3, betas=[0.9, 0.999], warmup_steps=100, max_steps=steps, batch_size=64,
        checkpoint_every=250, eval_size=1000, val_size=1000, threads=1,  # one thread: these matrices are too small to split
    )


PRESETS: dict[str, Callable[[TaskConfig], TrainConfig]] = {"paper": _paper, "seed": _seed, "quick": _quick}
"""Preset name -> builder of its TrainConfig for a task config."""


def resolve_config(
    preset: str, task: str, config_file: str | Path | None = None, overrides: dict | None = None
) -> TrainConfig:
    """The preset for `task`, then the YAML file's keys, then `overrides` (e.g. CLI flags) on top."""
    if preset not in PRESETS:
        raise PosymError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    config = PRESETS[preset](task_config(task))
    if config_file is not None:
        config = override(config, io.read_yaml(config_file), where=str(config_file))
    if overrides:
        config = override(config, overrides)
    return config


# ---- maths: schedule, loss, evaluation ---------------------------------------------------------


def lr_factor(step: int, warmup_steps: int, max_steps: int) -> float:
    """Multiplier of the peak lr for the update after `step` completed steps (HF linear schedule)."""
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))


def checkpoint_steps(max_steps: int, every: int) -> list[int]:
    """0, the powers of two below `every`, every multiple of `every`, and `max_steps`."""
    early = [0] + [2**k for k in range(int(math.log2(every)) + 1) if 2**k < every]
    regular = list(range(every, max_steps + 1, every))
    return sorted({s for s in early + regular if s <= max_steps} | {max_steps})


def last_logits(model, input_ids):
    """Next-token logits after the last position only: lm_head on one hidden vector per row."""
    hidden = model.transformer(input_ids=input_ids).last_hidden_state  # [batch, seq, embd]
    return model.lm_head(hidden[:, -1])  # [batch, vocab]


def _to_tensor(array, device):
    import torch

    return torch.as_tensor(array, dtype=torch.long).to(device)


def evaluate(model, task_cfg: TaskConfig, n: int, seed: int, split: str = "test", batch_size: int = 1000) -> dict:
    """Accuracy overall and per hop count, and mean cross-entropy, of the next token after the prompt.

    Keys: "acc", "loss", "n", "acc_hop1" .. "acc_hop{max_hops}" (NaN for a hop count with no sample).
    The model's train/eval mode is restored afterwards.
    """
    import torch
    import torch.nn.functional as F

    samples = generate(task_cfg, n, seed, split=split)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct, losses = [], []
    with torch.no_grad():
        for lo in range(0, n, batch_size):
            ids = _to_tensor(samples.input_ids[lo : lo + batch_size], device)  # [b, seq]
            answer = _to_tensor(samples.answer[lo : lo + batch_size], device)  # [b]
            logits = last_logits(model, ids).float()  # [b, vocab]
            losses.append(F.cross_entropy(logits, answer, reduction="none").cpu())
            correct.append((logits.argmax(-1) == answer).cpu())
    model.train(was_training)
    correct_t = torch.cat(correct).double()  # [n]
    hops = torch.as_tensor(samples.hops)  # [n]
    out = {"n": n, "loss": torch.cat(losses).mean().item(), "acc": correct_t.mean().item()}
    for h in range(1, task_cfg.max_hops + 1):
        mask = hops == h
        out[f"acc_hop{h}"] = correct_t[mask].mean().item() if mask.any() else float("nan")
    return out


def evaluate_checkpoint(
    path: str | Path, *, step: int | None = None, task: str | None = None, n: int = 2000,
    extra_targets: list[int] = (0,), seed: int = 0, split: str = "test", device: str = "cpu",
) -> list[dict]:
    """`evaluate` one checkpoint on its own task config (or the paper's `task`) per extra_target.

    Each row: checkpoint, step, task, extra_target, seq_len and the `evaluate` metrics.
    """
    import dataclasses

    from posym import lengthgen
    from posym.lengthgen import LengthGenConfig
    from posym.model import load_model

    model, info = load_model(path, step=step, device=device)
    if task is not None:
        base = task_config(task)
    elif info["task_config"] is not None:
        base = info["task_config"]
    else:
        raise PosymError(f"{info['path']} has no posym.json with its task; pass --task number or --task letter")
    rows = []
    for extra in extra_targets:
        cfg = dataclasses.replace(base, extra_target=extra)
        if cfg.vocab_size > model.config.vocab_size:
            raise PosymError(
                f"the {cfg.task} task needs {cfg.vocab_size} token ids but the model has {model.config.vocab_size}"
            )
        if cfg.seq_len > model.config.n_positions:
            raise PosymError(f"sequences of {cfg.seq_len} tokens exceed the model's {model.config.n_positions} positions")
        # the batch rule of posym lengthgen: bounded tokens per forward pass keep long lengths in memory
        metrics = evaluate(model, cfg, n, seed, split, lengthgen.batch_size(cfg.seq_len, LengthGenConfig.max_tokens))
        rows.append({"checkpoint": str(info["path"]), "step": info["step"], "task": cfg.task,
                     "extra_target": extra, "seq_len": cfg.seq_len, **metrics})
    return rows


# ---- trainer state: optimizer + RNG, without pickle --------------------------------------------


def _save_trainer_state(directory: Path, optimizer, step: int, config_hash: str) -> None:
    """Optimizer moments and RNG states as safetensors, scalars as JSON."""
    import torch
    from safetensors.torch import save_file

    state = optimizer.state_dict()
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    for index, slots in state["state"].items():
        for name, value in slots.items():
            tensors[f"optimizer.{index}.{name}"] = value.detach().cpu().contiguous()
    save_file(tensors, str(directory / TRAINER_TENSORS))
    io.write_json(
        directory / TRAINER_JSON,
        {"step": step, "config_hash": config_hash, "param_groups": state["param_groups"]},
    )


def _load_trainer_state(directory: Path, optimizer) -> int:
    """Restore optimizer and RNG from a checkpoint; return its step."""
    import json

    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(directory / TRAINER_TENSORS))
    meta = json.loads((directory / TRAINER_JSON).read_text(encoding="utf-8"))
    slots: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, index, name = key.split(".", 2)
            slots.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": slots, "param_groups": meta["param_groups"]})
    torch.set_rng_state(tensors["rng.torch"])
    cuda_states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    return int(meta["step"])


# ---- the loop -----------------------------------------------------------------------------------


def make_optimizer(model, config: TrainConfig):
    """AdamW with weight decay on matrices/embeddings only (biases and LayerNorms are 1-D)."""
    import torch

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), eps=config.eps)


def optimizer_update(model, optimizer, config: TrainConfig, step: int, loss):
    """Backpropagate `loss` and take the AdamW step at the schedule's lr for `step` (gradients
    clipped as configured); returns the detached loss."""
    import torch

    for group in optimizer.param_groups:
        group["lr"] = config.lr * lr_factor(step, config.warmup_steps, config.max_steps)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return loss.detach()


def train_step(model, optimizer, config: TrainConfig, step: int, ids, answer):
    """One optimizer update on a batch ([B, seq] ids, [B] answers); returns the (detached) loss.

    With precision bf16 the forward pass and the loss run under bfloat16 autocast (matmuls in bf16,
    softmax/LayerNorm/cross-entropy in fp32, as torch's autocast lists say); the backward pass
    follows the forward's dtypes and AdamW updates the fp32 weights. No loss scaling: bf16 has fp32's
    exponent range.
    """
    import contextlib

    import torch
    import torch.nn.functional as F

    autocast = (torch.autocast(ids.device.type, dtype=torch.bfloat16) if config.precision == "bf16"
                else contextlib.nullcontext())
    with autocast:
        loss = F.cross_entropy(last_logits(model, ids).float(), answer)
    return optimizer_update(model, optimizer, config, step, loss)


def train_batch(task: TaskConfig, step: int, batch_size: int, seed: int):
    """Samples [step*B, (step+1)*B) of the train split, wrapping around it (pure function of step)."""
    import numpy as np

    n_train = SPLIT_SIZES["train"]
    start = (step * batch_size) % n_train
    first = generate(task, min(batch_size, n_train - start), seed, split="train", start=start)
    if len(first.answer) == batch_size:
        return first.input_ids, first.answer
    rest = generate(task, batch_size - len(first.answer), seed, split="train", start=0)
    return np.concatenate([first.input_ids, rest.input_ids]), np.concatenate([first.answer, rest.answer])


LEGACY_DEFAULTS = {"val_size": 0, "precision": "fp32"}
"""Fields added to TrainConfig after runs existed, with the value that reproduces those runs."""


def run_hash(config: TrainConfig) -> str:
    """The config hash of a run, leaving out LEGACY_DEFAULTS fields at their legacy value, so a run
    started before a field existed keeps its hash when resumed by newer code."""
    data = {k: v for k, v in to_dict(config).items() if LEGACY_DEFAULTS.get(k, ...) != v}
    return io.config_hash(data)


def _prepare_run_dir(config: TrainConfig | None, run_dir: Path, resume: bool) -> TrainConfig:
    """Check the run directory; write config.yaml and manifest.json for a new run."""
    config_path = run_dir / "config.yaml"
    if resume:
        if not config_path.is_file():
            raise PosymError(f"cannot resume: {run_dir} is not a posym run directory (no config.yaml)")
        stored = from_dict(TrainConfig, io.read_yaml(config_path), where=str(config_path))
        if config is not None and run_hash(config) != run_hash(stored):
            raise PosymError(f"cannot resume {run_dir} with a different config than its config.yaml")
        return stored
    if config is None:
        raise PosymError("a config is needed to start a new run")
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise PosymError(f"{run_dir} already exists and is not empty; pass --resume or choose another --out")
    io.write_yaml(config_path, to_dict(config))
    io.write_json(run_dir / "manifest.json", {**io.manifest(to_dict(config), seed=config.seed),
                                              "config_hash": run_hash(config)})
    return config


def train(
    config: TrainConfig | None, run_dir: str | Path, *, resume: bool = False, progress: bool = True,
    stop_at: int | None = None,
) -> Path:
    """Train (or, with resume=True, continue) the run in `run_dir`; return `run_dir`.

    With resume, `config` may be None (the run's config.yaml is used) and must otherwise equal it.
    `stop_at` ends the session after a checkpoint at that step without touching the schedule (the lr
    still decays towards max_steps), so a later resume continues the very same run: the way to train
    the 6,000-step `paper` preset on a CPU up to its maximal accuracy, or in pieces.
    """
    import pandas as pd
    import torch

    if stop_at is not None and stop_at < 1:
        raise PosymError(f"--stop-at must be a positive step, got {stop_at}")
    run_dir = Path(run_dir)
    config = _prepare_run_dir(config, run_dir, resume)
    chash = run_hash(config)
    device = resolve_device(config.device)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    task = config.task

    model = build_model(config.model, task.vocab_size, config.seed).to(device)
    optimizer = make_optimizer(model, config)
    end = config.max_steps if stop_at is None else min(stop_at, config.max_steps)
    saves = set(checkpoint_steps(config.max_steps, config.checkpoint_every)) | {end}
    log_path = run_dir / "train.log"
    log_lines = log_path.read_text(encoding="utf-8").splitlines() if resume and log_path.is_file() else []
    rows: list[dict] = []

    step = 0
    resumable = [(s, p) for s, p in list_checkpoints(run_dir) if (p / TRAINER_TENSORS).is_file()]
    if resume:  # temporary files of writes a kill interrupted (never visible under final names)
        for leftover in [*run_dir.glob(".*.tmp-*"), *run_dir.glob(f"{CHECKPOINTS}/.*")]:
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    if resume and resumable:
        from safetensors.torch import load_file

        step, ckpt = resumable[-1]
        if stop_at is not None and step >= end:
            raise PosymError(f"{run_dir} is already at step {step}; nothing to do before step {end}")
        model.load_state_dict(load_file(str(ckpt / "model.safetensors"), device=device))
        _load_trainer_state(ckpt, optimizer)
        rows = [read_checkpoint_meta(p)["metrics"] for s, p in list_checkpoints(run_dir) if s <= step]
        log_lines.append(f"resumed at step {step} from {ckpt.name}")
    else:
        torch.manual_seed(config.seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(config.seed)

    def write_metrics() -> None:
        frame = pd.DataFrame(rows)  # rows read back from posym.json have sorted keys: fix the order
        first = ["step", "loss", "acc"] + [f"acc_hop{h}" for h in range(1, task.max_hops + 1)]
        io.write_parquet(run_dir / "metrics.parquet", frame[first + sorted(set(frame.columns) - set(first))])

    def checkpoint(step: int, train_loss: float) -> dict:
        metrics = evaluate(model, task, config.eval_size, config.seed, "test", config.eval_batch_size)
        if config.val_size:
            val = evaluate(model, task, config.val_size, config.seed, "val", config.eval_batch_size)
            metrics.update({f"val_{k}": v for k, v in val.items()})
        metrics = {"step": step, **metrics, "train_loss": train_loss, "time": time.time()}
        previous = list_checkpoints(run_dir)
        with io.atomic_path(run_dir / "checkpoints" / checkpoint_name(step), is_dir=True) as tmp:
            model.save_pretrained(tmp)
            io.write_json(tmp / CHECKPOINT_META, {
                "step": step, "seed": config.seed, "config_hash": chash,
                "task": to_dict(task), "model": to_dict(config.model), "metrics": metrics,
            })
            _save_trainer_state(tmp, optimizer, step, chash)
        if not config.keep_trainer_state:
            for s, old in previous:  # only the newest checkpoint needs to be resumable
                for name in (TRAINER_TENSORS, TRAINER_JSON):
                    if s != step:  # a checkpoint rewritten at this step is the new one
                        (old / name).unlink(missing_ok=True)
        rows.append(metrics)
        write_metrics()
        hop_text = " ".join(f"{k[4:]}={v:.3f}" for k, v in metrics.items() if k.startswith("acc_hop"))
        log_lines.append(
            f"step {step} train_loss {train_loss:.4f} test_loss {metrics['loss']:.4f} "
            f"acc {metrics['acc']:.4f} {hop_text}"
        )
        io.write_text(log_path, "\n".join(log_lines) + "\n")
        return metrics

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if not resume or not resumable:
        log_lines.append(f"training {config.preset} on {task.task}: {config.max_steps} steps on {device}")
        last = checkpoint(0, float("nan"))
    else:
        last = rows[-1]
        write_metrics()  # a kill between the latest checkpoint and metrics.parquet left it a row short
    if end < config.max_steps:
        log_lines.append(f"stopping at step {end} of {config.max_steps} (--stop-at); --resume continues")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = [
        TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]} steps/s"),
        TextColumn("loss {task.fields[loss]}"), TextColumn("acc {task.fields[acc]}"), TimeRemainingColumn(),
    ]
    model.train()
    window_loss = torch.zeros((), device=device)  # summed on device: no sync per step
    window_steps, t0, t0_step = 0, time.perf_counter(), step
    with Progress(*columns, disable=not progress, transient=False) as bar:
        bar_task = bar.add_task(
            "train", total=config.max_steps, completed=step, rate="-", loss="-", acc=f"{last['acc']:.3f}"
        )
        while step < end:
            ids, answer = train_batch(task, step, config.batch_size, config.seed)
            loss = train_step(model, optimizer, config, step, _to_tensor(ids, device), _to_tensor(answer, device))
            step += 1
            window_loss += loss
            window_steps += 1
            if step in saves:
                last = checkpoint(step, (window_loss / window_steps).item())
                window_loss.zero_()
                window_steps = 0
            if progress and (step % 10 == 0 or step == end):
                rate = (step - t0_step) / max(1e-9, time.perf_counter() - t0)
                bar.update(bar_task, completed=step, rate=f"{rate:.1f}", loss=f"{loss.item():.3f}",
                           acc=f"{last['acc']:.3f}")
    return run_dir
