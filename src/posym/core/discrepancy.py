"""Discrepancy (Definition 3.1 of 2605) of the heads of trained and real models, by length.

Per input, a head's discrepancy at a query is the gap between its largest and second-largest
attention logit over the keys the query sees (the pre-softmax logits the model itself computes,
scale included). Theorem 3.2 says why positional heads stop generalizing: the best gap a purely
positional (RoPE Index) head can keep shrinks like 2 pi^2 / n^2 as the sequence grows, while a
symbolic (Retrieval) head's need not. This module measures that on any head the scores engine
supports, from one forward pass per batch (the clean logits of the swapped-logit engine
`posym.core.swaps`, never `output_attentions`: post-softmax weights underflow in trained models).

Statistics per (layer, head, sequence length), as `posym.core.theory.gap_stats` for the constructions: `delta` =
the minimum gap over inputs (the worst-case margin, the quantity Theorem 3.2 bounds; see
`posym.core.theory`), `gap_max`, `gap_mean` and the 5 / 50 / 95 % quantiles. On trained heads the median
is the telling curve: one unlucky input sets the minimum.

- `head_gaps(model, input_ids, queries)`: one row per (prompt, query, layer, head): gap, top_key.
- `summarize_gaps(frame)`: the statistics per (layer, head, sequence length).
`posym discrepancy` (a posym run at several lengths, or any model on a prompt file, written as
Parquet, JSON and a figure) is `posym.commands.discrepancy`.
"""

from __future__ import annotations

import torch

from posym.core.swaps import clean_logits, scan
from posym.core.theory import gap_stats

GAP_COLUMNS = ("prompt", "query", "keys", "layer", "head", "gap", "top_key", "top_logit")


def head_gaps(model, input_ids, queries=None, *, layers: list[int] | None = None, batch_size: int = 64, progress=None):
    """Largest minus second-largest attention logit of every head at every query (float64 maths).

    input_ids: 1-D id sequences; queries: "last" (default), "all" or per prompt a list of positions
    (see `posym.core.swaps.query_batches`). Returns a DataFrame with GAP_COLUMNS: keys = the keys the
    query sees (query + 1, or the layer's sliding window: the gaps are over those keys only), top_key =
    the position of its largest logit, top_logit that logit.
    progress: optional callable(number of prompts just finished).
    """
    import pandas as pd

    def layer_gaps(layer, qk, jobs):
        found = []
        heads = list(range(qk.q.shape[1]))
        for p, rows in jobs.items():
            first = qk.first_key(p)  # keys first .. p are the ones query p sees
            logits = clean_logits(qk, torch.tensor(rows), heads, p)  # [G, H, n]
            top = logits.topk(2, dim=-1)  # values, indices [G, H, 2]
            gap = (top.values[..., 0] - top.values[..., 1]).tolist()  # [G][H]
            key, best = (top.indices[..., 0] + first).tolist(), top.values[..., 0].tolist()
            found += [
                (row, p, p - first + 1, layer, h, gap[g][h], key[g][h], best[g][h])
                for g, row in enumerate(rows)
                for h in heads
            ]
        return found

    records = []
    for batch, results in scan(
        model, input_ids, queries, layer_gaps, layers=layers, batch_size=batch_size, progress=progress
    ):
        records += [
            {
                "prompt": batch[row],
                "query": p,
                "keys": keys,
                "layer": layer,
                "head": h,
                "gap": gap,
                "top_key": key,
                "top_logit": best,
            }
            for found in results
            for row, p, keys, layer, h, gap, key, best in found
        ]
    frame = pd.DataFrame.from_records(records, columns=list(GAP_COLUMNS))
    return frame.sort_values(["prompt", "query", "layer", "head"], ignore_index=True)


def summarize_gaps(frame, by=("layer", "head", "length")):
    """`posym.core.theory.gap_stats` of the gaps per group (default: per head and sequence length)."""
    import pandas as pd

    rows = [
        {
            **dict(zip(by, key if isinstance(key, tuple) else (key,))),
            **gap_stats(torch.tensor(group["gap"].to_numpy(), dtype=torch.float64)),
        }
        for key, group in frame.groupby(list(by), sort=True)
    ]
    return pd.DataFrame(rows)
