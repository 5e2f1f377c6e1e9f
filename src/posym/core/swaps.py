"""The swapped-logit engine: queries, keys and rotary tables -> the logits of every key swap.

Swapping the residual vectors entering a layer at key positions a and b changes only entries a
and b of a query's attention row. With RoPE the logit of content b placed at position a is

    swapped[a, b] = scale * (R_p q_p) . (R_a k_b) = scale * u_a . k_b,   u_a = R_a^T R_p q_p

(k_b the pre-rotation key, `posym.qk`), so one [n, d] x [d, n] product gives every swap of a query
(`swap_logits`, or per RoPE plane `plane_swap_logits`), and a single swap costs two dot products
(`pair_logits`). Its diagonal is the clean row (`clean_logits` computes it alone in O(n d)). Every
function applies the head's attention-logit soft-capping (`HeadQK.softcap`) to whole-head logits.

The keys are the ones the query sees: positions first .. p with first = `HeadQK.first_key(p)` (0 on
global layers, p - w + 1 under a sliding window w), so index a of every row here is key position
first + a and n = p - first + 1 (docs/windows.md: swaps move only visible keys, both of them).

`scan` is the shared scaffolding of scores, geometry and discrepancy: checked prompts in batches of
equal length (`query_batches`), one forward pass per batch in eval mode (`posym.qk.capture`), a
callback per captured layer. Numbers are float64 unless a dtype is given; the model is not changed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posym.errors import PosymError
from posym.core.interop import scorable
from posym.core.qk import HeadQK, capture, check_layers, check_prompt, pair_planes, rotate

BUDGET = 1 << 22
"""Float64 elements of one vectorised chunk (~32 MB): callers size their chunks of rows, heads, channels
and swaps so that one chunk's logits stay under it (a dense head's own [n, n] logits excepted)."""


# ---- queries and batches ------------------------------------------------------------------------


def resolve_queries(queries, length: int, where: str = "prompt") -> list[int]:
    """Query positions of one prompt of `length` tokens: "last", "all" (every position with >= 2
    earlier keys) or explicit positions (each needs >= 2 earlier keys)."""
    if queries is None or queries == "last":
        queries = [length - 1]
    elif queries == "all":
        queries = list(range(2, length))
    elif isinstance(queries, str):
        raise PosymError(f"queries must be 'last', 'all' or a list of positions, got {queries!r}")
    positions = sorted({int(q) for q in queries})
    if not positions or positions[0] < 2 or positions[-1] >= length:
        raise PosymError(
            f"{where}: query positions must lie in 2..{length - 1} (two earlier keys to swap), got {list(queries)}"
        )
    return positions


def query_batches(prompts, queries, batch_size: int) -> list[tuple[list[int], dict[int, list[int]]]]:
    """Batches of equal-length prompts and, per batch, {query position: [rows of the batch]}.

    prompts: 1-D id sequences. queries: one spec for all prompts ("last", "all", positions) or one
    per prompt (see `resolve_queries`); every spec is checked before any batch is returned. Batches
    hold at most batch_size prompt indices, shortest prompts first.
    """
    per_prompt = isinstance(queries, (list, tuple)) and not all(isinstance(q, int) for q in queries)
    if per_prompt and len(queries) != len(prompts):
        raise PosymError(f"queries has {len(queries)} entries for {len(prompts)} prompts")
    wanted = [
        resolve_queries(queries[k] if per_prompt else queries, len(ids), f"prompt {k}") for k, ids in enumerate(prompts)
    ]
    by_length: dict[int, list[int]] = {}
    for k, ids in enumerate(prompts):
        by_length.setdefault(len(ids), []).append(k)
    out = []
    for length in sorted(by_length):
        group = by_length[length]
        for start in range(0, len(group), batch_size):
            batch = group[start : start + batch_size]
            jobs: dict[int, list[int]] = {}
            for row, k in enumerate(batch):
                for p in wanted[k]:
                    jobs.setdefault(p, []).append(row)
            out.append((batch, jobs))
    return out


def scan(model, input_ids, queries, work, *, layers=None, batch_size: int = 64, progress=None):
    """Yield (batch, results) per batch of equal-length prompts, results = [work(layer, qk, jobs)
    for every requested layer] from one forward pass (eval mode, `posym.qk.capture`).

    input_ids: 1-D id sequences; queries: see `query_batches`; batch: the prompt indices of the
    batch; jobs: {query position: [rows of the batch]}. Every prompt, query and layer is checked
    before the first pass. progress: optional callable(number of prompts just finished).
    model: a transformers model, an nnsight LanguageModel, a TransformerLens TransformerBridge or a
    TransformerLens 3 HookedTransformer (`posym.core.interop.scorable`).
    """
    model = scorable(model)
    layers = check_layers(model, layers)
    prompts = [check_prompt(model, ids, f"prompt {k}") for k, ids in enumerate(input_ids)]
    if not prompts:
        raise PosymError("no prompts given")
    for batch, jobs in query_batches(prompts, queries, batch_size):
        results: list = []
        ids = torch.stack([prompts[k] for k in batch]).to(model.device)
        capture(model, ids, layers, lambda layer, qk: results.append(work(layer, qk, jobs)))
        yield batch, results
        if progress is not None:
            progress(len(batch))


# ---- logits -------------------------------------------------------------------------------------


def soft_capped(logits: Tensor, softcap: float | None) -> Tensor:
    """softcap * tanh(logits / softcap) (Gemma 2 attention-logit capping), or logits when None."""
    return logits if softcap is None else softcap * torch.tanh(logits / softcap)


def unrotated_queries(qk: HeadQK, rows: Tensor, heads, p: int, dtype=torch.float64) -> tuple[Tensor, Tensor]:
    """(u, k) for query p of batch `rows` and `heads` (a slice or index list), over the keys it sees,
    positions first .. p (first = `qk.first_key(p)`, n = p - first + 1): u[g, h, a] = R_{first+a}^T R_p q_p
    (so that scale * u_a . k_b is the logit of content first+b at position first+a) and k[g, h, b] the
    pre-rotation keys, both [G, H, n, d]."""
    first = qk.first_key(p)
    rows = torch.as_tensor(rows, device=qk.q.device)
    cos, sin = (
        qk.cos[rows, first : p + 1].to(dtype)[:, None],
        qk.sin[rows, first : p + 1].to(dtype)[:, None],
    )  # [G, 1, n, r]
    q = rotate(qk.q[rows][:, heads, p].to(dtype), cos[:, :, -1], sin[:, :, -1], qk.pairing)  # [G, H, d]
    u = rotate(q[:, :, None, :], cos, sin, qk.pairing, inverse=True)  # [G, H, n, d]
    return u, qk.k[rows][:, heads, first : p + 1].to(dtype)  # [G, H, n, d] each


def swap_logits(qk: HeadQK, rows: Tensor, heads, p: int, dtype=torch.float64) -> Tensor:
    """swapped[g, h, a, b] [G, H, n, n]: the logit of key content first+b placed at position first+a
    (query p, the keys it sees: `unrotated_queries`); the diagonal is the clean row."""
    u, k = unrotated_queries(qk, rows, heads, p, dtype)
    return soft_capped(qk.scale * u @ k.transpose(-1, -2), qk.softcap)  # [G, H, n, n]


def plane_swap_logits(qk: HeadQK, rows: Tensor, heads, p: int) -> Tensor:
    """swapped[g, h, c, a, b] [G, H, C, n, n]: channel c's share of the swapped logits; channels =
    the rotary planes (frequency order) then, if any, the position-free dims. They sum to the raw
    logit, which soft-capping (a nonlinear map of the sum) would break: such heads are a PosymError."""
    if qk.softcap is not None:
        raise PosymError("per-plane logits are undefined under attention-logit soft-capping (tanh of the sum)")
    r = qk.cos.shape[-1]
    u, k = unrotated_queries(qk, rows, heads, p)  # [G, H, n, d] each
    up, kp = pair_planes(u, qk.pairing, r), pair_planes(k, qk.pairing, r)  # [G, H, n, r/2, 2]
    swapped = qk.scale * torch.einsum("ghapc,ghbpc->ghpab", up, kp)  # [G, H, r/2, n, n]
    if u.shape[-1] > r:
        free = qk.scale * u[..., r:] @ k[..., r:].transpose(-1, -2)  # [G, H, n, n]
        swapped = torch.cat((swapped, free[:, :, None]), dim=2)  # [G, H, r/2 + 1, n, n]
    return swapped


def channel_logits(qk: HeadQK, rows: Tensor, heads, p: int) -> Tensor:
    """clean[g, h, c, a] [G, H, C, n]: channel c's share of the clean row of query p (the diagonal of
    `plane_swap_logits`, in O(n d)): the rotary planes in frequency order, then the position-free dims if
    any. They sum to `clean_logits` (no soft-capping: such heads are a PosymError, as there)."""
    if qk.softcap is not None:
        raise PosymError("per-plane logits are undefined under attention-logit soft-capping (tanh of the sum)")
    r = qk.cos.shape[-1]
    u, k = unrotated_queries(qk, rows, heads, p)  # [G, H, n, d] each
    clean = qk.scale * (pair_planes(u, qk.pairing, r) * pair_planes(k, qk.pairing, r)).sum(-1)  # [G, H, n, r/2]
    if u.shape[-1] > r:
        free = qk.scale * (u[..., r:] * k[..., r:]).sum(-1)  # [G, H, n]
        clean = torch.cat((clean, free[..., None]), dim=-1)  # [G, H, n, r/2 + 1]
    return clean.transpose(-1, -2)  # [G, H, C, n]


def clean_logits(qk: HeadQK, rows: Tensor, heads, p: int, dtype=torch.float64) -> Tensor:
    """The logits [G, H, n] of query p over the keys it sees (first .. p), exactly as the model computes them."""
    u, k = unrotated_queries(qk, rows, heads, p, dtype)
    return soft_capped(qk.scale * (u * k).sum(-1), qk.softcap)  # [G, H, n]


def pair_logits(qk: HeadQK, u: Tensor, k: Tensor, row: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """swapped[row, a, b] for index tensors of one shape [P, ...]: u, k [R, n, d] (rows of
    `unrotated_queries` flattened); two gathers and a dot product per entry."""
    return soft_capped(qk.scale * (u[row, a] * k[row, b]).sum(-1), qk.softcap)  # [P, ...]
