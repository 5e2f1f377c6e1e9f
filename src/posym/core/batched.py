"""Swap scores of many queries of a layer at once: every query's scores at the cost of its attention.

`posym.core.pruning.score_rows` scores the rows of ONE query position (all of equal length n); a
prompt scored at every query then costs a Python loop of T positions per layer. This module scores a
whole block of query positions of every head and prompt with a handful of batched matrix products,
the same maths and the same proven bound per row:

- clean logits of the block: one product R_p q_p . R_j k_j per head, [queries, keys], the keys each
  query sees (`HeadQK.first_key`, so sliding windows hold) masked, exactly the attention logits;
- the kept swaps (`posym.core.pruning`): with G the largest gap and threshold t = G - c tau > 0, a kept
  swap (i, j) has x_i - x_j >= t, so its larger item i is a *pivot*, x_i >= min x + t (its partners are
  exactly {j : x_j <= x_i - t}, no sort needed). A peaked row has one pivot or a few;
- a pivot a of query p needs one row and one column of that query's swapped-logit matrix:
  swapped[a, b] = scale (R_a^T R_p q_p) . k_b for every b (one product with the keys) and
  swapped[b, a] = scale (R_p q_p) . (R_b k_a) = scale sum_i cos_b,i (qr_i k_a,i) + sin_b,i (qr_i (J k_a)_i)
  (+ the pass-through dims), one product with the rotary tables. Pivot slot s (the s-th largest item)
  of every row of the block is one pair of batched products, [queries, keys] each;
- every pair is weighed as `pruning.score_rows` weighs it (`pair_cosines`, the weights
  exp((|x_a - x_b| - G) / tau)), summed over partners and pivots, and the bound is the same
  2 m e / (Z_K + m e) (m dropped swaps, e from the largest dropped gap).

Rows this does not take go to the per-query path (`pruning.score_rows` on that query's rows, the
reference): rows whose threshold is <= 0 or that keep more than SPARSE_LIMIT of their swaps (dense:
near-uniform heads), block swaps (blocks=M), and epsilon=None
(the dense reference itself).

Memory: a block holds about `budget` bytes of [heads x queries, keys] float arrays (GRIDS of them at
once; default `default_budget`, the forward's own logits); `query_blocks` sizes the blocks, so a tiny budget only makes more, smaller blocks with the same
numbers.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from posym.errors import PosymError
from posym.core import pruning, swaps
from posym.core.qk import HeadQK, rotate, rotate_pairs

FLOOR_BYTES = 8 << 20
"""The smallest default budget (8 MiB): tiny models' logits would make one-query blocks."""


def default_budget(batch: int, tokens: int, vocab: int) -> int:
    """Bytes of the forward pass's float32 logits [batch, tokens, vocab], at least FLOOR_BYTES: what the
    model's own pass holds at its peak (SmolLM2-135M at 1,024 tokens: 192 MiB), so a block of queries
    keeps the scores' peak near the forward's.

    >>> default_budget(1, 1024, 49152) // 2**20
    192
    """
    return max(FLOOR_BYTES, batch * tokens * vocab * 4)


GRIDS = 24
"""[rows, keys] arrays alive at once in a block, at most (clean logits, probabilities, masks, sorted
values, the pivots' tables, a pivot's row and column of swapped logits, cosines, weights and their
temporaries): the budget's divisor."""


def query_blocks(positions: list[int], first_key, rows: int, budget: int, dtype=torch.float64) -> list[list[int]]:
    """Consecutive runs of the sorted query `positions` whose [rows, keys] grids fit the budget.

    rows: batch rows x heads scored together; first_key(p): the first key query p sees. A block of
    queries p0..p1 spans keys first_key(p0)..p1; it holds rows x queries x keys elements GRIDS times.
    A single query always forms a block, whatever the budget.

    >>> query_blocks([2, 3, 4, 5, 6, 7], lambda p: 0, rows=1, budget=24 * 8 * 12)
    [[2, 3], [4, 5], [6], [7]]
    """
    limit = max(1, budget // (GRIDS * torch.finfo(dtype).bits // 8))
    blocks: list[list[int]] = []
    for p in positions:
        if blocks and rows * (len(blocks[-1]) + 1) * (p - first_key(blocks[-1][0]) + 1) <= limit:
            blocks[-1].append(p)
        else:
            blocks.append([p])
    return blocks


def _movable(qk: HeadQK, ps: Tensor, k0: int, width: int, exclude_keys) -> Tensor:
    """[Q, width] bool: key k0 + j is a movable item of query ps[q] (seen, not the query, not excluded)."""
    j = k0 + torch.arange(width, device=ps.device)  # [W] key positions
    first = qk.first_keys(ps)  # [Q]
    seen = (j >= first[:, None]) & (j < ps[:, None])  # [Q, W]
    fixed = torch.tensor(sorted({int(key) for key in exclude_keys}), dtype=torch.long, device=ps.device)
    return seen & ~torch.isin(j, fixed) if len(fixed) else seen


def _folded(table: Tensor, pairing: str) -> Tensor | None:
    """The table [..., r] with each plane's two equal entries kept once [..., r / 2], or None when the
    planes' two entries differ (then no folding)."""
    one, two = (table[..., ::2], table[..., 1::2]) if pairing == "interleaved" else table.chunk(2, dim=-1)
    return one if torch.equal(one, two) else None


def _fold(x: Tensor, pairing: str) -> Tensor:
    """x [..., r] summed over each plane's two dims [..., r / 2] (x . table = fold(x) . folded table)."""
    return x[..., ::2] + x[..., 1::2] if pairing == "interleaved" else sum(x.chunk(2, dim=-1))


def _weigh(
    x: Tensor,
    clean: Tensor,
    partner: Tensor,
    xa: Tensor,
    clean_a: Tensor,
    gap: Tensor,
    new_a: Tensor,
    new_b: Tensor,
    tau: float,
    compare: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """(summed weight, weight x cos_pos, weight x cos_sym) [...] of the swaps of one pivot a with its
    partners (`partner` [..., W]) over rows [..., W]: item values x, clean logits, the pivot's value xa
    and logit clean_a [..., 1], the largest gap [...], swapped[a, b] (new_a) and swapped[b, a] (new_b).

    compare="probs" is `pruning.pair_cosines` for single keys, rewritten for a pivot: the pivot's clean
    logit is the larger of the pair (its probability is), so v = (1, e^(clean_b - clean_a)), and one of
    the two new weights is 1 (the larger new logit's): (1, e^-|delta|) with the same floats."""
    w = torch.where(partner, torch.exp(((xa - x).abs() - gap[..., None]) / tau), 0.0)  # [..., W]
    if compare == "probs":
        v1 = torch.exp(clean - clean_a)  # old weights (1, v1)
        delta = new_b - new_a
        e = torch.exp(-delta.abs())  # new weights (1, e) if new_a >= new_b, else (e, 1)
        norm = torch.sqrt((1 + e * e) * (1 + v1 * v1))
        straight, crossed = (1 + e * v1) / norm, (e + v1) / norm
        first = delta <= 0
        cos_pos, cos_sym = torch.where(first, straight, crossed), torch.where(first, crossed, straight)
    else:
        cos_pos, cos_sym = pruning.pair_cosines(
            clean_a.expand_as(clean)[..., None], clean[..., None], new_a[..., None], new_b[..., None], compare
        )
    return w.sum(-1), torch.where(partner, w * cos_pos, 0.0).sum(-1), torch.where(partner, w * cos_sym, 0.0).sum(-1)


def _rows(t: Tensor, at: Tensor | None) -> Tensor:
    """t [G, H, Q, ...] as rows [G * H * Q, ...], or only the rows `at`."""
    t = t.flatten(0, 2)
    return t if at is None else t[at]


def _slot(t: Tensor, at: Tensor | None, slot: Tensor | None) -> Tensor:
    """[R, 1]: entry 0 of t [G, H, Q, S] on every row, or entry slot[k] of row at[k]."""
    t = t.flatten(0, 2)
    return t[:, :1] if at is None else t[at, slot][:, None]


def score_block(
    qk: HeadQK, rows: Tensor, ps: list[int], dtype, *, tau: float, compare: str, epsilon: float, exclude_keys=()
) -> tuple[dict[str, Tensor], Tensor]:
    """Scores of the queries `ps` (sorted positions, each with >= 2 earlier keys) of batch `rows` [G],
    every head, batched (module docstring).

    Returns (results, done): results {s_pos, s_sym, entropy, kept, bound, attn_first, top_key,
    attn_top, n_swaps: [G, H, Q]} as `pruning.score_rows` gives them (and pivots [G, H, Q], the items
    with a kept partner), and done [G, H, Q] bool, the rows scored here; the others (dense, many
    pivots) are for the per-query path and their values here are meaningless.
    """
    device = qk.q.device
    p = torch.tensor(ps, device=device)  # [Q]
    first = qk.first_keys(p)  # [Q]
    k0, k1 = int(first.min()), int(p.max())
    width = k1 - k0 + 1
    r = qk.cos.shape[-1]
    cos, sin = qk.cos[rows].to(dtype), qk.sin[rows].to(dtype)  # [G, T, r]
    q = qk.q[:, :, p][rows].to(dtype)  # [G, H, Q, d]
    qr = rotate(q, cos[:, None, p], sin[:, None, p], qk.pairing)  # [G, H, Q, d]: R_p q_p
    keys = qk.k[:, :, k0 : k1 + 1][rows].to(dtype)  # [G, H, W, d] pre-rotation
    kc, ks = cos[:, None, k0 : k1 + 1], sin[:, None, k0 : k1 + 1]  # [G, 1, W, r]
    col = k0 + torch.arange(width, device=device)  # [W] key positions
    seen = (col >= first[:, None]) & (col <= p[:, None])  # [Q, W]
    clean = swaps.soft_capped(qk.scale * qr @ rotate(keys, kc, ks, qk.pairing).transpose(-1, -2), qk.softcap)
    clean = clean.masked_fill(~seen, -math.inf)  # [G, H, Q, W]: the attention logits, unseen keys -inf
    log_d = torch.log_softmax(clean, dim=-1)  # [G, H, Q, W]
    prob = torch.softmax(clean, dim=-1)
    entropy = -torch.where(seen, prob * log_d, 0.0).sum(-1)  # [G, H, Q]
    top = log_d.max(-1)
    attn_first = (
        log_d[..., 0].exp().masked_fill(first != 0, math.nan) if k0 == 0 else torch.full_like(entropy, math.nan)
    )
    out = {"entropy": entropy, "top_key": top.indices + k0, "attn_top": top.values.exp(), "attn_first": attn_first}

    items = _movable(qk, p, k0, width, exclude_keys)  # [Q, W]
    m = items.sum(-1)  # [Q] items per query
    if int(m.min()) < 2:
        raise PosymError(
            f"excluding key positions {sorted(int(k) for k in exclude_keys)} leaves no swap for "
            f"query {int(p[m.argmin()])}"
        )
    n_swaps = m * (m - 1) // 2  # [Q]
    x = prob if compare == "probs" else clean  # [G, H, Q, W]: single-token item values
    # the kept swaps exactly as pruning.kept_counts finds them: the sorted values, partners by searchsorted
    xs, order = x.masked_fill(~items, math.inf).sort(dim=-1)  # [G, H, Q, W], the non-items last
    last = (m - 1).expand(*xs.shape[:-1])[..., None]  # [G, H, Q, 1] sorted index of the largest item
    xmin = xs[..., 0]  # [G, H, Q]
    gap = xs.gather(-1, last)[..., 0] - xmin  # G, the largest gap
    threshold = gap - torch.log(n_swaps.to(dtype) / epsilon).clamp_min(0.0) * tau  # [G, H, Q]
    rank = torch.arange(width, device=device)
    pivots = ((xs - threshold[..., None] >= xmin[..., None]) & (rank < m[:, None])).sum(-1)  # [G, H, Q]
    fast = threshold > 0  # else every swap is kept: dense
    # largest dropped gap of the non-pivots: the largest of them (sorted index m - 1 - pivots >= 1) minus min x
    below = (last[..., 0] - pivots).clamp_min(0)  # [G, H, Q]
    dropped = torch.where(below >= 1, xs.gather(-1, below[..., None])[..., 0] - xmin, -math.inf)
    # every pivot's partners and first partner left out, as kept_counts finds them: [G, H, Q, S]
    slots = max(1, int(pivots[fast].max()) if bool(fast.any()) else 1)
    index = (last - torch.arange(slots, device=device)).clamp_min(0)  # sorted index of pivot s
    xa = xs.gather(-1, index)
    limit = xa - threshold[..., None]  # pivot s keeps the partners with x <= limit
    counts = torch.searchsorted(xs, limit, right=True).minimum(index)
    real = (torch.arange(slots, device=device) < pivots[..., None]) & fast[..., None]
    counts = torch.where(real, counts, 0)
    kept = counts.sum(-1)  # [G, H, Q]
    nearest = xs.gather(-1, counts.clamp_max(width - 1))
    dropped = torch.maximum(dropped, torch.where(real & (counts < index), xa - nearest, -math.inf).amax(-1))
    done = fast & (kept <= pruning.SPARSE_LIMIT * n_swaps)  # the rows scored here; dense ones are not
    weight, pos, sym = (torch.zeros_like(gap) for _ in range(3))
    fold_c, fold_s = _folded(kc, qk.pairing), _folded(ks, qk.pairing)
    folding = fold_c is not None and fold_s is not None
    tables = (torch.cat((fold_c, fold_s), -1) if folding else torch.cat((kc, ks), -1)).transpose(
        -1, -2
    )  # [G, 1, r|2r, W]
    heads = gap.shape[1]
    # work: slot 0 of every row as one grid, then (row, slot) pairs of the rows with more pivots, in
    # pieces of at most one grid's rows
    extra = torch.where(done, pivots - 1, 0).flatten()  # [G * H * Q]
    pair_row = torch.repeat_interleave(torch.arange(extra.numel(), device=device), extra)  # [P]
    pair_slot = 1 + torch.arange(len(pair_row), device=device) - (extra.cumsum(0) - extra)[pair_row]
    step = extra.numel()
    pieces = [(None, None)] + [(pair_row[k : k + step], pair_slot[k : k + step]) for k in range(0, len(pair_row), step)]
    for at_row, at_slot in pieces:
        whole = at_row is None
        take = functools.partial(_rows, at=at_row)  # [G, H, Q, ...] -> [R, ...]
        live = take(done)  # [R]
        i, xa_r, la = (_slot(t, at_row, at_slot) for t in (index, xa, limit))  # [R, 1] each
        i = i[:, 0]
        a = take(order).gather(-1, i[:, None])  # [R, 1] the pivot's column
        x_r, clean_r = take(x), take(clean)  # [R, W]
        flat_index = torch.arange(gap.numel(), device=device) if whole else at_row
        q_r, gh = flat_index % len(ps), flat_index // len(ps)  # [R]
        g, h = gh // heads, gh % heads
        partner = (x_r <= la) & items[q_r] & live[:, None]  # [R, W]
        # swapped[a, b] for every b: (R_a^T R_p q_p) . k_b ; swapped[b, a]: (R_p q_p) . (R_b k_a)
        at = a[:, 0] + k0
        qr_r = take(qr)  # [R, d]
        u = rotate(qr_r, cos[g, at], sin[g, at], qk.pairing, inverse=True)  # [R, d]
        ka = keys[g, h, a[:, 0]]  # [R, d] the pivot's pre-rotation key
        spin = (qr_r[..., :r] * ka[..., :r], qr_r[..., :r] * rotate_pairs(ka[..., :r], qk.pairing))  # [R, r] each
        spin = torch.cat([_fold(t, qk.pairing) for t in spin] if folding else spin, -1)  # [R, r or 2r]
        fixed = (qr_r[..., r:] * ka[..., r:]).sum(-1, keepdim=True)  # [R, 1] the pass-through dims
        if whole:
            new_a = (u.view(*qr.shape) @ keys.transpose(-1, -2)).flatten(0, 2)  # [R, W]
            new_b = (spin.view(*qr.shape[:-1], -1) @ tables).flatten(0, 2) + fixed  # [R, W]
        else:
            new_a, new_b = torch.empty_like(x_r), torch.empty_like(x_r)
            for one in torch.unique_consecutive(gh).tolist():  # the pairs come in runs of one (g, h)
                sel = (gh == one).nonzero()[:, 0]
                new_a[sel] = u[sel] @ keys[one // heads, one % heads].T
                new_b[sel] = spin[sel] @ tables[one // heads, 0] + fixed[sel]
        new_a = swaps.soft_capped(qk.scale * new_a, qk.softcap)
        new_b = swaps.soft_capped(qk.scale * new_b, qk.softcap)
        sums = _weigh(x_r, clean_r, partner, xa_r, clean_r.gather(-1, a), take(gap), new_a, new_b, tau, compare)
        for total, add in zip((weight, pos, sym), sums):
            total.view(-1).index_add_(0, flat_index, add)
    dropped_weight = (n_swaps - kept) * torch.exp((dropped - gap) / tau)  # [G, H, Q]
    out.update(
        s_pos=pos / weight,
        s_sym=sym / weight,
        kept=kept,
        n_swaps=n_swaps.expand_as(kept),
        bound=2 * dropped_weight / (weight + dropped_weight),
        pivots=pivots,
    )
    return out, done
