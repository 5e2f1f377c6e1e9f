"""Experiment drivers of `posym ablate` and `posym finetune` (the head operations are in
`posym.core.interventions`): accuracy per hop and accuracy against length for each condition.

Accuracy against length is `posym.commands.lengthgen.measure` (the paper protocol: extra target-window
tokens before the effective window; the same questions at every length), so the first length, the
training length, is also the accuracy-per-hop table.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from posym import io
from posym.commands.lengthgen import LengthGenConfig, measure, plan
from posym.configs import from_dict, override, to_dict
from posym.core.interventions import (ABLATION_MODES, LABEL_QUERIES, HeadFreezer, ablated, fold_ablation, head_means,
                                      head_slice, label_heads, select_heads)
from posym.core.paper import GAMMA
from posym.core.tasks import generate
from posym.core.train import TrainConfig, make_optimizer, to_tensor, train_batch, train_step
from posym.errors import PosymError
from posym.figures import save_figure, subplots
from posym.io import atomic_path, write_json, write_parquet
from posym.loading import CHECKPOINT_META, load_checkpoint
from posym.resources import check_count, sequence_bytes
from posym.sources import resolve


EACH_LAYER = "each"
"""Condition keyword: one condition per layer (every head of that layer)."""


def _head_text(heads) -> str:
    return " ".join(f"{layer}.{h}" for layer, h in heads)


def _expand(specs: list[str], model) -> list[str]:
    out: list[str] = []
    for spec in specs:
        out += [str(layer) for layer in range(model.config.n_layer)] if spec == EACH_LAYER else [spec]
    return list(dict.fromkeys(out))


def _lengths(model, task, factors: list[int], n: int, n_prompts: int) -> list[int]:
    """The lengths (factors of the training length) to measure, checked as `posym lengthgen` checks its
    own (lengthgen.plan: within the position table, `n` test sequences that fit in memory at the longest),
    and the `n_prompts` label prompts against memory too."""
    if not factors or min(factors) < 1:
        raise PosymError(f"length factors must be positive integers, got {factors}")
    if 1 not in factors:  # the figure's top panel compares every condition at the training length
        raise PosymError(f"--factors must include 1 (the training length, where the conditions are compared), "
                         f"got {','.join(map(str, factors))}")
    lengths = sorted({k * task.seq_len for k in factors})
    plan(task, LengthGenConfig(lengths=lengths, protocol="paper", n=n, heads=False), model.config.n_positions)
    rows = model.config.n_layer * model.config.n_head * task.max_hops  # score rows per label prompt
    check_count("--label-prompts", n_prompts, sequence_bytes(task) + 80 * rows, what="label prompt")
    return lengths


def _measure_rows(model, task, lengths, n: int, seed: int, **labels) -> list[dict]:
    """One row per length: the labels, length, factor and `posym.core.train.evaluate`'s metrics."""
    config = LengthGenConfig(lengths=lengths, protocol="paper", n=n, seed=seed, device=str(model.device))
    return [{**labels, "length": length, "factor": length / task.seq_len, **metrics}
            for length, metrics in measure(model, task, lengths, config).items()]


def _load(path, step, device):
    source = resolve(path)
    if source.kind != "posym":
        raise PosymError(f"ablate and finetune intervene on posym runs (a GPT-J trained on a task); {path} is a "
                         f"{'GGUF' if source.kind == 'gguf' else 'Hugging Face'} model: analyse it with score, "
                         "llm-scores, geometry or discrepancy")
    model, info = load_checkpoint(path, step=step, device=device, attn_implementation="sdpa")
    if info["task_config"] is None:
        raise PosymError(f"{info['path']} has no posym.json with its task config; interventions need a posym model")
    return model, info


def _write(out_dir: Path, name: str, table, result: dict, title: str) -> dict:
    write_parquet(out_dir / f"{name}.parquet", table)
    result["figures"] = [str(p) for p in save_figure(plot_conditions(table, title), out_dir / name)]
    write_json(out_dir / f"{name}.json", result)
    return {**result, "table": table}


def run_ablation(path, conditions: list[str], out_dir, *, modes=ABLATION_MODES, step: int | None = None,
                 factors=(1, 2, 4), n: int = 1000, seed: int = 0, n_prompts: int = 100, gamma: float = GAMMA,
                 mean_samples: int = 512, save: str | Path | None = None, device: str = "cpu",
                 progress: Callable[[str], None] | None = None) -> dict:
    """Accuracy (per hop, per length) of the model with each condition's heads ablated, per mode.

    conditions: "positional", "symbolic", "mixed", "each" (every layer on its own) or "L.H,..."; a
    label no head carries is reported under "skipped". Writes ablation.parquet/json/png/svg to
    out_dir; `save` writes the single (condition, mode) pruned model as a plain GPT-J checkpoint.
    """
    if not conditions:
        raise PosymError("give at least one set of heads to ablate (--heads)")
    model, info = _load(path, step, device)
    task = info["task_config"]
    lengths = _lengths(model, task, list(factors), n, n_prompts)
    labels = label_heads(model, task, n_prompts=n_prompts, seed=seed, gamma=gamma)
    every = [(layer, h) for layer in range(model.config.n_layer) for h in range(model.config.n_head)]
    means = head_means(model, generate(task, mean_samples, seed, split="train").input_ids, every)
    chosen, skipped = {}, []
    for spec in _expand(conditions, model):
        heads = select_heads(spec, model, labels)
        if heads:
            chosen[spec] = heads
        else:
            skipped.append(spec)
    if save is not None and (len(chosen) != 1 or len(modes) != 1):
        raise PosymError("--save writes one pruned model: give exactly one --heads condition and one --mode")

    note = progress or (lambda text: None)
    note("baseline")
    rows = _measure_rows(model, task, lengths, n, seed, condition="none", mode="none", heads="")
    for spec, heads in chosen.items():
        for mode in modes:
            note(f"{spec} ({mode})")
            with ablated(model, heads, mode, means):
                rows += _measure_rows(model, task, lengths, n, seed, condition=spec, mode=mode, heads=_head_text(heads))
    import pandas as pd

    table = pd.DataFrame(rows)
    out_dir = Path(out_dir)
    result = {"checkpoint": str(info["path"]), "step": info["step"], "queries": LABEL_QUERIES, "task": task.task,
              "gamma": gamma,
              "labels": labels.to_dict("records"), "conditions": {k: _head_text(v) for k, v in chosen.items()},
              "skipped": skipped, "mean_samples": mean_samples}
    if save is not None:
        (spec, heads), mode = next(iter(chosen.items())), modes[0]
        fold_ablation(model, heads, mode, means)
        result["saved"] = str(save_model(model, info, save, {"ablation": {"heads": _head_text(heads), "mode": mode}}))
    return _write(out_dir, "ablation", table, result, f"{task.task} task, step {info['step']}: head ablation")


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
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / max(seconds, 1e-9), "params": total,
            "frozen_params": freezer.frozen_elements, "trainable_params": total - freezer.frozen_elements}


def run_finetune(path, conditions: list[str], out_dir, *, step: int | None = None, steps: int = 300,
                 lr: float | None = None, factors=(1, 2, 4), n: int = 1000, seed: int = 0, n_prompts: int = 100,
                 gamma: float = GAMMA, save_models: bool = False, device: str = "cpu",
                 progress: Callable[[str], None] | None = None) -> dict:
    """Continue training a run's checkpoint once per condition ("none" = nothing frozen, a label or
    "L.H,..." = those heads frozen), each from the same weights, data and dropout stream; compare
    accuracy per hop and per length, steps/s and trainable parameters. Writes finetune.* to out_dir."""
    import pandas as pd
    import torch

    model, info = _load(path, step, device)
    if info["run_dir"] is None:
        raise PosymError(f"{path} is not inside a posym run directory: fine-tuning reuses its config.yaml")
    config = from_dict(TrainConfig, io.read_yaml(Path(info["run_dir"]) / "config.yaml"))
    if lr is not None:
        config = override(config, {"lr": lr})
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    task = info["task_config"]
    lengths = _lengths(model, task, list(factors), n, n_prompts)
    labels = label_heads(model, task, n_prompts=n_prompts, seed=seed, gamma=gamma)
    note = progress or (lambda text: None)
    rows, costs, skipped = [], {}, []
    note("before fine-tuning")
    rows += _measure_rows(model, task, lengths, n, seed, condition="start", heads="", finetune_steps=0)
    for spec in list(dict.fromkeys(conditions)):
        heads = [] if spec == "none" else select_heads(spec, model, labels)
        if spec != "none" and not heads:
            skipped.append(spec)
            continue
        note(f"fine-tune, frozen: {spec}")
        fresh, _ = _load(info["path"], None, device)
        before = {k: v.clone() for k, v in fresh.state_dict().items()}
        cost = finetune(fresh, task, config, heads, start=info["step"] or 0, steps=steps)
        cost["frozen_unchanged"] = _frozen_unchanged(fresh, before, heads)
        costs[spec] = {**cost, "heads": _head_text(heads)}
        rows += _measure_rows(fresh, task, lengths, n, seed, condition=spec, heads=_head_text(heads),
                              finetune_steps=steps)
        if save_models:
            save_model(fresh, info, Path(out_dir) / "models" / spec.replace(",", "_"),
                       {"finetune": {"frozen": _head_text(heads), "steps": steps, "lr": config.lr}}, replace=True)
    table = pd.DataFrame(rows)
    result = {"checkpoint": str(info["path"]), "step": info["step"], "queries": LABEL_QUERIES, "task": task.task,
              "lr": config.lr,
              "steps": steps, "gamma": gamma, "labels": labels.to_dict("records"), "costs": costs, "skipped": skipped}
    return _write(Path(out_dir), "finetune", table, result,
                  f"{task.task} task, step {info['step']}: +{steps} fine-tuning steps, frozen heads")


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


def plot_conditions(table, title: str):
    """Top: accuracy per hop at the training length per condition; bottom: accuracy vs length."""
    import numpy as np

    keys = [c for c in ("condition", "mode") if c in table.columns]
    table = table.assign(name=table[keys].astype(str).agg(" / ".join, axis=1).str.replace(" / none", ""))
    names = list(dict.fromkeys(table["name"]))
    base = table[table["factor"] == 1].set_index("name").loc[names]
    hops = ["acc"] + sorted(c for c in table.columns if c.startswith("acc_hop"))
    fig, (left, right) = subplots(2, 1, figsize=(min(16.0, max(7.0, 0.5 * len(names) + 3)), 8.5),
                                      gridspec_kw={"height_ratios": [1, 1]})
    x = np.arange(len(names))
    width = 0.8 / len(hops)
    for k, column in enumerate(hops):
        left.bar(x + (k - (len(hops) - 1) / 2) * width, base[column], width, label=column.replace("acc_", ""))
    left.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    left.set(ylim=(0, 1.05), ylabel="accuracy at the training length")
    left.legend(fontsize=7, ncol=len(hops))
    for name in names:
        rows = table[table["name"] == name].sort_values("length")
        right.plot(rows["length"], rows["acc"], marker="o", ms=3, lw=2.2 if name in ("none", "start") else 1,
                   color="black" if name in ("none", "start") else None, label=name)
    lengths = sorted(table["length"].unique())
    right.set(xscale="log", ylim=(-0.02, 1.05), xlabel="sequence length (tokens)", ylabel="accuracy (all hops)")
    right.set_xticks(lengths, [str(k) for k in lengths], minor=False)
    right.minorticks_off()
    right.legend(fontsize=6, ncol=max(1, len(names) // 6), loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig

