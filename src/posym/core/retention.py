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
                  most at the base length (moved to where that token sits in the longer prompt; on a real
                  model with the attention sinks left out of that choice), or a key the task fixes (the
                  chain's next position for a hop pointer);
- attn_answer   = the softmax weight on the ANSWER-BEARING keys, which the prompt builder knows (the
                  fact's value token: `posym.prompts.LengthPrompt.answer_keys`), at every length;
- a key the query cannot see (outside its sliding window) has attention 0: it is LOST, never missing;
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

from posym.core.interop import scorable
from posym.core.qk import check_layers
from posym.core.stats import (
    ALPHA,
    N_BOOT,
    POWER,
    auroc,
    auroc_interval,
    bootstrap_weights,
    detectable_effect,
    holm,
    percentile_interval,
    prompts_for_effect,
    randomization_p,
)
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
    "tracked_seen",
    "top_free",
    "attn_answer",
)
MEASURES = ("margin", "attn_tracked", "attn_answer")
"""The per-head quantities whose retention is reported."""
RANDOM = "random"
"""Group name prefix of layer-matched random draws (`matched_random`)."""


def head_measures(
    model,
    input_ids,
    queries=None,
    *,
    tracked=None,
    answer=None,
    exclude=(),
    layers: list[int] | None = None,
    batch_size: int = 16,
    progress=None,
):
    """Margin, top key and attention on a tracked key and on the answer keys of every head at every
    query (float64 maths).

    input_ids: 1-D id sequences; queries: "last" (default), "all" or per prompt a list of positions
    (`posym.core.swaps.query_batches`). tracked: None, or callable(prompt, query) -> None, an int
    (one key position for every head) or an integer array [n_layers_of_model, heads] of key positions
    per head (-1 = none, or a key after the query: attn_tracked NaN); a tracked key before the query's
    window gives attn_tracked 0 and tracked_seen False: the head has lost it. answer: None (attn_answer NaN) or
    callable(prompt) -> the answer-bearing key positions; attn_answer sums the attention on those the
    query sees (0 when it sees none). exclude: key positions (the attention sinks) that top_free, the
    head's top key among the others, never is. Returns a DataFrame with MEASURE_COLUMNS (keys = the
    number of keys the query sees).
    """
    import pandas as pd

    exclude = sorted({int(k) for k in exclude})

    def layer_work(layer, qk, jobs):
        found = []
        heads = list(range(qk.q.shape[1]))
        for p, rows in jobs.items():
            first = qk.first_key(p)
            logits = clean_logits(qk, torch.tensor(rows), heads, p)  # [G, H, n] over keys first..p
            margin, top, attn_top, probs = row_measures(logits)
            free = logits.clone()
            sinks = [k - first for k in exclude if first <= k <= p]
            if sinks and len(sinks) < logits.shape[-1]:
                free[..., sinks] = -torch.inf  # the sinks cannot be the free top key
            found.append(
                (p, rows, first, logits.shape[-1], margin, top + first, attn_top, probs, free.argmax(-1) + first)
            )
        return found

    layers = check_layers(scorable(model), layers)
    records = []
    for batch, results in scan(
        model, input_ids, queries, layer_work, layers=layers, batch_size=batch_size, progress=progress
    ):
        for layer, found in zip(layers, results):
            for p, rows, first, n, margin, top_key, attn_top, probs, top_free in found:
                for g, row in enumerate(rows):
                    prompt = batch[row]
                    keys = _tracked_keys(tracked, prompt, p, layer, probs.shape[1])  # [H] absolute, -1 none
                    wanted = None if answer is None else [int(k) for k in answer(prompt)]
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
                                float(probs[g, h, key - first])
                                if seen
                                else (0.0 if 0 <= key < first else float("nan")),
                                bool(seen),
                                int(top_free[g, h]),
                                _attention_on(probs[g, h], wanted, first, p),
                            )
                        )
    frame = pd.DataFrame.from_records(records, columns=list(MEASURE_COLUMNS))
    return frame.sort_values(["prompt", "query", "layer", "head"], ignore_index=True)


def _attention_on(probs, keys, first: int, query: int) -> float:
    """Attention of one row (probs over keys first..query) summed over `keys` it sees; NaN for no keys."""
    if keys is None:
        return float("nan")
    return float(sum(float(probs[k - first]) for k in keys if first <= k <= query))


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


def base_tracking(base, position_map, *, key: str = "top_key"):
    """`tracked` callable for `head_measures` at a longer length: each head's top key at the base length
    (column `key`: 'top_key', or 'top_free' for the top key with the sinks left out), moved to where
    that token sits in the longer prompt.

    base: `head_measures` rows of the base-length prompts; position_map(prompt, base_position) -> the
    position of that token in the longer prompt (None: it is not there). A base query moves by the same
    map, so the longer prompt's queries must be the mapped base queries."""
    n_layers = int(base.layer.max()) + 1
    n_heads = int(base["head"].max()) + 1
    table: dict[tuple[int, int], np.ndarray] = {}
    for (prompt, query), group in base.groupby(["prompt", "query"], sort=False):
        keys = np.full((n_layers, n_heads), -1)
        for layer, head, top in zip(group.layer, group["head"], group[key]):
            moved = position_map(int(prompt), int(top))
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


def measured(measures) -> list[str]:
    """The MEASURES a table holds values of (a column of NaNs, e.g. attn_answer without answer keys, is none)."""
    return [m for m in MEASURES if m in measures and measures[m].notna().any()]


def head_retention(measures, *, base_length: int):
    """Per (layer, head, length): the prompt means of every measure present, their retentions
    (mean at L / mean at base_length) and the prompt count. measures: `head_measures` rows with a
    `length` column (every prompt index measured at every length, the same questions)."""
    import pandas as pd

    present = measured(measures)
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


def matched_random(
    all_heads, group, draws: int, seed: int = 0, kinds: dict[int, str] | None = None
) -> list[list[tuple[int, int]]]:
    """`draws` random head sets matched to `group` layer by layer: each head (l, h) of the group is
    replaced by a head of layer l outside the group (without repeats within a draw); where layer l has
    no such head left (a one-head-per-layer toy model, or a group holding the whole layer), by a head of
    the nearest layer that has one and, with `kinds` (layer -> its kind, e.g. 'sliding_attention' /
    'full_attention'), of the same kind: a local layer's head is never matched by a global one's.

    >>> heads = [(l, h) for l in range(2) for h in range(3)]
    >>> draws = matched_random(heads, [(0, 0), (1, 2)], 2, seed=1)
    >>> [sorted(l for l, _ in d) for d in draws], all((0, 0) not in d and (1, 2) not in d for d in draws)
    ([[0, 1], [0, 1]], True)
    >>> kinds = {0: "local", 1: "global", 2: "local"}
    >>> heads = [(l, h) for l in range(3) for h in range(2)]
    >>> {l for d in matched_random(heads, [(0, 0), (0, 1)], 5, kinds=kinds) for l, _ in d}  # layer 1 is global
    {2}
    """
    group = {tuple(h) for h in group}
    kind = (lambda layer: kinds.get(layer)) if kinds else (lambda layer: None)
    pool: dict[int, list[tuple[int, int]]] = {}
    for layer, head in sorted({tuple(h) for h in all_heads} - group):
        pool.setdefault(layer, []).append((layer, head))
    for wanted in {kind(layer) for layer, _ in group}:
        have = sum(len(v) for layer, v in pool.items() if kind(layer) == wanted)
        need = sum(1 for layer, _ in group if kind(layer) == wanted)
        if have < need:
            where = f" of kind {wanted}" if wanted is not None else ""
            raise PosymError(
                f"cannot draw {need} random heads{where} outside a group of {len(group)} "
                f"from {len(set(map(tuple, all_heads)))} heads"
            )
    rng = random.Random(seed)
    out = []
    for _ in range(draws):
        left = {layer: list(heads) for layer, heads in pool.items()}
        chosen = []
        for layer, _ in sorted(group):
            near = min((l for l in left if left[l] and kind(l) == kind(layer)), key=lambda l: (abs(l - layer), l))
            pick = left[near].pop(rng.randrange(len(left[near])))
            chosen.append(pick)
        out.append(sorted(chosen))
    return out


STATISTICS = ("median", "pooled")
"""How a group's retention is made of its heads': 'median' of the heads' own retentions (mean at L / mean
at the base length), or 'pooled', the group's summed measure at L over its sum at the base length (for an
attention, the share the group keeps of the attention it gave the key: not swamped by heads whose base
attention on the key is ~0, whose own ratios are noise)."""


def group_retention(
    measures,
    groups: dict[str, list[tuple[int, int]]],
    *,
    base_length: int,
    n_boot: int = N_BOOT,
    seed: int = 0,
    statistic: dict[str, str] | None = None,
):
    """Retention per group of heads and length, with paired-bootstrap 95% intervals over prompts and,
    for a group with a pool of random draws, the randomization test against them.

    groups: name -> heads; names starting with RANDOM followed by ':' and a draw index (e.g.
    'random:symbolic:3') are pooled per prefix ('random:symbolic'): the value is the mean over draws of
    each draw's statistic, in every bootstrap sample. statistic: measure -> one of STATISTICS (default
    'median' for every measure). Returns rows (group, measure, statistic, length, value, lo, hi, level,
    heads, draws, prompts) and, for a group whose pool 'random:<group>' exists, null_median, null_lo,
    null_hi (the median and 2.5 / 97.5 percentiles of the draws' values), p_random (two-sided
    randomization p over the draws, `posym.core.stats.randomization_p`), diff (value minus the draws'
    mean), diff_lo / diff_hi (its paired-bootstrap 95% interval over prompts) and diff_se (the bootstrap
    standard error of diff: what a minimal detectable effect over prompts is made of). level = the mean
    over the group's heads of the measure itself at that length.
    """
    import pandas as pd

    statistic = statistic or {}
    rows = []
    for value in measured(measures):
        how = statistic.get(value, "median")
        if how not in STATISTICS:
            raise PosymError(f"statistic must be one of {', '.join(STATISTICS)}, got {how!r}")
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

        def summary(idx, with_boot: bool = True):  # -> statistic [lengths] on all prompts, [B, lengths] or None
            with np.errstate(all="ignore"):
                if how == "pooled":
                    point = np.nansum(full[idx], 0) / np.nansum(full[idx, b])
                    if not with_boot:
                        return point, None
                    return point, np.nansum(boot[:, idx], 1) / np.nansum(boot[:, idx, b], 1)[:, None]
                point = np.nanmedian(full[idx] / full[idx, b : b + 1], axis=0)
                if not with_boot:
                    return point, None
                return point, np.nanmedian(boot[:, idx] / boot[:, idx, b : b + 1], axis=1)

        pooled: dict[str, list[str]] = {}
        for name in groups:
            pooled.setdefault(_pool_name(name), []).append(name)
        found: dict[str, tuple] = {}
        for name, members in pooled.items():
            stats_full, stats_boot, levels, sizes = [], [], [], []
            for member in members:
                idx = [index[tuple(h)] for h in groups[member] if tuple(h) in index]
                if not idx:
                    continue
                sizes.append(len(idx))
                point, samples = summary(idx, len(sizes) <= BOOT_DRAWS)
                stats_full.append(point)  # [lengths]
                if samples is not None:
                    stats_boot.append(samples)  # [B, lengths]
                with np.errstate(all="ignore"):
                    levels.append(np.nanmean(full[idx], axis=0))  # [lengths]
            if sizes:
                found[name] = (np.array(stats_full), np.array(stats_boot), np.array(levels), sizes)
        for name, (stats_full, stats_boot, levels, sizes) in found.items():
            with np.errstate(all="ignore"):
                point = np.nanmean(stats_full, axis=0)  # [lengths]
                mean_boot = np.nanmean(stats_boot, axis=0)  # [B, lengths]
                lo, hi = percentile_interval(mean_boot)
                level = np.nanmean(levels, axis=0)
            pool = found.get(f"{RANDOM}:{name}") if not name.startswith(RANDOM) else None
            for j, length in enumerate(lengths):
                row = {
                    "group": name,
                    "measure": value,
                    "statistic": how,
                    "length": length,
                    "value": float(point[j]),
                    "lo": float(lo[j]),
                    "hi": float(hi[j]),
                    "level": float(level[j]),
                    "heads": int(sizes[0]),
                    "draws": len(sizes),
                    "prompts": len(prompts),
                }
                if pool is not None:
                    null, null_boot = pool[0][:, j], np.nanmean(pool[1][:, :, j], axis=0)  # [D], [B]
                    with np.errstate(all="ignore"):
                        diff_boot = mean_boot[:, j] - null_boot  # [B]
                        dlo, dhi = percentile_interval(diff_boot)
                        row.update(
                            null_median=float(np.nanmedian(null)),
                            null_lo=float(np.nanpercentile(null, 2.5)),
                            null_hi=float(np.nanpercentile(null, 97.5)),
                            p_random=randomization_p(float(point[j]), null) if j != b else float("nan"),
                            diff=float(point[j] - np.nanmean(null)),
                            diff_lo=float(dlo),
                            diff_hi=float(dhi),
                            diff_se=float(np.nanstd(diff_boot, ddof=1)),
                        )
                rows.append(row)
    columns = ["group", "measure", "statistic", "length", "value", "lo", "hi", "level", "heads", "draws", "prompts"]
    columns += [c for c in GROUP_TEST_COLUMNS if any(c in r for r in rows)]
    return pd.DataFrame(rows, columns=columns)


BOOT_DRAWS = 200
"""Draws of a random pool that enter its bootstrap (the pool's mean over prompts resampled): its other
draws count in the randomization p alone, which needs each draw's value on all prompts only."""
GROUP_TEST_COLUMNS = ("null_median", "null_lo", "null_hi", "p_random", "diff", "diff_lo", "diff_hi", "diff_se")
"""The columns `group_retention` adds for a group tested against its pool of random draws."""


def holm_verdicts(table, *, alpha: float = ALPHA, effect: float | None = None, power: float = POWER):
    """Holm over every randomization test of a group table (`group_retention` rows, or several
    concatenated: the table is one family), and a verdict per tested row.

    Adds p_holm, family (the number of tests), verdict ('keeps more than random' / 'loses more than
    random' when p_holm < alpha AND the prompt-bootstrap interval of diff excludes 0 on the same side;
    'not separated' otherwise; NaN for untested rows), mde (the difference in value detectable over
    prompts with `power` at level alpha / family, from diff_se) and, with `effect`, needed (prompts for
    that effect at that level and power)."""
    import pandas as pd

    out = table.copy()
    tested = out["p_random"].to_numpy(dtype=np.float64) if "p_random" in out else np.full(len(out), np.nan)
    out["p_holm"] = holm(tested)
    family = int(np.sum(~np.isnan(tested)))
    out["family"] = family
    level = alpha / max(family, 1)
    verdicts, mde, needed = [], [], []
    for row in out.itertuples():
        if not np.isfinite(getattr(row, "p_holm", np.nan)):
            verdicts.append(None)
            mde.append(np.nan)
            needed.append(None)
            continue
        side = "keeps more than random" if row.diff > 0 else "loses more than random"
        bootstrap_agrees = row.diff_lo > 0 if row.diff > 0 else row.diff_hi < 0
        verdicts.append(side if row.p_holm < alpha and bootstrap_agrees else "not separated")
        sd = row.diff_se * np.sqrt(row.prompts)  # the per-prompt spread the bootstrap implies
        mde.append(detectable_effect(sd, int(row.prompts), alpha=level, power=power))
        needed.append(prompts_for_effect(sd, effect, alpha=level, power=power) if effect else None)
    out["verdict"] = pd.Series(verdicts, index=out.index, dtype=object)
    out["mde"] = mde
    out["needed"] = pd.Series(needed, index=out.index, dtype=object)
    return out


def _pool_name(name: str) -> str:
    """'random:symbolic:3' -> 'random:symbolic'; any other group name is its own pool."""
    parts = name.split(":")
    return ":".join(parts[:-1]) if parts[0] == RANDOM and len(parts) > 2 else name


KEEPS = 0.5
"""A head KEEPS its answer key at length L when its attention there is at least this share of its attention at
the base length (`label_prediction`'s outcome; stated beside every AUROC it gives)."""


def label_prediction(head_table, *, base_length: int, length: int, keeps: float = KEEPS, draws: int = 1000, seed=0):
    """Does a head's label predict that it keeps its answer key at `length`? An AUROC over heads.

    head_table: `head_retention` rows of one (layout, ranking) with the heads' `s_pos` and `s_sym` (the labels'
    scores). Only heads that LOOK at the answer key at the base length take part (attention on it at least
    uniform, 1 / base_length: a head that never looked cannot keep or lose it); the outcome is
    attn_answer_retention at `length` >= `keeps`; the score is s_sym - s_pos (more symbolic, higher). Returns
    the head counts, the AUROC with its 95% head-bootstrap interval (`posym.core.stats.auroc_interval`), and the
    layer-matched AUROC with its interval (pairs inside one layer only: depth alone scores 0.5).

    >>> import pandas as pd
    >>> rows = pd.DataFrame({"layer": [0, 0, 1, 1] * 2, "head": [0, 1, 0, 1] * 2, "length": [8] * 4 + [16] * 4,
    ...     "attn_answer": [0.5, 0.5, 0.5, 0.01] * 2, "attn_answer_retention": [1, 1, 1, 1, 0.9, 0.1, 0.8, 0.0],
    ...     "s_pos": [0.1, 0.9, 0.2, 0.0] * 2, "s_sym": [0.9, 0.1, 0.8, 1.0] * 2})
    >>> out = label_prediction(rows, base_length=8, length=16, draws=50)
    >>> (out["heads"], out["looking"], out["kept"], out["auroc"])
    (4, 3, 2, 1.0)
    """
    base = head_table[head_table.length == base_length].set_index(["layer", "head"]).sort_index()
    grown = head_table[head_table.length == length].set_index(["layer", "head"]).reindex(base.index)
    looking = (base.attn_answer >= 1.0 / base_length).to_numpy()
    kept = (grown.attn_answer_retention.to_numpy(dtype=np.float64) >= keeps)[looking]
    score = (base.s_sym - base.s_pos).to_numpy(dtype=np.float64)[looking]
    layers = base.index.get_level_values("layer").to_numpy()[looking]
    lo, hi = auroc_interval(score, kept, draws=draws, seed=seed)
    layer_lo, layer_hi = auroc_interval(score, kept, strata=layers, draws=draws, seed=seed)
    return {
        "heads": len(base),
        "looking": int(looking.sum()),
        "kept": int(kept.sum()),
        "keeps": keeps,
        "auroc": auroc(score, kept),
        "auroc_lo": lo,
        "auroc_hi": hi,
        "auroc_layer": auroc(score, kept, strata=layers),
        "auroc_layer_lo": layer_lo,
        "auroc_layer_hi": layer_hi,
    }
