"""Positional and symbolic head scores (SPEC section 3): exact, one forward pass per prompt.

For a head, a prompt and a query position q, D is the softmax of the query's logits over keys
0..q. Swapping the residual vectors entering the layer at two key positions i < j < q changes only
the entries i and j of that attention row, so every swap follows from one matrix of "swapped"
logits: swapped[a, b] = logit at key position a if it held the content of position b. With RoPE
that is q_rot . R_a k_b * scale = (R_a^T q_rot) . k_b * scale (k_b the pre-rotation key), one
[n, d] x [d, n] product per query and head instead of re-running the layer per swap.

Three lines from a notebook:

    from posym.core.scores import score_model, summarize_heads
    frame = score_model(model, [[17, 3, 9, 2, 5, 1]], queries="last")   # any supported HF causal LM
    print(summarize_heads(frame))                                       # mean s_pos/s_sym + label

Public API
- `swap_scores(clean, swapped, tau=1e-4, blocks=None, compare="probs")`: the pure maths for one query
  (`posym.core.constructions` builds `clean`/`swapped` for its heads).
- `score_model(model, input_ids, queries=None, ...)`: a DataFrame with one row per (prompt, query,
  layer, head); `iter_scores` yields the same rows in batches (streamed to Parquet by `posym score`).
- `hop_queries(chain)`: the pointer positions of a task chain; `resolve_queries` / `query_batches`
  turn query specs into positions and equal-length batches (geometry batches the same way);
  `task_prompts` draws test-split task prompts with their queries (`queries_for`); prompt files
  and Parquet output are `posym.loading`'s.
- `summarize_heads(frame, gamma=0.1)`: per (layer, head) mean scores and a label.
- `BUDGET` caps the elements of one vectorised chunk (here and in geometry).

The queries, keys and rotary tables come from `posym.core.qk` (GPT-J, GPT-NeoX/Pythia, Llama, Mistral,
Qwen2; others, e.g. GPT-2 without RoPE, are a PosymError). Numbers are computed in float64 from the
model's tensors; the model itself is not changed.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posym.errors import PosymError
from posym.core.qk import HeadQK, capture, check_layers, check_prompt, rotate
from posym.core.tasks import TaskConfig, generate


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
    exclude_keys=(),
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
    exclude_keys: key positions that never move (e.g. 0, an attention sink): swaps touching them are
        dropped, while they keep their share of the softmax. Positions past the query are ignored.
    Returns s_pos [...], s_sym [...], entropy [...] (nats, of softmax(clean)), n_swaps (int), and the
    sink view of the clean row: attn_first [...] (attention on key 0), top_key [...] (position of the
    largest attention) and attn_top [...] (its attention).
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
    fixed = torch.tensor(sorted({int(k) for k in exclude_keys if 0 <= int(k) < n - 1}), dtype=torch.long)
    if len(fixed):
        keep = ~(torch.isin(a, fixed).any(-1) | torch.isin(b, fixed).any(-1))  # [swaps]
        a, b = a[keep], b[keep]
        if not len(a):
            raise PosymError(f"excluding key positions {fixed.tolist()} leaves no swap for a query with {n - 1} keys")
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
    top = log_d.max(-1)
    return {"s_pos": s_pos, "s_sym": s_sym, "entropy": entropy, "n_swaps": a.shape[0],
            "attn_first": log_d[..., 0].exp(), "top_key": top.indices, "attn_top": top.values.exp()}


# ---- queries -------------------------------------------------------------------------------------


def hop_queries(chain) -> list[int]:
    """The pointer tokens of a chain (query -> ... -> answer, -1 padded): all but the answer."""
    positions = [int(p) for p in chain if int(p) >= 0]
    return positions[:-1]


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
        raise PosymError(f"{where}: query positions must lie in 2..{length - 1} (two earlier keys to swap), got {list(queries)}")
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
    wanted = [resolve_queries(queries[k] if per_prompt else queries, len(ids), f"prompt {k}")
              for k, ids in enumerate(prompts)]
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


# ---- scoring -------------------------------------------------------------------------------------

COLUMNS = ("prompt", "query", "layer", "head", "s_pos", "s_sym", "entropy", "n_swaps", "attn_first", "top_key",
           "attn_top")
FLOAT_COLUMNS = ("s_pos", "s_sym", "entropy", "attn_first", "attn_top")
# Float64 elements of one vectorised swap tensor (~32 MB): callers size their chunks of rows, heads
# and channels so that one chunk's [.., n, n] logits stay under it.
BUDGET = 1 << 22


ROW_KEYS = ("s_pos", "s_sym", "entropy", "attn_first", "top_key", "attn_top")


def _score_layer(qk: HeadQK, jobs: dict[int, list[int]], dtype, **options) -> list[dict]:
    """Scores of one layer for jobs {query position: [batch rows]}: vectorised over rows and heads.

    A chunk of rows x heads holds about BUDGET swaps: many rows at short queries, one row and a
    few heads at a query thousands of tokens in (where one head alone has millions of swaps).
    """
    out = []
    heads = qk.q.shape[1]
    for p, rows in jobs.items():
        n = p + 1
        swaps = max(1, math.comb(p, 2))
        head_step = min(heads, max(1, BUDGET // swaps))
        row_step = max(1, BUDGET // (swaps * head_step))
        for start in range(0, len(rows), row_step):
            b = torch.tensor(rows[start : start + row_step], device=qk.q.device)
            cos, sin = qk.cos[b, :n].to(dtype)[:, None], qk.sin[b, :n].to(dtype)[:, None]  # [G, 1, n, r]
            for h0 in range(0, heads, head_step):
                hs = slice(h0, h0 + head_step)
                q = rotate(qk.q[b, hs, p].to(dtype), cos[:, :, p], sin[:, :, p], qk.pairing)  # [G, h, d]
                # u[a] = R_a^T q_rot: then u[a] . k_b is the logit of content b placed at position a
                u = rotate(q[:, :, None, :], cos, sin, qk.pairing, inverse=True)  # [G, h, n, d]
                swapped = qk.scale * u @ qk.k[b, hs, :n].to(dtype).transpose(-1, -2)  # [G, h, n, n]
                res = swap_scores(swapped.diagonal(dim1=-2, dim2=-1), swapped, **options)
                per_head = {key: res[key].tolist() for key in ROW_KEYS}  # {key: [G][h]}
                for g, row in enumerate(b.tolist()):
                    for i in range(len(per_head["s_pos"][g])):
                        out.append({"row": row, "query": p, "head": h0 + i, "n_swaps": res["n_swaps"],
                                    **{key: values[g][i] for key, values in per_head.items()}})
    return out


def iter_scores(
    model,
    input_ids,
    queries=None,
    *,
    tau: float = 1e-4,
    blocks: int | None = None,
    compare: str = "probs",
    exclude_keys=(),
    layers: list[int] | None = None,
    batch_size: int = 64,
    dtype: torch.dtype = torch.float64,
    progress=None,
):
    """Yield DataFrames of scores (columns COLUMNS), one per batch of equal-length prompts.

    input_ids: a list of 1-D id sequences (lengths may differ) or a 2-D [n, T] array.
    queries: "last" (default), "all", or per prompt a list of positions (e.g. `hop_queries(chain)`).
    tau, blocks, compare, exclude_keys: see `swap_scores`. layers: layer indices (default all).
    dtype: precision of the score maths (float64 default: tau = 1e-4 amplifies rounding).
    progress: optional callable(number of prompts just finished).
    One forward pass per batch; the attention maps are never materialised.
    """
    import pandas as pd

    swap_scores(torch.zeros(3), torch.zeros(3, 3), tau=tau, compare=compare)  # validates tau/compare early
    layers = check_layers(model, layers)
    prompts = [check_prompt(model, ids, f"prompt {k}") for k, ids in enumerate(input_ids)]
    if not prompts:
        raise PosymError("no prompts to score")
    batches = query_batches(prompts, queries, batch_size)
    was_training = model.training
    model.eval()  # dropout off: the scores are of the deterministic model
    try:
        for batch, jobs in batches:
            records = []

            def on_layer(layer, qk):
                for r in _score_layer(qk, jobs, dtype, tau=tau, blocks=blocks, compare=compare,
                                      exclude_keys=exclude_keys):
                    r["layer"] = layer
                    r["prompt"] = batch[r.pop("row")]
                    records.append(r)

            ids = torch.stack([prompts[k] for k in batch]).to(model.device)
            capture(model, ids, layers, on_layer)
            frame = pd.DataFrame.from_records(records, columns=list(COLUMNS))
            yield frame.sort_values(["prompt", "query", "layer", "head"], ignore_index=True)
            if progress is not None:
                progress(len(batch))
    finally:
        model.train(was_training)


def score_model(model, input_ids, queries=None, **options):
    """All scores as one DataFrame (one row per prompt, query, layer, head); see `iter_scores`."""
    import pandas as pd

    return pd.concat(list(iter_scores(model, input_ids, queries, **options)), ignore_index=True)


def summarize_heads(frame, gamma: float = 0.1):
    """Per (layer, head): prompt-mean s_pos, s_sym, entropy, row count (and attn_first, attn_top when
    the frame has them) and a label.

    Labels on the means (gamma = 0.1 is the paper's purity threshold, footnote 3 of 2605):
    uniform if both scores >= 1 - gamma; positional if s_pos >= 1 - gamma and s_sym <= gamma;
    symbolic if s_sym >= 1 - gamma and s_pos <= gamma; mixed otherwise.
    """
    import numpy as np

    if not 0 < gamma < 0.5:
        raise PosymError(f"gamma must lie in (0, 0.5), got {gamma}")
    sinks = {key: (key, "mean") for key in ("attn_first", "attn_top") if key in frame.columns}
    out = frame.groupby(["layer", "head"], as_index=False).agg(
        s_pos=("s_pos", "mean"), s_sym=("s_sym", "mean"), entropy=("entropy", "mean"), rows=("s_pos", "size"),
        **sinks)
    hi, lo = 1 - gamma, gamma
    out["label"] = np.select(
        [(out.s_pos >= hi) & (out.s_sym >= hi), (out.s_pos >= hi) & (out.s_sym <= lo), (out.s_sym >= hi) & (out.s_pos <= lo)],
        ["uniform", "positional", "symbolic"],
        default="mixed",
    )
    return out


# ---- files: prompt JSONL in, Parquet out ---------------------------------------------------------


# ---- prompt sets: which queries of which prompts -------------------------------------------------

QUERY_MODES = ("last", "all", "hops")


def check_query_mode(queries) -> None:
    """`queries` must be None (each prompt's own, else the last token) or one of QUERY_MODES."""
    if queries not in (None, *QUERY_MODES):
        raise PosymError(f"--queries must be last, hops or all, got {queries!r}")


def queries_for(records: list[dict], queries=None) -> list:
    """Per-prompt query specs of prompt records ({"queries", "chain"}, None when absent).

    queries: "last", "all", "hops" (needs a chain on every record) or None (a record's own
    "queries" where given, else the last token).
    """
    check_query_mode(queries)
    if queries == "hops":
        missing = [k for k, r in enumerate(records) if r["chain"] is None]
        if missing:
            raise PosymError(f"--queries hops needs a chain for every prompt; prompt {missing[0]} has none")
        return [hop_queries(r["chain"]) for r in records]
    return [queries or r["queries"] or "last" for r in records]


def task_prompts(task_config: TaskConfig, n_prompts: int = 100, seed: int = 0, queries=None):
    """(input_ids, per-prompt queries) of `n_prompts` test-split task samples (queries as `queries_for`)."""
    check_query_mode(queries)
    samples = generate(task_config, n_prompts, seed, split="test")
    records = [{"input_ids": ids.tolist(), "queries": None, "chain": chain.tolist()}
               for ids, chain in zip(samples.input_ids, samples.chain)]
    return [r["input_ids"] for r in records], queries_for(records, queries)
