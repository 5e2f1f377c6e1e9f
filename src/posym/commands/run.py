"""`posym run`: the whole study in one resumable command (train -> dynamics -> geometry -> theory ->
length generalization -> report).

Layout of the output directory (default `runs/main/`):
```
runs/main/
  pipeline.yaml          # the resolved PipelineConfig (a re-run must use the same one)
  number/ letter/        # one posym run directory per task (posym.core.train), with analysis/, lengthgen/
                         # and discrepancy/
  theory/                # posym.core.theory outputs (constructions, discrepancy, Fig. 5A)
  report/                # posym.commands.report: report.html + every figure as PNG and SVG
  stages/<job>-<stage>.done.json   # one done-file per finished stage
```
Each stage writes its outputs first and its done-file last (atomically), so a killed run re-runs
exactly the stages without a done-file; training continues from its latest checkpoint with
`posym.core.train`'s exact resume. The report is always rebuilt (seconds), so it reflects every input.

Parallelism: one job per task (its train -> dynamics -> geometry -> lengthgen -> discrepancy chain)
plus the theory job run in a pool of `workers` spawned processes; with 2 workers on 2 cores the two quick trainings
run side by side, each on one thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from posym import io
from posym.commands import discrepancy, dynamics, geometry, lengthgen, report, theory, train
from posym.configs import from_dict, to_dict
from posym.core.lengthgen import LengthGenConfig
from posym.core.model import DEVICES, resolve_device
from posym.core.theory import TheoryConfig
from posym.core.train import PRESETS
from posym.errors import PosymError
from posym.parallel import worker_signals
from posym.resources import check_resources
from posym.runs import PIPELINE_MARKER, RunDir, list_checkpoints
from posym.stages import claim, die_with_parent, is_done, resumable, run_stage

TASK_STAGES = ("train", "dynamics", "geometry", "lengthgen", "discrepancy")
"""The stages of one task's job, in order."""
THEORY = "theory"
"""Name of the job (and stage) that checks the paper's constructions."""


@dataclass
class PipelineConfig:
    """What `posym run` computes (written to `<out>/pipeline.yaml`)."""

    preset: str = "quick"
    """Training preset of posym.core.train: quick (minutes on a CPU), seed or paper."""
    tasks: list[str] = field(default_factory=lambda: ["number", "letter"])
    """Tasks to train and analyse, each in its own run directory `<out>/<task>`."""
    seed: int = 0
    """Seed of training (initialisation, data) and of every analysis prompt set."""
    device: str = "auto"
    """Device of training and length generalization: cpu, cuda or auto (scores run on the CPU)."""
    train: dict = field(default_factory=dict)
    """Overrides of the preset's TrainConfig fields (nested: {model: {n_layer: 4}}), as `--config` of
    posym train; unknown keys are errors."""
    dynamics_prompts: int = 100
    """Test prompts scored at every checkpoint by posym.commands.dynamics (the paper: 100)."""
    geometry_prompts: int = 100
    """Test prompts of the per-plane analysis of the last checkpoint (posym.core.geometry)."""
    lengthgen: LengthGenConfig = field(default_factory=lambda: LengthGenConfig(n=64))
    """Length-generalization settings (lengths, factors, questions per length); its device follows
    `device`. 64 questions per length (posym lengthgen: 128) keep a quick run within 10 minutes on 2
    cores: the 1,024- and 2,048-token lengths dominate the whole analysis."""
    theory: TheoryConfig = field(default_factory=TheoryConfig)
    """Constructions and discrepancy checks of posym.core.theory (task-independent, run once)."""
    workers: int | None = None
    """Processes running jobs side by side; None = one per job up to the number of CPU cores."""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise PosymError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise PosymError(f"tasks must be a non-empty list without repeats, got {self.tasks}")
        for task in self.tasks:
            if task not in ("number", "letter"):
                raise PosymError(f"unknown task {task!r}; choose number and/or letter")
        if self.device not in DEVICES:
            raise PosymError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dynamics_prompts < 1 or self.geometry_prompts < 1:
            raise PosymError("dynamics_prompts and geometry_prompts must be positive")
        if not isinstance(self.train, dict):
            raise PosymError(f"train must be a mapping of TrainConfig overrides, got {self.train!r}")
        if self.workers is not None and self.workers < 1:
            raise PosymError(f"workers must be a positive integer or null, got {self.workers}")


def resolve_pipeline(config_file: str | Path | None = None, overrides: dict | None = None) -> PipelineConfig:
    """Defaults, then the YAML file's keys, then `overrides` (CLI flags, e.g. preset, tasks); each
    train config is resolved once here so that a bad `train:` key fails before anything runs."""
    data: dict[str, Any] = io.read_yaml(config_file) if config_file is not None else {}
    data.update(overrides or {})
    config = from_dict(PipelineConfig, data, where=str(config_file or "pipeline config"))
    for task in config.tasks:
        check_resources(train_config(config, task))
    return config


def train_config(config: PipelineConfig, task: str):
    """The TrainConfig of `task`: the preset, the `train` overrides, then the pipeline's seed/device."""
    return train.resolve_config(
        config.preset, task, None, {**config.train, "seed": config.seed, "device": config.device}
    )


# ---- stages -------------------------------------------------------------------------------------


# ---- jobs (run in worker processes) -------------------------------------------------------------


def _pool_worker() -> None:
    """`posym run`'s pool initializer: die with the driver, and leave Ctrl-C (sent to the whole process
    group) to the driver, which stops the workers itself and says what was kept."""
    die_with_parent()
    worker_signals()


def task_job(config_dict: dict, out: str, task: str, threads: int) -> dict:
    """One task's chain: train (resuming), dynamics, geometry, lengthgen, discrepancy. Returns seconds per stage."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(threads)
    config = from_dict(PipelineConfig, config_dict)
    out_path, run_dir = Path(out), Path(out) / task
    cfg = train_config(config, task)
    lg = dataclasses.replace(config.lengthgen, device=resolve_device(config.device))
    work = {
        "train": lambda: train.train(cfg, run_dir, resume=RunDir(run_dir).config.is_file(), progress=False),
        "dynamics": lambda: dynamics.run_dynamics(run_dir, n_prompts=config.dynamics_prompts, seed=config.seed),
        "geometry": lambda: geometry.run_geometry(
            **geometry.prepare(run_dir, n_prompts=config.geometry_prompts, seed=config.seed)
        ),
        "lengthgen": lambda: lengthgen.run_lengthgen(run_dir, lg, RunDir(run_dir).output("lengthgen")),
        # the paper-protocol lengths and questions of lengthgen, so the two read side by side
        "discrepancy": lambda: discrepancy.run_discrepancy(
            run_dir, lengths=lg.lengths, n=lg.n, seed=config.seed, max_tokens=lg.max_tokens, device=lg.device
        ),
    }
    return {stage: run_stage(out_path, task, stage, work[stage]) or 0.0 for stage in TASK_STAGES}


def theory_job(config_dict: dict, out: str, threads: int) -> dict:
    """The constructions and discrepancy checks (posym.core.theory) into `<out>/theory`."""
    import torch

    torch.set_num_threads(threads)
    config = from_dict(PipelineConfig, config_dict)
    work = lambda: theory.run_theory(config.theory, Path(out) / THEORY)  # noqa: E731
    return {THEORY: run_stage(Path(out), THEORY, THEORY, work) or 0.0}


# ---- the driver ----------------------------------------------------------------------------------


def job_status(config: PipelineConfig, out: Path, job: str) -> str:
    """One line on where a job stands, read from its files (done-files, checkpoints)."""
    if job == THEORY:
        return "theory: done" if is_done(out, THEORY, THEORY) else "theory: constructions and discrepancy"
    for stage in TASK_STAGES:
        if not is_done(out, job, stage):
            if stage == "train":
                checkpoints = list_checkpoints(out / job) if (out / job).is_dir() else []
                step = checkpoints[-1][0] if checkpoints else 0
                return f"{job}: train, step {step}/{train_config(config, job).max_steps}"
            return f"{job}: {stage}"
    return f"{job}: done"


@contextlib.contextmanager
def _stopping_workers(pool):
    """On Ctrl-C, end the pool's workers at once (their writes are atomic, as after a kill) instead of
    letting the pool wait for their jobs to finish."""
    try:
        yield
    except KeyboardInterrupt:
        for process in list(pool._processes.values()):  # noqa: SLF001 (the executor offers no kill)
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise


def run_pipeline(
    config: PipelineConfig,
    out: str | Path,
    *,
    bench: str | Path | None = None,
    status: Callable[[list[str]], None] | None = None,
) -> dict:
    """Run (or continue) every stage into `out`, then build the report. `status(lines)` is called
    about once a second with one line per job. Returns {"report": path, "seconds": {...}, "summary": [...]}.

    A job that fails with a PosymError does not stop the others; the run then raises one PosymError
    naming every failed job after the report of what did finish is written.
    """
    start = time.perf_counter()
    out = Path(out)
    if bench is not None and (not Path(bench).is_dir() or report.input_kind(Path(bench)) != "bench"):
        raise PosymError(f"--bench {bench} is not a posym llm-bench output directory (table.md, summary.parquet)")
    jobs = [*config.tasks, THEORY]
    with resumable(out, lambda: _kept(out, jobs)):
        claim(out, PIPELINE_MARKER, to_dict(config), what="a run")
        return _run_jobs(config, out, jobs, bench, status, start)


def _kept(out: Path, jobs: list[str]) -> str:
    """The Ctrl-C line of `posym run`: the finished stages and how to continue."""
    stages = [(job, stage) for job in jobs for stage in ((THEORY,) if job == THEORY else TASK_STAGES)]
    done = sum(is_done(out, job, stage) for job, stage in stages)
    return (
        f"kept {done} of {len(stages)} finished stages (and the checkpoints of any training) in {out}; "
        "re-running the same command resumes"
    )


def _run_jobs(config: PipelineConfig, out: Path, jobs: list[str], bench, status, start: float) -> dict:
    """The body of `run_pipeline`, under the output directory's lock."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from multiprocessing import get_context

    workers = config.workers or max(1, min(len(jobs), os.cpu_count() or 1))
    threads = max(1, (os.cpu_count() or 1) // workers)
    as_dict = to_dict(config)
    seconds: dict[str, dict] = {}
    failures: dict[str, str] = {}
    # spawn, not fork: torch and OpenMP state must not be copied into the workers
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=_pool_worker)
    with pool, _stopping_workers(pool):
        futures = {
            pool.submit(theory_job, as_dict, str(out), threads)
            if job == THEORY
            else pool.submit(task_job, as_dict, str(out), job, threads): job
            for job in jobs
        }
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in finished:
                try:
                    seconds[futures[future]] = future.result()
                except PosymError as exc:
                    failures[futures[future]] = str(exc)
            if status is not None:
                status([job_status(config, out, job) for job in jobs])
    run_dirs = [out / task for task in config.tasks if task not in failures]
    extra = [out / THEORY] if THEORY not in failures else []
    html = report.build_report([*run_dirs, *extra, *([Path(bench)] if bench else [])], out / "report")
    if failures:
        raise PosymError(
            "; ".join(f"job {job} failed: {message}" for job, message in failures.items())
            + f" (report of the rest: {html})"
        )
    result = {
        "report": str(html),
        "seconds": seconds,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "summary": [report.run_summary(d) for d in run_dirs],
    }
    io.write_json(out / "pipeline.json", {**io.manifest(as_dict, seed=config.seed), **result})
    return result
