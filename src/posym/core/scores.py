"""Positional and symbolic head scores (docs/method.md section 3): exact, one forward pass per prompt.

For a head, a prompt and a query position q, D is the softmax of the query's logits over keys
0..q. Swapping the residual vectors entering the layer at two key positions i < j < q changes only
the entries i and j of that attention row, so every swap follows from one matrix of "swapped"
logits: swapped[a, b] = logit at key position a if it held the content of position b. With RoPE
that is q_rot . R_a k_b * scale = (R_a^T q_rot) . k_b * scale (k_b the pre-rotation key), one
[n, d] x [d, n] product per query and head instead of re-running the layer per swap.

Three lines from a notebook:

    from posym.core.scores import score_model, summarize_heads
    frame = score_model(model, [[17, 3, 9, 2, 5, 1]], queries="last")   # any supported HF causal LM
    print(summarize_heads(frame))                # prompt-mean s_pos/s_sym + label (`head_scores`)

Task prompts at their hop queries, or text with the model's tokenizer:

    frame = score_model(model, generate(task_config, 100, seed=0, split="test"), queries="hops")
    frame = score_model(model, ["Alice likes red. Bob likes blue. Bob likes"], tokenizer=tokenizer)

Public API
- `swap_scores(clean, swapped, tau=1e-4, blocks=None, compare="probs")`: the pure maths for one query
  (`posym.core.constructions` builds `clean`/`swapped` for its heads).
- `score_model(model, input_ids, queries=None, ...)`: a DataFrame with one row per (prompt, query,
  layer, head); `iter_scores` yields the same rows in batches (streamed to Parquet by `posym score`);
  `prompt_inputs` accepts ids, task samples (queries="hops") or text with a tokenizer.
- `hop_queries(chain)`: the pointer positions of a task chain (`posym.core.swaps.resolve_queries` /
  `query_batches` turn query specs into positions and equal-length batches);
  `task_prompts` draws test-split task prompts with their queries (`queries_for`); prompt files
  and Parquet output are `posym.prompts`' and `posym.commands.score`'s.
- `head_scores(frame)`: the score of a head over a prompt set (the prompt-mean rule: hops averaged
  within each prompt, then prompts); `head_labels` the purity labels; `summarize_heads` both.

The queries, keys and rotary tables come from `posym.core.qk` (GPT-J, GPT-NeoX/Pythia, Llama, Mistral,
Qwen2; others, e.g. GPT-2 without RoPE, are a PosymError) through the swapped-logit engine
`posym.core.swaps`. By default only the swaps that carry all but epsilon = 1e-12 of the swap weights
are weighed (`posym.core.pruning`: O(n d) per peaked head and query instead of O(n^2 d)), and a layer's
queries are scored in blocks of every head at once (`posym.core.batched`; engine="loop" scores one
query position at a time, the reference the tests hold it to); every row
records the bound its s_pos and s_sym satisfy against weighing every swap (exact="dense", the
reference). Numbers are computed in float64 from the model's tensors; the model is not changed.
Each layer is scored inside the forward pass with one torch thread (SCORE_THREADS), or after it, one
(layer, head) a unit over forked one-thread processes (`posym.parallel`; workers=, `posym score
--workers`: by default one per torch thread where a batch's scores are large): the same rows, bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posym import parallel
from posym.errors import PosymError
from posym.core import batched, swaps
from posym.core.interop import scorable
from posym.core.paper import GAMMA, TAU
from posym.core.pruning import item_values, movable_items, pair_cosines, score_rows, sink_view
from posym.core.qk import HeadQK, check_layers
from posym.core.tasks import Samples, TaskConfig, generate


COMPARES = ("probs", "logits")
"""What `compare` compares: attention probabilities (the paper) or raw logits."""
_HELD = object()
"""Marks a layer captured for the forked workers rather than scored inside the forward (`iter_scores`)."""
EXACTNESS = ("pruned", "dense")
"""How `exact` weighs the swaps: the kept swaps within the epsilon bound, or every swap (the reference)."""


def swap_scores(
    clean: Tensor,
    swapped: Tensor,
    *,
    tau: float = TAU,
    blocks: int | None = None,
    compare: str = "probs",
    exclude_keys=(),
) -> dict[str, Tensor | int]:
    """Positional and symbolic scores of one query row (computed in float64).

    clean   [..., n]     logits of the query over the n keys it sees, the query last (keys 0..n-1 when
                         the query is at position n-1; the window's keys on a sliding-window layer).
    swapped [..., n, n]  swapped[..., a, b] = logit at key position a holding the content of b
                         (its diagonal equals `clean`). Swaps move keys 0..n-2; the query never moves.
    tau: temperature of the swap weights alpha = softmax(|D_i - D_j| / tau) (1e-4: nearly a hard max).
    blocks: None for single-token swaps (2605), M for swaps of M contiguous key blocks compared by
        block means (2511; see `posym.core.pruning.block_items`).
    compare: "probs" compares softmax probabilities (the paper); "logits" puts the raw logits in
        v, v' and the swap weights instead.
    exclude_keys: key positions that never move (e.g. 0, an attention sink): swaps touching them are
        dropped, while they keep their share of the softmax. Positions past the query are ignored.
    Returns s_pos [...], s_sym [...], entropy [...] (nats, of softmax(clean)), n_swaps (int), and the
    sink view of the clean row: attn_first [...] (attention on key 0), top_key [...] (position of the
    largest attention) and attn_top [...] (its attention).
    """
    if compare not in COMPARES:
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
    items = movable_items(n - 1, blocks, exclude_keys)  # [M, size]: key positions of what each swap moves
    ia, ib = torch.triu_indices(len(items), len(items), offset=1)  # [swaps] each
    a, b = items[ia], items[ib]  # [swaps, size]
    cos_pos, cos_sym = pair_cosines(clean[..., a], clean[..., b], swapped[..., a, b], swapped[..., b, a], compare)
    x = item_values(clean, items, compare)  # [..., M]
    alpha = torch.softmax((x[..., ia] - x[..., ib]).abs() / tau, dim=-1)  # [..., swaps]
    return {
        "s_pos": (alpha * cos_pos).sum(-1),
        "s_sym": (alpha * cos_sym).sum(-1),
        "entropy": entropy,
        "n_swaps": len(ia),
        **sink_view(log_d),
    }


def swap_details(
    clean: Tensor, swapped: Tensor, *, tau: float = TAU, top: int = 8, exclude_keys=()
) -> dict[str, Tensor]:
    """The heaviest swaps of one query row, for display (single-token swaps, compare="probs").

    clean [n], swapped [n, n]: as `swap_scores` (keys 0..n-1 of the row, the query last). Returns, in
    float64: attention [n] (softmax of clean), s_pos and s_sym (over every swap: `swap_scores`'
    values), and for the `top` swaps of largest weight alpha, heaviest first: a, b [top] (key indices,
    a < b), weight [top] (alpha), before_a/before_b (attention on a and b), after_a/after_b (attention
    on a and b once their contents are swapped, the whole row renormalised), cos_pos and cos_sym.

    >>> d = swap_details(torch.tensor([3.0, 0.0, 0.0, 0.0]), torch.zeros(4, 4) + torch.diag(torch.tensor([3.0, 0, 0, 0])), top=1)
    >>> (int(d["a"][0]), int(d["b"][0]))   # the swap that moves the most attention: key 0 with key 1
    (0, 1)
    """
    if clean.dim() != 1:
        raise PosymError(f"swap_details takes one query row: clean [n], got shape {tuple(clean.shape)}")
    clean, swapped = clean.to(torch.float64), swapped.to(torch.float64)
    scores = swap_scores(clean, swapped, tau=tau, exclude_keys=exclude_keys)  # validates shapes and tau
    n = clean.shape[-1]
    items = movable_items(n - 1, None, exclude_keys)[:, 0]  # [M]: the keys that may move
    ia, ib = torch.triu_indices(len(items), len(items), offset=1)  # [swaps] each
    a, b = items[ia], items[ib]  # [swaps]
    attention = torch.softmax(clean, dim=-1)  # [n]
    alpha = torch.softmax((attention[a] - attention[b]).abs() / tau, dim=-1)  # [swaps]
    heaviest = alpha.argsort(descending=True, stable=True)[:top]  # [top]
    a, b = a[heaviest], b[heaviest]  # [top] each
    cos_pos, cos_sym = pair_cosines(clean[a, None], clean[b, None], swapped[a, b, None], swapped[b, a, None], "probs")
    after = clean.expand(len(a), n).clone()  # [top, n]: each row one swap applied
    rows = torch.arange(len(a))
    after[rows, a], after[rows, b] = swapped[a, b], swapped[b, a]
    after = torch.softmax(after, dim=-1)  # [top, n]
    return {
        "attention": attention,
        "s_pos": scores["s_pos"],
        "s_sym": scores["s_sym"],
        "a": a,
        "b": b,
        "weight": alpha[heaviest],
        "before_a": attention[a],
        "before_b": attention[b],
        "after_a": after[rows, a],
        "after_b": after[rows, b],
        "cos_pos": cos_pos,
        "cos_sym": cos_sym,
    }


# ---- queries -------------------------------------------------------------------------------------


def hop_queries(chain) -> list[int]:
    """The pointer tokens of a chain (query -> ... -> answer, -1 padded): all but the answer."""
    positions = [int(p) for p in chain if int(p) >= 0]
    return positions[:-1]


# ---- scoring -------------------------------------------------------------------------------------

COLUMNS = (
    "prompt",
    "query",
    "layer",
    "head",
    "keys",
    "s_pos",
    "s_sym",
    "entropy",
    "n_swaps",
    "kept",
    "bound",
    "attn_first",
    "top_key",
    "attn_top",
    "low_mass",
)
"""keys: how many keys the query sees (query + 1, or the layer's sliding window); top_key is a position;
attn_first is NaN where the window excludes token 0 (no token-0 sink there); low_mass (`low_mass`): the
row's s_pos and s_sym rest on attention below MASS_FLOOR."""

MASS_FLOOR = 1e-3
"""The least attention a query row must put on the keys that swaps move (every visible key but the
query itself, which never moves) for its s_pos and s_sym to be read as a head's behaviour. Below it the
scores are decided by the few swaps of whatever mass is left: on held-out real models a few heads per
prompt keep >= 0.9996 of their attention on the query token, and their scores then turn on swaps of
1e-8 to 1e-20 of attention."""


def low_mass(frame):
    """Per score row: whether the attention on the keys swaps move, 1 - attention on the query itself,
    is below MASS_FLOOR. Only a row whose top key is the query can be (any other top key holds at least
    1/keys of the movable mass), so top_key and attn_top decide it.

    >>> import pandas as pd
    >>> low_mass(pd.DataFrame({"query": [5, 5, 5], "top_key": [5, 5, 0], "attn_top": [0.9999, 0.99, 0.9999]})).tolist()
    [True, False, False]
    """
    return (frame["top_key"] == frame["query"]) & (1.0 - frame["attn_top"] < MASS_FLOOR)


FLOAT_COLUMNS = ("s_pos", "s_sym", "entropy", "bound", "attn_first", "attn_top")
ROW_KEYS = ("s_pos", "s_sym", "entropy", "kept", "bound", "attn_first", "top_key", "attn_top")
"""Per-row results of `posym.core.pruning.score_rows` that become columns."""


def _columns() -> dict[str, list]:
    return {key: [] for key in ("row", "query", "head", "keys", "n_swaps", *ROW_KEYS)}


def _append(out: dict[str, list], rows: list[int], heads: list[int], p: int, n: int, res: dict) -> None:
    """Add rows x heads score rows of query p (n keys seen) from per-row results [rows * heads]."""
    count = len(rows) * len(heads)
    out["row"].append(torch.tensor(rows).repeat_interleave(len(heads)))
    out["head"].append(torch.tensor(heads).repeat(len(rows)))
    out["query"].append(torch.full((count,), p))
    out["keys"].append(torch.full((count,), n))
    n_swaps = res["n_swaps"]
    out["n_swaps"].append(n_swaps.cpu() if isinstance(n_swaps, Tensor) else torch.full((count,), n_swaps))
    for key in ROW_KEYS:
        out[key].append(res[key].cpu())


def _joined(out: dict[str, list]) -> dict:
    """The columns as numpy arrays (one per key; compact, unlike lists of Python numbers)."""
    return {key: torch.cat(parts).numpy() if parts else [] for key, parts in out.items()}


def _score_query(qk: HeadQK, p: int, rows: list[int], heads: list[int], dtype, out: dict[str, list], **options) -> None:
    """The per-query path: scores of query p at batch `rows` and `heads`, in chunks of about BUDGET
    elements of queries and keys (many rows at short queries, one row and a few heads at a query
    thousands of tokens in)."""
    n = p - qk.first_key(p) + 1  # the keys query p sees (the query itself included)
    per_head = n * qk.q.shape[-1]
    head_step = min(len(heads), max(1, swaps.BUDGET // per_head))
    row_step = max(1, swaps.BUDGET // (per_head * head_step))
    for start in range(0, len(rows), row_step):
        chunk = rows[start : start + row_step]
        for h0 in range(0, len(heads), head_step):
            hs = heads[h0 : h0 + head_step]
            u, k = swaps.unrotated_queries(qk, torch.tensor(chunk), hs, p, dtype)  # [G, h, n, d] each
            _append(
                out, chunk, hs, p, n, score_rows(qk, u.flatten(0, 1), k.flatten(0, 1), first=qk.first_key(p), **options)
            )


ENGINES = ("batched", "loop")
"""How a layer's queries are scored: "batched" (`posym.core.batched`: blocks of queries of every head
at once, `batched.score_dense` for the near-uniform rows it leaves and for exact="dense") or "loop" (one query
position at a time through `pruning.score_rows`: the reference)."""


def _score_layer(
    qk: HeadQK,
    jobs: dict[int, list[int]],
    dtype,
    engine: str = "batched",
    budget: int = batched.FLOOR_BYTES,
    heads: list[int] | None = None,
    prepared: dict | None = None,
    scratch: batched.Scratch | None = None,
    **options,
) -> dict:
    """Columns of one layer's scores for jobs {query position: [batch rows]}, of `heads` (None: every
    head; a head's rows are the same whichever heads are scored with it). prepared: {batch rows:
    `batched.prepare`'s tables of this layer}, filled here and read by later calls on the same layer
    (the forked workers score one head a call); scratch: the blocks' work buffers (`batched.Scratch`),
    reused across layers and heads.

    engine "batched" scores blocks of query positions sharing their batch rows (`batched.query_blocks`
    under `budget` bytes) with `batched.score_block` and weighs every swap of the rows it leaves
    (near-uniform: dense) with `batched.score_dense`, which also weighs every row of the dense reference
    (epsilon None); block swaps take the per-query path."""
    out = _columns()
    heads = list(range(qk.q.shape[1])) if heads is None else heads
    for p in jobs:
        if p - qk.first_key(p) + 1 < 3:
            raise PosymError(f"a sliding window of {qk.window} keys leaves query {p} fewer than 2 earlier keys to swap")
    if engine == "loop" or options["blocks"] is not None:
        for p, rows in jobs.items():
            _score_query(qk, p, rows, heads, dtype, out, **options)
        return _joined(out)
    shared: dict[tuple[int, ...], list[int]] = {}  # the query positions of each set of batch rows
    for p, rows in jobs.items():
        shared.setdefault(tuple(rows), []).append(p)
    keep = {key: options[key] for key in ("tau", "compare", "epsilon", "exclude_keys")}
    keep_dense = {key: options[key] for key in ("tau", "compare", "exclude_keys")}
    for rows, positions in shared.items():
        prepared = {} if prepared is None else prepared
        if rows not in prepared:  # once per layer and rows
            prepared[rows] = batched.prepare(qk, torch.tensor(rows), dtype, options["exclude_keys"], scratch)
        tables = prepared[rows]
        if options["epsilon"] is None:  # the dense reference: every swap of every row, on the grid
            for p in positions:
                for g, row in enumerate(rows):
                    dense = batched.score_dense(qk, row, heads, p, dtype, **keep_dense, tables=tables, g=g)
                    _append(out, [row], heads, p, p - qk.first_key(p) + 1, dense)
            continue
        for head in heads:  # one head a block: its products are then single matrix products (`head_view`)
            one, part = batched.head_view(qk, tables, head)
            for block in batched.query_blocks(sorted(positions), qk.first_key, len(rows), budget, dtype):
                res, done = batched.score_block(one, torch.tensor(rows), block, dtype, **keep, tables=part)  # [G, 1, Q]
                g, _, q = done.nonzero().unbind(1)  # [D] each, in the order of res[key][done]
                p = torch.tensor(block, device=g.device)[q]
                out["row"].append(torch.tensor(rows)[g.cpu()])
                out["head"].append(torch.full((len(g),), head))
                out["query"].append(p.cpu())
                out["keys"].append((p - qk.first_keys(p) + 1).cpu())
                for key in (*ROW_KEYS, "n_swaps"):
                    out[key].append(res[key][done].cpu())
                for g, _, q in (~done).nonzero().tolist():  # near-uniform rows: every swap weighed, on a grid
                    p = block[q]
                    dense = batched.score_dense(qk, rows[g], [head], p, dtype, **keep_dense, tables=tables, g=g)
                    _append(out, [rows[g]], [head], p, p - qk.first_key(p) + 1, dense)
    return _joined(out)


SCORE_THREADS = 1
"""torch threads that score a layer in this process (workers=1; the forked workers have one each): the
scores' ops are small (one head's block of queries), and more threads cost more than they give on them
(benchmarks/all_queries.py, docs/commands/analysis.md)."""


FORK_ELEMENTS = 1 << 22
"""Score-grid elements of a batch (keys seen x query rows x heads, summed over its layers) from which
`iter_scores`' workers=0 scores in forked workers: about a second of one core's work (every query of
SmolLM2 at 1,024 tokens is 141.6M elements, 22.9 s on one thread: 162 ns each), against the tenth of a
second that forking and collecting cost. SmolLM2's last query at 4,096 tokens is 1.1M: scored in this
process, inside the forward, as before; every query at 256 tokens 8.9M: forked."""


def _grid_elements(qk: HeadQK, jobs: dict[int, list[int]]) -> int:
    """Elements of one layer's score grids: keys each query sees x its batch rows x heads."""
    return qk.q.shape[1] * sum(len(rows) * (p - qk.first_key(p) + 1) for p, rows in jobs.items())


def _held_bytes(qk: HeadQK) -> int:
    """Bytes one captured layer holds until the forked workers score it (its queries and keys)."""
    return qk.q.numel() * qk.q.element_size() + qk.k.numel() * qk.k.element_size()


def _scoring_workers(workers: int, qk: HeadQK, jobs: dict[int, list[int]], layers: int, logits: int) -> int:
    """Processes that score a batch whose first layer is `qk` (`layers` layers): `workers` when > 0.
    workers=0 (automatic) forks as many as the threads torch gives the forward pass (`torch.get_num_threads`,
    at most one per CPU: the cores the forward uses, none a user held back with OMP_NUM_THREADS) where the
    batch's grids reach FORK_ELEMENTS and its captured layers fit in `logits` bytes (the size of the
    forward's own logits: every layer's queries and keys are held at once before the workers start); else 1. Always 1
    (this process, inside the forward) on a GPU, without fork, or inside a `forked_map` worker (they do
    not nest)."""
    if qk.q.device.type != "cpu" or parallel.nested():
        return 1
    if workers > 0:
        return parallel.cpu_workers(workers)
    if _grid_elements(qk, jobs) * layers < FORK_ELEMENTS or _held_bytes(qk) * layers > logits:
        return 1
    return min(parallel.cpu_workers(0), torch.get_num_threads())


def _forked_layers(held: list[tuple], workers: int, dtype, engine: str, options: dict) -> list[tuple[int, dict]]:
    """[(layer, columns)] of the layers `held` [(layer, qk, jobs, budget)] captured by one forward, scored
    one (layer, head) at a time over `workers` forked 1-thread processes (`posym.parallel.forked_map`:
    they inherit the captured queries and keys; a head's columns come back through a pipe). Heads, not
    layers, are the units, so that a few heavy heads (SmolLM2's layer 0 has three with dozens of pivots
    per row) are shared out rather than keep one worker busy after the others finish."""
    import numpy as np

    units = [(k, head) for k, (_, qk, _, _) in enumerate(held) for head in range(qk.q.shape[1])]
    # what a worker keeps between its units: the tables of its latest layer and one set of work buffers
    # (fresh ones per head are page-faulted anew: SmolLM2 at 256 tokens, every query, 2 workers on the
    # loaded 2-core machine: 5.3 CPU s with fresh ones, 4.5-4.8 kept; 3.3-3.7 in one process, 2 threads)
    kept: dict = {"layer": None, "prepared": {}, "scratch": batched.Scratch()}

    def score(unit):
        k, head = unit
        _, qk, jobs, budget = held[k]
        if kept["layer"] != k:
            kept.update(layer=k, prepared={})
        return _score_layer(
            qk, jobs, dtype, engine, budget, heads=[head], prepared=kept["prepared"], scratch=kept["scratch"], **options
        )

    parts = parallel.forked_map(score, units, workers=workers)
    out = []
    for k, (layer, _, _, _) in enumerate(held):
        mine = [columns for (j, _), columns in zip(units, parts) if j == k]
        out.append((layer, {key: np.concatenate([c[key] for c in mine]) for key in mine[0]}))
    return out


def prompt_inputs(prompts, queries=None, *, chains=None, tokenizer=None) -> tuple[list, object]:
    """(id sequences, query specs) of the prompts `score_model` accepts, as `query_batches` takes them.

    prompts: id sequences, a 2-D array, task samples (`posym.core.tasks.Samples`, which carry their
    chains) or text, tokenized with `tokenizer` (the model's own, as `posym score` does: special
    tokens included). queries: as `resolve_queries`, or "hops": the pointer tokens of each prompt's
    chain (`hop_queries`; chains from the samples or `chains`, one per prompt).
    """
    if isinstance(prompts, Samples):
        chains = prompts.chain if chains is None else chains
        prompts = prompts.input_ids
    ids = []
    for k, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise PosymError(f"prompt {k} is text: pass tokenizer= (the model's tokenizer) to score text")
            prompt = tokenizer(prompt).input_ids
        ids.append(prompt)
    if queries == "hops":
        if chains is None:
            raise PosymError('queries="hops" needs chains: pass task samples (posym.core.tasks.generate) or chains=')
        if len(chains) != len(ids):
            raise PosymError(f"chains has {len(chains)} entries for {len(ids)} prompts")
        queries = [hop_queries(chain) for chain in chains]
    return ids, queries


def iter_scores(
    model,
    input_ids,
    queries=None,
    *,
    chains=None,
    tokenizer=None,
    tau: float = TAU,
    blocks: int | None = None,
    compare: str = "probs",
    epsilon: float = 1e-12,
    exact: str = "pruned",
    exclude_keys=(),
    layers: list[int] | None = None,
    batch_size: int = 64,
    dtype: torch.dtype = torch.float64,
    engine: str = "batched",
    budget: int | None = None,
    workers: int = 0,
    progress=None,
):
    """Yield DataFrames of scores (columns COLUMNS), one per batch of equal-length prompts.

    input_ids: a list of 1-D id sequences (lengths may differ), a 2-D [n, T] array, task samples, or
    texts with `tokenizer` (see `prompt_inputs`).
    queries: "last" (default), "all", "hops" (task prompts: samples or `chains`), or per prompt a
    list of positions (e.g. `hop_queries(chain)`).
    tau, blocks, compare, exclude_keys: see `swap_scores`. layers: layer indices (default all).
    exact: "pruned" (default) weighs only the swaps that carry all but `epsilon` of the swap
        weights, so each row's s_pos and s_sym lie within its `bound` (<= 2 epsilon) of the dense
        value (`posym.pruning`); "dense" weighs every swap (the reference; bound 0).
    dtype: precision of the score maths (float64 default: tau = 1e-4 amplifies rounding).
    engine: "batched" (default: blocks of queries of every head scored together, `posym.core.batched`)
        or "loop" (one query position at a time, the reference); both give the same rows.
    budget: bytes of working memory one block of queries may hold (batched engine; smaller only
        means more blocks, the same numbers). None: `batched.default_budget`, the size of the
        forward pass's own logits for the batch, so the peak stays near the forward's.
    workers: processes that score a batch on the CPU. 0 (default, automatic): as many forked 1-thread
        processes as torch's threads (the cores the forward pass uses) where a batch's score grids reach
        FORK_ELEMENTS (every query of a long prompt) and its captured layers fit in the size of the
        forward's logits, else this one; 1: this one, each layer inside the forward pass; >= 2: that
        many forked 1-thread processes (`posym.parallel.forked_map`), one (layer, head) at a time,
        after the forward has captured every layer's queries and keys (which it then holds at once).
        The same rows either way, bit for bit: this process scores with one torch thread too
        (SCORE_THREADS). benchmarks/all_queries.py measures both (docs/commands/analysis.md).
    progress: optional callable(number of prompts just finished).
    One forward pass per batch; the attention maps are never materialised. Rows record keys (the keys
    the query sees: on a sliding-window layer only its window's, and every swap moves two of those),
    n_swaps, kept (the swaps weighed) and bound.
    """
    import numpy as np
    import pandas as pd

    swap_scores(torch.zeros(3), torch.zeros(3, 3), tau=tau, compare=compare)  # validates tau/compare early
    input_ids, queries = prompt_inputs(input_ids, queries, chains=chains, tokenizer=tokenizer)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None) or 0
    if exact not in EXACTNESS:
        raise PosymError(f"exact must be 'pruned' or 'dense', got {exact!r}")
    if not 0 < epsilon < 1:
        raise PosymError(f"epsilon must lie in (0, 1), got {epsilon}")
    if engine not in ENGINES:
        raise PosymError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise PosymError(f"budget must be a positive number of bytes, got {budget!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise PosymError(f"workers must be 0 (automatic) or a number of processes, got {workers!r}")
    options = {
        "tau": tau,
        "blocks": blocks,
        "compare": compare,
        "epsilon": epsilon if exact == "pruned" else None,
        "exclude_keys": exclude_keys,
    }
    layer_count = len(check_layers(scorable(model), layers))
    forking: dict[int, int] = {}  # id(jobs) of the batch -> its workers (decided at its first layer)
    scratch = batched.Scratch()  # the blocks' work buffers, allocated once for every layer of the scan

    def work(layer: int, qk: HeadQK, jobs: dict[int, list[int]]):
        logits = batched.default_budget(*qk.q.shape[:3:2], vocab)  # bytes of the forward's own logits
        size = budget or logits
        if id(jobs) not in forking:
            forking.clear()
            forking[id(jobs)] = _scoring_workers(workers, qk, jobs, layer_count, logits)
        if forking[id(jobs)] > 1:
            return _HELD, layer, qk, jobs, size  # scored after the forward, by the workers
        with parallel.torch_threads(SCORE_THREADS if qk.q.device.type == "cpu" else torch.get_num_threads()):
            return layer, _score_layer(qk, jobs, dtype, engine, size, scratch=scratch, **options)

    for batch, results in swaps.scan(model, input_ids, queries, work, layers=layers, batch_size=batch_size):
        held = [r[1:] for r in results if r[0] is _HELD]
        if held:
            results = _forked_layers(held, forking.popitem()[1], dtype, engine, options)
        if progress is not None:
            progress(len(batch))
        parts = []
        prompts = np.asarray(batch, dtype=np.int64)  # [rows of the batch]: each row's prompt index
        for layer, columns in results:
            frame = pd.DataFrame(columns)
            frame.insert(0, "prompt", prompts[frame.pop("row").to_numpy()])
            parts.append(frame.assign(layer=layer))
        frame = pd.concat(parts, ignore_index=True)
        frame["low_mass"] = low_mass(frame)
        yield frame[list(COLUMNS)].sort_values(["prompt", "query", "layer", "head"], ignore_index=True)


def score_model(model, input_ids, queries=None, **options):
    """All scores as one DataFrame (one row per prompt, query, layer, head); see `iter_scores`."""
    import pandas as pd

    return pd.concat(list(iter_scores(model, input_ids, queries, **options)), ignore_index=True)


DETAIL_LISTS = ("a", "b", "weight", "before_a", "before_b", "after_a", "after_b", "cos_pos", "cos_sym")
"""Per-swap columns of `head_details` (one list per row, heaviest swap first; a and b are key positions)."""


def head_details(
    model,
    input_ids,
    queries=None,
    *,
    tau: float = TAU,
    top: int = 8,
    exclude_keys=(),
    layers: list[int] | None = None,
    batch_size: int = 16,
):
    """What a head does at each query, for display: one row per (prompt, query, layer, head) with
    `first` (the first key the query sees), `attention` (a list over keys first..query), s_pos and
    s_sym (every swap weighed: the dense value), and the `top` heaviest swaps (`swap_details`) as
    lists (DETAIL_LISTS; a and b as key positions). input_ids and queries as `iter_scores`; one
    forward pass per batch; one head's [n, n] swapped logits at a time (n = keys the query sees).
    """
    import pandas as pd

    swap_scores(torch.zeros(3), torch.zeros(3, 3), tau=tau)  # validates tau early
    input_ids, queries = prompt_inputs(input_ids, queries)

    def work(layer: int, qk: HeadQK, jobs: dict[int, list[int]]) -> list[dict]:
        out = []
        heads = qk.q.shape[1]
        for p, rows in jobs.items():
            first = qk.first_key(p)
            keep = [int(key) - first for key in exclude_keys]
            for row in rows:
                for head in range(heads):
                    swapped = swaps.swap_logits(qk, [row], [head], p)[0, 0]  # [n, n]
                    d = swap_details(swapped.diagonal(), swapped, tau=tau, top=top, exclude_keys=keep)
                    lists = {key: (d[key] + first if key in ("a", "b") else d[key]).tolist() for key in DETAIL_LISTS}
                    out.append(
                        {
                            "row": row,
                            "query": p,
                            "layer": layer,
                            "head": head,
                            "first": first,
                            "attention": d["attention"].tolist(),
                            "s_pos": float(d["s_pos"]),
                            "s_sym": float(d["s_sym"]),
                            **lists,
                        }
                    )
        return out

    frames = []
    for batch, results in swaps.scan(model, input_ids, queries, work, layers=layers, batch_size=batch_size):
        rows = pd.DataFrame([r for layer_rows in results for r in layer_rows])
        rows.insert(0, "prompt", [batch[row] for row in rows.pop("row")])
        frames.append(rows)
    return pd.concat(frames, ignore_index=True).sort_values(["prompt", "query", "layer", "head"], ignore_index=True)


# ---- the score of a head over a prompt set ------------------------------------------------------

SCORE_COLUMNS = ("s_pos", "s_sym", "entropy")
SINK_COLUMNS = ("attn_first", "attn_top", "low_mass")
"""Attention of the query on token 0 and on its top key, and the low_mass flag: averaged like the scores
where present (low_mass becomes the share of a prompt's, then a head's, rows that rest on too little
attention: 0 for a head whose scores all mean something)."""


def _averaged(frame) -> list[str]:
    return [c for c in (*SCORE_COLUMNS, *SINK_COLUMNS) if c in frame.columns]


LABELS = ("positional", "symbolic", "mixed", "uniform")


def prompt_scores(frame, keys=()):
    """Step 1 of the prompt-mean rule: per (*keys, prompt, layer, head) the mean of s_pos, s_sym and
    entropy over that prompt's query rows (its hop queries, every position, or its one last token),
    and `queries`, the number of rows averaged."""
    group = [*keys, "prompt", "layer", "head"]
    return frame.groupby(group, as_index=False).agg(
        **{c: (c, "mean") for c in _averaged(frame)}, queries=("s_pos", "size")
    )


def head_scores(frame, keys=()):
    """The score of a head over a prompt set, by the PROMPT-MEAN rule used everywhere in posym.

    A prompt's score is the mean over its query rows (`prompt_scores`); a head's score is the mean
    of its prompts' scores, so every prompt weighs the same whatever its number of queries (a 4-hop
    prompt has four hop queries, a 1-hop prompt one). This is docs/method.md section 3: a head's score over a
    prompt set is the mean over prompts, as in the paper's figures (mean over 100 prompts per checkpoint).
    A pooled mean over all (prompt, query) rows would weigh long chains more and can move a head
    near the purity threshold across it.

    frame: score rows (columns prompt, layer, head, s_pos, s_sym, entropy; more rows per prompt
    allowed, e.g. `score_model` output, or one row per prompt, e.g. `prompt_scores` output).
    keys: columns that split the table further (e.g. ("step", "query_mode") in dynamics).
    Returns per (*keys, layer, head): s_pos, s_sym, entropy (and attn_first, attn_top where the rows
    have them), prompts (count) and rows (query rows).
    """
    missing = sorted({*keys, "prompt", "layer", "head", *SCORE_COLUMNS} - set(frame.columns))
    if missing:
        raise PosymError(f"score rows need the columns {', '.join(missing)} (as score_model writes them)")
    if "queries" not in frame.columns:
        frame = prompt_scores(frame, keys)
    return frame.groupby([*keys, "layer", "head"], as_index=False).agg(
        **{c: (c, "mean") for c in _averaged(frame)}, prompts=("prompt", "size"), rows=("queries", "sum")
    )


def check_gamma(gamma: float) -> None:
    """gamma, the purity threshold, must lie in (0, 0.5)."""
    if not 0 < gamma < 0.5:
        raise PosymError(f"gamma must lie in (0, 0.5), got {gamma}")


def head_labels(s_pos, s_sym, gamma: float = GAMMA):
    """Labels of heads with scores s_pos, s_sym (arrays) at purity threshold gamma (footnote 3 of
    2605; the paper shows 0.1 and 0.05): uniform if both >= 1 - gamma; positional if s_pos >= 1 -
    gamma and s_sym <= gamma; symbolic if s_sym >= 1 - gamma and s_pos <= gamma; mixed otherwise."""
    import numpy as np

    check_gamma(gamma)
    s_pos, s_sym = np.asarray(s_pos), np.asarray(s_sym)
    hi, lo = 1 - gamma, gamma
    return np.select(
        [(s_pos >= hi) & (s_sym >= hi), (s_pos >= hi) & (s_sym <= lo), (s_sym >= hi) & (s_pos <= lo)],
        ["uniform", "positional", "symbolic"],
        default="mixed",
    )


def label_column(gamma: float) -> str:
    """The column holding labels at threshold gamma: label_gamma_0p1 for 0.1 (an identifier)."""
    return "label_gamma_" + f"{gamma:g}".replace(".", "p").replace("-", "m")


def summarize_heads(frame, gamma: float = GAMMA):
    """Per (layer, head): `head_scores` (the prompt-mean rule) and `label` (`head_labels`)."""
    check_gamma(gamma)
    out = head_scores(frame)
    out["label"] = head_labels(out.s_pos, out.s_sym, gamma)
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
    records = [
        {"input_ids": ids.tolist(), "queries": None, "chain": chain.tolist()}
        for ids, chain in zip(samples.input_ids, samples.chain)
    ]
    return [r["input_ids"] for r in records], queries_for(records, queries)
