"""Head-level length generalization: does a head keep doing at length L what it did at the base length?

The paper's thesis (arXiv 2605.31558, Sec. 5 and Theorem 3.2) is about heads, not models: a purely
positional head's best margin shrinks like 2 pi^2 / n^2 as the input grows, a symbolic head's need not.
This module measures it head by head on prompt families whose answer is fixed while the length grows
(the toy tasks' extra target window, `posym.commands.lengthgen`; the real-model length families,
`posym.prompts`). Per (prompt, query, layer, head) and length, from the logits the model itself
computes over the keys the query sees (`posym.core.swaps.clean_logits`, float64, never post-softmax
weights read back from the model):

- margin        = top-1 minus top-2 logit (the discrepancy of Definition 3.1, `posym.core.discrepancy`);
- attn_tracked  = the softmax weight the query gives to its TRACKED key: the key the same head attended
                  most at the base length (moved to where that token sits in the longer prompt), or a key
                  the task fixes (the chain's next position for a hop pointer);
- and per head: retention = (mean over prompts at L) / (mean over prompts at the base length), for both.

Groups of heads (positional, symbolic, mixed, layer-matched random draws) are summarised by the
median over their heads of the head retentions; 95% intervals come from the paired prompt bootstrap
(`posym.core.stats`): the same resampled prompts at every length and for every head.

>>> import pandas as pd
>>> rows = pd.DataFrame({"prompt": [0, 1, 0, 1], "query": 5, "layer": 0, "head": 0,
...                      "length": [8, 8, 16, 16], "margin": [2.0, 4.0, 1.0, 2.0], "attn_tracked": 0.5})
>>> head_retention(rows, base_length=8)[["length", "margin", "margin_retention"]].to_dict("records")
[{'length': 8, 'margin': 3.0, 'margin_retention': 1.0}, {'length': 16, 'margin': 1.5, 'margin_retention': 0.5}]
"""

from __future__ import annotations

import random

import numpy as np
import torch

from posym.core.stats import N_BOOT, bootstrap_weights, percentile_interval
from posym.core.interop import scorable
from posym.core.qk import check_layers
from posym.core.swaps import clean_logits, scan
from posym.errors import PosymError

MEASURE_COLUMNS = (
    "prompt",
    "query",
    "keys",
    "layer",
    "head",
    "margin",
    "top_key",
    "attn_top",
    "tracked_key",
    "attn_tracked",
)
MEASURES = ("margin", "attn_tracked")
"""The per-head quantities whose retention is reported."""
RANDOM = "random"
"""Group name prefix of layer-matched random draws (`matched_random`)."""


def head_measures(
    model,
    input_ids,
    queries=None,
    *,
    tracked=None,
    layers: list[int] | None = None,
    batch_size: int = 16,
    progress=None,
):
    """Margin, top key and attention on a tracked key of every head at every query (float64 maths).

    input_ids: 1-D id sequences; queries: "last" (default), "all" or per prompt a list of positions
    (`posym.core.swaps.query_batches`). tracked: None, or callable(prompt, query) -> None, an int
    (one key position for every head) or an integer array [n_layers_of_model, heads] of key positions
    per head (-1 = none); a tracked key the query does not see (outside its window, after it) gives
    attn_tracked NaN. Returns a DataFrame with MEASURE_COLUMNS (keys = the number of keys the query sees).
    """
    import pandas as pd

    def layer_work(layer, qk, jobs):
        found = []
        heads = list(range(qk.q.shape[1]))
        for p, rows in jobs.items():
            first = qk.first_key(p)
            logits = clean_logits(qk, torch.tensor(rows), heads, p)  # [G, H, n] over keys first..p
            margin, top, attn_top, probs = row_measures(logits)
            found.append((p, rows, first, logits.shape[-1], margin, top + first, attn_top, probs))
        return found

    layers = check_layers(scorable(model), layers)
    records = []
    for batch, results in scan(
        model, input_ids, queries, layer_work, layers=layers, batch_size=batch_size, progress=progress
    ):
        for layer, found in zip(layers, results):
            for p, rows, first, n, margin, top_key, attn_top, probs in found:
                for g, row in enumerate(rows):
                    prompt = batch[row]
                    keys = _tracked_keys(tracked, prompt, p, layer, probs.shape[1])  # [H] absolute, -1 none
                    for h in range(probs.shape[1]):
                        key = int(keys[h])
                        seen = first <= key <= p
                        records.append(
                            (
                                prompt,
                                p,
                                n,
                                layer,
                                h,
                                float(margin[g, h]),
                                int(top_key[g, h]),
                                float(attn_top[g, h]),
                                key,
                                float(probs[g, h, key - first]) if seen else float("nan"),
                            )
                        )
    frame = pd.DataFrame.from_records(records, columns=list(MEASURE_COLUMNS))
    return frame.sort_values(["prompt", "query", "layer", "head"], ignore_index=True)


def row_measures(logits):
    """(margin, top index, softmax weight of the top key, softmax weights) of attention rows
    logits [..., n]: margin = top-1 minus top-2 logit (0 when two keys tie), all [...] but the weights."""
    probs = torch.softmax(logits, dim=-1)  # [..., n]
    top = logits.topk(2, dim=-1)  # values, indices [..., 2]
    margin = top.values[..., 0] - top.values[..., 1]  # [...]
    best = top.indices[..., 0]  # [...]
    return margin, best, probs.gather(-1, best[..., None])[..., 0], probs


def _tracked_keys(tracked, prompt: int, query: int, layer: int, heads: int) -> np.ndarray:
    """The tracked key of each head of `layer` for (prompt, query), -1 where none."""
    if tracked is None:
        return np.full(heads, -1)
    keys = tracked(prompt, query)
    if keys is None:
        return np.full(heads, -1)
    if np.isscalar(keys):
        return np.full(heads, int(keys))
    return np.asarray(keys)[layer]


def base_tracking(base, position_map):
    """`tracked` callable for `head_measures` at a longer length: each head's top key at the base length,
    moved to where that token sits in the longer prompt.

    base: `head_measures` rows of the base-length prompts; position_map(prompt, base_position) -> the
    position of that token in the longer prompt (None: it is not there). A base query moves by the same
    map, so the longer prompt's queries must be the mapped base queries."""
    n_layers = int(base.layer.max()) + 1
    n_heads = int(base["head"].max()) + 1
    table: dict[tuple[int, int], np.ndarray] = {}
    for (prompt, query), group in base.groupby(["prompt", "query"], sort=False):
        keys = np.full((n_layers, n_heads), -1)
        for layer, head, key in zip(group.layer, group["head"], group.top_key):
            moved = position_map(int(prompt), int(key))
            keys[int(layer), int(head)] = -1 if moved is None else int(moved)
        table[(int(prompt), int(position_map(int(prompt), int(query))))] = keys
    return lambda prompt, query: table.get((prompt, query))


# ---- tables ---------------------------------------------------------------------------------------


def prompt_means(measures, value: str):
    """Array [prompts, heads, lengths] of `value` averaged over each prompt's queries, with the axes'
    labels: (values, prompts, heads as (layer, head) pairs, lengths). NaN where a prompt lacks a head."""
    import pandas as pd

    table = measures.groupby(["prompt", "layer", "head", "length"])[value].mean().unstack("length")
    prompts = sorted(measures.prompt.unique().tolist())
    heads = sorted({(int(a), int(b)) for a, b in zip(measures.layer, measures["head"])})
    lengths = sorted(measures.length.unique().tolist())
    full = table.reindex(
        index=pd.MultiIndex.from_tuples(
            [(p, a, b) for p in prompts for a, b in heads], names=["prompt", "layer", "head"]
        ),
        columns=lengths,
    )
    return full.to_numpy(dtype=np.float64).reshape(len(prompts), len(heads), len(lengths)), prompts, heads, lengths


def head_retention(measures, *, base_length: int):
    """Per (layer, head, length): the prompt means of every measure present, their retentions
    (mean at L / mean at base_length) and the prompt count. measures: `head_measures` rows with a
    `length` column (every prompt index measured at every length, the same questions)."""
    import pandas as pd

    present = [m for m in MEASURES if m in measures]
    frames = []
    for value in present:
        values, _, heads, lengths = prompt_means(measures, value)
        if base_length not in lengths:
            raise PosymError(f"the base length {base_length} was not measured (lengths: {lengths})")
        with np.errstate(all="ignore"):
            mean = np.nanmean(values, axis=0)  # [heads, lengths]
        base = mean[:, lengths.index(base_length)][:, None]
        with np.errstate(all="ignore"):
            ret = np.where(base != 0, mean / base, np.nan)
        frames.append(
            pd.DataFrame(
                {
                    "layer": [h[0] for h in heads for _ in lengths],
                    "head": [h[1] for h in heads for _ in lengths],
                    "length": lengths * len(heads),
                    value: mean.ravel(),
                    f"{value}_retention": ret.ravel(),
                }
            )
        )
    out = frames[0]
    for frame in frames[1:]:
        out = out.merge(frame, on=["layer", "head", "length"])
    counts = measures.groupby("length").prompt.nunique().rename("prompts").reset_index()
    return out.merge(counts, on="length").sort_values(["layer", "head", "length"], ignore_index=True)


def matched_random(all_heads, group, draws: int, seed: int = 0) -> list[list[tuple[int, int]]]:
    """`draws` random head sets matched to `group` layer by layer: each head (l, h) of the group is
    replaced by a head of layer l outside the group (without repeats within a draw); where layer l has
    no such head left (a one-head-per-layer toy model), by a head of the nearest layer that has one.

    >>> heads = [(l, h) for l in range(2) for h in range(3)]
    >>> draws = matched_random(heads, [(0, 0), (1, 2)], 2, seed=1)
    >>> [sorted(l for l, _ in d) for d in draws], all((0, 0) not in d and (1, 2) not in d for d in draws)
    ([[0, 1], [0, 1]], True)
    """
    group = {tuple(h) for h in group}
    pool: dict[int, list[tuple[int, int]]] = {}
    for layer, head in sorted({tuple(h) for h in all_heads} - group):
        pool.setdefault(layer, []).append((layer, head))
    if len(pool) == 0 or sum(map(len, pool.values())) < len(group):
        raise PosymError(
            f"cannot draw {len(group)} random heads outside a group of {len(group)} "
            f"from {len(set(map(tuple, all_heads)))} heads"
        )
    rng = random.Random(seed)
    out = []
    for _ in range(draws):
        left = {layer: list(heads) for layer, heads in pool.items()}
        chosen = []
        for layer, _ in sorted(group):
            near = min((l for l in left if left[l]), key=lambda l: (abs(l - layer), l))
            pick = left[near].pop(rng.randrange(len(left[near])))
            chosen.append(pick)
        out.append(sorted(chosen))
    return out


def group_retention(
    measures, groups: dict[str, list[tuple[int, int]]], *, base_length: int, n_boot: int = N_BOOT, seed: int = 0
):
    """Retention per group of heads and length, with paired-bootstrap 95% intervals over prompts.

    groups: name -> heads; names starting with RANDOM followed by ':' and a draw index (e.g.
    'random:symbolic:3') are pooled per prefix ('random:symbolic'): the value is the mean over draws of
    each draw's median head retention, in every bootstrap sample. Returns rows (group, measure, length,
    value, lo, hi, heads, draws, prompts): value = median over the group's heads of (mean at L / mean at
    base) on all prompts; lo, hi = the 2.5 / 97.5 percentiles of the same statistic over bootstrap samples.
    """
    import pandas as pd

    rows = []
    for value in [m for m in MEASURES if m in measures]:
        values, prompts, heads, lengths = prompt_means(measures, value)
        if base_length not in lengths:
            raise PosymError(f"the base length {base_length} was not measured (lengths: {lengths})")
        index = {h: i for i, h in enumerate(heads)}
        weights = bootstrap_weights(len(prompts), n_boot, seed)  # [B, P]
        flat = np.nan_to_num(values.reshape(len(prompts), -1))  # [P, heads * lengths]
        seen = (~np.isnan(values)).reshape(len(prompts), -1).astype(np.float64)
        with np.errstate(all="ignore"):
            boot = (weights @ flat) / (weights @ seen)  # [B, heads * lengths]: bootstrap means
            full = flat.sum(0) / seen.sum(0)  # [heads * lengths]
        boot = boot.reshape(n_boot, len(heads), len(lengths))
        full = full.reshape(len(heads), len(lengths))
        b = lengths.index(base_length)
        with np.errstate(all="ignore"):
            boot_ret = boot / boot[:, :, b : b + 1]  # [B, heads, lengths]
            full_ret = full / full[:, b : b + 1]  # [heads, lengths]
        pooled: dict[str, list[str]] = {}
        for name in groups:
            pooled.setdefault(_pool_name(name), []).append(name)
        for name, members in pooled.items():
            stats_full, stats_boot, sizes = [], [], []
            for member in members:
                idx = [index[tuple(h)] for h in groups[member] if tuple(h) in index]
                if not idx:
                    continue
                sizes.append(len(idx))
                with np.errstate(all="ignore"):
                    stats_full.append(np.nanmedian(full_ret[idx], axis=0))  # [lengths]
                    stats_boot.append(np.nanmedian(boot_ret[:, idx], axis=1))  # [B, lengths]
            if not sizes:
                continue
            with np.errstate(all="ignore"):
                point = np.nanmean(stats_full, axis=0)
                lo, hi = percentile_interval(np.nanmean(stats_boot, axis=0))
            rows += [
                {
                    "group": name,
                    "measure": value,
                    "length": length,
                    "value": float(point[j]),
                    "lo": float(lo[j]),
                    "hi": float(hi[j]),
                    "heads": int(sizes[0]),
                    "draws": len(sizes),
                    "prompts": len(prompts),
                }
                for j, length in enumerate(lengths)
            ]
    return pd.DataFrame(rows, columns=["group", "measure", "length", "value", "lo", "hi", "heads", "draws", "prompts"])


def _pool_name(name: str) -> str:
    """'random:symbolic:3' -> 'random:symbolic'; any other group name is its own pool."""
    parts = name.split(":")
    return ":".join(parts[:-1]) if parts[0] == RANDOM and len(parts) > 2 else name
