"""Learning dynamics of a run: head scores at every checkpoint, purity, composition (docs/method.md sections 3-4).

`collect_dynamics` scores every head of every checkpoint on one fixed prompt set (test split, seed
fixed, the same prompts at every step) with `posym.core.scores`, at these query positions (query_mode):
- "hops": every pointer token of the chain (the query and each intermediate hop), each seeing only
  the keys before it; a prompt's score is the mean over its hop queries;
- and by the pointer's role in the chain query -> p_1 -> ... -> p_{H-1} -> answer, three disjoint
  sets whose union is "hops": "last", the last token (the query) only; "target", the pointer into
  the target window p_{H-1} (chains of >= 2 hops; on 1-hop chains the query is that pointer and
  counts as "last"); "inner", the pointers p_1 .. p_{H-2} into the pre-target window (chains of
  >= 3 hops). A prompt's role score is the mean over its queries of that role; prompts without one
  are left out of that role's mean.
A head's score at a step is `posym.core.scores.head_scores`, the prompt-mean rule (a prompt's score
is the mean over its queries, the head's the mean over prompts; the paper: 100 prompts per
checkpoint; `posym ablate` labels heads by the same rule, so both agree on every head), joined
with that checkpoint's test accuracy (overall and per hop count) from the run's metrics.parquet and
its validation accuracy (`posym.commands.validate`). Beside the label of the mean,
pure_column(kind, gamma) (pure_positional_gamma_0p1, ...) are the fractions of prompts whose own
(prompt-mean) scores get that label under the same rule: a head whose mean is pure can still be
impure on some prompts, and one whose mean is mixed can be pure on each prompt of two kinds.

Purity rule (footnote 3 of 2605, made exact here). At threshold gamma a head's label at a step is
`posym.core.scores.head_labels` of its scores, in column `label_column(gamma)` (label_gamma_0p1):
positional if s_pos >= 1 - gamma and s_sym <= gamma, symbolic if s_sym >= 1 - gamma and s_pos <=
gamma (uniform if both >= 1 - gamma, mixed otherwise). The head's kind is its label at the LAST checkpoint when that is positional or
symbolic (else "none"), and `pure_from` is the first checkpoint step from which its label equals
that kind at every later checkpoint ("stays pure"; NaN for kind none). Cumulative purity counts
(Fig. 7): at each step, the heads of each kind whose pure_from <= step; `*_now` columns count the
heads with that label at that step alone. The max-accuracy step is the earliest checkpoint with the
highest validation accuracy (the authors' trainer keeps its best checkpoint by validation; choosing
it on the test split would select on the numbers reported). Entropy (of the last token's
attention, Fig. 6) is min-max normalised per head over the steps: (e - min) / (max - min), 0 when it never changes.
"""

from __future__ import annotations

import time
from pathlib import Path

from posym import figures
from posym.core.paper import GAMMAS
from posym.core.purity import (
    composition,
    label,
    max_accuracy_step,
    normalised_entropy,
    prompt_purity,
    purity,
    purity_counts,
    query_roles,
)
from posym.core.scores import head_scores, prompt_scores, score_model, task_prompts
from posym.errors import PosymError
from posym.io import manifest, read_parquet, write_json, write_parquet
from posym.models import load_checkpoint, validation_table
from posym.resources import check_count, sequence_bytes
from posym.runs import RunDir, figure_file, list_checkpoints, output_file

QUERY_MODES = ("hops", "last", "target", "inner")


def _score_checkpoint(model, ids, hops):
    """Per-prompt rows of one checkpoint for every query mode (one scoring pass over the hop queries:
    each role's rows are a subset of them)."""
    import pandas as pd

    frame = score_model(model, ids, hops)
    roles = query_roles(hops)
    frame["query_mode"] = [roles[key] for key in zip(frame["prompt"], frame["query"])]
    return pd.concat(
        [prompt_scores(frame).assign(query_mode="hops"), prompt_scores(frame, keys=("query_mode",))], ignore_index=True
    )


def collect_dynamics(run_dir, *, n_prompts: int = 100, seed: int = 0, progress=None):
    """(table, per_prompt) for every checkpoint of `run_dir`.

    table: one row per (step, query_mode, layer, head): prompt-mean s_pos, s_sym, entropy,
    entropy_norm, label_column(gamma) for GAMMAS, and the checkpoint's loss, acc, acc_hop1..H.
    per_prompt: step, query_mode, prompt, layer, head, s_pos, s_sym, entropy (hops: the prompt's
    mean over its hop queries). progress: optional callable(step) after each checkpoint.
    """
    import pandas as pd

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PosymError(f"{run_dir} is not a run directory")
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise PosymError(f"{run_dir} has no checkpoints/step-* directories (is it a posym run directory?)")
    if not RunDir(run_dir).metrics.is_file():
        raise PosymError(f"{run_dir} has no metrics.parquet (written by posym train at every checkpoint)")
    if n_prompts < 1:
        raise PosymError(f"--n-prompts must be at least 1, got {n_prompts}")
    metrics = read_parquet(RunDir(run_dir).metrics).drop_duplicates("step", keep="last").set_index("step")
    missing = [s for s, _ in checkpoints if s not in metrics.index]
    if missing:
        raise PosymError(f"{run_dir}/metrics.parquet has no row for checkpoint step {missing[0]}")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per checkpoint would drown ours
    parts, ids = [], None
    for step, path in checkpoints:
        model, info = load_checkpoint(path, dtype=None)
        if info["task_config"] is None:
            raise PosymError(f"{path} has no posym.json task config; dynamics needs posym training checkpoints")
        if ids is None:  # one prompt set for every checkpoint: the task config never changes within a run
            rows = len(checkpoints) * len(QUERY_MODES) * model.config.n_layer * model.config.n_head  # per prompt
            check_count("--n", n_prompts, sequence_bytes(info["task_config"]) + 80 * rows, what="prompt")
            ids, hops = task_prompts(info["task_config"], n_prompts, seed, queries="hops")
        parts.append(_score_checkpoint(model, ids, hops).assign(step=step))
        if progress is not None:
            progress(step)
    per_prompt = pd.concat(parts, ignore_index=True)[
        ["step", "query_mode", "prompt", "layer", "head", "s_pos", "s_sym", "entropy", "queries"]
    ]
    keys = ["step", "query_mode", "layer", "head"]
    table = head_scores(per_prompt, keys=("step", "query_mode")).drop(columns=["prompts", "rows"])
    per_prompt = per_prompt.drop(columns="queries")
    table["entropy_norm"] = normalised_entropy(table)
    table = label(table, GAMMAS).merge(prompt_purity(per_prompt, GAMMAS), on=keys, how="left")
    acc_columns = ["loss", "acc"] + [c for c in metrics.columns if c.startswith("acc_hop")]
    table = table.merge(metrics[acc_columns], left_on="step", right_index=True, how="left")
    validation = validation_table(run_dir)[["step", "val_acc"]]
    table = table.merge(validation, on="step", how="left")
    return table, per_prompt


def run_dynamics(run_dir, out_dir=None, *, n_prompts: int = 100, seed: int = 0, progress=None) -> dict:
    """`posym dynamics`: write dynamics.parquet, dynamics_prompts.parquet, purity.parquet,
    purity_counts.parquet, composition.parquet, composition_summary.parquet, dynamics.json and the
    figures fig2a_accuracy, fig2b_scores (hop queries), fig6_entropy (last token), fig7_purity,
    fig7_roles (scores and prompt purity per query role at the max-accuracy step) (PNG + SVG) to out_dir (default RUN_DIR/analysis). Returns the dynamics.json dict."""
    start = time.perf_counter()
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else RunDir(run_dir).output("analysis")
    table, per_prompt = collect_dynamics(run_dir, n_prompts=n_prompts, seed=seed, progress=progress)
    scored = time.perf_counter() - start
    pure = purity(table)
    counts = purity_counts(table, pure)
    best = max_accuracy_step(table)
    heads, summary = composition(table, best)
    for name, frame in [
        ("dynamics", table),
        ("dynamics_prompts", per_prompt),
        ("purity", pure),
        ("purity_counts", counts),
        ("composition", heads),
        ("composition_summary", summary),
    ]:
        write_parquet(output_file(out_dir, "dynamics", name), frame)
    paths = figures.save_figure(figures.plot_accuracy(table, best), figure_file(out_dir, "dynamics", "accuracy"))
    paths += figures.save_figure(
        figures.plot_layer_scores(table[table.query_mode == "hops"], best, title="scores at hop queries"),
        figure_file(out_dir, "dynamics", "scores"),
    )
    paths += figures.save_figure(
        figures.plot_layer_scores(
            table[table.query_mode == "last"], best, title="scores and normalised entropy at the last token"
        ),
        figure_file(out_dir, "dynamics", "entropy"),
    )
    paths += figures.save_figure(figures.plot_purity(counts, best), figure_file(out_dir, "dynamics", "purity"))
    paths += figures.save_figure(
        figures.plot_roles(heads[(heads.stage == "max_acc") & (heads.gamma == GAMMAS[0])], GAMMAS[0]),
        figure_file(out_dir, "dynamics", "roles"),
    )
    settings = {
        "run_dir": str(run_dir),
        "n_prompts": n_prompts,
        "seed": seed,
        "query_modes": list(QUERY_MODES),
        "gammas": list(GAMMAS),
    }
    result = {
        **manifest(settings, seed=seed),
        "settings": settings,
        "steps": sorted(int(s) for s in table.step.unique()),
        "max_acc_step": best,
        "max_acc": float(table[table.step == best].acc.iloc[0]),
        "max_acc_val": float(table[table.step == best].val_acc.iloc[0]),
        "max_acc_chosen_on": "val",
        "purity": pure.to_dict("records"),
        "composition": summary.to_dict("records"),
        "seconds_scoring": round(scored, 2),
        "seconds_total": round(time.perf_counter() - start, 2),
        "figures": [str(p) for p in paths],
    }
    write_json(output_file(out_dir, "dynamics", "record"), result)
    return result
