"""The paper-scale study's figures over seeds, drawn from the committed tables alone.

Reads docs/results/paper/*.parquet (scripts/collect_paper_results.py) and writes, as PNG + SVG, one
figure per claim that docs/results.md's scoreboard states over seeds: each seed drawn thin, the mean
over seeds thick, the paper's value where it gives one. The per-run figures of `posym report`
(docs/figures/paper/) show one seed in full detail; these show how far the seeds agree.

- fig2a_seeds: test accuracy per hop count over training (paper preset, both tasks).
- fig7_seeds: s_pos and s_sym per layer at the last step, hop queries and each query role (gamma 0.1).
- table1_seeds: the weighted frequency ID per layer under every weighting, beside the paper's Table 1.
- fig5b_seeds: accuracy by prompt length (paper protocol), last and best-by-validation checkpoints.

    python scripts/paper_figures.py [--dir docs/results/paper] [--out docs/results/paper/figures]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import pandas as pd  # noqa: E402
from posym.core import paper  # noqa: E402
from posym.core.geometry import WEIGHTINGS  # noqa: E402
from posym.figures import colormap, save_figure, spaced_tick_labels, subplots  # noqa: E402

TASKS = ("number", "letter")
ROLES = ("hops", "inner", "last", "target")
GAMMA = paper.GAMMA


def seed_lines(ax, wide: pd.DataFrame, color, label: str) -> None:
    """Each column of `wide` ([x, seed]) thin, their mean thick and labelled."""
    for seed in wide.columns:
        ax.plot(wide.index, wide[seed], color=color, lw=0.7, alpha=0.45)
    ax.plot(wide.index, wide.mean(axis=1), color=color, lw=2, label=label)


def _seeds_title(frame: pd.DataFrame, task: str) -> str:
    seeds = sorted(frame.seed.unique())
    return f"{task} (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})"


def accuracy_figure(training: pd.DataFrame):
    fig, axes = subplots(1, 2, figsize=(11, 3.6), sharey=True)
    colors = colormap("viridis")
    for ax, task in zip(axes, TASKS):
        runs = training[(training.preset == "paper") & (training.task == task)]
        for hop in range(1, 5):
            seed_lines(
                ax,
                runs.pivot_table(index="step", columns="seed", values=f"acc_hop{hop}"),
                colors((hop - 1) / 3.5),
                f"{hop} hop{'s' if hop > 1 else ''}",
            )
        ax.axhline(0.95, color="grey", ls=":", lw=1)
        ax.set(title=_seeds_title(runs, task), xlabel="training step", ylim=(-0.02, 1.02))
    axes[0].set_ylabel("test accuracy (mean thick, seeds thin)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Fig. 2A over seeds: the number model learns hop by hop, the letter model all at once", y=1.02)
    return fig


def roles_figure(composition: pd.DataFrame):
    fig, axes = subplots(2, len(ROLES), figsize=(14, 6.4), sharex=True, sharey=True)
    for row, task in enumerate(TASKS):
        runs = composition[
            (composition.preset == "paper")
            & (composition.task == task)
            & (composition.stage == "end")
            & (composition.gamma == GAMMA)
        ]
        for ax, role in zip(axes[row], ROLES):
            heads = runs[runs.query_mode == role]
            for score, color in (("s_pos", "tab:blue"), ("s_sym", "tab:orange")):
                seed_lines(ax, heads.pivot_table(index="layer", columns="seed", values=score), color, score)
            for kind, color in (("positional", "tab:blue"), ("symbolic", "tab:orange")):
                for layer in paper.FIG7_LABELS[GAMMA][task][kind]:  # the paper's Fig. 7 labels, shaded behind ours
                    ax.axvspan(layer - 0.5, layer + 0.5, color=color, alpha=0.08, lw=0)
            ax.axhline(GAMMA, color="grey", ls=":", lw=1)
            ax.set(
                title=f"{task}, {role} queries" if role != "hops" else _seeds_title(runs, task) + ", hop queries",
                ylim=(-0.03, 1.03),
                xticks=range(0, int(runs.layer.max()) + 1),
            )
        axes[row, 0].set_ylabel("score at the last step")
    for ax in axes[-1]:
        ax.set_xlabel("layer")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(
        f"Fig. 7 over seeds: pure positional when s_sym <= {GAMMA}, pure symbolic when s_pos <= {GAMMA} "
        "(dotted); shading: the paper's labels"
    )
    return fig


def frequency_figure(geometry: pd.DataFrame):
    fig, axes = subplots(1, 2, figsize=(11, 3.8), sharey=True)
    colors = colormap("tab10")
    for ax, task in zip(axes, TASKS):
        runs = geometry[(geometry.preset == "paper") & (geometry.task == task)]
        for k, weighting in enumerate(WEIGHTINGS):
            seed_lines(
                ax,
                runs.pivot_table(index="layer", columns="seed", values=f"weighted_id_{weighting}"),
                colors(k),
                weighting,
            )
        ax.plot(range(len(paper.TABLE1[task])), paper.TABLE1[task], "ks--", ms=4, label="paper (Table 1)")
        ax.axhline(runs.uniform_id.iloc[0], color="grey", ls=":", lw=1, label="uniform use")
        ax.set(title=_seeds_title(runs, task), xlabel="layer", xticks=range(len(paper.TABLE1[task])))
    axes[0].set_ylabel("weighted frequency ID")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle("Table 1 over seeds: every weighting beside the paper's row", y=1.02)
    return fig


PAPER_CURVE = "paper (Fig. 5B, read point by point)"
"""The label of the paper's Fig. 5B curve (posym.core.paper.FIG5B) in figures and tables."""


def fig5b_axis(ax, task: str, lengths):
    """A Fig. 5B panel's axis: prompt lengths on a log axis ticked at `lengths` and the paper's, and the
    paper's curve of `task` drawn dashed (labelled PAPER_CURVE); returns that line."""
    curve = paper.FIG5B[task]
    ticks = sorted({int(n) for n in lengths} | set(curve))
    ax.set_xscale("log")
    ax.set_xticks(ticks, spaced_tick_labels(ticks))
    ax.minorticks_off()
    (line,) = ax.plot(list(curve), list(curve.values()), "ks--", ms=4, label=PAPER_CURVE)
    return line


def length_figure(lengthgen: pd.DataFrame):
    fig, axes = subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, task in zip(axes, TASKS):
        runs = lengthgen[
            (lengthgen.preset == "paper")
            & (lengthgen.protocol == "paper")
            & (lengthgen.task == task)
            & (lengthgen.hop == 0)
        ]
        for checkpoint, color in (("last", "tab:blue"), ("best", "tab:green")):
            chosen = runs[runs.checkpoint == checkpoint]
            seed_lines(
                ax, chosen.pivot_table(index="length", columns="seed", values="acc"), color, f"{checkpoint} checkpoint"
            )
        fig5b_axis(ax, task, runs.length.unique())
        ax.axhline(0.9, color="grey", ls=":", lw=1)
        ax.set(title=_seeds_title(runs, task), xlabel="prompt length (tokens, log)", ylim=(-0.02, 1.02))
    axes[0].set_ylabel("accuracy, all hops (0.9 dotted)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Fig. 5B over seeds beside the paper's curve (dashed)", y=1.02)
    return fig


FIGURES = {
    "fig2a_seeds": ("training", accuracy_figure),
    "fig7_seeds": ("composition", roles_figure),
    "table1_seeds": ("geometry", frequency_figure),
    "fig5b_seeds": ("lengthgen", length_figure),
}
"""Figure stem -> (the committed table it reads, the function drawing it)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=ROOT / "docs" / "results" / "paper")
    parser.add_argument("--out", type=Path, help="where the figures go (default: DIR/figures)")
    args = parser.parse_args()
    out = args.out or args.dir / "figures"
    out.mkdir(parents=True, exist_ok=True)
    for stem, (name, draw) in FIGURES.items():
        for path in save_figure(draw(pd.read_parquet(args.dir / f"{name}.parquet")), out / stem):
            print(path)


if __name__ == "__main__":
    main()
