"""Figures of the dynamics and geometry analyses, and the package's one figure writer.

Every plot function of the package (here, and in llm, bench, theory, lengthgen, ...) returns a
`matplotlib.figure.Figure` and writes nothing: saving is the caller's choice, `save_figure(fig,
stem)` writes stem.png and stem.svg atomically (the commands use it). Figures are built with
`subplots` on a plain `Figure`, not through pyplot: nothing switches or even reads the user's
backend, a notebook shows the returned figure, and headless runs need no display. The plot
functions here take tables (the DataFrames `posym.commands.dynamics` / `posym.core.geometry`
write), so reports can rebuild any figure from the Parquet files alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from posym.io import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, **kwargs):
    """(figure, axes) like `matplotlib.pyplot.subplots`, on a `Figure` pyplot never sees (its
    canvas renders PNG and SVG headless; the global backend is left alone)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def colormap(name: str):
    """The matplotlib colormap `name` (from the registry; no pyplot)."""
    import matplotlib

    return matplotlib.colormaps[name]


def save_figure(fig, stem: str | os.PathLike, *, dpi: int = 120) -> list[Path]:
    """Write `fig` as stem.png and stem.svg atomically, both cropped to its tight bounding box, and
    return the paths. The box is what `bbox_inches="tight"` measures for the PNG, measured once for
    both files: per format, matplotlib would lay the figure out twice more (a third of the time of a
    report's figures). The PNG is byte-identical to savefig's own "tight"; the SVG's box can differ from
    the one its 72-dpi renderer would measure by a fraction of a point (tests/test_figures.py)."""
    box = tight_box(fig, dpi)
    paths = []
    for fmt in ("png", "svg"):
        path = Path(f"{stem}.{fmt}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches=box)
        paths.append(path)
    return paths


def tight_box(fig, dpi: int):
    """The bounding box (inches, padded by savefig.pad_inches) that `fig.savefig(..., dpi=dpi,
    bbox_inches="tight")` crops a PNG to: laid out once by the Agg renderer at that dpi, as savefig
    does, the figure's canvas and dpi left as they were."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas, old_dpi = fig.canvas, fig.dpi
    try:
        fig.dpi = dpi
        renderer = FigureCanvasAgg(fig).get_renderer()  # the canvas savefig's PNG uses (it sets itself on fig)
        with renderer._draw_disabled():  # savefig's own layout pass before it measures "tight"
            fig.draw(renderer)
        pad = matplotlib.rcParams["savefig.pad_inches"]
        return fig.get_tightbbox(renderer).padded(0.1 if pad in (None, "layout") else pad)
    finally:
        fig.set_canvas(canvas)
        fig.dpi = old_dpi


def spaced_tick_labels(values, *, min_ratio: float = 1.35) -> list[str]:
    """Labels for ticks at `values` (ascending) on a log axis, blank where a value is within
    `min_ratio` of the last labelled one (850 and 1024 would print as "8501024"); the axis end wins
    over its close neighbour."""
    kept: list[int] = []
    for k, value in enumerate(values):
        if not kept or value / values[kept[-1]] >= min_ratio:
            kept.append(k)
    kept[-1] = len(values) - 1
    return [str(int(v)) if k in kept else "" for k, v in enumerate(values)]


def plot_accuracy(table, max_step: int) -> Figure:
    """Fig. 2A: test accuracy overall and per hop count over steps, a vertical line at max accuracy."""
    acc = table.groupby("step").first().sort_index()
    fig, ax = subplots(figsize=(6.5, 3.6))
    ax.plot(acc.index, acc.acc, "k-", lw=2, label="all hops")
    for column in sorted(c for c in acc.columns if c.startswith("acc_hop")):
        ax.plot(acc.index, acc[column], "o-", ms=3, label=f"{column[7:]} hop{'s' if column[7:] != '1' else ''}")
    ax.axvline(max_step, color="grey", ls="--", label=f"max accuracy (step {max_step})")
    ax.set(xlabel="training step", ylabel="test accuracy", ylim=(-0.02, 1.02))
    ax.legend(fontsize=8)
    return fig


def plot_layer_scores(table, max_step: int, *, title: str = "") -> Figure:
    """Fig. 2B / 6: s_pos, s_sym and normalised entropy over steps, one panel per (layer, head)."""
    heads = list(table.groupby(["layer", "head"]))
    cols = min(4, len(heads))
    rows = -(-len(heads) // cols)
    fig, axes = subplots(rows, cols, figsize=(3.2 * cols, 2.2 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, ((layer, head), g) in zip(axes.flat, heads):
        g = g.sort_values("step")
        ax.plot(g.step, g.s_pos, "-", color="tab:blue", label="s_pos")
        ax.plot(g.step, g.s_sym, "-", color="tab:red", label="s_sym")
        ax.plot(g.step, g.entropy_norm, ":", color="k", label="entropy (min-max)")
        ax.axvline(max_step, color="grey", ls="--", lw=0.8)
        multi = table["head"].nunique() > 1
        ax.set_title(f"L{layer}" + (f" H{head}" if multi else ""), fontsize=9)
        ax.set_ylim(-0.05, 1.05)
    for ax in axes.flat[len(heads) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    # one legend under the panels: inside a panel it would hide the curves it explains
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def plot_purity(counts, max_step: int) -> Figure:
    """Fig. 7: cumulative counts of heads pure for good (positional, symbolic) over steps, per gamma,
    at hop queries (solid) and the last token (dotted)."""
    gammas = sorted(counts.gamma.unique(), reverse=True)
    fig, axes = subplots(1, len(gammas), figsize=(5 * len(gammas), 3.4), sharey=True, squeeze=False)
    for ax, gamma in zip(axes[0], gammas):
        for mode, style in (("hops", "-"), ("last", ":")):
            g = counts[(counts.gamma == gamma) & (counts.query_mode == mode)].sort_values("step")
            ax.plot(g.step, g.positional, style, color="tab:blue", label=f"positional ({mode})")
            ax.plot(g.step, g.symbolic, style, color="tab:red", label=f"symbolic ({mode})")
        ax.axvline(max_step, color="grey", ls="--", lw=0.8, label="max accuracy")
        ax.set(title=f"gamma = {gamma}", xlabel="step")
    axes[0, 0].set_ylabel("pure heads (cumulative)")
    axes[0, 0].legend(fontsize=7)
    return fig


ROLE_STYLES = {
    "hops": ("black", "all hops"),
    "last": ("tab:green", "last token"),
    "target": ("tab:purple", "pointer into target"),
    "inner": ("tab:brown", "inner pointers"),
}


def plot_roles(heads, gamma: float) -> Figure:
    """Fig. 7 by query role: per layer (heads averaged), s_pos, s_sym and the fraction of prompts on
    which the head is pure (positional solid, symbolic dashed) for the all-hops mean and each role;
    `heads` is one step's `posym.core.purity.composition` rows at one gamma."""
    fig, axes = subplots(1, 3, figsize=(14, 3.6), sharex=True)
    step = int(heads.step.iloc[0])
    for mode, (color, name) in ROLE_STYLES.items():
        g = (
            heads[heads.query_mode == mode]
            .groupby("layer")[["s_pos", "s_sym", "pure_positional", "pure_symbolic"]]
            .mean()
        )
        if g.empty:
            continue
        axes[0].plot(g.index, g.s_pos, "o-", color=color, label=name)
        axes[1].plot(g.index, g.s_sym, "o-", color=color, label=name)
        axes[2].plot(g.index, g.pure_positional, "o-", color=color, label=f"{name}, positional")
        axes[2].plot(g.index, g.pure_symbolic, "s--", color=color, label=f"{name}, symbolic")
    axes[0].set(title=f"positional score (step {step})", ylabel="s_pos", ylim=(-0.05, 1.05))
    axes[1].set(title="symbolic score", ylabel="s_sym", ylim=(-0.05, 1.05))
    axes[2].set(title=f"prompts on which the head is pure (gamma {gamma})", ylabel="fraction", ylim=(-0.05, 1.05))
    for ax in axes:
        ax.set_xlabel("layer")
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=6, ncol=2)
    return fig


def plot_frequency_use(channels, heads, *, paper=None, paper_planes: int = 64) -> Figure:
    """Fig. 8: use (mean max logit) of each rotary plane per layer as a heat map, and the weighted
    frequency ID per layer divided by the number of planes (so models of different widths share one
    axis) beside the paper's Table 1 (`paper`: one number per layer, out of `paper_planes`) and the
    uniform baseline (planes + 1) / 2 (every plane used alike). Where layers have different RoPE bases
    (Gemma 3's local and global layers), each layer's label carries its base: frequency ID k is a
    different theta on each kind."""
    import numpy as np

    rotary = channels[channels.frequency_id > 0]
    grid = rotary.groupby(["layer", "frequency_id"]).use.mean().unstack("frequency_id")  # [layers, planes]
    planes = grid.shape[1]
    fig, (left, right) = subplots(1, 2, figsize=(11, 0.35 * len(grid) + 2.5), width_ratios=[3, 1.4])
    image = left.imshow(
        grid.to_numpy().clip(min=0),
        aspect="auto",
        origin="lower",
        cmap="viridis",
        extent=(0.5, planes + 0.5, -0.5, len(grid) - 0.5),
    )
    fig.colorbar(image, ax=left, label="use (mean max logit, clipped at 0)")
    bases = rotary.groupby("layer").apply(
        lambda g: (
            g.frequency[g.frequency_id == 2].iloc[0] ** -g.frequency_id.max() if (g.frequency_id == 2).any() else np.nan
        ),
        include_groups=False,
    )
    mixed = bases.round(-1).nunique() > 1  # local and global RoPE bases (Gemma 3): label each layer's
    left.set(
        xlabel="frequency ID (1 = fastest)",
        ylabel="layer (RoPE base)" if mixed else "layer",
        title="frequency use per layer",
        yticks=range(len(grid)),
        yticklabels=[f"{layer} ({bases[layer]:.0e})" if mixed else str(layer) for layer in grid.index],
    )
    per_layer = heads.groupby("layer").weighted_id.mean()
    right.plot(per_layer.to_numpy() / planes, per_layer.index, "o-", label=f"ours ({planes} planes)")
    if paper is not None:
        right.plot(
            np.asarray(paper) / paper_planes,
            np.arange(len(paper)),
            "x--",
            color="grey",
            label=f"paper Table 1 ({paper_planes} planes)",
        )
    right.axvline((planes + 1) / 2 / planes, color="k", lw=0.8, ls=":", label="uniform use, (planes + 1) / 2")
    right.set(xlabel="weighted frequency ID / planes", ylabel="layer", xlim=(0, 1))
    right.yaxis.get_major_locator().set_params(integer=True)
    right.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return fig


def _thinned_labels(ax, points, texts, *, spread: float, fontsize: int = 7) -> None:
    """Label points, skipping any within `spread` (data units) of one already labelled: clustered
    points (a positional head's keys) get one label instead of a pile."""
    import numpy as np

    placed: list = []
    for (x, y), text in zip(points, texts):
        if all(np.hypot(x - px, y - py) >= spread for px, py in placed):
            ax.annotate(text, (x, y), fontsize=fontsize, alpha=0.8, xytext=(3, 3), textcoords="offset points")
            placed.append((x, y))


def plot_qk_plane(projection, *, token_names=None) -> Figure:
    """Fig. 4B: one prompt's queries and keys on one RoPE plane, before rotation (what the q/k
    projections write) and after RoPE rotated each by its own position (what the dot product sees),
    labelled token@position where labels do not overlap."""
    import numpy as np

    fig, axes = subplots(1, 2, figsize=(10, 5))
    for ax, (x, y, when) in zip(axes, (("x", "y", "before rotation"), ("x_rot", "y_rot", "after rotation"))):
        extent = float(np.abs(projection[[x, y]].to_numpy()).max()) or 1.0
        for role, marker, color, name in (("key", "s", "tab:orange", "keys"), ("query", "o", "tab:blue", "queries")):
            g = projection[projection.role == role]
            ax.scatter(g[x], g[y], marker=marker, color=color, label=name, alpha=0.8)
            texts = [f"{token_names[t] if token_names is not None else t}@{p}" for t, p in zip(g.token, g.position)]
            _thinned_labels(ax, zip(g[x], g[y]), texts, spread=0.12 * extent)
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_aspect("equal", adjustable="datalim")
        ax.set(title=when, xlabel="plane coordinate 1", ylabel="plane coordinate 2")
    axes[0].legend(fontsize=8)
    first = projection.iloc[0]
    fig.suptitle(f"layer {first.layer} head {first['head']}, RoPE plane ID {first.frequency_id}")
    return fig


def plot_heads(heads, r: float):
    """Layer x head heatmaps of s_pos and s_sym, and the positional-symbolic plane (one dot per head)."""
    import numpy as np

    n_layers, n_heads = int(heads.layer.max()) + 1, int(heads["head"].max()) + 1
    fig, axes = subplots(1, 3, figsize=(14, 4.2), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    for ax, key in zip(axes, ("s_pos", "s_sym")):
        grid = np.full((n_layers, n_heads), np.nan)  # [layers, heads]
        grid[heads.layer.to_numpy(), heads["head"].to_numpy()] = heads[key].to_numpy()
        image = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", vmin=0, vmax=1)
        ax.set(xlabel="head", ylabel="layer", title=key)
        fig.colorbar(image, ax=ax)
    dots = axes[2].scatter(heads.s_pos, heads.s_sym, c=heads.layer, cmap="plasma", s=14)
    axes[2].plot([0, 1], [1, 0], ":", color="grey")
    axes[2].set(
        xlabel="s_pos", ylabel="s_sym", title=f"heads (Pearson r = {r:.2f})", xlim=(-0.05, 1.05), ylim=(-0.05, 1.05)
    )
    fig.colorbar(dots, ax=axes[2], label="layer")
    return fig
