"""Swap scores of many queries of a layer at once: every query's scores at the cost of its attention.

`posym.core.pruning.score_rows` scores the rows of ONE query position (all of equal length n); a
prompt scored at every query then costs a Python loop of T positions per layer. This module scores a
whole block of query positions of one head (`head_view`; every prompt's rows) with a handful of
matrix products, the same maths and the same proven bound per row:

- clean logits of the block: one product R_p q_p . R_j k_j per head, [queries, keys], the keys each
  query sees (`HeadQK.first_key`, so sliding windows hold) masked, exactly the attention logits;
- the kept swaps (`posym.core.pruning`): with G the largest gap and threshold t = G - c tau > 0, a kept
  swap (i, j) has x_i - x_j >= t, so its larger item i is a *pivot*, x_i >= min x + t (its partners are
  exactly {j : x_j <= x_i - t}). A peaked row has one pivot or a few. No sort: the pivots are the
  items above min x + t (the largest from one max, the others, on the few rows that have them, from
  `topk`), a pivot's partners one comparison, its first dropped partner one masked minimum;
- a pivot a of query p needs one row and one column of that query's swapped-logit matrix:
  swapped[a, b] = scale (R_a^T R_p q_p) . k_b for every b (one product with the keys) and
  swapped[b, a] = scale (R_p q_p) . (R_b k_a) = scale sum_i cos_b,i (qr_i k_a,i) + sin_b,i (qr_i (J k_a)_i)
  (+ the pass-through dims), one product with the rotary tables. The largest pivot of every row of
  the block is one pair of batched products, [queries, keys] each; the other pivots (few rows) one
  pair of products over those rows, in pieces of at most CHUNK elements;
- every pair is weighed as `pruning.score_rows` weighs it (`pair_cosines`, the weights
  exp((|x_a - x_b| - G) / tau)), summed over partners and pivots, and the bound is the same
  2 m e / (Z_K + m e) (m dropped swaps, e from the largest dropped gap).

Rows whose threshold is <= 0 or that keep more than SPARSE_LIMIT of their swaps (dense: near-uniform
heads) are weighed swap by swap on the grid of key pairs (`score_dense`: O(n^2) per row, as
`pruning.score_rows`' dense branch, without its gathered pair lists), and so is every row of the dense
reference (epsilon=None). Block swaps (blocks=M) take the per-query path (`pruning.score_rows`).

Speed: the work is elementwise passes over [rows x queries, keys] arrays, so a block is kept to at
most CHUNK elements whatever the memory budget (its arrays then stay near the processor), masks
are additive tables added once, and the per-layer pieces every block reads (the keys, rotated and not,
and the rotary tables in float64) are computed once per layer (`prepare`).

Memory: a block holds about `budget` bytes of [rows x queries, keys] float arrays (GRIDS of them at
once; default `default_budget`, the forward's own logits; never more than CHUNK elements a grid);
`query_blocks` sizes the blocks, so a tiny budget only makes more, smaller blocks with the same
numbers. `prepare` holds two [rows, heads, T, head_dim] float arrays per layer on top.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

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


GRIDS = 16
"""[rows, keys] arrays a block holds at most (the `Scratch` buffers: clean logits, shifted logits,
probabilities, the items' values with non-items +inf and -inf, a search temporary, a pivot's row and
column of swapped logits, the weights, v1, c, a cosine temporary; three boolean masks; and the pivots
after each row's first, taken in pieces of at most a grid's elements): the budget's divisor."""

CHUNK = 1 << 17
"""The most elements of one block's [rows, keys] grid, whatever the budget (1 MiB per float64 array):
a block's arrays stay in the cache, so each of its elementwise passes runs at the processor's speed,
not the memory's (on SmolLM2 at 512 tokens a layer's blocks of the forward's logits took 1.6x the
processor time of blocks of this size)."""


def query_blocks(positions: list[int], first_key, rows: int, budget: int, dtype=torch.float64) -> list[list[int]]:
    """Consecutive runs of the sorted query `positions` whose [rows, keys] grids fit the budget.

    rows: batch rows x heads scored together; first_key(p): the first key query p sees. A block of
    queries p0..p1 spans keys first_key(p0)..p1; it holds rows x queries x keys elements GRIDS times,
    and at most CHUNK elements a grid. A single query always forms a block, whatever the budget.

    >>> query_blocks([2, 3, 4, 5, 6, 7], lambda p: 0, rows=1, budget=16 * 8 * 12)
    [[2, 3], [4, 5], [6], [7]]
    """
    limit = max(1, min(CHUNK, budget // (GRIDS * torch.finfo(dtype).bits // 8)))
    blocks: list[list[int]] = []
    for p in positions:
        if blocks and rows * (len(blocks[-1]) + 1) * (p - first_key(blocks[-1][0]) + 1) <= limit:
            blocks[-1].append(p)
        else:
            blocks.append([p])
    return blocks


def _folded(table: Tensor, pairing: str) -> Tensor | None:
    """The table [..., r] with each plane's two equal entries kept once [..., r / 2], or None when the
    planes' two entries differ (then no folding)."""
    one, two = (table[..., ::2], table[..., 1::2]) if pairing == "interleaved" else table.chunk(2, dim=-1)
    return one if torch.equal(one, two) else None


def _fold(x: Tensor, pairing: str) -> Tensor:
    """x [..., r] summed over each plane's two dims [..., r / 2] (x . table = fold(x) . folded table)."""
    return x[..., ::2] + x[..., 1::2] if pairing == "interleaved" else sum(x.chunk(2, dim=-1))


class Scratch:
    """Flat work buffers that every block reuses, by role: a block's dozen [rows, keys] arrays are
    then allocated once per scan, not once per block. Fresh arrays of a megabyte each come from the
    kernel as new pages (page faults and zeroing), which cost as much as the arithmetic on them (on
    SmolLM2 at 512 tokens, the weighing of a block took 3x its arithmetic's time with fresh arrays).
    A buffer grows to the largest block asked of it; nothing is kept between scans."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], Tensor] = {}

    def __call__(self, role: str, shape: tuple[int, ...], dtype, device) -> Tensor:
        """An uninitialised array of `shape` for `role` (the same memory each time the role is asked)."""
        size = math.prod(shape)
        buffer = self._buffers.get((role, dtype))
        if buffer is None or buffer.numel() < size or buffer.device != torch.device(device):
            buffer = self._buffers[(role, dtype)] = torch.empty(size, dtype=dtype, device=device)
        return buffer[:size].view(shape)


@dataclass
class Tables:
    """What every block of one layer reads, for batch rows `rows`, in the score dtype: computed once
    per layer (`prepare`), since a block of a few queries would otherwise redo O(T d) work per head
    for its O(queries T)."""

    keys: Tensor
    """Pre-rotation keys [G, H, T, d]."""
    rotated: Tensor
    """Rotated keys R_j k_j [G, H, T, d]."""
    cos: Tensor
    """Rotary cosines [G, T, r]."""
    sin: Tensor
    """Rotary sines [G, T, r]."""
    planes: Tensor
    """[G, 1, r or 2r, T]: the tables of swapped[b, a] = scale (spin . planes[:, b] + fixed): each plane's
    cos then sin, folded to one entry per plane when its two dims share them."""
    folding: bool
    """Whether `planes` is folded (then the spin vector is too)."""
    excluded: Tensor
    """[T] bool: the key positions no swap moves (exclude_keys)."""
    scratch: Scratch
    """The blocks' work buffers."""


def prepare(qk: HeadQK, rows: Tensor, dtype, exclude_keys=(), scratch: Scratch | None = None) -> Tables:
    """The `Tables` of layer `qk` for batch rows `rows` [G] (scratch: buffers to reuse, e.g. one per scan)."""
    cos, sin = qk.cos[rows].to(dtype), qk.sin[rows].to(dtype)  # [G, T, r]
    keys = qk.k[rows].to(dtype)  # [G, H, T, d]
    rotated = rotate(keys, cos[:, None], sin[:, None], qk.pairing)  # [G, H, T, d]
    fold_c, fold_s = _folded(cos, qk.pairing), _folded(sin, qk.pairing)
    folding = fold_c is not None and fold_s is not None
    planes = (torch.cat((fold_c, fold_s), -1) if folding else torch.cat((cos, sin), -1)).transpose(-1, -2)[:, None]
    excluded = torch.zeros(qk.q.shape[2], dtype=torch.bool, device=qk.q.device)  # [T]
    fixed = sorted({int(key) for key in exclude_keys if 0 <= int(key) < len(excluded)})
    excluded[fixed] = True
    return Tables(keys, rotated, cos, sin, planes.contiguous(), folding, excluded, scratch or Scratch())


def head_view(qk: HeadQK, t: Tables, h: int) -> tuple[HeadQK, Tables]:
    """Layer `qk` and its `prepare` tables restricted to head h (views, nothing copied), for `score_block`.

    A block of one head's queries makes each of its products one [queries, d] x [d, keys] matrix
    product: on SmolLM2 (9 heads, head dim 64, float64) a block of 126 queries of one head took 0.54 ms
    where 9 heads x 14 queries (the same elements) took 2.8 ms, products of a few rows being slow."""
    one = slice(h, h + 1)
    return dataclasses.replace(qk, q=qk.q[:, one], k=qk.k[:, one]), dataclasses.replace(
        t, keys=t.keys[:, one], rotated=t.rotated[:, one]
    )


def _grouped(u: Tensor, group: Tensor, mats: Tensor) -> Tensor:
    """u[i] @ mats[group[i]] for every i: u [P, k], group [P] (sorted), mats [M, k, W] -> [P, W], from
    one batched product with each group's rows padded to the largest group (one group: one product)."""
    if mats.shape[0] == 1:
        return u @ mats[0]
    counts = torch.bincount(group, minlength=mats.shape[0])  # [M]
    slot = torch.arange(len(group), device=u.device) - (counts.cumsum(0) - counts)[group]  # [P]
    padded = u.new_zeros(mats.shape[0], int(counts.max()), u.shape[-1])  # [M, most, k]
    padded[group, slot] = u
    return (padded @ mats)[group, slot]  # [P, W]


def _pivot_logits(qk: HeadQK, t: Tables, qr: Tensor, key: Tensor, g: Tensor, h: Tensor, k0: int, k1: int):
    """(swapped[a, b] for every b, swapped[b, a] for every b) [..., W] of pivots at key positions `key`
    of rows with rotated queries qr [..., d], batch rows g and heads h (broadcast to one leading shape):
    batched products into scratch buffers for a whole [G, H, Q] block, `_grouped` products over (g, h)
    for a flat list of rows."""
    r = qk.cos.shape[-1]
    u = rotate(qr, t.cos[g, key], t.sin[g, key], qk.pairing, inverse=True)  # [..., d]: R_a^T R_p q_p
    ka = t.keys[g, h, key]  # [..., d] the pivot's pre-rotation key
    spin = (qr[..., :r] * ka[..., :r], qr[..., :r] * rotate_pairs(ka[..., :r], qk.pairing))  # [..., r] each
    spin = torch.cat([_fold(s, qk.pairing) for s in spin] if t.folding else spin, -1)  # [..., r or 2r]
    fixed = (qr[..., r:] * ka[..., r:]).sum(-1, keepdim=True)  # [..., 1] the pass-through dims
    keys = t.keys[:, :, k0 : k1 + 1]  # [G, H, W, d]
    planes = t.planes[..., k0 : k1 + 1]  # [G, 1, r', W]
    if qr.dim() == 4:  # a whole block [G, H, Q, d]
        shape = (*qr.shape[:-1], k1 - k0 + 1)
        new_a = torch.matmul(u, keys.transpose(-1, -2), out=t.scratch("new_a", shape, qr.dtype, qr.device))
        new_b = torch.matmul(spin, planes, out=t.scratch("new_b", shape, qr.dtype, qr.device))
    else:  # a flat list of rows [P, d]
        new_a = _grouped(u, g * keys.shape[1] + h, keys.flatten(0, 1).transpose(-1, -2))  # [P, W]
        new_b = _grouped(spin, g, planes[:, 0])
    return swaps.soft_capped(new_a.mul_(qk.scale), qk.softcap), swaps.soft_capped(
        new_b.add_(fixed).mul_(qk.scale), qk.softcap
    )


def _weigh(t: Tables, x, logits, partner, xa, logit_a, gap, new_a, new_b, tau: float, compare: str):
    """(summed weight, weight x cos_pos, weight x cos_sym) [...] of the swaps of one pivot a with its
    partners (`partner` [..., W]) over rows [..., W]: item values x, clean logits (finite), the pivot's
    value xa and logit logit_a [..., 1], the largest gap [...], swapped[a, b] (new_a) and swapped[b, a]
    (new_b), both overwritten.

    compare="probs" is `pruning.pair_cosines` for single keys, rewritten for a pivot: the pivot's
    probability is the larger of the pair, so the old weights are v = (1, v1), v1 = p_b / p_a, and one
    of the two new weights is 1 (the larger new logit's): (c, d) = (1, e^delta) if delta = new_b - new_a
    <= 0, else (e^-delta, 1); cos_pos = (c + d v1) / |.|, cos_sym = (d + c v1) / |.|. A weight's
    exponent is masked before exp (non-partners' would be far below -700, where exp is slow)."""
    work = functools.partial(t.scratch, shape=x.shape, dtype=x.dtype, device=x.device)
    w = torch.sub(xa, x, out=work("w")).sub_(gap[..., None]).div_(tau)  # [..., W] exponents
    w = torch.where(partner, w, x.new_tensor(-math.inf), out=w).exp_()  # a partner's weight, else 0
    if compare != "probs":
        cos_pos, cos_sym = pruning.pair_cosines(
            logit_a.expand_as(logits)[..., None], logits[..., None], new_a[..., None], new_b[..., None], compare
        )
        return w.sum(-1), torch.where(partner, w * cos_pos, 0.0).sum(-1), torch.where(partner, w * cos_sym, 0.0).sum(-1)
    v1 = torch.div(x, xa, out=work("v1"))  # [..., W] p_b / p_a
    delta = new_b.sub_(new_a)
    # one exp for both: e^-|delta| is c where delta > 0 and d elsewhere, the other one is 1 (bit for bit
    # the two exps it replaces: e^-delta, e^delta and e^0 = 1)
    e = torch.abs(delta, out=work("c")).neg_().exp_()  # [..., W]
    up = torch.gt(delta, 0.0, out=t.scratch("up", x.shape, torch.bool, x.device))
    one = x.new_ones(())
    d = torch.where(up, one, e, out=delta)  # e^delta where delta <= 0, else 1
    c = torch.where(up, e, one, out=e)  # 1 where delta <= 0, else e^-delta
    norm = torch.mul(c, c, out=new_a).addcmul_(d, d).mul_(torch.mul(v1, v1, out=work("tmp")).add_(1.0)).sqrt_()
    weight = w.sum(-1)
    k = w.div_(norm)  # [..., W]: the weight over the two vectors' norms
    pos = torch.linalg.vecdot(k, torch.addcmul(c, d, v1, out=work("tmp")))
    sym = torch.linalg.vecdot(k, torch.addcmul(d, c, v1, out=work("tmp")))
    return weight, pos, sym


def score_block(
    qk: HeadQK,
    rows: Tensor,
    ps: list[int],
    dtype,
    *,
    tau: float,
    compare: str,
    epsilon: float,
    exclude_keys=(),
    tables: Tables | None = None,
) -> tuple[dict[str, Tensor], Tensor]:
    """Scores of the queries `ps` (sorted positions, each with >= 2 earlier keys) of batch `rows` [G],
    every head, batched (module docstring). tables: `prepare(qk, rows, dtype, exclude_keys)`, computed
    here if not given.

    Returns (results, done): results {s_pos, s_sym, entropy, kept, bound, attn_first, top_key,
    attn_top, n_swaps: [G, H, Q]} as `pruning.score_rows` gives them (and pivots [G, H, Q], the items
    with a kept partner), and done [G, H, Q] bool, the rows scored here; the others (dense: near-uniform
    rows) are for `score_dense` and their values here are meaningless.
    """
    t = tables if tables is not None else prepare(qk, rows, dtype, exclude_keys)
    device = qk.q.device
    p = torch.tensor(ps, device=device)  # [Q]
    k0, k1 = qk.first_key(ps[0]), ps[-1]  # the block's keys: first_key grows with the position
    col = torch.arange(k0, k1 + 1, device=device)  # [W] key positions
    first = qk.first_keys(p)  # [Q]
    seen = (col >= first[:, None]) & (col <= p[:, None])  # [Q, W]
    items = seen & (col < p[:, None]) & ~t.excluded[k0 : k1 + 1]  # [Q, W]: the movable keys
    m = items.sum(-1)  # [Q] items per query
    if int(m.min()) < 2:
        raise PosymError(
            f"excluding key positions {sorted(int(k) for k in exclude_keys)} leaves no swap for "
            f"query {int(p[m.argmin()])}"
        )
    inf = torch.tensor(math.inf, dtype=dtype, device=device)
    zero = torch.zeros((), dtype=dtype, device=device)
    heads = qk.q.shape[1]
    shape = (len(rows), heads, len(ps), k1 - k0 + 1)  # [G, H, Q, W]
    work = functools.partial(t.scratch, shape=shape, dtype=dtype, device=device)

    qr = rotate(qk.q[:, :, p][rows].to(dtype), t.cos[:, None, p], t.sin[:, None, p], qk.pairing)  # [G, H, Q, d]
    logits = torch.matmul(qk.scale * qr, t.rotated[:, :, k0 : k1 + 1].transpose(-1, -2), out=work("logits"))
    logits = swaps.soft_capped(logits, qk.softcap)  # [G, H, Q, W]: the attention logits (finite; unseen keys too)
    shifted = torch.add(logits, torch.where(seen, zero, -inf), out=work("shifted"))  # unseen keys -inf
    top = shifted.max(-1)  # the largest logit and its key
    shifted.sub_(top.values[..., None])  # logit - max
    prob = torch.exp(shifted, out=work("prob"))  # [G, H, Q, W] unnormalised
    total = prob.sum(-1)  # Z
    prob.div_(total[..., None])  # the attention row, as softmax(clean) computes it
    # entropy = log Z - sum_j p_j (logit_j - max): both terms >= 0; unseen keys (p_j = 0) kept finite
    entropy = total.log() - torch.linalg.vecdot(prob, shifted.clamp_min_(torch.finfo(dtype).min))
    attn_top = prob.gather(-1, top.indices[..., None])[..., 0]  # [G, H, Q]
    attn_first = prob[..., 0].masked_fill(first != 0, math.nan) if k0 == 0 else torch.full_like(entropy, math.nan)
    out = {"entropy": entropy, "top_key": top.indices + k0, "attn_top": attn_top, "attn_first": attn_first}

    n_swaps = m * (m - 1) // 2  # [Q]
    x = prob if compare == "probs" else logits  # [G, H, Q, W]: single-token item values (finite)
    high = torch.where(items, zero, -inf)  # [Q, W]
    x_lo = torch.add(x, torch.where(items, zero, inf), out=work("x_lo"))  # non-items +inf
    x_hi = torch.add(x, high, out=work("x_hi"))  # non-items -inf
    xmin = x_lo.amin(-1)  # [G, H, Q]
    xmax, a0 = x_hi.max(-1)  # the largest item: the first pivot
    gap = xmax - xmin  # G, the largest gap
    threshold = gap - torch.log(n_swaps.to(dtype) / epsilon).clamp_min(0.0) * tau  # [G, H, Q]
    fast = threshold > 0  # else every swap is kept: dense
    below = torch.sub(x_hi, threshold[..., None], out=work("tmp"))
    pivotal = torch.ge(below, xmin[..., None], out=t.scratch("pivotal", shape, torch.bool, device))  # as kept_counts
    pivots = pivotal.sum(-1)  # [G, H, Q]
    # the largest dropped gap: the largest non-pivot's with min x (when it is not min x itself) ...
    rest = torch.where(pivotal, -inf, x_hi, out=below).amax(-1)
    dropped = torch.where(m - pivots >= 2, rest - xmin, -inf)  # [G, H, Q]
    # ... and each pivot's with its first partner left out (the smallest item above its limit)
    index = (m - 1).expand_as(pivots)  # items below the first pivot
    partner = torch.le(x_lo, (xmax - threshold)[..., None], out=t.scratch("partner", shape, torch.bool, device))
    counts = partner.sum(-1).minimum(index)  # [G, H, Q]
    nearest = torch.where(partner, inf, x_lo, out=below).amin(-1)
    dropped = torch.maximum(dropped, torch.where(counts < index, xmax - nearest, -inf))
    kept = torch.where(fast, counts, 0)

    # the other pivots: (row, slot) pairs of the rows that have them
    flat = (gap.numel(), -1)  # [G, H, Q, W] -> [rows, W]
    many = (fast & (pivots >= 2)).flatten().nonzero()[:, 0]  # [E] flat rows
    if len(many):
        above = x.view(flat)[many] + high[many % len(ps)]  # [E, W]: their items' values, non-items -inf
        above[torch.arange(len(many), device=device), a0.flatten()[many]] = -inf  # the first pivot is done
        slots = above.topk(int(pivots.flatten()[many].max()) - 1, dim=-1)  # [E, S - 1] pivots 1..S-1
        extra = pivots.flatten()[many] - 1
        pair = torch.repeat_interleave(torch.arange(len(many), device=device), extra)  # [P] row of each pair
        slot = torch.arange(len(pair), device=device) - (extra.cumsum(0) - extra)[pair]  # [P] 0-based
        at = many[pair]  # [P] flat row
        xa, a = slots.values[pair, slot], slots.indices[pair, slot]  # [P] the pivot's value and column
        limit = (xa - threshold.flatten()[at])[:, None]  # [P, 1] a partner's largest value
        pair_index = index.flatten()[at] - 1 - slot  # items below pivot slot + 1
        step = max(1, CHUNK // shape[-1])  # pairs a piece: its [pairs, W] arrays no larger than a block's grid
        for piece in torch.arange(len(at), device=device).split(step):
            xl = x_lo.view(flat)[at[piece]]  # [p, W]
            pair_partner = xl <= limit[piece]  # [p, W]
            pair_counts = pair_partner.sum(-1).minimum(pair_index[piece])
            pair_near = torch.where(pair_partner, inf, xl).amin(-1)
            kept.view(-1).index_add_(0, at[piece], pair_counts)
            gaps = torch.where(pair_counts < pair_index[piece], xa[piece] - pair_near, -inf)
            dropped.view(-1).scatter_reduce_(0, at[piece], gaps, "amax")
    done = fast & (kept <= pruning.SPARSE_LIMIT * n_swaps)  # the rows scored here; dense ones are not

    # the first pivot of every row: one pair of batched products
    g = torch.arange(len(rows), device=device)[:, None, None]  # [G, 1, 1]
    h = torch.arange(heads, device=device)[:, None]  # [H, 1]
    new_a, new_b = _pivot_logits(qk, t, qr, a0 + k0, g, h, k0, k1)  # [G, H, Q, W] each
    logit_a = logits.gather(-1, a0[..., None])
    weight, pos, sym = _weigh(t, x, logits, partner, xmax[..., None], logit_a, gap, new_a, new_b, tau, compare)
    if len(many):
        live = done.flatten()[at]  # [P] pairs of rows scored here
        at, a, xa, limit = at[live], a[live], xa[live], limit[live]
        for piece in torch.arange(len(at), device=device).split(step):
            rows_at = at[piece]  # [p] flat rows
            gh = rows_at // len(ps)
            new_a, new_b = _pivot_logits(
                qk, t, qr.flatten(0, 2)[rows_at], a[piece] + k0, gh // heads, gh % heads, k0, k1
            )
            lg = logits.view(flat)[rows_at]  # [p, W]
            sums = _weigh(
                t,
                x.view(flat)[rows_at],
                lg,
                x_lo.view(flat)[rows_at] <= limit[piece],
                xa[piece, None],
                lg.gather(-1, a[piece, None]),
                gap.flatten()[rows_at],
                new_a,
                new_b,
                tau,
                compare,
            )
            for total, add in zip((weight, pos, sym), sums):
                total.view(-1).index_add_(0, rows_at, add)
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


def _unit_cosines(delta: Tensor, old: Tensor) -> tuple[Tensor, Tensor]:
    """`pruning.pair_cosines`' (cos_pos, cos_sym) for single keys from the differences of the new logits
    (delta = new_b - new_a) and of the old ones (old = old_b - old_a): each pair of weights shifted by its
    own max is (e^-max(delta, 0), e^min(delta, 0)), and the same of `old`."""
    c, d = torch.exp(-delta.clamp_min(0.0)), torch.exp(delta.clamp_max(0.0))  # the new weights
    v0, v1 = torch.exp(-old.clamp_min(0.0)), torch.exp(old.clamp_max(0.0))  # the old weights
    norm = torch.sqrt((c * c + d * d) * (v0 * v0 + v1 * v1))
    return (c * v0 + d * v1) / norm, (c * v1 + d * v0) / norm


SMALLEST = 1e-150
"""The smallest key probability `score_dense` weighs through `_probs_sums` (its square stays a normal
float64); a row with a smaller one takes the logit differences (`_unit_cosines`)."""


def _probs_sums(delta: Tensor, pi: Tensor, pj: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """(sum w (cos_pos + cos_sym), sum w (cos_pos - cos_sym)) [h] over a piece of swaps (i, j) for
    compare="probs", from delta = new_b - new_a [h, c, M'] (overwritten), the probabilities p_i [h, c, 1]
    and p_j [h, 1, M'] and the weights w [h, c, M'] (overwritten).

    `pair_cosines` for single keys: the old weights are (p_i, p_j) and the new ones, scaled by the
    larger, (c, d) = (1, t) if delta <= 0 else (t, 1), t = e^-|delta| (one exponential). Then
    cos_pos + cos_sym = (1 + t)(p_i + p_j) / N and cos_pos - cos_sym = +-(1 - t)(p_i - p_j) / N (+ where
    delta <= 0), N = sqrt(1 + t^2) |(p_i, p_j)|."""
    t = delta.abs().neg_().exp_()  # [h, c, M']
    norm = torch.mul(t, t).add_(1.0).sqrt_()  # |(c, d)|
    plus = torch.add(t, 1.0).div_(norm)  # (1 + t) / |(c, d)|
    minus = torch.rsub(t, 1.0).div_(norm)
    minus = torch.where(delta > 0, minus.neg(), minus)
    k = w.div_(torch.hypot(pi, pj))  # the weight over |(p_i, p_j)|
    both = torch.linalg.vecdot(k, plus.mul_(pi + pj)).sum(-1)
    return both, torch.linalg.vecdot(k, minus.mul_(pi - pj)).sum(-1)


def score_dense(
    qk: HeadQK,
    row: int,
    heads: list[int],
    p: int,
    dtype,
    *,
    tau: float,
    compare: str,
    exclude_keys=(),
    tables: Tables | None = None,
    g: int = 0,
) -> dict:
    """Every swap of query p at batch row `row` for `heads`, weighed (the rows `score_block` leaves: a
    near-uniform row keeps more than SPARSE_LIMIT of its swaps): `pruning.score_rows`' dense branch on
    the grid of item pairs i < j (its upper triangle), in pieces of at most CHUNK elements, instead of
    gathered pair lists.
    tables, g: `prepare`'s tables of the batch rows and row's index among them (default: prepared here).
    Returns `pruning.score_rows`' keys, [len(heads)] each (kept = n_swaps, bound 0)."""
    t = tables if tables is not None else prepare(qk, torch.tensor([row]), dtype, exclude_keys)
    first = qk.first_key(p)
    movable = ~t.excluded[first:p]  # [p - first] the keys first .. p - 1 that may move
    items = movable.nonzero()[:, 0]  # [M] key indices (relative to first)
    hs = torch.tensor(heads, device=qk.q.device)
    cos, sin = t.cos[g, first : p + 1], t.sin[g, first : p + 1]  # [n, r]
    qr = rotate(qk.q[row, hs, p].to(dtype), t.cos[g, p], t.sin[g, p], qk.pairing)  # [h, d]
    u = rotate(qr[:, None], cos, sin, qk.pairing, inverse=True)  # [h, n, d]
    k = t.keys[g, hs, first : p + 1]  # [h, n, d]
    clean = swaps.soft_capped(qk.scale * (u * k).sum(-1), qk.softcap)  # [h, n], as score_rows
    log_d = torch.log_softmax(clean, dim=-1)
    entropy = -(log_d.exp() * log_d).sum(-1)
    x = pruning.item_values(clean, items[:, None], compare)  # [h, M]
    top = x.amax(-1) - x.amin(-1)  # [h] the largest gap
    weight, pos, sym = (torch.zeros(len(heads), dtype=dtype, device=qk.q.device) for _ in range(3))
    ku, kk, old = u[:, items], k[:, items], clean[:, items]  # [h, M, d], [h, M, d], [h, M]
    # probabilities whose squares stay normal weigh with (p_i, p_j) as the old weights (`_probs_sums`)
    probs = compare == "probs" and bool((x > SMALLEST).all())
    step = max(1, CHUNK // (len(items) * len(heads)))  # grid rows per piece
    for start in range(0, len(items), step):
        part, rest = slice(start, start + step), slice(start, None)  # rows i, columns j >= the piece's first i
        new_a = swaps.soft_capped(qk.scale * ku[:, part] @ kk[:, rest].transpose(-1, -2), qk.softcap)  # [h, c, M']
        new_b = swaps.soft_capped(qk.scale * kk[:, part] @ ku[:, rest].transpose(-1, -2), qk.softcap)  # content i at j
        xi, xj = x[:, part, None], x[:, None, rest]  # [h, c, 1], [h, 1, M']
        w = torch.sub(xi, xj).abs_().sub_(top[:, None, None]).div_(tau).exp_()  # [h, c, M']
        w[..., : w.shape[1]].triu_(1)  # each swap once: j > i (the piece's own columns)
        weight += w.sum((-1, -2))
        if probs:
            plus, minus = _probs_sums(new_b.sub_(new_a), xi, xj, w)
            pos += (plus + minus) / 2
            sym += (plus - minus) / 2
            continue
        ci, cj = old[:, part, None], old[:, None, rest]  # [h, c, 1], [h, 1, M']
        if compare == "probs":
            cos_pos, cos_sym = _unit_cosines(new_b - new_a, cj - ci)
        else:
            cos_pos, cos_sym = pruning.pair_cosines(
                ci.expand_as(new_a)[..., None],
                cj.expand_as(new_a)[..., None],
                new_a[..., None],
                new_b[..., None],
                compare,
            )
        pos += (w * cos_pos).sum((-1, -2))
        sym += (w * cos_sym).sum((-1, -2))
    n_swaps = len(items) * (len(items) - 1) // 2
    return {
        "s_pos": pos / weight,
        "s_sym": sym / weight,
        "entropy": entropy,
        "kept": torch.full((len(heads),), n_swaps),
        "bound": torch.zeros(len(heads), dtype=dtype),
        "n_swaps": n_swaps,
        **pruning.sink_view(log_d, first),
    }
