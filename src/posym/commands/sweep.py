"""`posym sweep`: a grid of training runs (tasks x seeds x presets x RoPE settings) executed with Ray.

Every trial is a normal posym run directory `<out>/trials/<name>` (posym.core.train), optionally followed
by posym.commands.dynamics; a finished trial leaves a done-file (posym.commands.run's) holding its result row, so
re-running a sweep skips finished trials and resumes interrupted ones from their last checkpoint.
A trial that fails is reported with its error and does not stop the others.

RoPE settings: `rotary_dims` (how many head dimensions are rotated; the rest are position-free),
`rope_bases` (Hugging Face GPT-J hard-codes 10,000), `rope_bands` (which frequency IDs rotate, one
band for every layer or one per layer) and `nope_from` (layers from this index on get no rotation);
all but rotary_dims are posym.core.rope's variant, which posym's own loading applies and plain
transformers loading ignores. Every axis value is resolved against the preset's model: two values of
one axis that are the same setting (rotary_dims null and the head dimension, rope_bands null and
[[1, planes]], nope_from null and n_layer) are an error; a combination of axes that only repeats an
earlier one (with nope_from 0 no layer rotates, so every band is the same NoPE model) runs once, under
the first one's name. Trial names carry the effective setting: `-band<first>-<last>` (per layer:
joined by `_`, NoPE layers left out) and `-nope<layer>` appear only when they differ from full RoPE.

Outputs: trials.parquet (one row per trial: settings, status, error, final accuracy per hop and, with
dynamics, the fraction of pure positional/symbolic heads at the end), aggregate.parquet (mean and std
over seeds per task x preset x RoPE setting), aggregate.png/svg and sweep.json.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from posym import io
from posym.commands import dynamics as dyn
from posym.commands import train
from posym.configs import from_dict, to_dict
from posym.core.paper import GAMMA
from posym.core.rope import layer_bands
from posym.core.train import TrainConfig
from posym.errors import PosymError
from posym.figures import save_figure, subplots
from posym.runs import TRIALS, RunDir, done_path, figure_file, output_file
from posym.stages import die_with_parent, is_done, mark_done, resumable

SWEEP_JOB = "trial"
"""Stage name of the done-file of a trial."""
TRIAL_KEYS = ("name", "task", "preset", "seed", "rotary_dim", "rope_base", "rope_bands", "nope_from")
"""The settings every trial row starts with (rope_bands as its label, nope_from resolved)."""
SETTING_KEYS = ["task", "preset", "rotary_dim", "rope_base", "rope_bands", "nope_from"]
"""The columns a grid setting is identified by (the aggregate averages over seeds within one)."""


@dataclass
class SweepConfig:
    """The grid of `posym sweep CONFIG.yaml` (unknown keys are errors)."""

    tasks: list[str] = field(default_factory=lambda: ["number", "letter"])
    """Tasks of the grid (number, letter)."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Training seeds; the aggregate table averages over them."""
    presets: list[str] = field(default_factory=lambda: ["quick"])
    """Training presets of posym.core.train (quick, seed, paper)."""
    rotary_dims: list[int | None] = field(default_factory=lambda: [None])
    """Head dimensions RoPE rotates (even); null = all of them (the paper)."""
    rope_bases: list[float] = field(default_factory=lambda: [10000.0])
    """RoPE bases (frequencies base^(-2(k-1)/rotary_dim)); the paper: 10,000."""
    rope_bands: list[list[list[int]] | None] = field(default_factory=lambda: [None])
    """Rotating frequency bands, each a model.rope_bands value: null = every plane, [[first, last]] =
    frequency IDs first..last (1 = fastest) in every layer, or one [first, last] per layer."""
    nope_from: list[int | None] = field(default_factory=lambda: [None])
    """Layers with index >= this value get no rotation (NoPE); null = RoPE in every layer, 0 = NoPE."""
    train: dict = field(default_factory=dict)
    """Overrides of every trial's TrainConfig (e.g. {max_steps: 500, model: {n_layer: 4}})."""
    dynamics: bool = False
    """Also run posym.commands.dynamics on every trial and aggregate its pure-head fractions."""
    n_prompts: int = 100
    """Test prompts per checkpoint of the dynamics analysis."""
    cpus_per_trial: int = 1
    """CPU cores Ray reserves for one trial (also its torch threads)."""
    num_cpus: int | None = None
    """CPUs of the local Ray instance (ignored with --address); null = all cores."""

    def __post_init__(self) -> None:
        for name in ("tasks", "seeds", "presets", "rotary_dims", "rope_bases", "rope_bands", "nope_from"):
            values = getattr(self, name)
            if not values or len({repr(v) for v in values}) != len(values):
                raise PosymError(f"{name} must be a non-empty list without repeats, got {values}")
        if not isinstance(self.train, dict):
            raise PosymError(f"train must be a mapping of TrainConfig overrides, got {self.train!r}")
        if self.n_prompts < 1 or self.cpus_per_trial < 1 or (self.num_cpus is not None and self.num_cpus < 1):
            raise PosymError("n_prompts, cpus_per_trial and num_cpus must be positive")


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and validate a sweep YAML file."""
    return from_dict(SweepConfig, io.read_yaml(path), where=str(path))


def bands_label(model) -> str:
    """The effective rotating bands of a ModelConfig: "all" (every plane wherever RoPE is on), "none"
    (NoPE everywhere), "first-last" (one band in every rotating layer) or per rotating layer joined by "_"."""
    planes = model.resolved_rotary_dim // 2
    bands = [b for b in layer_bands(model) if b is not None]  # NoPE layers have no band
    if not bands:
        return "none"
    if all(b == (1, planes) for b in bands):
        return "all"
    labels = [f"{a}-{b}" for a, b in bands]
    return labels[0] if len(set(labels)) == 1 else "_".join(labels)


def _setting(cfg) -> tuple:
    """(rotary dim, bands label, nope_from) of a resolved TrainConfig, defaults resolved."""
    model = cfg.model
    nope = model.n_layer if model.nope_from is None else model.nope_from
    return model.resolved_rotary_dim, bands_label(model), nope


def _resolve(config: SweepConfig, preset: str, task: str, seed: int, rope: dict):
    """The TrainConfig of one trial: the sweep's train overrides, then the RoPE values in `rope`
    (ModelConfig field -> value; None keeps the preset's or the train overrides' value)."""
    model = {**config.train.get("model", {}), **{k: v for k, v in rope.items() if v is not None}}
    return train.resolve_config(preset, task, None, {**config.train, "seed": seed, "model": model})


def _check_axis(config: SweepConfig, preset: str, task: str, axis: str, key: str) -> None:
    """PosymError when two values of one RoPE axis resolve to the same setting for this preset."""
    seen = {}
    for value in getattr(config, axis):
        setting = _setting(_resolve(config, preset, task, 0, {key: value}))
        if setting in seen:
            raise PosymError(
                f"the grid holds the same trial twice: {axis} lists {seen[setting]!r} and {value!r}, "
                f"which are the same setting for the {preset} preset"
            )
        seen[setting] = value


def trials(config: SweepConfig) -> list[dict]:
    """The grid, one dict per trial: name, task, preset, seed, the RoPE setting (rotary_dim and nope_from
    resolved, rope_bands as `bands_label`), rope_base and its TrainConfig as a dict. Every config is
    resolved here, so a bad key or band fails before any trial starts; see the module docstring for
    repeated settings."""
    out, names = [], set()
    for preset in config.presets:
        for task in config.tasks:
            for axis, key in (("rotary_dims", "rotary_dim"), ("rope_bands", "rope_bands"), ("nope_from", "nope_from")):
                _check_axis(config, preset, task, axis, key)
            grid = itertools.product(
                config.rotary_dims, config.rope_bases, config.rope_bands, config.nope_from, config.seeds
            )
            for rotary, base, bands, nope, seed in grid:
                cfg = _resolve(
                    config,
                    preset,
                    task,
                    seed,
                    {"rotary_dim": rotary, "rope_base": base, "rope_bands": bands, "nope_from": nope},
                )
                rot, label, nope_layer = _setting(cfg)
                name = (
                    f"{task}-{preset}-rot{rot}-base{base:g}"
                    + ("" if label in ("all", "none") else f"-band{label}")
                    + ("" if nope_layer == cfg.model.n_layer else f"-nope{nope_layer}")
                    + f"-seed{seed}"
                )
                if name in names:
                    continue  # an earlier combination already is this model (e.g. any band with nope_from 0)
                names.add(name)
                out.append(
                    {
                        "name": name,
                        "task": task,
                        "preset": preset,
                        "seed": seed,
                        "rotary_dim": rot,
                        "rope_base": base,
                        "rope_bands": label,
                        "nope_from": nope_layer,
                        "config": to_dict(cfg),
                    }
                )
    return out


def run_trial(trial: dict, run_dir: str, dynamics: bool, n_prompts: int, threads: int) -> dict:
    """Train one trial (resuming if its directory exists), optionally score its dynamics; return its
    result row. Any exception becomes status "failed" with the error text (a trial never raises)."""
    start = time.perf_counter()
    row = {k: trial[k] for k in TRIAL_KEYS}
    try:
        import torch

        torch.set_num_threads(threads)
        run_path = Path(run_dir)
        cfg = from_dict(TrainConfig, trial["config"])
        train.train(cfg, run_path, resume=RunDir(run_path).config.is_file(), progress=False)
        last = io.read_parquet(RunDir(run_path).metrics).sort_values("step").iloc[-1]
        row.update({k: float(last[k]) for k in last.index if k == "acc" or k.startswith("acc_hop")})
        row["step"] = int(last.step)
        if dynamics:
            result = dyn.run_dynamics(run_path, n_prompts=n_prompts, seed=trial["seed"])
            end = [
                r
                for r in result["composition"]
                if r["gamma"] == GAMMA and r["stage"] == "end" and r["query_mode"] == "hops"
            ][0]
            row.update(
                {
                    "frac_positional": end["frac_positional"],
                    "frac_symbolic": end["frac_symbolic"],
                    "layers_positional": end["layers_positional"],
                    "layers_symbolic": end["layers_symbolic"],
                }
            )
        row.update(status="ok", error="")
    except Exception as exc:  # noqa: BLE001 - a failed trial is data, reported in trials.parquet
        row.update(status="failed", error=f"{type(exc).__name__}: {exc}")
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def _ray_trial(*args) -> dict:
    """`run_trial` as a Ray task. Its worker first ties its life to its parent's, the raylet (which
    dies with the `posym sweep` that started it): Ray workers lead their own sessions and would
    otherwise train on, unwatched, into the trial directory a re-run resumes."""
    die_with_parent()
    return run_trial(*args)


def aggregate(rows):
    """Mean and std over seeds (successful trials) per grid setting (SETTING_KEYS), of the final
    accuracy (overall and per hop) and, when present, the pure-head fractions; `n_seeds` counts them."""
    ok = rows[rows.status == "ok"]
    metrics = [c for c in ok.columns if c == "acc" or c.startswith("acc_hop") or c.startswith("frac_")]
    keys = SETTING_KEYS
    if ok.empty:
        return ok[keys]
    grouped = ok.groupby(keys)
    table = grouped[metrics].agg(["mean", "std"])
    table.columns = [f"{metric}_{stat}" for metric, stat in table.columns]
    table.insert(0, "n_seeds", grouped.size())
    return table.reset_index()


def plot_aggregate(table):
    """Mean final accuracy per hop (bars, std over seeds as error bars) for every grid setting, and
    the pure-head fractions if the trials ran dynamics."""
    import numpy as np

    hops = sorted(c[:-5] for c in table.columns if c.startswith("acc_hop") and c.endswith("_mean"))
    fracs = [c[:-5] for c in table.columns if c.startswith("frac_") and c.endswith("_mean")]
    panels = [("final test accuracy", ["acc", *hops])] + (
        [("pure heads at the end (gamma 0.1)", fracs)] if fracs else []
    )
    varied = len(table[["rope_bands", "nope_from"]].drop_duplicates()) > 1  # say the band setting only then
    labels = [
        f"{r.task}\n{r.preset}, rot {r.rotary_dim}, base {r.rope_base:g}"
        + (f"\nbands {r.rope_bands}, NoPE from L{r.nope_from}" if varied else "")
        for r in table.itertuples()
    ]
    fig, axes = subplots(1, len(panels), figsize=(max(5.0, 1.6 * len(table)) * len(panels), 3.8), squeeze=False)
    x = np.arange(len(table))
    for ax, (title, columns) in zip(axes[0], panels):
        width = 0.8 / len(columns)
        for k, column in enumerate(columns):
            ax.bar(
                x + (k - (len(columns) - 1) / 2) * width,
                table[f"{column}_mean"],
                width,
                yerr=table[f"{column}_std"].fillna(0),
                capsize=2,
                label=column.replace("acc_", ""),
            )
        ax.set_xticks(x, labels, fontsize=8)
        ax.set(ylim=(0, 1.05), title=f"{title}, mean ± std over seeds")
        ax.legend(fontsize=7)
    return fig


def run_sweep(
    config: SweepConfig,
    out: str | Path,
    *,
    address: str | None = None,
    max_concurrent: int | None = None,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Run every trial not yet done on Ray (local unless `address`), at most `max_concurrent` at a
    time; write trials.parquet, aggregate.parquet, aggregate.png/svg and sweep.json into `out`.
    `progress(row)` is called after each trial. Returns sweep.json's content plus the two tables."""
    out = Path(out)
    grid = trials(config)
    if max_concurrent is not None and max_concurrent < 1:
        raise PosymError(f"--max-concurrent must be positive, got {max_concurrent}")
    # one process per OUT: a second sweep into `out` would run the same trials and race on its tables
    with resumable(out, lambda: _kept(out, grid)):
        return _run_sweep(config, out, grid, address, max_concurrent, progress)


def _kept(out: Path, grid: list[dict]) -> str:
    """The Ctrl-C line of `posym sweep`: the finished trials and how to continue."""
    done = sum(is_done(out, t["name"], SWEEP_JOB) for t in grid)
    return f"kept {done} of {len(grid)} finished trials in {out}; re-running the same command resumes"


def _done_row(path: Path) -> dict:
    """The table row a finished trial's done-file keeps; a damaged one is one PosymError line saying how to
    run that trial again."""
    row = io.read_json_object(path).get("row")
    if not isinstance(row, dict):
        raise PosymError(f"{path} is damaged (it holds no table row); delete it to run that trial again")
    return row


LOCAL_RAY = {"worker_niceness": 0}
"""Ray's system settings for the local instance a sweep starts. Ray starts its workers at nice 15 (so that its
own services stay responsive): the trials, the whole work of a sweep, then get a fortieth of a core's share
beside anything at nice 0 (a 4-step trial's worker had 21 s of CPU in its first 4 minutes here). A cluster
named by `--address` keeps its own settings."""


def _run_sweep(
    config: SweepConfig,
    out: Path,
    grid: list[dict],
    address: str | None,
    max_concurrent: int | None,
    progress: Callable[[dict], None] | None,
) -> dict:
    """The body of `run_sweep`, run under `out`'s lock."""
    import pandas as pd
    import ray

    rows = {
        t["name"]: _done_row(done_path(out, t["name"], SWEEP_JOB)) for t in grid if is_done(out, t["name"], SWEEP_JOB)
    }
    todo = [t for t in grid if t["name"] not in rows]
    if todo:
        started = not ray.is_initialized()
        if started:
            try:
                ray.init(address=address, log_to_driver=False) if address else ray.init(
                    num_cpus=config.num_cpus, include_dashboard=False, log_to_driver=False, _system_config=LOCAL_RAY
                )
            except ConnectionError as exc:
                raise PosymError(f"cannot connect to the Ray cluster at {address}: {exc}") from None
        remote = ray.remote(num_cpus=config.cpus_per_trial, max_retries=0)(_ray_trial)
        limit = max_concurrent or len(todo)
        queue, running = list(todo), {}
        try:
            while queue or running:
                while queue and len(running) < limit:
                    t = queue.pop(0)
                    ref = remote.remote(
                        t, str(out / TRIALS / t["name"]), config.dynamics, config.n_prompts, config.cpus_per_trial
                    )
                    running[ref] = t
                ready, _ = ray.wait(list(running), num_returns=1)
                t = running.pop(ready[0])
                try:
                    row = ray.get(ready[0])
                except Exception as exc:  # noqa: BLE001 - a crashed worker fails this trial only
                    row = {k: t[k] for k in TRIAL_KEYS}
                    row.update(status="failed", error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
                rows[t["name"]] = row
                if row["status"] == "ok":
                    mark_done(out, t["name"], SWEEP_JOB, row.get("seconds", 0.0), row=row)
                if progress is not None:
                    progress(row)
        finally:
            if started:
                ray.shutdown()
    frame = pd.DataFrame([rows[t["name"]] for t in grid])
    # one column order whatever the rows' source (a done-file's JSON has sorted keys, a fresh row not)
    frame = frame[[*TRIAL_KEYS, *sorted(set(frame.columns) - set(TRIAL_KEYS))]]
    table = aggregate(frame)
    io.write_parquet(output_file(out, "sweep", "trials"), frame)
    io.write_parquet(output_file(out, "sweep", "aggregate"), table)
    figure = figure_file(out, "sweep", "aggregate")
    figures = [str(p) for p in save_figure(plot_aggregate(table), figure)] if len(table) else []
    failed = frame[frame.status != "ok"][["name", "error"]].to_dict("records")
    result = {
        **io.manifest(to_dict(config)),
        "config": to_dict(config),
        "trials": len(grid),
        "failed": failed,
        "figures": figures,
    }
    io.write_json(output_file(out, "sweep", "record"), result)
    return {**result, "table": table, "rows": frame}
