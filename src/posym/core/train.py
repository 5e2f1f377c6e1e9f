"""Training a GPT-J on a multi-hop task: configs and presets, the training step, evaluation.

The loop is the paper's recipe (docs/method.md section 2): AdamW, linear warmup then linear decay (the
schedule of Hugging Face `get_linear_schedule_with_warmup`, computed here as a pure function of the
step), loss on the last position only. Batch t is train-split samples [t*B, (t+1)*B) (wrapping
around the split), so the data needs no RNG state; dropout draws from torch's global RNG, which
every checkpoint saves. Resuming restores weights, optimizer moments, RNG and step, so a resumed
run ends bit-identical to an uninterrupted one on the same machine (the loop, run directories and
checkpoints are `posym.commands.train`; nothing here touches a file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal

from posym.core.model import DEVICES, ModelConfig
from posym.core.tasks import SPLIT_SIZES, TaskConfig, generate
from posym.errors import PosymError

PRECISIONS = ("float32", "bfloat16")
"""Training precisions, in torch's dtype names (as `--dtype` of the llm commands spells them): float32, or
bfloat16 autocast of the forward pass and the loss."""
LEGACY_PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}
"""The spellings runs wrote before the precision took torch's names (config.yaml `precision: fp32`): read as
these; a run's config hash is computed with them (posym.commands.train.run_hash), so it never changes."""


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
    this field; `posym validate` computes them from the checkpoints)."""
    eval_batch_size: int = 1000
    """Sequences per forward pass during evaluation."""
    seed: int = 0
    """Seed of the initialisation, the dropout stream and the data."""
    device: str = "auto"
    """cpu, cuda or auto (cuda when available)."""
    threads: int | None = None
    """torch CPU threads for training; null keeps torch's default."""
    precision: Literal["float32", "bfloat16", "fp32", "bf16"] = "float32"
    """float32, or bfloat16: forward and loss under torch.autocast(bfloat16) (weights, AdamW moments and
    evaluation stay float32; CPUs with AVX-512 BF16/AMX and GPUs); docs/results.md compares the two. The
    spellings fp32 and bf16 of earlier runs' config.yaml are read as float32 and bfloat16 (LEGACY_PRECISIONS)."""
    keep_trainer_state: bool = False
    """Keep optimizer/RNG state in every checkpoint; by default only the latest keeps it (saves disk)."""

    def __post_init__(self) -> None:
        self.precision = LEGACY_PRECISIONS.get(self.precision, self.precision)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise PosymError(f"betas must be two numbers in [0, 1), got {self.betas}")
        for name in ("max_steps", "batch_size", "checkpoint_every", "eval_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise PosymError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if not 0 <= self.val_size <= SPLIT_SIZES["val"]:
            raise PosymError(
                f"val_size must be between 0 and the val split's {SPLIT_SIZES['val']}, got {self.val_size}"
            )
        if self.warmup_steps < 0 or self.lr <= 0 or self.weight_decay < 0:
            raise PosymError("warmup_steps and weight_decay must be >= 0 and lr > 0")
        if not self.eps > 0:
            raise PosymError(f"eps (AdamW's epsilon) must be positive, got {self.eps}")
        if not 0 <= self.seed <= MAX_SEED:
            raise PosymError(
                f"seed must be an integer in 0..{MAX_SEED:,} (what every random generator takes), got {self.seed}"
            )
        if self.max_steps > MAX_STEPS:
            raise PosymError(f"max_steps must be at most {MAX_STEPS:,}, got {self.max_steps}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise PosymError(f"grad_clip must be positive or null, got {self.grad_clip}")
        if self.device not in DEVICES:
            raise PosymError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.threads is not None and self.threads < 1:
            raise PosymError(f"threads must be a positive integer or null, got {self.threads}")
        if self.model.n_positions < self.task.seq_len:
            raise PosymError(
                f"model.n_positions ({self.model.n_positions}) must cover the task's "
                f"{self.task.seq_len}-token sequences"
            )


MAX_SEED = 2**32 - 1
"""Largest seed: numpy's and torch's generators all take 0..2**32 - 1 (10**23 overflowed later)."""
MAX_STEPS = 10**9
"""Largest max_steps (the paper trains 6,000; 10**21 overflowed the int64 step counters)."""


def _paper(task: TaskConfig) -> TrainConfig:
    """docs/method.md section 2: 12 x 1 head, width 128, AdamW 1e-4, 750 warmup, batch 192, 6,000 steps."""
    return TrainConfig(preset="paper", task=task, model=ModelConfig(), val_size=SPLIT_SIZES["val"])


def _authors(task: TaskConfig) -> TrainConfig:
    """The paper preset with what the authors' released code effectively ran (docs/method.md section 6).

    Taken from that code: embedding dropout 0.0 (their `embed_pdrop=0.1` is a misspelt keyword that
    GPTJConfig ignores), residual and attention dropout 0.1. Kept from the paper preset because the
    code agrees with it or does not say: batch 192 (64 per device on their 3 GPUs), lr, warmup and the
    6,000-step linear schedule (their epoch count is in a config that is not released), fp32 (their fp16
    autocast is a GPU setting; bf16 is slower on this CPU, docs/results.md). Their Trainer kept the best
    checkpoint by validation accuracy: posym's `--step best` selects that checkpoint after training.
    """
    config = _paper(task)
    config.preset = "authors"
    config.model.embd_dropout = 0.0
    return config


def _seed(task: TaskConfig) -> TrainConfig:
    """The seed summary's GPT-J: 6 layers x 8 heads, width 128, with a faster optimisation."""
    return TrainConfig(
        preset="seed",
        task=task,
        model=ModelConfig(n_layer=6, n_head=8, n_embd=128),
        lr=5e-4,
        betas=[0.9, 0.999],
        warmup_steps=300,
        max_steps=4000,
        batch_size=128,
        checkpoint_every=250,
        val_size=SPLIT_SIZES["val"],
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
        preset="quick",
        task=task,
        # exact GELU: faster than gelu_new on CPU
        model=ModelConfig(n_layer=8, n_head=1, n_embd=64, activation="gelu", dropout=0.1),
        lr=1e-3,
        betas=[0.9, 0.999],
        warmup_steps=100,
        max_steps=steps,
        batch_size=64,
        checkpoint_every=250,
        eval_size=1000,
        val_size=1000,
        threads=1,  # one thread: these matrices are too small to split
    )


PRESETS: dict[str, Callable[[TaskConfig], TrainConfig]] = {
    "paper": _paper,
    "authors": _authors,
    "seed": _seed,
    "quick": _quick,
}
"""Preset name -> builder of its TrainConfig for a task config."""


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


def to_tensor(array, device):
    """Token ids or answers (any integer array) as a long tensor on `device`."""
    import torch

    return torch.as_tensor(array, dtype=torch.long).to(device)


def answer_logits(model, samples, batch_size: int = 1000):
    """Per batch of `samples`: (next-token logits [b, vocab] in float32, answers [b]), without gradients."""
    import torch

    device = next(model.parameters()).device
    for lo in range(0, len(samples.answer), batch_size):
        ids = to_tensor(samples.input_ids[lo : lo + batch_size], device)  # [b, seq]
        with torch.no_grad():
            logits = last_logits(model, ids).float()  # [b, vocab]
        yield logits, to_tensor(samples.answer[lo : lo + batch_size], device)


def evaluate(model, task_cfg: TaskConfig, n: int, seed: int, split: str = "test", batch_size: int = 1000) -> dict:
    """Accuracy overall and per hop count, and mean cross-entropy, of the next token after the prompt.

    Keys: "acc", "loss", "n", "acc_hop1" .. "acc_hop{max_hops}" (NaN for a hop count with no sample).
    The model's train/eval mode is restored afterwards.
    """
    import torch
    import torch.nn.functional as F

    samples = generate(task_cfg, n, seed, split=split)
    was_training = model.training
    model.eval()
    correct, losses = [], []
    for logits, answer in answer_logits(model, samples, batch_size):
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


# ---- the step -----------------------------------------------------------------------------------


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

    With precision bfloat16 the forward pass and the loss run under bfloat16 autocast (matmuls in bf16,
    softmax/LayerNorm/cross-entropy in fp32, as torch's autocast lists say); the backward pass
    follows the forward's dtypes and AdamW updates the fp32 weights. No loss scaling: bf16 has fp32's
    exponent range.
    """
    import contextlib

    import torch
    import torch.nn.functional as F

    autocast = (
        torch.autocast(ids.device.type, dtype=torch.bfloat16)
        if config.precision == "bfloat16"
        else contextlib.nullcontext()
    )
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
