"""Positional and symbolic head scores (SPEC section 3): exact, one forward pass per prompt.

For a head, a prompt and a query position q, D is the softmax of the query's logits over keys
0..q. Swapping the residual vectors entering the layer at two key positions i < j < q changes only
the entries i and j of that attention row, so every swap follows from one matrix of "swapped"
logits: swapped[a, b] = logit at key position a if it held the content of position b. With RoPE
that is q_rot . R_a k_b * scale = (R_a^T q_rot) . k_b * scale (k_b the pre-rotation key), one
[n, d] x [d, n] product per query and head instead of re-running the layer per swap.

Three lines from a notebook:

    from posym.scores import score_model, summarize
    frame = score_model(model, [[17, 3, 9, 2, 5, 1]], queries="last")   # any supported HF causal LM
    print(summarize(frame))                                             # mean s_pos/s_sym + label

Public API
- `swap_scores(clean, swapped, tau=1e-4, blocks=None, compare="probs")`: the pure maths for one query
  (theory builds `clean`/`swapped` from its own constructions).
- `score_model(model, input_ids, queries=None, ...)`: a DataFrame with one row per (prompt, query,
  layer, head); `iter_scores` yields the same rows in batches (streamed to Parquet by `posym score`).
- `head_qk(model, input_ids, layer)`: per-head pre-rotation queries and keys of one layer plus the
  model's own rotary cos/sin and the pairing convention (`pair_planes` turns them into RoPE planes),
  for per-plane analysis (geometry).
- `summarize(frame, gamma=0.1)`: per (layer, head) mean scores and a label.
"""

from __future__ import annotations



import torch
from torch import Tensor

from posym.errors import PosymError


def _pair_blocks(keys: int, blocks: int | None) -> tuple[Tensor, Tensor]:
    """Index tensors [swaps, size] of the key positions exchanged by each swap.

    Single-token swaps (blocks=None) are all pairs i < j of the keys 0..keys-1. With blocks=M the
    keys are cut into M contiguous blocks of size keys // M aligned to the query end (the oldest
    keys % M keys stay put, so the blocks have equal sizes), and block A swaps with block B
    element-wise (the k-th key of A with the k-th of B).
    """
    if blocks is None:
        i, j = torch.triu_indices(keys, keys, offset=1)  # [2, swaps]
        return i[:, None], j[:, None]
    if isinstance(blocks, bool) or not isinstance(blocks, int) or not 2 <= blocks <= keys:
        raise PosymError(f"blocks must be an integer between 2 and the number of keys ({keys}), got {blocks!r}")
    size = keys // blocks
    start = keys - size * blocks
    block_ids = start + torch.arange(blocks * size).view(blocks, size)  # [blocks, size]
    a, b = torch.triu_indices(blocks, blocks, offset=1)  # [2, swaps]
    return block_ids[a], block_ids[b]


def _cosine(u0: Tensor, u1: Tensor, w0: Tensor, w1: Tensor) -> Tensor:
    """cos((u0, u1), (w0, w1)) elementwise; a zero vector has cosine 0 with anything."""
    norm = torch.sqrt((u0 * u0 + u1 * u1) * (w0 * w0 + w1 * w1))
    return (u0 * w0 + u1 * w1) / norm.clamp_min(torch.finfo(norm.dtype).tiny)


def swap_scores(
    clean: Tensor,
    swapped: Tensor,
    *,
    tau: float = 1e-4,
    blocks: int | None = None,
    compare: str = "probs",
) -> dict[str, Tensor | int]:
    """Positional and symbolic scores of one query row (computed in float64).

    clean   [..., n]     logits of the query (position n-1) over keys 0..n-1.
    swapped [..., n, n]  swapped[..., a, b] = logit at key position a holding the content of b
                         (its diagonal equals `clean`). Swaps move keys 0..n-2; the query never moves.
    tau: temperature of the swap weights alpha = softmax(|D_i - D_j| / tau) (1e-4: nearly a hard max).
    blocks: None for single-token swaps (2605), M for swaps of M contiguous key blocks compared by
        block means (2511; see `_pair_blocks`).
    compare: "probs" compares softmax probabilities (the paper); "logits" puts the raw logits in
        v, v' and the swap weights instead.
    Returns s_pos [...], s_sym [...], entropy [...] (nats, of softmax(clean)), n_swaps (int).
    """
    if compare not in ("probs", "logits"):
        raise PosymError(f"compare must be 'probs' or 'logits', got {compare!r}")
    if not tau > 0:
        raise PosymError(f"tau must be positive, got {tau}")
    n = clean.shape[-1]
    if swapped.shape[-2:] != (n, n) or swapped.shape[:-2] != clean.shape[:-1]:
        raise PosymError(f"swapped must have shape [..., {n}, {n}] matching clean, got {tuple(swapped.shape)}")
    if n < 3:
        raise PosymError(f"a query needs at least 2 earlier keys to swap, got {n - 1}")
    clean = clean.to(torch.float64)
    swapped = swapped.to(torch.float64)
    log_d = torch.log_softmax(clean, dim=-1)  # [..., n]
    entropy = -(log_d.exp() * log_d).sum(-1)  # [...]

    a, b = _pair_blocks(n - 1, blocks)  # [swaps, size] each
    old_a, old_b = clean[..., a], clean[..., b]  # [..., swaps, size]
    new_a, new_b = swapped[..., a, b], swapped[..., b, a]  # [..., swaps, size]: a now holds b's content
    if compare == "logits":
        v0, v1 = old_a.mean(-1), old_b.mean(-1)  # [..., swaps]
        w0, w1 = new_a.mean(-1), new_b.mean(-1)
        gap = (v0 - v1).abs()
    else:
        # D' = exp(new) / Z' and the cosine ignores the common factor 1/Z', so only the direction of
        # (exp(new_a), exp(new_b)) matters: shift by the pair's own max and nothing under/overflows.
        m_new = torch.maximum(new_a.amax(-1), new_b.amax(-1))[..., None]  # [..., swaps, 1]
        w0, w1 = (new_a - m_new).exp().mean(-1), (new_b - m_new).exp().mean(-1)  # [..., swaps]
        m_old = torch.maximum(old_a.amax(-1), old_b.amax(-1))[..., None]
        v0, v1 = (old_a - m_old).exp().mean(-1), (old_b - m_old).exp().mean(-1)
        gap = (log_d[..., a].exp().mean(-1) - log_d[..., b].exp().mean(-1)).abs()  # |D_A - D_B|
    alpha = torch.softmax(gap / tau, dim=-1)  # [..., swaps]
    s_pos = (alpha * _cosine(w0, w1, v0, v1)).sum(-1)  # [...]
    s_sym = (alpha * _cosine(w0, w1, v1, v0)).sum(-1)  # [...]
    return {"s_pos": s_pos, "s_sym": s_sym, "entropy": entropy, "n_swaps": a.shape[0]}
