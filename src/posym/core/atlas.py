"""The head atlas: the head taxonomies of the long-context literature, scored from queries and keys.

Every score here is computed from the attention a query gives its keys, and that attention is
rebuilt from the layer's captured pre-rotation queries and keys (`posym.core.qk.HeadQK`) in float64:
logit = scale * (R_p q_p) . (R_j k_j) (soft-capped where the model caps), softmax over the keys the
query sees (causal, or the layer's sliding window). The model's own post-softmax weights are never
read: in float32 or bfloat16 a weight below ~1e-38 underflows to 0 and a head's mass on far keys,
which the streaming score measures, would be lost.

Per query row (the functions below return one value per query, NaN where it is undefined):
- `previous_token`   attention on key p - 1 (the previous-token heads every interpretability
                     library points at; Olsson et al. 2022, "In-context learning and induction heads").
- `sink_mass`        attention on the first `sink` keys (the attention sink: Xiao et al. 2023,
                     "Efficient streaming language models with attention sinks").
- `entropy`          entropy of the attention row in nats (0: one key; log(keys): uniform).
- `streaming`        attention on the sink and the recent window: the keys j < sink and
                     p - window < j <= p. A head that keeps (nearly) all its attention there loses
                     (nearly) nothing under a sink + recent-window KV cache, a streaming head of
                     DuoAttention (Xiao et al. 2024); 1 - streaming is the attention mass outside
                     sink + recent window, the training-free proxy of its full-attention gate.
                     Defined for queries with keys outside both (p >= sink + window).
- `match_mass`       RazorAttention (Tang et al. 2024) on random tokens repeated several times:
                     shift 0, the echo score, is the attention on earlier keys holding the query's own
                     token; shift 1, the induction score, the attention on the keys right after an
                     earlier occurrence of the query's token (the token that came next last time).
- `copy_events`      Wu et al. 2024, "Retrieval head mechanistically explains long-context
                     factuality": at a step that generates token w, a head copy-pastes when its most
                     attended key lies inside the needle and holds w. Here the answer is
                     teacher-forced (the needle itself), so the token generated at query p is the
                     prompt's token p + 1; a head's retrieval score is the share of answer steps at
                     which it copy-pastes (Wu's |g_h intersect k| / |k| when each needle token is
                     generated once).

Aggregation follows posym's prompt-mean rule (`posym.core.scores.head_scores`): a prompt's score is the
mean of its defined query rows, a head's the mean over prompts.

Grouped-query attention: `kv_pool` pools query-head scores per key-value head (max and mean), the
granularity KV-cache tools work at (`kv_grid` lays them out layer x KV head; `full_attention_mask` marks
the heads at or above a quantile, as DuoAttention's full_attention_heads.tsv does).

Agreement (`spearman_pairs`, `auroc`, `auroc_interval`, `top_heads`, `confusion`): rank correlation of
every pair of scores over heads, and how well one score ranks the heads another score singles out.

The causal check of the frequency story (`plane_ablations`, `causal_summary`): which RoPE planes of
which heads are zeroed (`posym.core.interventions.ablated_planes` does it) in each condition: the slowest
planes of the top heads of a group, the same number of random planes of the same heads, the slowest
planes of layer-matched random heads; and the needle accuracy of every condition with its n and
interval, and the paired differences that answer "do the slow planes carry retrieval?".

>>> import torch
>>> probs = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0]])   # [q, k]: key 0, then key 1
>>> previous_token(probs, torch.arange(3)).tolist()
[nan, 1.0, 1.0]
"""

from __future__ import annotations

import math
import random

import torch
from torch import Tensor

from posym.core.qk import HeadQK, rotate, visible_keys
from posym.core.retention import matched_random
from posym.core.stats import N_BOOT, bootstrap_weights, percentile_interval, spearman, wilson_interval
from posym.core.swaps import soft_capped
from posym.errors import PosymError

BYTES = 8
"""float64: the attention rows here are float64 (the module docstring says why)."""


def attention(qk: HeadQK, queries: Tensor, heads=slice(None)) -> Tensor:
    """probs [B, H, Q, T] (float64): the attention of the query rows `queries` [Q] (positions) of every
    prompt of the batch over all T keys, rebuilt from the layer's queries and keys; keys a query does
    not see (later ones, or outside its sliding window) get exactly 0."""
    queries = torch.as_tensor(queries, device=qk.q.device)
    T = qk.q.shape[2]
    cos, sin = qk.cos.to(torch.float64)[:, None], qk.sin.to(torch.float64)[:, None]  # [B, 1, T, r]
    q = rotate(qk.q[:, heads][:, :, queries].to(torch.float64), cos[:, :, queries], sin[:, :, queries], qk.pairing)
    k = rotate(qk.k[:, heads].to(torch.float64), cos, sin, qk.pairing)  # [B, H, T, d]
    logits = soft_capped(qk.scale * q @ k.transpose(-1, -2), qk.softcap)  # [B, H, Q, T]
    seen = visible_keys(T, qk.window, logits.device)[queries]  # [Q, T]
    return torch.softmax(logits.masked_fill(~seen, -math.inf), dim=-1)  # [B, H, Q, T]


def query_chunk(batch: int, heads: int, T: int, budget: int) -> int:
    """Query rows per `attention` call so that one chunk of probs [B, H, Q, T] stays within `budget`
    float64 elements (at least one row); the caller estimates memory before it allocates."""
    return max(1, budget // max(1, batch * heads * T))


# ---- per-query scores ---------------------------------------------------------------------------


def previous_token(probs: Tensor, queries: Tensor) -> Tensor:
    """[..., Q]: attention on key p - 1 of each query p (NaN at p = 0, which has no previous key)."""
    queries = torch.as_tensor(queries, device=probs.device)
    prev = (queries - 1).clamp_min(0)  # [Q]
    out = probs.gather(-1, prev[:, None].expand(*probs.shape[:-1], 1)).squeeze(-1)  # [..., Q]
    return out.masked_fill(queries == 0, math.nan)


def sink_mass(probs: Tensor, sink: int = 1) -> Tensor:
    """[..., Q]: attention on the first `sink` keys."""
    if sink < 1:
        raise PosymError(f"the sink must hold at least 1 key, got {sink}")
    return probs[..., :sink].sum(-1)


def entropy(probs: Tensor) -> Tensor:
    """[..., Q]: entropy of each attention row in nats (0 log 0 = 0)."""
    return -torch.special.xlogy(probs, probs).sum(-1)


def streaming(probs: Tensor, queries: Tensor, *, sink: int, window: int) -> Tensor:
    """[..., Q]: attention on the sink keys j < sink and the recent window p - window < j <= p (NaN for
    queries p < sink + window, whose keys all lie in one of the two)."""
    if sink < 0 or window < 1:
        raise PosymError(f"streaming needs sink >= 0 and window >= 1, got sink {sink}, window {window}")
    queries = torch.as_tensor(queries, device=probs.device)
    j = torch.arange(probs.shape[-1], device=probs.device)[None, :]  # [1, T]
    kept = (j < sink) | (j > queries[:, None] - window)  # [Q, T]
    out = (probs * kept).sum(-1)  # [..., Q]
    return out.masked_fill(queries < sink + window, math.nan)


def match_keys(ids: Tensor, queries: Tensor, shift: int) -> Tensor:
    """[B, Q, T] bool: keys j < p with ids[j - shift] == ids[p] (shift 0: earlier copies of the query's
    token; shift 1: the keys right after them), for ids [B, T] and query positions [Q]."""
    if shift not in (0, 1):
        raise PosymError(f"shift must be 0 (echo) or 1 (induction), got {shift}")
    queries = torch.as_tensor(queries, device=ids.device)
    T = ids.shape[-1]
    j = torch.arange(T, device=ids.device)
    held = torch.roll(ids, shifts=shift, dims=-1)  # held[:, j] = ids[:, j - shift]
    same = held[:, None, :] == ids[:, queries][:, :, None]  # [B, Q, T]
    return same & (j[None, None, :] < queries[None, :, None]) & (j >= shift)[None, None, :]


def match_mass(probs: Tensor, ids: Tensor, queries: Tensor, shift: int) -> Tensor:
    """[B, H, Q]: attention on `match_keys` (echo for shift 0, induction for shift 1); NaN for queries
    with no such key (the token has not occurred before)."""
    keys = match_keys(ids, queries, shift)  # [B, Q, T]
    out = (probs * keys[:, None]).sum(-1)  # [B, H, Q]
    return out.masked_fill(~keys.any(-1)[:, None], math.nan)


def copy_events(probs: Tensor, ids: Tensor, queries: Tensor, needle: Tensor) -> Tensor:
    """[B, H, Q] float (1.0 / 0.0): whether each query's most attended key lies in the needle and holds
    the token generated at that step, ids[p + 1] (teacher-forced). needle: [B, T] bool, the needle's
    positions. Queries must lie before the last position (the generated token is in the prompt)."""
    queries = torch.as_tensor(queries, device=ids.device)
    if int(queries.max()) + 1 >= ids.shape[-1]:
        raise PosymError("copy_events needs the generated token of every query: queries must lie before the last token")
    top = probs.argmax(-1)  # [B, H, Q]
    held = ids[:, None, :].expand(-1, top.shape[1], -1).gather(-1, top)  # [B, H, Q]
    inside = needle[:, None, :].expand(-1, top.shape[1], -1).gather(-1, top)  # [B, H, Q]
    return (inside & (held == ids[:, queries + 1][:, None, :])).to(torch.float64)


def row_mean(values: Tensor) -> Tensor:
    """Mean over the last axis of the defined (non-NaN) entries; NaN where none is defined."""
    return values.nanmean(-1)


# ---- grouped-query attention and the KV-cache tables ----------------------------------------------


def kv_group(head: int, n_heads: int, n_kv_heads: int) -> int:
    """The key-value head that query head `head` reads (transformers' repeat_kv: h // (H / KVH))."""
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise PosymError(f"{n_heads} query heads cannot share {n_kv_heads} key-value heads evenly")
    return head // (n_heads // n_kv_heads)


def kv_pool(heads, columns, n_heads: int, n_kv_heads: int):
    """Per (layer, kv_head): <column>_max and <column>_mean over its query heads, for every column, and
    query_heads (how many were pooled). heads: one row per (layer, head)."""
    frame = heads.assign(kv_head=[kv_group(int(h), n_heads, n_kv_heads) for h in heads["head"]])
    aggs = {f"{c}_{how}": (c, how) for c in columns for how in ("max", "mean")}
    return frame.groupby(["layer", "kv_head"], as_index=False).agg(**aggs, query_heads=("head", "size"))


def kv_grid(pooled, column: str, n_layers: int, n_kv_heads: int):
    """numpy [layers, kv_heads] of one pooled column (the layout of DuoAttention's
    full_attention_heads.tsv: one line per layer, one column per KV head); a missing cell is an error."""
    import numpy as np

    grid = np.full((n_layers, n_kv_heads), np.nan)  # [layers, kv_heads]
    grid[pooled.layer.to_numpy(dtype=int), pooled.kv_head.to_numpy(dtype=int)] = pooled[column].to_numpy(dtype=float)
    if np.isnan(grid).any():
        raise PosymError(f"the {column} table lacks {int(np.isnan(grid).sum())} (layer, KV head) cells")
    return grid


def full_attention_mask(grid, quantile: float):
    """bool array like grid: True (full attention) where the score is at or above its `quantile` over
    all cells, so a share of about 1 - quantile of the KV heads keeps the full cache."""
    import numpy as np

    if not 0 <= quantile <= 1:
        raise PosymError(f"the quantile must lie in [0, 1], got {quantile}")
    return np.asarray(grid) >= np.quantile(grid, quantile)


# ---- agreement ------------------------------------------------------------------------------------


def spearman_pairs(heads, columns):
    """One row per pair of columns (a, b, rho, heads): Spearman rho over the heads where both are defined."""
    import pandas as pd

    rows = []
    for i, a in enumerate(columns):
        for b in columns[i + 1 :]:
            both = heads[[a, b]].dropna()
            rows.append({"a": a, "b": b, "rho": spearman(both[a], both[b]), "heads": len(both)})
    return pd.DataFrame(rows, columns=["a", "b", "rho", "heads"])


def top_heads(values, share: float):
    """bool array: the heads whose value is among the top `share` (at least one head; ties at the
    cut included), NaNs never."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    if not 0 < share <= 1:
        raise PosymError(f"the top share must lie in (0, 1], got {share}")
    defined = values[~np.isnan(values)]
    if not len(defined):
        return np.zeros(len(values), dtype=bool)
    cut = np.sort(defined)[::-1][max(1, round(share * len(defined))) - 1]
    return ~np.isnan(values) & (values >= cut)


def confusion(a, b, name_a: str, name_b: str):
    """Long table (name_a, name_b, heads): how many heads carry each pair of values of a and b."""
    import pandas as pd

    frame = pd.DataFrame({name_a: list(a), name_b: list(b)})
    return frame.groupby([name_a, name_b], as_index=False).size().rename(columns={"size": "heads"})


# ---- the causal check: RoPE planes of chosen heads ----------------------------------------------


CONTROLS = ("slowest", "random planes", "matched heads")
"""What each group's ablation is compared with: its heads' slowest planes, the same number of random
planes of the same heads (drawn per head), and the slowest planes of layer-matched random heads."""
CLEAN = ("none", "clean")
"""(group, control) of the unablated model."""


def top_k(values, heads, k: int) -> list[tuple[int, int]]:
    """The k heads with the largest values (NaNs never; ties: the earlier head first), sorted.

    >>> top_k([0.1, 0.9, 0.5, float("nan")], [(0, 0), (0, 1), (1, 0), (1, 1)], 2)
    [(0, 1), (1, 0)]
    """
    ranked = sorted((i for i, v in enumerate(values) if not math.isnan(float(v))), key=lambda i: (-float(values[i]), i))
    return sorted(tuple(heads[i]) for i in ranked[:k])


def plane_ablations(
    groups: dict[str, list[tuple[int, int]]], all_heads, n_planes: int, planes: int, draws: int, seed: int = 0
) -> list[dict]:
    """Every ablation of the causal check: one dict per (group, control, draw) with `planes`, the
    {head: zeroed plane indices} (0-based, the slowest plane of n_planes is n_planes - 1), for the
    controls of `CONTROLS` (one "slowest" per group, `draws` of each random control); seeded.

    >>> rows = plane_ablations({"g": [(1, 0)]}, [(l, h) for l in range(2) for h in range(2)], 4, 2, 1)
    >>> [(r["control"], r["planes"]) for r in rows][:1], sorted(rows[2]["planes"]), rows[2]["planes"][rows[2]["heads"][0]]
    ([('slowest', {(1, 0): [2, 3]})], [(1, 1)], [2, 3])
    """
    if not 1 <= planes <= n_planes:
        raise PosymError(f"cannot ablate {planes} of {n_planes} RoPE planes")
    slowest = list(range(n_planes - planes, n_planes))
    out = []
    for g, (group, heads) in enumerate(groups.items()):
        heads = sorted(tuple(h) for h in heads)
        out.append(
            {"group": group, "control": "slowest", "draw": 0, "heads": heads, "planes": {h: slowest for h in heads}}
        )
        for d in range(draws):
            rng = random.Random(f"planes:{seed}:{group}:{d}")
            drawn = {h: sorted(rng.sample(range(n_planes), planes)) for h in heads}
            out.append({"group": group, "control": "random planes", "draw": d, "heads": heads, "planes": drawn})
        for d, others in enumerate(matched_random(all_heads, heads, draws, seed=seed + 97 * g)):
            out.append(
                {
                    "group": group,
                    "control": "matched heads",
                    "draw": d,
                    "heads": others,
                    "planes": {h: slowest for h in others},
                }
            )
    return out


def paired_difference(a, b, draws: int = N_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """mean(a - b) over prompts (a, b: per-prompt values on the same prompts) and its 95% paired
    prompt-bootstrap interval (the same resampled prompts for both)."""
    import numpy as np

    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    weights = bootstrap_weights(len(diff), draws, seed)  # [draws, prompts]
    lo, hi = percentile_interval(weights @ diff / len(diff))
    return float(diff.mean()), float(lo), float(hi)


MEASURES = ("recalled", "words", "logprob")
"""Per needle prompt: every answer word the greedy token (0/1), the share of answer words that are,
and the mean log-probability of the answer words (teacher-forced)."""


def causal_summary(rows, draws: int = N_BOOT, seed: int = 0):
    """One row per (group, control) of the causal check from `rows` (one per group, control, draw,
    prompt with the `MEASURES`; the clean model as group "none", control "clean"): the mean of each
    measure (random controls: per prompt, the mean over their draws first) with a 95% interval (recall
    of a single condition: Wilson over its n prompts; otherwise the prompt bootstrap), its difference
    from the clean model (clean - ablated, paired bootstrap), and for each "slowest" row the same
    difference against its group's random-planes and matched-heads controls (control - slowest: how
    much more the slow planes of these heads matter than the controls'); `n` prompts, `draws`."""
    import numpy as np
    import pandas as pd

    def per_prompt(frame):
        return frame.groupby("prompt")[list(MEASURES)].mean().sort_index()

    clean = per_prompt(rows[(rows.group == CLEAN[0]) & (rows.control == CLEAN[1])])
    prompts = clean.index
    n = len(prompts)
    weights = bootstrap_weights(n, draws, seed)  # [draws, prompts]
    values = {key: per_prompt(frame).reindex(prompts) for key, frame in rows.groupby(["group", "control"], sort=False)}
    out = []
    for (group, control), table in values.items():
        count = int(rows[(rows.group == group) & (rows.control == control)].draw.nunique())
        row = {"group": group, "control": control, "n": n, "draws": count}
        for measure in MEASURES:
            x = table[measure].to_numpy(dtype=float)
            row[measure] = float(x.mean())
            if measure == "recalled" and count == 1:
                row["recalled_low"], row["recalled_high"] = wilson_interval(round(x.sum()), n)
            else:
                lo, hi = percentile_interval(weights @ x / n)
                row[f"{measure}_low"], row[f"{measure}_high"] = float(lo), float(hi)
            if (group, control) != CLEAN:
                d = paired_difference(clean[measure], x, draws, seed)
                row[f"{measure}_drop"], row[f"{measure}_drop_low"], row[f"{measure}_drop_high"] = d
            if control == "slowest":
                for other in CONTROLS[1:]:
                    tag = other.replace(" ", "_")
                    d = paired_difference(values[(group, other)][measure], x, draws, seed)
                    row[f"{measure}_vs_{tag}"], row[f"{measure}_vs_{tag}_low"], row[f"{measure}_vs_{tag}_high"] = d
        out.append(row)
    return pd.DataFrame(out).replace({None: np.nan})
