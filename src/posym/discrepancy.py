"""Discrepancy (Definition 3.1 of 2605) of the heads of trained and real models, by length.

Per input, a head's discrepancy at a query is the gap between its largest and second-largest
attention logit over the keys the query sees (the pre-softmax logits the model itself computes,
scale included). Theorem 3.2 says why positional heads stop generalizing: the best gap a purely
positional (RoPE Index) head can keep shrinks like 2 pi^2 / n^2 as the sequence grows, while a
symbolic (Retrieval) head's need not. This module measures that on any head the scores engine
supports, from one forward pass per batch (queries and keys from `posym.qk`, never
`output_attentions`: post-softmax weights underflow in trained models).

Statistics per (layer, head, sequence length), as `posym.theory.gap_stats` for the constructions: `delta` =
the minimum gap over inputs (the worst-case margin, the quantity Theorem 3.2 bounds; see
`posym.theory`), `gap_max`, `gap_mean` and the 5 / 50 / 95 % quantiles. On trained heads the median
is the telling curve: one unlucky input sets the minimum.

- `head_gaps(model, input_ids, queries)`: one row per (prompt, query, layer, head): gap, top_key.
- `summarize_gaps(frame)`: the statistics per (layer, head, sequence length).
- `run_discrepancy(path, out_dir, ...)`: `posym discrepancy` (a posym run at several lengths via the
  paper protocol's extra target tokens, or any model on a prompt file): Parquet, JSON, figure.
"""

from __future__ import annotations

import torch

from posym.errors import PosymError
from posym.interop import scorable
from posym.qk import capture, check_layers, check_prompt, rotate
from posym.scores import query_batches
from posym.theory import gap_stats

GAP_COLUMNS = ("prompt", "query", "keys", "layer", "head", "gap", "top_key", "top_logit")


def head_gaps(model, input_ids, queries=None, *, layers: list[int] | None = None, batch_size: int = 64,
              progress=None):
    """Largest minus second-largest attention logit of every head at every query (float64 maths).

    input_ids: 1-D id sequences; queries: "last" (default), "all" or per prompt a list of positions
    (see `posym.scores.query_batches`). Returns a DataFrame with GAP_COLUMNS: keys = query + 1 (the
    keys it sees), top_key = the position of its largest logit, top_logit that logit.
    progress: optional callable(number of prompts just finished).
    """
    import pandas as pd

    model = scorable(model)  # nnsight / TransformerLens models too (posym.interop)
    layers = check_layers(model, layers)
    prompts = [check_prompt(model, ids, f"prompt {k}") for k, ids in enumerate(input_ids)]
    if not prompts:
        raise PosymError("no prompts to measure")
    records: list[dict] = []
    was_training = model.training
    model.eval()
    try:
        for batch, jobs in query_batches(prompts, queries, batch_size):

            def on_layer(layer, qk):
                heads = qk.q.shape[1]
                for p, rows in jobs.items():
                    b = torch.tensor(rows, device=qk.q.device)
                    cos, sin = qk.cos[b, : p + 1].double(), qk.sin[b, : p + 1].double()  # [G, n, r]
                    q = rotate(qk.q[b, :, p].double(), cos[:, None, p], sin[:, None, p], qk.pairing)  # [G, H, d]
                    k = rotate(qk.k[b, :, : p + 1].double(), cos[:, None], sin[:, None], qk.pairing)  # [G, H, n, d]
                    logits = qk.cap(qk.scale * (k @ q[..., None])[..., 0])  # [G, H, n]
                    top = logits.topk(2, dim=-1)  # values, indices [G, H, 2]
                    gap = (top.values[..., 0] - top.values[..., 1]).tolist()  # [G][H]
                    key, best = top.indices[..., 0].tolist(), top.values[..., 0].tolist()
                    for g, row in enumerate(rows):
                        for h in range(heads):
                            records.append({"prompt": batch[row], "query": p, "keys": p + 1, "layer": layer,
                                            "head": h, "gap": gap[g][h], "top_key": key[g][h],
                                            "top_logit": best[g][h]})

            capture(model, torch.stack([prompts[k] for k in batch]).to(model.device), layers, on_layer)
            if progress is not None:
                progress(len(batch))
    finally:
        model.train(was_training)
    frame = pd.DataFrame.from_records(records, columns=list(GAP_COLUMNS))
    return frame.sort_values(["prompt", "query", "layer", "head"], ignore_index=True)


def summarize_gaps(frame, by=("layer", "head", "length")):
    """`posym.theory.gap_stats` of the gaps per group (default: per head and sequence length)."""
    import pandas as pd

    rows = [{**dict(zip(by, key if isinstance(key, tuple) else (key,))),
             **gap_stats(torch.tensor(group["gap"].to_numpy(), dtype=torch.float64))}
            for key, group in frame.groupby(list(by), sort=True)]
    return pd.DataFrame(rows)


def plot_gaps(summary, path_stem, *, title: str = "") -> list:
    """Median gap (line) and Delta = minimum gap (dotted) vs sequence length per layer (its head 0),
    log-log, with a 1 / n^2 guide (Theorem 3.2's Index rate); PNG + SVG."""
    from posym.figures import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    layers = sorted(summary.layer.unique())
    colors = plt.get_cmap("viridis")([0.1 + 0.8 * i / max(1, len(layers) - 1) for i in range(len(layers))])
    for color, layer in zip(colors, layers):
        sub = summary[(summary.layer == layer) & (summary["head"] == 0)].sort_values("length")
        ax.plot(sub["length"], sub["gap_q50"].clip(lower=1e-6), color=color, marker="o", ms=3, lw=1.3,
                label=f"L{layer}")
        ax.plot(sub["length"], sub["delta"].clip(lower=1e-6), color=color, ls=":", lw=1)
    lengths = sorted(summary["length"].unique())
    if len(lengths) > 1:
        top = float(summary["gap_q50"].max())
        ax.plot(lengths, [top * (lengths[0] / n) ** 2 for n in lengths], color="gray", ls="--", lw=1,
                label="~ 1 / n^2")
    ax.set_xscale("log")
    ax.set_xticks(lengths, [str(int(v)) for v in lengths], minor=False)
    ax.minorticks_off()
    ax.set(yscale="log", xlabel="sequence length (tokens)",
           ylabel="top-1 minus top-2 logit", title=title or "discrepancy by length: median (solid), min (dotted)")
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path_stem)


def run_discrepancy(path, out_dir=None, *, step: int | None = None, lengths=None, n: int = 64, seed: int = 0,
                    prompts=None, queries: str | None = None, max_tokens: int = 16384, device: str = "cpu",
                    progress=None) -> dict:
    """`posym discrepancy PATH`: gaps of every head, per length.

    A posym run or checkpoint: its task's test questions (the same `n` at every length), lengthened
    to each of `lengths` by extra target-window tokens (the paper protocol of `posym lengthgen`).
    Any other model (`posym.sources`: smollm2-135m, GGUF, Hugging Face directory): the prompts of the
    JSONL file `prompts` as they are (token ids or text; their lengths are the lengths; queries None =
    the file's own "queries", else the last token). A forward pass reads at most `max_tokens` tokens (the eager attention
    HF model directories load with holds a [batch, heads, n, n] matrix per layer). Writes
    gaps.parquet, discrepancy.parquet (summary), discrepancy.json and fig_discrepancy PNG + SVG to out_dir (default RUN_DIR/discrepancy); returns the JSON dict
    plus "summary" (the discrepancy.parquet frame) and "out_dir".
    """
    import dataclasses

    import pandas as pd

    from posym import geometry, lengthgen
    from posym.io import manifest, write_json, write_parquet
    from posym.scores import prompt_set

    if queries not in (None, "last", "hops", "all"):
        raise PosymError(f"--queries must be last, hops or all, got {queries!r}")
    # gaps come from queries and keys (posym.qk), never from attention weights: the fast kernel serves
    loaded, out = geometry.load_analysable(path, step=step, device=device, out=out_dir, attn_implementation="sdpa")
    model, task, step = loaded.model, loaded.info.get("task_config"), loaded.info.get("step")
    out_dir = out.parent / "discrepancy" if out_dir is None else out  # a run's default: RUN_DIR/discrepancy
    if prompts is not None:  # any model: the file's prompts at their own lengths
        if lengths:
            raise PosymError("--lengths lengthens a posym task; a prompt file's prompts keep their own lengths")
        ids, wanted = prompt_set(model, prompts_file=prompts, queries=queries, encode=loaded.text_ids)
        batch = lengthgen.batch_size(max(len(x) for x in ids), max_tokens)
        frame = head_gaps(model, ids, wanted, batch_size=batch, progress=progress)
        frame["length"] = frame["prompt"].map({k: len(x) for k, x in enumerate(ids)})
    elif task is None:
        raise PosymError("give --prompts: the model carries no posym task to lengthen")
    else:  # a posym model: the same n test questions, lengthened by extra target tokens
        lengths = sorted(set(lengths or lengthgen.LengthGenConfig().lengths))
        lengthgen.plan(task, dataclasses.replace(lengthgen.LengthGenConfig(), lengths=lengths, protocol="paper"),
                       model.config.n_positions)  # every length is checked before any pass
        parts = []
        for length in lengths:
            ids, wanted = prompt_set(model, task_config=lengthgen.extension(task, length), n_prompts=n, seed=seed,
                                     queries=queries)
            batch = lengthgen.batch_size(length, max_tokens)
            parts.append(head_gaps(model, ids, wanted, batch_size=batch, progress=progress).assign(length=length))
        frame = pd.concat(parts, ignore_index=True)
    summary = summarize_gaps(frame)
    write_parquet(out_dir / "gaps.parquet", frame)
    write_parquet(out_dir / "discrepancy.parquet", summary)
    paths = plot_gaps(summary, out_dir / "fig_discrepancy")
    settings = {"model": str(path), "step": step, "prompts": str(prompts) if prompts else None,
                "queries": queries or "file/last",
                "lengths": sorted(int(v) for v in frame["length"].unique()), "n": n, "seed": seed}
    result = {**manifest(settings, seed=seed), "settings": settings, "task": task.task if task else None,
              "median_gap": {f"L{int(r.layer)}H{int(r.head)}@{int(r.length)}": round(float(r.gap_q50), 6)
                             for r in summary.itertuples()},
              "figures": [str(p) for p in paths]}
    write_json(out_dir / "discrepancy.json", result)
    return {**result, "summary": summary, "out_dir": out_dir}
