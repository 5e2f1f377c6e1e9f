"""Issue 28's training variants of the paper preset, defined once, and Fig. 5B over them beside the paper.

Each variant is a preset plus config overrides (and, for a longer learning-rate horizon, the step at
which it is compared); `scripts/paper_seeds.sh` trains and analyses RUNS/<variant>-s<seed>/<task> for
the variants named in PRESETS, `scripts/collect_paper_results.py RUNS --presets ... --out
docs/results/paper-variants` collects them, and this script prints the Fig. 5B table of docs/results.md
(between `<!-- fig5b-variants:begin -->` and `<!-- fig5b-variants:end -->`; `--write FILE` rewrites it):
per task, the paper's curve (posym.core.paper.FIG5B), the default preset's three seeds and each variant,
mean ± std (ddof 1) over the seeds present with the 95% t interval of the mean in brackets, at the last and the
best-by-validation checkpoint, and Welch's test of every variant of two or more seeds against the default.

    python scripts/paper_variants.py table [--write docs/results.md]
    python scripts/paper_variants.py figure             # the same curves drawn: paper-variants/figures/fig5b_variants
    python scripts/paper_variants.py overrides NAME     # the variant's YAML overrides (for paper_seeds.sh)
    python scripts/paper_variants.py preset NAME        # the preset it starts from
    python scripts/paper_variants.py final NAME         # the step it is compared at (0: the schedule's end)
    python scripts/paper_variants.py tasks NAME         # the tasks it is trained on
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import yaml  # noqa: E402

from posym.core import paper  # noqa: E402

BEGIN, END = "<!-- fig5b-variants:begin -->", "<!-- fig5b-variants:end -->"


@dataclass(frozen=True)
class Variant:
    """One training variant of the paper-scale study."""

    preset: str
    """The posym preset it starts from."""
    what: str
    """What it changes, in words (the table's row label)."""
    overrides: dict = field(default_factory=dict)
    """Config overrides on top of the preset (the YAML of `posym train --config`)."""
    final_step: int = 0
    """The step it is trained to and compared at; 0 = the schedule's last step (max_steps)."""
    tasks: tuple[str, ...] = ("number", "letter")
    """The tasks it is trained on."""


VARIANTS = {
    "paper": Variant("paper", "default paper preset"),
    "authors": Variant("authors", "embedding dropout 0 (the authors' effective setting)"),
    "horizon": Variant("paper", "lr horizon 22,500 steps, compared at step 6,000", {"max_steps": 22500}, 6000),
    "batch64": Variant("paper", "batch 64 (one device of the authors' three)", {"batch_size": 64}),
    "authors64": Variant(
        "authors", "embedding dropout 0 and batch 64 (the authors' settings on one device)", {"batch_size": 64}
    ),
    "noid1": Variant(
        "paper",
        "plane ID 1 not rotated (the number cliff's fast plane)",
        {"model": {"rope_bands": [[2, 64]]}},
        tasks=("number",),
    ),
}
"""Variant name -> its definition; `paper` is the committed default study (docs/results/paper/)."""
LENGTHS = tuple(paper.FIG5B["letter"])
"""The lengths of Fig. 5B's table (those the paper's curve is read at)."""
MIN_GAP = 0.05
"""Where the default preset's mean is within this of the paper's curve, no share of the gap is computed
(a share of a gap inside the curve's reading error, +- 0.01, and the seeds' spread means nothing)."""


def curve_rows(lengthgen, task: str, label: str) -> list[list[str]]:
    """One row per checkpoint (last, best): accuracy mean ± std over seeds [95% t interval] at each of LENGTHS."""
    from paper_tables import spread_ci  # pandas: imported only for tables (paper_seeds.sh asks the variants often)

    rows = []
    for checkpoint in ("last", "best"):
        chosen = paper_runs(lengthgen, task, checkpoint)
        if chosen.empty:
            continue
        cells = [spread_ci(chosen[chosen.length == length].acc, 2) for length in LENGTHS]
        rows.append([label, checkpoint, str(chosen.seed.nunique()), *cells])
    return rows


def paper_runs(lengthgen, task: str, checkpoint: str):
    """The paper-protocol, all-hops rows of one task at one checkpoint (last or best)."""
    keep = (lengthgen.protocol == "paper") & (lengthgen.hop == 0) & (lengthgen.task == task)
    return lengthgen[keep & (lengthgen.checkpoint == checkpoint)]


def gap_closed(default, variant, task: str, checkpoint: str, length: int) -> float | None:
    """The share of the gap between the default preset and the paper's curve that a variant closes at one
    length: (variant - default) / (paper - default), on means over each one's seeds; 1 = the paper's
    value reached, 0 = no change, negative = further from it. None where the default is within MIN_GAP
    of the paper or either side has no run.

    >>> import pandas as pd
    >>> rows = lambda accs: pd.DataFrame({"protocol": "paper", "hop": 0, "task": "number", "checkpoint": "last",
    ...                                   "length": 128, "seed": range(len(accs)), "acc": accs})
    >>> round(gap_closed(rows([0.2, 0.22]), rows([0.47]), "number", "last", 128), 3)  # paper: 0.73
    0.5
    """
    means = [paper_runs(frame, task, checkpoint) for frame in (default, variant)]
    means = [runs[runs.length == length].acc.mean() for runs in means]
    gap = paper.FIG5B[task][length] - means[0]
    if any(math.isnan(mean) for mean in means) or abs(gap) < MIN_GAP:  # NaN: no run at that length
        return None
    return float((means[1] - means[0]) / gap)


def gap_rows(default, variants, task: str) -> list[list[str]]:
    """Per variant present and checkpoint, the share of the gap closed at each of LENGTHS ('-': none)."""
    rows = []
    for name in VARIANTS if variants is not None else ():
        if name == "paper":  # the default itself: no gap of its own to close
            continue
        chosen = variants[variants.preset == name]
        for checkpoint in ("last", "best"):
            runs = paper_runs(chosen, task, checkpoint)
            if runs.empty:
                continue
            shares = [gap_closed(default, runs, task, checkpoint, length) for length in LENGTHS]
            rows.append(
                [name, checkpoint, str(runs.seed.nunique()), *("-" if s is None else f"{s:+.2f}" for s in shares)]
            )
    return rows


def welch_rows(default, variants, task: str) -> list[list[str]]:
    """Per variant of two or more seeds and checkpoint: at each of LENGTHS the difference of the seeds' means
    to the default's same checkpoint and Welch's two-sided p over seeds ('-' where either side has < 2 seeds).

    >>> import pandas as pd
    >>> rows = lambda name, accs: pd.DataFrame({"preset": name, "protocol": "paper", "hop": 0, "task": "letter",
    ...     "checkpoint": "last", "length": 850, "seed": range(len(accs)), "acc": accs})
    >>> welch_rows(rows("paper", [0.60, 0.62, 0.64]), rows("horizon", [0.70, 0.72, 0.74]), "letter")[0][:4]
    ['horizon', 'last', '3', '-']
    """
    from posym.core.stats import welch_test

    rows = []
    for name in VARIANTS if variants is not None else ():
        if name == "paper":
            continue
        for checkpoint in ("last", "best"):
            runs = paper_runs(variants[variants.preset == name], task, checkpoint)
            base = paper_runs(default, task, checkpoint)
            if runs.seed.nunique() < 2 or base.seed.nunique() < 2:
                continue
            cells = []
            for length in LENGTHS:
                a, b = runs[runs.length == length].acc, base[base.length == length].acc
                t, _, p = welch_test(a, b)
                cells.append(
                    "-"
                    if math.isnan(p)
                    else f"{a.mean() - b.mean():+.2f} (p {p:.3f})"
                    if p >= 0.001
                    else f"{a.mean() - b.mean():+.2f} (p < 0.001)"
                )
            rows.append([name, checkpoint, str(runs.seed.nunique()), *cells])
    return rows


def variants_table(default, variants) -> str:
    """The Markdown block (DataFrames of lengthgen rows in; `variants` may be None): per task the paper's
    curve, the default preset and every variant present."""
    from paper_figures import PAPER_CURVE, TASKS
    from paper_tables import table

    parts = []
    for task in TASKS:
        rows = [[PAPER_CURVE, "-", "1", *(f"{paper.FIG5B[task][n]:.2f}" for n in LENGTHS)]]
        rows += curve_rows(default[default.preset == "paper"], task, VARIANTS["paper"].what)
        for name, variant in VARIANTS.items():
            if name != "paper" and variants is not None:
                rows += curve_rows(variants[variants.preset == name], task, f"{name}: {variant.what}")
        header = ["model", "checkpoint", "seeds", *(f"{n:,}" for n in LENGTHS)]
        parts.append(
            f"Fig. 5B, {task} model (accuracy, all hops, 480 questions per length and seed; mean ± "
            f"std (ddof 1) over seeds [95% t interval of the mean]):\n\n" + table(header, rows)
        )
        welch = welch_rows(default[default.preset == "paper"], variants, task)
        if welch:
            parts.append(
                f"Each {task} variant of two or more seeds against the default preset's seeds, same checkpoint: "
                f"difference of the means and Welch's two-sided p over seeds (unequal variances; no correction "
                f"for the {len(LENGTHS)} lengths):\n\n"
                + table(["variant", "checkpoint", "seeds", *(f"{n:,}" for n in LENGTHS)], welch)
            )
        gaps = gap_rows(default[default.preset == "paper"], variants, task)
        if gaps:
            parts.append(
                f"Share of the {task} model's gap to the paper closed, (variant − default) / (paper − default) "
                f"on the seeds' means, each checkpoint against the default's same checkpoint (1: the paper's "
                f"value, 0: no change, negative: further away; '-' where the default is within {MIN_GAP} of "
                f"the paper):\n\n" + table(["variant", "checkpoint", "seeds", *(f"{n:,}" for n in LENGTHS)], gaps)
            )
    missing = []  # per variant, the tasks it is trained on that have no collected run yet
    for name, variant in VARIANTS.items():
        have = set() if variants is None else set(variants[variants.preset == name].task)
        lacking = [task for task in variant.tasks if task not in have]
        if name != "paper" and lacking:
            which = "" if len(lacking) == len(variant.tasks) else f", its {' and '.join(lacking)} model"
            missing.append(f"`{name}` ({variant.what}){which}")
    if missing:
        parts.append("Not trained yet: " + ", ".join(missing) + ".")
    return "\n\n".join(parts)


FIGURE = "fig5b_variants"
"""The figure's file stem under the variants directory's figures/ (PNG + SVG)."""


def variants_figure(default, variants):
    """Fig. 5B per task (columns) at the last and the best-by-validation checkpoint (rows): the paper's
    curve dashed, the default preset and each variant present, each seed thin and the mean over seeds
    thick (one seed: its line alone, with dots). Lengths on a log axis; the same runs as `variants_table`.
    One legend for the figure: each model once, with its seeds per task."""
    from paper_figures import PAPER_CURVE, TASKS, fig5b_axis, seed_lines

    from posym.figures import colormap, subplots

    frames = [("default paper preset", default[default.preset == "paper"])]
    frames += [
        (name, variants[variants.preset == name]) for name in VARIANTS if name != "paper" and variants is not None
    ]
    colors = colormap("tab10")
    fig, axes = subplots(2, 2, figsize=(11, 7), sharey=True, squeeze=False)
    handles: dict[str, object] = {}
    for row, checkpoint in enumerate(("last", "best")):
        for ax, task in zip(axes[row], TASKS):
            lengths: set[int] = set()
            for i, (name, frame) in enumerate(frames):
                runs = paper_runs(frame, task, checkpoint)
                if runs.empty:
                    continue
                wide = runs.pivot_table(index="length", columns="seed", values="acc")  # [length, seed]
                lengths |= set(wide.index)
                if len(wide.columns) > 1:
                    seed_lines(ax, wide, colors(i), name)
                else:
                    ax.plot(wide.index, wide.iloc[:, 0], color=colors(i), lw=1.4, marker=".", label=name)
                handles.setdefault(name, ax.lines[-1])
            handles.setdefault(PAPER_CURVE, fig5b_axis(ax, task, lengths))
            ax.set(title=f"{task}, {checkpoint} checkpoint", ylim=(-0.02, 1.02))
            if row == 1:
                ax.set_xlabel("prompt length (tokens, log)")
        axes[row][0].set_ylabel("accuracy, all hops")

    def seeds(frame) -> str:
        per_task = [f"{task} {paper_runs(frame, task, 'last').seed.nunique()}" for task in TASKS]
        return ", ".join(part for part in per_task if not part.endswith(" 0"))

    labels = [f"{name} (seeds: {seeds(frame)})" for name, frame in frames if name in handles]
    labels.append(PAPER_CURVE)
    fig.legend(
        [handles[name] for name, _ in frames if name in handles] + [handles[PAPER_CURVE]],
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(
        "Fig. 5B: the default preset and each training variant beside the paper's curve (dashed); "
        "thin lines single seeds, thick their mean",
        y=1.0,
    )
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["table", "figure", "overrides", "preset", "final", "tasks"])
    parser.add_argument("name", nargs="?", help="a variant (for overrides, preset, final, tasks)")
    parser.add_argument("--default", type=Path, default=ROOT / "docs" / "results" / "paper")
    parser.add_argument("--variants", type=Path, default=ROOT / "docs" / "results" / "paper-variants")
    parser.add_argument("--write", type=Path, help="rewrite the Fig. 5B variants block of this Markdown file")
    args = parser.parse_args()
    if args.what not in ("table", "figure"):
        if args.name not in VARIANTS:
            sys.exit(f"unknown variant {args.name!r}; choose one of {', '.join(VARIANTS)}")
        variant = VARIANTS[args.name]
        print(
            {
                "overrides": lambda: (
                    yaml.safe_dump(variant.overrides, default_flow_style=True).strip() if variant.overrides else ""
                ),
                "preset": lambda: variant.preset,
                "final": lambda: variant.final_step,
                "tasks": lambda: " ".join(variant.tasks),
            }[args.what]()
        )
        return
    import pandas as pd

    variants_path = args.variants / "lengthgen.parquet"
    default = pd.read_parquet(args.default / "lengthgen.parquet")
    variants = pd.read_parquet(variants_path) if variants_path.is_file() else None
    if args.what == "figure":
        from posym.figures import save_figure

        for path in save_figure(variants_figure(default, variants), args.variants / "figures" / FIGURE):
            print(path)
        return
    block = variants_table(default, variants)
    if args.write:
        from paper_scoreboard import replace_block

        args.write.write_text(replace_block(args.write.read_text(), block, BEGIN, END))
    else:
        print(block)


if __name__ == "__main__":
    main()
