"""`posym lengthgen`: accuracy of a trained run against sequence length (Fig. 5B; docs/method.md section 6), and
head-level retention.

The protocols (paper and seed), how a sequence is lengthened, the batching and the head-level retention
are `posym.core.lengthgen`'s (its docstring says what is measured); this module loads the run, checks
that the longest length fits in memory, and writes lengthgen.parquet, lengthgen.json, fig5b.png/svg
and, with head retention, head_retention.parquet, head_groups.parquet and head_retention.png/svg.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from posym.configs import to_dict
from posym.core.interventions import label_heads
from posym.core.lengthgen import (
    ALL_HOPS,
    HEAD_GAMMA,
    LABEL_PROMPTS,
    LengthGenConfig,
    head_lengths,
    head_tables,
    measure,
    measure_heads,
    plan,
    protocol_table,
    summarize_head_retention,
    summarize_protocols,
)
from posym.core.retention import RANDOM
from posym.core.tasks import TaskConfig, generate
from posym.errors import PosymError
from posym.figures import colormap, save_figure, spaced_tick_labels, subplots
from posym.io import manifest, write_json, write_parquet
from posym.models import load_checkpoint
from posym.resources import check_lengths
from posym.runs import figure_file, output_file

# ---- evaluation and outputs -------------------------------------------------------------------------


def plot(table, task: TaskConfig, *, title: str = ""):
    """Fig. 5B: accuracy vs length per hop (log x, the discrepancy bound on the right axis) and, for
    the seed protocol, retention vs length factor per hop. PNG + SVG; returns the paths."""
    protocols = [p for p in ("paper", "seed") if (table["protocol"] == p).any()]
    fig, axes = subplots(1, len(protocols), figsize=(5.5 * len(protocols), 4), squeeze=False)
    hops = [ALL_HOPS, *range(1, task.max_hops + 1)]
    colors = colormap("viridis")([0.15 + 0.7 * i / max(1, task.max_hops - 1) for i in range(task.max_hops)])
    for ax, protocol in zip(axes[0], protocols):
        twin_lines = []  # the bound's line on the right axis joins the left axis' legend
        sub = table[table["protocol"] == protocol]
        x_col, y_col = ("length", "acc") if protocol == "paper" else ("factor", "retention")
        for hop in hops:
            rows = sub[sub["hop"] == hop].sort_values(x_col)
            style = (
                dict(color="black", lw=2.2, label="all hops")
                if hop == ALL_HOPS
                else dict(color=colors[hop - 1], lw=1.2, label=f"{hop} hop{'s' if hop > 1 else ''}")
            )
            ax.plot(rows[x_col], rows[y_col], marker="o", ms=3, **style)
        ax.set_ylim(-0.02, 1.05 if protocol == "paper" else max(1.1, float(sub["retention"].max()) + 0.05))
        if protocol == "paper":
            ax.set_xscale("log")
            ax.axvline(task.seq_len, color="gray", ls=":", lw=1, label=f"training length {task.seq_len}")
            ax.set(
                xlabel="sequence length (tokens)", ylabel="accuracy", title="paper protocol: extra target-window tokens"
            )
            bound = sub[sub["hop"] == ALL_HOPS].sort_values("length")
            if bound["bound"].notna().any():
                twin = ax.twinx()
                head = "T_Index" if task.task == "number" else "T_Retrieval"
                twin.plot(
                    bound["length"],
                    bound["bound"],
                    color="tab:red",
                    ls="--",
                    lw=1,
                    label=f"{head} discrepancy bound (Thm 3.2)",
                )
                twin.set(yscale="log", ylabel="discrepancy bound")
                twin_lines = twin.get_lines()
        else:
            factors = sorted(sub["factor"].unique())
            ax.set_xlim(min(factors) - 0.3, max(factors) + 0.3)
            for level, text in [(0.8, "expected: symbolic >= 0.8"), (0.3, "expected: positional ~0.3")]:
                ax.axhline(level, color="gray", ls=":", lw=1)
                ax.text(min(factors) - 0.25, level + 0.01, text, fontsize=7, color="gray")
            ax.set(
                xlabel=f"length / training length ({task.seq_len} tokens)",
                ylabel="retention: acc / acc at training length",
                title="multiples of the training length (protocol seed)",
            )
            ax.set_xticks(factors, [f"{f:g}x" for f in factors])
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles + twin_lines, labels + [line.get_label() for line in twin_lines], loc="best", fontsize=7)
    fig.suptitle(title or f"{task.task} task: length generalization", fontsize=10)
    fig.tight_layout()
    return fig


# ---- head-level retention (issue 33) ----------------------------------------------------------------


MEASURE_TITLES = {"margin": "margin (top-1 minus top-2 logit)", "attn_tracked": "attention on the chain key"}


def plot_head_retention(groups, task: TaskConfig, *, title: str = ""):
    """Retention vs length per group of heads (margin and attention panels, log x): each label a solid
    line with its 95% bootstrap band, its layer-matched random draws dashed with theirs. Returns the Figure."""
    panels = list(MEASURE_TITLES)  # the toy tasks fix the tracked key; they have no answer-bearing fact key
    fig, axes = subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    colors = {"positional": "tab:red", "symbolic": "tab:blue", "mixed": "tab:purple"}
    for ax, kind in zip(axes[0], panels):
        sub = groups[groups["measure"] == kind]
        for name in dict.fromkeys(sub["group"]):
            rows = sub[sub["group"] == name].sort_values("length")
            random = name.startswith(f"{RANDOM}:")
            label = name.split(":", 1)[1] if random else name
            color = colors.get(label, "gray")
            text = (
                f"random, matched to {label} ({int(rows['draws'].iloc[0])} draws)"
                if random
                else f"{name} ({int(rows['heads'].iloc[0])} head{'s' * (int(rows['heads'].iloc[0]) != 1)})"
            )
            ax.plot(
                rows["length"],
                rows["value"],
                color=color,
                ls="--" if random else "-",
                lw=1 if random else 1.8,
                marker="" if random else "o",
                ms=3,
                label=text,
            )
            ax.fill_between(rows["length"], rows["lo"], rows["hi"], color=color, alpha=0.08 if random else 0.2, lw=0)
        ax.axhline(1.0, color="gray", ls=":", lw=1)
        ax.axvline(task.seq_len, color="gray", ls=":", lw=1)
        ax.set_xscale("log")
        lengths = sorted(sub["length"].unique()) if len(sub) else [task.seq_len]
        ax.set_xticks(lengths, spaced_tick_labels(lengths), minor=False)
        ax.minorticks_off()
        ax.set(
            xlabel="sequence length (tokens)",
            ylabel=f"retention: value / value at {task.seq_len} tokens",
            title=MEASURE_TITLES[kind],
        )
        if len(sub):
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(
                0.5,
                0.5,
                "no positional, symbolic or mixed head",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=8,
                color="gray",
            )
    fig.suptitle(
        title or f"{task.task} task: head-level retention (median over heads, 95% bootstrap over prompts)", fontsize=10
    )
    fig.tight_layout()
    return fig


def run_lengthgen(
    run_dir,
    config: LengthGenConfig,
    out_dir,
    *,
    step: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Evaluate a run's checkpoint at every planned length; write lengthgen.parquet, lengthgen.json
    and fig5b.png/svg into `out_dir`, and with `config.heads` the head-level retention:
    head_retention.parquet, head_groups.parquet and head_retention.png/svg. `progress(done_tokens,
    total_tokens)` follows the work. Returns what lengthgen.json holds plus the table (a DataFrame) under
    "table" (and with `config.heads` "head_table", "group_table")."""
    import numpy as np

    model, info = load_checkpoint(run_dir, step=step, device=config.device, attn_implementation="sdpa")
    task = info["task_config"]
    if task is None:
        raise PosymError(f"{info['path']} has no posym.json with its task config; lengthgen needs a posym run")
    points = plan(task, config, model.config.n_positions)
    check_lengths(task, config, points)
    lengths = sorted({length for _, length, _ in points})
    heads_at = head_lengths(task, lengths) if config.heads else []
    total, done = config.n * sum(lengths) + config.head_prompts * sum(heads_at), 0

    def advance(tokens: int) -> None:
        nonlocal done
        done += tokens
        if progress:
            progress(done, total)

    measured = measure(model, task, lengths, config, advance)
    hops = generate(task, config.n, config.seed, config.split).hops  # the same at every length
    counts = {
        ALL_HOPS: config.n,
        **{h: int(c) for h, c in enumerate(np.bincount(hops, minlength=task.max_hops + 1)) if h},
    }
    table = protocol_table(measured, task, points, counts, config)
    table.insert(0, "step", info["step"])
    out_dir = Path(out_dir)
    write_parquet(output_file(out_dir, "lengthgen", "lengthgen"), table)
    figure = plot(table, task, title=f"{task.task} task, step {info['step']}")
    figures = [str(path) for path in save_figure(figure, figure_file(out_dir, "lengthgen", "lengthgen"), dpi=150)]
    extra = {}
    if config.heads:
        labels = label_heads(model, task, n_prompts=LABEL_PROMPTS, seed=config.seed, gamma=HEAD_GAMMA)
        measures = measure_heads(model, task, heads_at, config, advance)
        per_head, groups, notes = head_tables(measures, labels, task, seed=config.seed)
        per_head.insert(0, "step", info["step"])
        write_parquet(output_file(out_dir, "lengthgen", "head_retention"), per_head)
        write_parquet(output_file(out_dir, "lengthgen", "head_groups"), groups)
        figures += [
            str(path)
            for path in save_figure(
                plot_head_retention(
                    groups,
                    task,
                    title=f"{task.task} task, step {info['step']}: head-level retention (median over heads, "
                    f"95% bootstrap over {config.head_prompts} prompts)",
                ),
                figure_file(out_dir, "lengthgen", "head_retention"),
                dpi=150,
            )
        ]
        extra = {"head_table": per_head, "group_table": groups}
    result = {
        "summary": summarize_protocols(table, task),
        "checkpoint": str(info["path"]),
        "step": info["step"],
        "queries": "last (the answer token)"
        + ("; head retention: hops (every pointer of the chain)" if config.heads else ""),
        "figures": figures,
        "config": to_dict(config),
        "manifest": manifest(to_dict(config), seed=config.seed, task=to_dict(task)),
    }
    if config.heads:
        result["head_retention"] = summarize_head_retention(per_head, groups, notes, task, config)
    write_json(output_file(out_dir, "lengthgen", "record"), result)
    return {**result, "table": table, **extra}
