"""`posym finetune`: continue training a run with chosen heads frozen (their q/k/v/out slices), then
measure accuracy per hop and against length per condition.

The conditions, lengths and outputs are `posym.conditions`'; the head operations `posym.core.interventions`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from posym import io
from posym.conditions import (
    condition_lengths,
    head_text,
    load_run,
    measure_rows,
    write_conditions,
)
from posym.configs import from_dict, override
from posym.core.interventions import (
    LABEL_QUERIES,
    HeadFreezer,
    head_slice,
    label_heads,
    select_heads,
)
from posym.core.train import (
    TrainConfig,
    make_optimizer,
    to_tensor,
    train_batch,
    train_step,
)
from posym.core.paper import GAMMA
from posym.errors import PosymError
from posym.models import save_model
from posym.runs import MODELS, RunDir


def finetune(model, task, config, heads, *, start: int, steps: int) -> dict:
    """Train `model` for `steps` steps of `config` (a TrainConfig: optimizer, lr schedule over
    `steps`) on train batches start, start+1, ... with `heads` frozen; returns cost figures."""
    import torch

    config = override(config, {"max_steps": steps, "warmup_steps": 0})
    freezer = HeadFreezer(model, heads)
    total = sum(p.numel() for p in model.parameters())
    optimizer = make_optimizer(model, config)
    device = next(model.parameters()).device
    model.train()
    torch.manual_seed(config.seed)  # dropout stream: the same for every condition
    t0 = time.perf_counter()
    try:
        for t in range(steps):
            ids, answer = train_batch(task, start + t, config.batch_size, config.seed)
            train_step(model, optimizer, config, t, to_tensor(ids, device), to_tensor(answer, device))
            freezer.restore()
    finally:
        freezer.remove()
    seconds = time.perf_counter() - t0
    model.eval()
    return {
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / max(seconds, 1e-9),
        "params": total,
        "frozen_params": freezer.frozen_elements,
        "trainable_params": total - freezer.frozen_elements,
    }


def run_finetune(
    path,
    conditions: list[str],
    out_dir,
    *,
    step: int | None = None,
    steps: int = 300,
    lr: float | None = None,
    factors=(1, 2, 4),
    n: int = 1000,
    seed: int = 0,
    n_prompts: int = 100,
    gamma: float = GAMMA,
    save_models: bool = False,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Continue training a run's checkpoint once per condition ("none" = nothing frozen, a label or
    "L.H,..." = those heads frozen), each from the same weights, data and dropout stream; compare
    accuracy per hop and per length, steps/s and trainable parameters. Writes finetune.* to out_dir."""
    import pandas as pd
    import torch

    model, info = load_run(path, step, device)
    if info["run_dir"] is None:
        raise PosymError(f"{path} is not inside a posym run directory: fine-tuning reuses its config.yaml")
    config = from_dict(TrainConfig, io.read_yaml(RunDir(Path(info["run_dir"])).config))
    if lr is not None:
        config = override(config, {"lr": lr})
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    task = info["task_config"]
    lengths = condition_lengths(model, task, list(factors), n, n_prompts)
    labels = label_heads(model, task, n_prompts=n_prompts, seed=seed, gamma=gamma)
    note = progress or (lambda text: None)
    rows, costs, skipped = [], {}, []
    note("before fine-tuning")
    rows += measure_rows(model, task, lengths, n, seed, condition="start", heads="", finetune_steps=0)
    for spec in list(dict.fromkeys(conditions)):
        heads = [] if spec == "none" else select_heads(spec, model, labels)
        if spec != "none" and not heads:
            skipped.append(spec)
            continue
        note(f"fine-tune, frozen: {spec}")
        fresh, _ = load_run(info["path"], None, device)
        before = {k: v.clone() for k, v in fresh.state_dict().items()}
        cost = finetune(fresh, task, config, heads, start=info["step"] or 0, steps=steps)
        cost["frozen_unchanged"] = _frozen_unchanged(fresh, before, heads)
        costs[spec] = {**cost, "heads": head_text(heads)}
        rows += measure_rows(
            fresh, task, lengths, n, seed, condition=spec, heads=head_text(heads), finetune_steps=steps
        )
        if save_models:
            save_model(
                fresh,
                info,
                Path(out_dir) / MODELS / spec.replace(",", "_"),
                {"finetune": {"frozen": head_text(heads), "steps": steps, "lr": config.lr}},
                replace=True,
            )
    table = pd.DataFrame(rows)
    result = {
        "checkpoint": str(info["path"]),
        "step": info["step"],
        "queries": LABEL_QUERIES,
        "task": task.task,
        "lr": config.lr,
        "steps": steps,
        "gamma": gamma,
        "labels": labels.to_dict("records"),
        "costs": costs,
        "skipped": skipped,
    }
    return write_conditions(
        Path(out_dir),
        "finetune",
        table,
        result,
        f"{task.task} task, step {info['step']}: +{steps} fine-tuning steps, frozen heads",
    )


def _frozen_unchanged(model, before: dict, heads) -> bool:
    """Whether every frozen q/k/v row and out_proj column equals its value before fine-tuning, bit for bit."""
    import torch

    state = model.state_dict()
    for layer, h in heads:
        span = head_slice(model, (layer, h))
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            key = f"transformer.h.{layer}.attn.{name}.weight"
            index = (slice(None), span) if name == "out_proj" else (span, slice(None))
            if not torch.equal(state[key][index], before[key][index]):
                return False
    return True
