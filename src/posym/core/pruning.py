"""Swap scores of query rows from the swaps that matter, with a proven error bound (docs/method.md section 3, issue 16).

The swap weights alpha = softmax(gap / tau), tau = 1e-4, are nearly a hard maximum: a swap whose
gap lies c * tau below the largest gap G weighs at most e^{-c} times the heaviest. Keeping only the
swaps with gap >= G - c * tau, c = ln(N / epsilon) for N swaps, leaves out a total weight W <= m e /
(Z_K + m e) <= epsilon (m dropped swaps, e = e^{(g_d - G) / tau} <= e^{-c} with g_d the largest
dropped gap, Z_K the kept swaps' summed e^{(g - G) / tau} >= 1). Renormalising over the kept swaps
moves s_pos and s_sym by at most 2 W (each cosine lies in [-1, 1]): `bound` = 2 m e / (Z_K + m e)
is recorded per row, 0 where every swap was weighed.

The kept swaps come from the clean row alone: sort the items' values x (the key probabilities, block
means for block swaps, raw logits for compare="logits"); the partners j of item i with x_i - x_j >=
G - c * tau form a prefix of the sorted order (`torch.searchsorted`). Each kept swap then costs two
dot products u_a . k_b and u_b . k_a (`posym.swaps.pair_logits`). A row whose kept set is more than
SPARSE_LIMIT of its swaps (a near-uniform head: every gap is within c * tau of G) takes the dense
path: the head's [n, n] swapped logits from one matrix product, every swap weighed, bound 0.

Memory: pairs are processed in chunks of at most `posym.swaps.BUDGET` float64 elements; the dense
path also holds one head's [n, n] logits (or several heads' when they fit in BUDGET).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posym.errors import PosymError
from posym.core import swaps
from posym.core.paper import TAU
from posym.core.qk import HeadQK

SPARSE_LIMIT = 0.25
"""A row is pruned when it keeps at most this fraction of its swaps; above it, dense is cheaper."""


def block_items(keys: int, blocks: int | None) -> Tensor:
    """Key positions [items, size] of the things a swap exchanges.

    Single-token swaps (blocks=None): every key 0..keys-1 is an item of size 1. With blocks=M the
    keys are cut into M contiguous blocks of size keys // M aligned to the query end (the oldest
    keys % M keys stay put, so the blocks have equal sizes); block A swaps with block B element-wise
    (the k-th key of A with the k-th of B). Every pair of items is one swap.
    """
    if blocks is None:
        return torch.arange(keys)[:, None]
    if isinstance(blocks, bool) or not isinstance(blocks, int) or not 2 <= blocks <= keys:
        raise PosymError(f"blocks must be an integer between 2 and the number of keys ({keys}), got {blocks!r}")
    size = keys // blocks
    return keys - size * blocks + torch.arange(blocks * size).view(blocks, size)  # [blocks, size]


def movable_items(keys: int, blocks: int | None, exclude_keys=()) -> Tensor:
    """`block_items` without the items that hold an excluded key position (e.g. 0, an attention sink):
    those keys never move, while they keep their share of the softmax. Fewer than two items left is an
    error."""
    items = block_items(keys, blocks)  # [M, size]
    fixed = torch.tensor(sorted({int(k) for k in exclude_keys if 0 <= int(k) < keys}), dtype=torch.long)
    if len(fixed):
        items = items[~torch.isin(items, fixed).any(-1)]
        if len(items) < 2:
            raise PosymError(f"excluding key positions {fixed.tolist()} leaves no swap for a query with {keys} keys")
    return items


def sink_view(log_d: Tensor, first: int = 0) -> dict[str, Tensor]:
    """attn_first (attention on token 0), top_key (the position of the most attended key) and attn_top
    (its attention) of log-softmax rows [..., n] over key positions first .. first + n - 1. A row whose
    window starts past token 0 (first > 0) has no token-0 sink: attn_first is NaN there, not 0."""
    top = log_d.max(-1)
    attn_first = log_d[..., 0].exp() if first == 0 else torch.full_like(log_d[..., 0], float("nan"))
    return {"attn_first": attn_first, "top_key": top.indices + first, "attn_top": top.values.exp()}


def item_values(clean: Tensor, items: Tensor, compare: str) -> Tensor:
    """x [..., items]: the quantity whose differences are the swap gaps (mean probability of the
    item's keys, or their mean raw logit for compare="logits")."""
    row = clean if compare == "logits" else torch.softmax(clean, dim=-1)
    return row[..., items].mean(-1)


def _cosine(u0: Tensor, u1: Tensor, w0: Tensor, w1: Tensor) -> Tensor:
    """cos((u0, u1), (w0, w1)) elementwise; a zero vector has cosine 0 with anything."""
    norm = torch.sqrt((u0 * u0 + u1 * u1) * (w0 * w0 + w1 * w1))
    return (u0 * w0 + u1 * w1) / norm.clamp_min(torch.finfo(norm.dtype).tiny)


def pair_cosines(old_a: Tensor, old_b: Tensor, new_a: Tensor, new_b: Tensor, compare: str) -> tuple[Tensor, Tensor]:
    """(cos_pos, cos_sym) [...] of swaps from the logits [..., size] of their two items before
    (old) and after (new: item A's positions holding B's content, and vice versa)."""
    if compare == "logits":
        v0, v1, w0, w1 = old_a.mean(-1), old_b.mean(-1), new_a.mean(-1), new_b.mean(-1)
    else:
        # D' = exp(new) / Z' and the cosine ignores the common factor 1/Z', so only the direction of
        # (exp(new_a), exp(new_b)) matters: shift by the pair's own max and nothing under/overflows.
        m_new = torch.maximum(new_a.amax(-1), new_b.amax(-1))[..., None]  # [..., 1]
        w0, w1 = (new_a - m_new).exp().mean(-1), (new_b - m_new).exp().mean(-1)
        m_old = torch.maximum(old_a.amax(-1), old_b.amax(-1))[..., None]
        v0, v1 = (old_a - m_old).exp().mean(-1), (old_b - m_old).exp().mean(-1)
    return _cosine(w0, w1, v0, v1), _cosine(w0, w1, v1, v0)


def kept_counts(x: Tensor, tau: float, epsilon: float | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Which swaps of rows x [R, M] to keep, from the sorted item values alone.

    Returns (order [R, M], counts [R, M], top [R], dropped_gap [R]): item order[r, i] (i-th smallest
    x) is paired with the items order[r, :counts[r, i]]; top is the largest gap G; dropped_gap the
    largest gap left out (-inf if none). epsilon None keeps every swap (counts = i).
    """
    xs, order = x.sort(dim=-1)  # [R, M]
    top = xs[:, -1] - xs[:, 0]  # [R]
    everything = torch.arange(x.shape[-1], device=x.device).expand_as(xs)  # [R, M]: j < i
    if epsilon is None:
        return order, everything, top, torch.full_like(top, -math.inf)
    swaps_total = x.shape[-1] * (x.shape[-1] - 1) // 2
    threshold = top - max(math.log(swaps_total / epsilon), 0.0) * tau  # [R]
    counts = torch.searchsorted(xs, xs - threshold[:, None], right=True).minimum(everything)  # [R, M]
    # item i's best dropped partner is the first one past its prefix (sorted order)
    partner = xs.gather(1, counts.clamp_max(x.shape[-1] - 1))  # [R, M]
    dropped = torch.where(counts < everything, xs - partner, -math.inf).amax(-1)  # [R]
    return order, counts, top, dropped


def _pair_chunks(counts: Tensor, order: Tensor, chunk: int):
    """Yield (row, item_a, item_b) index tensors [P] of the pairs (order[r, i], order[r, j]),
    j < counts[r, i], in chunks of at most `chunk` pairs (never materialising all of them)."""
    flat = counts.flatten()  # [R * M]
    ends = flat.cumsum(0)  # [R * M]
    total, width = int(ends[-1]), counts.shape[-1]
    for start in range(0, total, chunk):
        t = torch.arange(start, min(start + chunk, total), device=counts.device)  # [P]
        parent = torch.searchsorted(ends, t, right=True)  # [P]
        j = t - (ends[parent] - flat[parent])
        row, i = parent // width, parent % width
        yield row, order[row, i], order[row, j]


def score_rows(
    qk: HeadQK,
    u: Tensor,
    k: Tensor,
    *,
    first: int = 0,
    tau: float = TAU,
    blocks: int | None = None,
    compare: str = "probs",
    epsilon: float | None = 1e-12,
    exclude_keys=(),
) -> dict[str, Tensor]:
    """Scores of R query rows from u, k [R, n, d] (`posym.swaps.unrotated_queries`, flattened): the n
    keys the queries see, positions first .. first + n - 1 (the last is the query, which never moves).

    epsilon: the bound on the dropped swap weight per row (None: every swap, the dense reference).
    exclude_keys: key positions no swap moves (`movable_items`; positions outside the window are ignored).
    Returns s_pos, s_sym, entropy, kept (swaps weighed), bound (max change of s_pos and s_sym from
    the dropped swaps), the sink view (`sink_view`), all [R], and n_swaps (int).
    """
    R, n, d = u.shape
    clean = swaps.soft_capped(qk.scale * (u * k).sum(-1), qk.softcap)  # [R, n]
    log_d = torch.log_softmax(clean, dim=-1)
    entropy = -(log_d.exp() * log_d).sum(-1)  # [R]
    items = movable_items(n - 1, blocks, [int(key) - first for key in exclude_keys]).to(u.device)  # [M, size]
    x = item_values(clean, items, compare)  # [R, M]
    order, counts, top, dropped = kept_counts(x, tau, epsilon)
    kept = counts.sum(-1)  # [R]
    n_swaps = items.shape[0] * (items.shape[0] - 1) // 2
    sparse = kept <= SPARSE_LIMIT * n_swaps  # [R]
    weight, pos, sym = (torch.zeros(R, dtype=u.dtype, device=u.device) for _ in range(3))

    def weigh(row, ia, ib, new_a, new_b):
        a, b = items[ia], items[ib]  # [P, size]
        cos_pos, cos_sym = pair_cosines(clean[row[:, None], a], clean[row[:, None], b], new_a, new_b, compare)
        w = torch.exp(((x[row, ia] - x[row, ib]).abs() - top[row]) / tau)  # [P]: <= 1, the top swap 1
        weight.index_add_(0, row, w)
        pos.index_add_(0, row, w * cos_pos)
        sym.index_add_(0, row, w * cos_sym)

    size = items.shape[1]
    rows = sparse.nonzero()[:, 0]
    if len(rows):  # two gathered dot products per kept swap
        for row, ia, ib in _pair_chunks(counts[rows], order[rows], max(1, swaps.BUDGET // (size * d))):
            a, b, row = items[ia], items[ib], rows[row]  # [P, size], [P, size], [P]
            weigh(
                row,
                ia,
                ib,
                swaps.pair_logits(qk, u, k, row[:, None], a, b),
                swaps.pair_logits(qk, u, k, row[:, None], b, a),
            )
    dense = (~sparse).nonzero()[:, 0]
    step = max(1, swaps.BUDGET // (n * n))
    for start in range(0, len(dense), step):  # every swap from one [n, n] product per head
        group = dense[start : start + step]
        logits = swaps.soft_capped(qk.scale * u[group] @ k[group].transpose(-1, -2), qk.softcap)  # [g, n, n]
        everything = torch.arange(items.shape[0], device=u.device).expand(len(group), -1)
        for local, ia, ib in _pair_chunks(everything, order[group], max(1, swaps.BUDGET // (8 * size))):
            a, b, at = items[ia], items[ib], local[:, None]
            weigh(group[local], ia, ib, logits[at, a, b], logits[at, b, a])
    kept = torch.where(sparse, kept, n_swaps)
    dropped_weight = (n_swaps - kept) * torch.exp((dropped - top) / tau)  # [R] (0 where dense)
    return {
        "s_pos": pos / weight,
        "s_sym": sym / weight,
        "entropy": entropy,
        "kept": kept,
        "bound": torch.where(sparse, 2 * dropped_weight / (weight + dropped_weight), 0.0),
        "n_swaps": n_swaps,
        **sink_view(log_d, first),
    }
