"""Discrepancy (Definition 3.1 of 2605) of the heads of trained and real models, by length.

Per input, a head's discrepancy at a query is the gap between its largest and second-largest
attention logit over the keys the query sees (the pre-softmax logits the model itself computes,
scale included). Theorem 3.2 says why positional heads stop generalizing: the best gap a purely
positional (RoPE Index) head can keep shrinks like 2 pi^2 / n^2 as the sequence grows, while a
symbolic (Retrieval) head's need not. This module measures that on any head the scores engine
supports, from one forward pass per batch (queries and keys from `posym.core.qk`, never
`output_attentions`: post-softmax weights underflow in trained models).

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

from posym.core.interop import scorable
from posym.core.qk import capture, check_layers, check_prompt, rotate
from posym.core.scores import query_batches
from posym.core.theory import gap_stats
from posym.errors import PosymError

GAP_COLUMNS = ("prompt", "query", "keys", "layer", "head", "gap", "top_key", "top_logit")


def head_gaps(model, input_ids, queries=None, *, layers: list[int] | None = None, batch_size: int = 64,
              progress=None):
    """Largest minus second-largest attention logit of every head at every query (float64 maths).

    input_ids: 1-D id sequences; queries: "last" (default), "all" or per prompt a list of positions
    (see `posym.core.scores.query_batches`). Returns a DataFrame with GAP_COLUMNS: keys = query + 1 (the
    keys it sees), top_key = the position of its largest logit, top_logit that logit.
    progress: optional callable(number of prompts just finished).
    """
    import pandas as pd

    model = scorable(model)  # nnsight / TransformerLens models too (posym.core.interop)
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
    """`posym.core.theory.gap_stats` of the gaps per group (default: per head and sequence length)."""
    import pandas as pd

    rows = [{**dict(zip(by, key if isinstance(key, tuple) else (key,))),
             **gap_stats(torch.tensor(group["gap"].to_numpy(), dtype=torch.float64))}
            for key, group in frame.groupby(list(by), sort=True)]
    return pd.DataFrame(rows)


