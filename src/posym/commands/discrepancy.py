"""`posym discrepancy`: the gaps of every head by sequence length, as files (Definition 3.1 of 2605).

The gaps themselves are `posym.core.discrepancy` (one forward pass per batch); this module loads
the model (`posym.models`: any model spec), lengthens a posym task with the `posym lengthgen` protocol or reads a
prompt file, and writes gaps.parquet, discrepancy.parquet, discrepancy.json and the figure.
"""

from __future__ import annotations

import dataclasses

from posym.core import lengthgen as core_lengthgen
from posym.core.discrepancy import head_gaps, summarize_gaps
from posym.errors import PosymError
from posym.figures import colormap, save_figure, spaced_tick_labels, subplots
from posym.io import manifest, write_json, write_parquet
from posym.models import load_analysable
from posym.prompts import score_prompts
from posym.resources import check_lengths
from posym.runs import figure_file, output_file


def plot_gaps(summary, *, title: str = ""):
    """Median gap (line) and Delta = minimum gap (dotted) vs sequence length per layer (its head 0),
    log-log, with a 1 / n^2 guide (Theorem 3.2's Index rate); PNG + SVG."""
    fig, ax = subplots(figsize=(7, 4.6))
    layers = sorted(summary.layer.unique())
    # a qualitative palette and a marker per layer: neighbouring layers stay apart (a sequential map does not)
    colors = colormap("tab10" if len(layers) <= 10 else "tab20")(range(len(layers)))
    markers = "osD^vP*Xhp<>"
    for k, (color, layer) in enumerate(zip(colors, layers)):
        sub = summary[(summary.layer == layer) & (summary["head"] == 0)].sort_values("length")
        ax.plot(
            sub["length"],
            sub["gap_q50"].clip(lower=1e-6),
            color=color,
            marker=markers[k % len(markers)],
            ms=4,
            lw=1.4,
            label=f"L{layer}",
        )
        ax.plot(sub["length"], sub["delta"].clip(lower=1e-6), color=color, ls=":", lw=1)
    lengths = sorted(summary["length"].unique())
    if len(lengths) > 1:
        top = float(summary["gap_q50"].max())
        ax.plot(lengths, [top * (lengths[0] / n) ** 2 for n in lengths], color="gray", ls="--", lw=1, label="~ 1 / n^2")
    ax.set_xscale("log")
    ax.set_xticks(lengths, spaced_tick_labels(lengths), minor=False)
    ax.minorticks_off()
    ax.set(
        yscale="log",
        xlabel="sequence length (tokens)",
        ylabel="top-1 minus top-2 logit",
        title=title or "discrepancy by length: median (solid), min (dotted)",
    )
    ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return fig


def run_discrepancy(
    path,
    out_dir=None,
    *,
    step: int | None = None,
    lengths=None,
    n: int = 64,
    seed: int = 0,
    prompts=None,
    queries: str | None = None,
    max_tokens: int = 16384,
    device: str = "cpu",
    progress=None,
) -> dict:
    """`posym discrepancy PATH`: gaps of every head, per length.

    A posym run or checkpoint: its task's test questions (the same `n` at every length), lengthened
    to each of `lengths` by extra target-window tokens (the paper protocol of `posym lengthgen`).
    Any other model (`posym.models`: smollm2-135m, GGUF, Hugging Face directory): the prompts of the
    JSONL file `prompts` as they are (token ids or text; their lengths are the lengths; queries None =
    the file's own "queries", else the last token). A forward pass reads at most `max_tokens` tokens (bounds the memory
    of a batch of long prompts). Writes
    gaps.parquet, discrepancy.parquet (summary), discrepancy.json and fig_discrepancy PNG + SVG to out_dir (default RUN_DIR/discrepancy); returns the JSON dict
    plus "summary" (the discrepancy.parquet frame) and "out_dir".
    """
    import pandas as pd

    if queries not in (None, "last", "hops", "all"):
        raise PosymError(f"--queries must be last, hops or all, got {queries!r}")
    # gaps come from queries and keys (posym.core.qk), never from attention weights: the fast kernel serves
    loaded, out_dir = load_analysable(
        path, step=step, device=device, out=out_dir, default="discrepancy", attn_implementation="sdpa"
    )
    model, task, step = loaded.model, loaded.info.get("task_config"), loaded.info.get("step")
    if prompts is not None:  # any model: the file's prompts at their own lengths
        if lengths:
            raise PosymError("--lengths lengthens a posym task; a prompt file's prompts keep their own lengths")
        ids, wanted = score_prompts(model, prompts_file=prompts, queries=queries, encode=loaded.text_ids)
        batch = core_lengthgen.batch_size(max(len(x) for x in ids), max_tokens)
        frame = head_gaps(model, ids, wanted, batch_size=batch, progress=progress)
        frame["length"] = frame["prompt"].map({k: len(x) for k, x in enumerate(ids)})
    elif task is None:
        raise PosymError("give --prompts: the model carries no posym task to lengthen")
    else:  # a posym model: the same n test questions, lengthened by extra target tokens
        lengths = sorted(set(lengths or core_lengthgen.LengthGenConfig().lengths))
        planned = dataclasses.replace(core_lengthgen.LengthGenConfig(), lengths=lengths, protocol="paper")
        # every length is checked before any pass
        check_lengths(task, planned, core_lengthgen.plan(task, planned, model.config.n_positions))
        parts = []
        for length in lengths:
            ids, wanted = score_prompts(
                model, task_config=core_lengthgen.extension(task, length), n_prompts=n, seed=seed, queries=queries
            )
            batch = core_lengthgen.batch_size(length, max_tokens)
            parts.append(head_gaps(model, ids, wanted, batch_size=batch, progress=progress).assign(length=length))
        frame = pd.concat(parts, ignore_index=True)
    summary = summarize_gaps(frame)
    write_parquet(output_file(out_dir, "discrepancy", "gaps"), frame)
    write_parquet(output_file(out_dir, "discrepancy", "discrepancy"), summary)
    paths = save_figure(plot_gaps(summary), figure_file(out_dir, "discrepancy", "gaps"))
    settings = {
        "model": str(path),
        "step": step,
        "prompts": str(prompts) if prompts else None,
        "queries": queries or "file/last",
        "lengths": sorted(int(v) for v in frame["length"].unique()),
        "n": n,
        "seed": seed,
    }
    result = {
        **manifest(settings, seed=seed),
        "settings": settings,
        "task": task.task if task else None,
        "median_gap": {
            f"L{int(r.layer)}H{int(r.head)}@{int(r.length)}": round(float(r.gap_q50), 6) for r in summary.itertuples()
        },
        "figures": [str(p) for p in paths],
    }
    write_json(output_file(out_dir, "discrepancy", "record"), result)
    return {**result, "summary": summary, "out_dir": out_dir}
