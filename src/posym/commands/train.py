"""`posym train` / `posym eval`: run directories, the exact-resume training loop, checkpoint evaluation.

The maths of a step (schedule, loss on the last position, AdamW update, the batch of a step) and
the evaluation are `posym.core.train`; this module owns the files: config.yaml and manifest.json of
a run, checkpoints (weights + posym.json + the trainer state that makes a resumed run end
bit-identical to an uninterrupted one on the same machine), metrics.parquet and train.log.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

from posym import io
from posym.configs import from_dict, override, to_dict
from posym.core.model import build_model
from posym.core.tasks import task_config
from posym.core.train import (
    LEGACY_PRECISIONS,
    PRESETS,
    TrainConfig,
    checkpoint_steps,
    evaluate,
    make_optimizer,
    to_tensor,
    train_batch,
    train_step,
)
from posym.errors import PosymError
from posym.models import read_checkpoint_meta
from posym.resources import check_resources
from posym.runs import CHECKPOINT_META, CHECKPOINTS, RunDir, list_checkpoints

TRAINER_TENSORS = "trainer_state.safetensors"
TRAINER_JSON = "trainer_state.json"


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
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(directory / TRAINER_TENSORS))
    meta = io.read_json(directory / TRAINER_JSON)
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


def _restore(model, optimizer, ckpt: Path, device: str) -> None:
    """Load a checkpoint's weights and trainer state; a damaged file raises `_Damaged(file, reason)`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    steps = [
        (ckpt / "model.safetensors", lambda f: model.load_state_dict(load_file(str(f), device=device))),
        (ckpt / TRAINER_JSON, lambda f: io.read_json(f)["param_groups"]),
        (ckpt / TRAINER_TENSORS, lambda f: _load_trainer_state(ckpt, optimizer)),
    ]
    for path, load in steps:
        try:
            load(path)
        except (OSError, ValueError, KeyError, IndexError, TypeError, RuntimeError, SafetensorError, PosymError) as exc:
            raise _Damaged(path, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from None


class _Damaged(Exception):
    """A checkpoint file that cannot be read back (path, reason)."""


def _resume_point(run_dir: Path, resumable: list[tuple[int, Path]], model, optimizer, device: str) -> tuple[int, Path]:
    """Restore the newest resumable checkpoint; if one of its files is damaged, one PosymError naming the
    file and the newest checkpoint that does load (the one to resume from once the damaged one is moved away)."""
    step, ckpt = resumable[-1]
    try:
        _restore(model, optimizer, ckpt, device)
        return step, ckpt
    except _Damaged as damaged:
        path, reason = damaged.args
    intact = None
    for _, older in reversed(resumable[:-1]):
        try:
            _restore(model, optimizer, older, device)
            intact = older
            break
        except _Damaged:
            continue
    offer = (
        f"the newest intact checkpoint is {intact.name}: move {ckpt.name} (and any checkpoint after "
        f"{intact.name}) out of {ckpt.parent}, then resume again"
        if intact is not None
        else "no other checkpoint keeps its trainer state (set keep_trainer_state: true to keep them), so the run "
        "cannot continue exactly; start it again"
    )
    raise PosymError(f"cannot resume {run_dir}: {path.relative_to(run_dir)} is damaged ({reason[:120]}); {offer}")


LEGACY_DEFAULTS = {"val_size": 0, "precision": "float32"}
"""Fields added to TrainConfig after runs existed, with the value that reproduces those runs."""
LEGACY_MODEL_DEFAULTS = {"embd_dropout": None, "resid_dropout": None, "attn_dropout": None}
"""The same for fields added to its ModelConfig (None: the site takes the shared `dropout`)."""


_FIRST_SPELLING = {name: legacy for legacy, name in LEGACY_PRECISIONS.items()}


def _without_legacy(data: dict, legacy: dict) -> dict:
    return {k: v for k, v in data.items() if legacy.get(k, ...) != v}


def run_hash(config: TrainConfig) -> str:
    """The config hash of a run, leaving out LEGACY_DEFAULTS (and LEGACY_MODEL_DEFAULTS) fields at their
    legacy value, so a run started before a field existed keeps its hash when resumed by newer code. The
    precision is hashed in its first spelling (fp32, bf16: `posym.core.train.LEGACY_PRECISIONS`), so a run
    keeps its hash whichever spelling its config.yaml has."""
    data = _without_legacy(to_dict(config), LEGACY_DEFAULTS)
    if "precision" in data:
        data["precision"] = _FIRST_SPELLING[data["precision"]]
    data["model"] = _without_legacy(data["model"], LEGACY_MODEL_DEFAULTS)
    return io.config_hash(data)


def _run_config(config: TrainConfig | None, run_dir: Path, resume: bool) -> TrainConfig:
    """The config of the run: `config` for a new run, the run's config.yaml (which `config`, if given,
    must equal) to resume. Reads only."""
    config_path = RunDir(run_dir).config
    if resume:
        if not config_path.is_file():
            raise PosymError(f"cannot resume: {run_dir} is not a posym run directory (no config.yaml)")
        stored = from_dict(TrainConfig, io.read_yaml(config_path), where=str(config_path))
        if config is not None and run_hash(config) != run_hash(stored):
            raise PosymError(f"cannot resume {run_dir} with a different config than its config.yaml")
        return stored
    if config is None:
        raise PosymError("a config is needed to start a new run")
    if run_dir.exists() and (not run_dir.is_dir() or any(p.name != io.LOCK for p in run_dir.iterdir())):
        raise PosymError(f"{run_dir} already exists and is not empty; pass --resume or choose another --out")
    return config


def _kept(run_dir: Path) -> str:
    """The Ctrl-C line of `posym train`: what is on disk and how to continue."""
    steps = [s for s, _ in list_checkpoints(run_dir)]
    if not steps:
        return f"no checkpoint was finished, so nothing was kept in {run_dir}; the same command starts it again"
    return (
        f"kept checkpoints up to step {steps[-1]} in {run_dir}; `posym train --resume {run_dir}` continues from there"
    )


def train(
    config: TrainConfig | None,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    stop_at: int | None = None,
    device: str | None = None,
    threads: int | None = None,
) -> Path:
    """Train (or, with resume=True, continue) the run in `run_dir`; return `run_dir`.

    With resume, `config` may be None (the run's config.yaml is used) and must otherwise equal it.
    `stop_at` ends the session after a checkpoint at that step without touching the schedule (the lr
    still decays towards max_steps), so a later resume continues the very same run: the way to train
    the 6,000-step `paper` preset on a CPU up to its maximal accuracy, or in pieces.
    `device` / `threads` (resume only) continue the run on another machine than its config names, e.g.
    a run started on a GPU finished on a CPU: the config, its hash and the schedule stay the run's, and
    train.log records the change (the steps after it then differ from an uninterrupted run by float
    rounding and, for dropout, by the other device's random stream).
    """
    if stop_at is not None and stop_at < 1:
        raise PosymError(f"--stop-at must be a positive step, got {stop_at}")
    if not resume and (device, threads) != (None, None):
        raise PosymError("device and threads overrides are for resuming a run; a new run takes them from its config")
    run_dir = Path(run_dir)
    config = _run_config(config, run_dir, resume)
    machine = dataclasses.replace(
        config, **{k: v for k, v in (("device", device), ("threads", threads)) if v is not None}
    )
    try:
        resolved = check_resources(machine)  # before the run directory exists: a refused config leaves nothing
    except PosymError as refused:
        if resume:  # a run started elsewhere (a GPU, more cores) can still be finished here
            raise PosymError(
                f"{refused}; to continue {run_dir} on this machine, pass --device and/or --threads"
            ) from None
        raise
    with io.locked(run_dir), io.interruptible(lambda: _kept(run_dir)):
        if resume:
            return _train(config, run_dir, resume, progress, stop_at, resolved, machine)
        _run_config(config, run_dir, resume)  # again, under the lock: nobody started it meanwhile
        started = [
            io.write_yaml(RunDir(run_dir).config, to_dict(config)),
            io.write_json(
                RunDir(run_dir).manifest,
                {**io.manifest(to_dict(config), seed=config.seed), "config_hash": run_hash(config)},
            ),
        ]
        try:
            return _train(config, run_dir, resume, progress, stop_at, resolved, machine)
        except BaseException:
            if not list_checkpoints(run_dir):  # a start that failed before its first checkpoint blocks nothing
                for path in [*started, RunDir(run_dir).log, RunDir(run_dir).metrics, run_dir / CHECKPOINTS]:
                    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
            raise


def _train(
    config: TrainConfig,
    run_dir: Path,
    resume: bool,
    progress: bool,
    stop_at: int | None,
    device: str,
    machine: TrainConfig,
) -> Path:
    """The body of `train`, run under the run directory's lock, on `device` (resolved) with the threads of
    `machine` (`config` with this session's device/threads overrides)."""
    import pandas as pd
    import torch

    chash = run_hash(config)
    if machine.threads is not None:
        torch.set_num_threads(machine.threads)
    task = config.task

    model = build_model(config.model, task.vocab_size, config.seed).to(device)
    optimizer = make_optimizer(model, config)
    end = config.max_steps if stop_at is None else min(stop_at, config.max_steps)
    saves = set(checkpoint_steps(config.max_steps, config.checkpoint_every)) | {end}
    log_path = RunDir(run_dir).log
    # the log only informs: a damaged one (bytes that are not UTF-8) is kept as far as it reads, never a refusal
    log_lines = (
        log_path.read_text(encoding="utf-8", errors="replace").splitlines() if resume and log_path.is_file() else []
    )
    rows: list[dict] = []

    step = 0
    resumable = [(s, p) for s, p in list_checkpoints(run_dir) if (p / TRAINER_TENSORS).is_file()]
    if resume:  # temporary files of writes a kill interrupted (never visible under final names)
        for leftover in [*run_dir.glob(".*.tmp-*"), *run_dir.glob(f"{CHECKPOINTS}/.*")]:
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    if resume and resumable:
        step, ckpt = resumable[-1]
        if stop_at is not None and step >= end:
            raise PosymError(f"{run_dir} is already at step {step}; nothing to do before step {end}")
        step, ckpt = _resume_point(run_dir, resumable, model, optimizer, device)
        rows = [read_checkpoint_meta(p)["metrics"] for s, p in list_checkpoints(run_dir) if s <= step]
        log_lines.append(f"resumed at step {step} from {ckpt.name}")
        if (machine.device, machine.threads) != (config.device, config.threads):
            log_lines.append(
                f"continuing on {device} with {machine.threads or 'default'} threads (the run's config "
                f"names {config.device} with {config.threads or 'default'} threads)"
            )
    else:
        torch.manual_seed(config.seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(config.seed)

    def write_metrics() -> None:
        frame = pd.DataFrame(rows)  # rows read back from posym.json have sorted keys: fix the order
        first = ["step", "loss", "acc"] + [f"acc_hop{h}" for h in range(1, task.max_hops + 1)]
        io.write_parquet(RunDir(run_dir).metrics, frame[first + sorted(set(frame.columns) - set(first))])

    def checkpoint(step: int, train_loss: float) -> dict:
        metrics = evaluate(model, task, config.eval_size, config.seed, "test", config.eval_batch_size)
        if config.val_size:
            val = evaluate(model, task, config.val_size, config.seed, "val", config.eval_batch_size)
            metrics.update({f"val_{k}": v for k, v in val.items()})
        metrics = {"step": step, **metrics, "train_loss": train_loss, "time": time.time()}
        previous = list_checkpoints(run_dir)
        with io.atomic_path(RunDir(run_dir).checkpoint(step), is_dir=True, replace=True) as tmp:
            model.save_pretrained(tmp)
            io.write_json(
                tmp / CHECKPOINT_META,
                {
                    "step": step,
                    "seed": config.seed,
                    "config_hash": chash,
                    "task": to_dict(task),
                    "model": to_dict(config.model),
                    "metrics": metrics,
                },
            )
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

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = [
        TextColumn("train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} steps/s"),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("acc {task.fields[acc]}"),
        TimeRemainingColumn(),
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
            loss = train_step(model, optimizer, config, step, to_tensor(ids, device), to_tensor(answer, device))
            step += 1
            window_loss += loss
            window_steps += 1
            if step in saves:
                last = checkpoint(step, (window_loss / window_steps).item())
                window_loss.zero_()
                window_steps = 0
            if progress and (step % 10 == 0 or step == end):
                rate = (step - t0_step) / max(1e-9, time.perf_counter() - t0)
                bar.update(
                    bar_task, completed=step, rate=f"{rate:.1f}", loss=f"{loss.item():.3f}", acc=f"{last['acc']:.3f}"
                )
    return run_dir
