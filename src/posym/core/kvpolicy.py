"""A head-aware KV-cache policy from any head table: which (layer, KV head) keeps the full cache and
which keeps only a sink + recent window (issue 53).

A streaming KV head stores the first `sink` keys and the last `recent` keys before each query; the
query at position p sees key j iff j <= p and (j < sink or p - j < recent) (`visible`). A layer with its
own sliding window w (Mistral, Qwen2 with use_sliding_window, Gemma 2/3's local layers) keeps it on
every head, full or streaming: p - j < w as well.

Choosing the heads. Every policy turns a head table into a keep score per (layer, KV head), higher =
more worth its full cache, and streams the lowest-scored KV heads first (`choose`):
- 'posym'      posym's labels: keep = s_sym - s_pos (the sink-free scores where the table holds them,
               `s_sym_sinkfree` / `s_pos_sinkfree`), so positional heads are streamed first and symbolic
               heads kept.
- 'retrieval'  the atlas's retrieval score (Wu et al. 2024): high = kept.
- 'duo'        DuoAttention's full_attention_heads.tsv (a layer x KV-head grid, high = full attention)
               or the atlas's training-free proxy of it, the non-streaming score (`non_streaming_w*`).
- 'random'     a seeded draw matched on layer: as many streaming KV heads in each layer as a reference
               policy streams there (`random_policy`); or matched on layer type (as many among the layers
               of each window, windowed and global layers apart), the only match that leaves a choice
               on a model with one KV head per layer (Gemma 3 270M), where every layer-matched draw is the
               reference itself (`matched_draws` counts the distinct draws).
- 'streaming'  every KV head streams (StreamingLLM); 'full' none does.

Grouped-query attention: a KV head serves n_heads / n_kv_heads query heads, and a streaming KV head
streams all of them. A KV head's keep score is the MAX over its query heads (`atlas.kv_pool`'s
<column>_max): it is streamed only when every query head it serves is among the streamable ones, so one
symbolic query head keeps its whole group full.

The budget is the fraction of KV heads streaming; the kept-KV fraction it implies at prompt length L
(`kept_fraction`) counts what a cache stores after L tokens, the keys the next query can still see: L
for a full KV head of a global layer, min(L, w - 1) for one of a layer with window w (already windowed:
streaming it saves only what the window did not; transformers' DynamicCache keeps as much), sink +
recent - 1 (at most L) for a streaming one; it divides by the same count under the 'full' policy (the
model's own cache, its windows included). `posym.core.kvcache.HeadKVCache` holds exactly `kept`.

>>> import numpy as np
>>> grid = np.array([[0.9, 0.1], [0.5, 0.3]])            # keep scores, 2 layers x 2 KV heads
>>> policy = choose(grid, 0.5, sink=4, recent=8, windows=(None, None), n_heads=4)
>>> policy.full.tolist()                                 # the two lowest KV heads stream
[[True, False], [True, False]]
>>> policy.streaming_fraction
0.5
>>> policy.kept_fraction(1000)                           # (1000 + 11 + 1000 + 11) / 4000
0.5055
>>> policy.query_full().tolist()                         # 2 query heads per KV head
[[True, True, False, False], [True, True, False, False]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from posym.core import atlas
from posym.errors import PosymError

POLICIES = ("posym", "retrieval", "duo", "random", "streaming", "full")
"""The policies `policy_from_table` builds (see the module docstring)."""
MATCHES = ("layer", "type")
"""What a random draw keeps of its reference (`random_policy`): the streaming count of each layer, or of
each layer type (window)."""

SINK = 4
"""Keys at the start a streaming KV head keeps (StreamingLLM's 4 attention sinks; DuoAttention's sink_size)."""
RECENT = 256
"""Recent keys a streaming KV head keeps (DuoAttention's recent_size)."""


def visible(p, j, *, sink: int | None, recent: int | None, window: int | None):
    """bool (numpy or torch, broadcast): query position p sees key position j. sink / recent None:
    a full KV head (causal); window: the layer's own sliding window (None: none)."""
    seen = j <= p
    if window is not None:
        seen = seen & (p - j < window)
    if recent is not None:
        seen = seen & ((j < sink) | (p - j < recent))
    return seen


def kept_keys(length: int, *, sink: int | None, recent: int | None, window: int | None) -> int:
    """How many of the keys 0 .. length - 1 the last query (p = length - 1) sees: what the cache holds
    after a prompt of `length` tokens (closed form of `visible` summed over j)."""
    if length <= 0:
        return 0
    p = length - 1
    lo = max(0, p - window + 1) if window is not None else 0  # the window's first key
    if recent is None:
        return p - lo + 1
    near = max(lo, p - recent + 1)  # the first recent key inside the window
    sinks = max(0, min(sink, p + 1) - lo)  # sink keys inside the window
    both = max(0, min(sink, p + 1) - near)  # sink keys that are recent too
    return sinks + (p - near + 1) - both


@dataclass(frozen=True)
class KVPolicy:
    """A per-(layer, KV head) cache choice. full: bool [layers, kv_heads], True = full cache, False =
    sink + recent window; windows: each layer's own sliding window (None: a global layer); n_heads: query
    heads per layer (a multiple of kv_heads)."""

    full: np.ndarray
    sink: int
    recent: int
    windows: tuple
    n_heads: int
    name: str = ""

    def __post_init__(self):
        full = np.asarray(self.full, dtype=bool)
        if full.ndim != 2 or not full.size:
            raise PosymError(f"a KV policy needs a layers x KV-heads grid, got shape {full.shape}")
        if self.sink < 0 or self.recent < 1:
            raise PosymError(f"a streaming KV head needs sink >= 0 and recent >= 1, got {self.sink}, {self.recent}")
        if len(self.windows) != full.shape[0]:
            raise PosymError(f"{len(self.windows)} layer windows for {full.shape[0]} layers")
        if any(w is not None and w < 1 for w in self.windows):
            raise PosymError(f"a sliding window holds at least one key, got {self.windows}")
        atlas.kv_group(0, self.n_heads, full.shape[1])  # the query heads share the KV heads evenly
        object.__setattr__(self, "full", full)
        object.__setattr__(self, "windows", tuple(None if w is None else int(w) for w in self.windows))

    @property
    def n_layers(self) -> int:
        return self.full.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.full.shape[1]

    @property
    def streaming_fraction(self) -> float:
        """The budget: the share of KV heads that stream."""
        return float((~self.full).mean())

    def query_full(self) -> np.ndarray:
        """bool [layers, n_heads]: each query head's choice (that of the KV head it reads)."""
        return np.repeat(self.full, self.n_heads // self.n_kv_heads, axis=1)

    def kept(self, length: int) -> np.ndarray:
        """int [layers, kv_heads]: the keys each KV head holds after `length` tokens, those the next
        query (position `length`) sees before its own."""
        out = np.zeros(self.full.shape, dtype=np.int64)
        for layer, window in enumerate(self.windows):
            full = kept_keys(length + 1, sink=None, recent=None, window=window) - 1
            stream = kept_keys(length + 1, sink=self.sink, recent=self.recent, window=window) - 1
            out[layer] = np.where(self.full[layer], full, stream)
        return out

    def kept_fraction(self, length: int) -> float:
        """The KV memory kept at prompt length `length`, as a share of the model's full cache (its own
        windows included): sum of `kept` over the same sum with every KV head full."""
        if length < 1:
            raise PosymError(f"the prompt length must be at least 1, got {length}")
        full = KVPolicy(np.ones_like(self.full), self.sink, self.recent, self.windows, self.n_heads)
        return float(self.kept(length).sum() / full.kept(length).sum())


def layer_windows(config) -> tuple:
    """Each layer's own sliding window from a transformers config (None: a global layer): the layers
    `layer_types` marks 'sliding_attention' (Gemma 2/3, Qwen2 with use_sliding_window), else every layer
    when the config sets sliding_window (Mistral, Starcoder2, Mixtral), else none."""
    config = getattr(config, "text_config", None) or config
    n_layers = config.num_hidden_layers
    window = getattr(config, "sliding_window", None) or None
    types = getattr(config, "layer_types", None)
    if types:
        return tuple(window if t == "sliding_attention" else None for t in types)
    return (window,) * n_layers


def head_counts(config) -> tuple[int, int, int]:
    """(layers, query heads, KV heads) of a transformers config (KV heads = query heads without GQA)."""
    config = getattr(config, "text_config", None) or config
    n_heads = config.num_attention_heads
    return config.num_hidden_layers, n_heads, getattr(config, "num_key_value_heads", None) or n_heads


def choose(
    keep, fraction: float, *, sink: int = SINK, recent: int = RECENT, windows, n_heads: int, name: str = ""
) -> KVPolicy:
    """The policy streaming round(fraction * cells) KV heads, the lowest of the keep-score grid `keep`
    [layers, kv_heads] (ties: the earlier layer, then the lower KV head, streams first)."""
    keep = np.asarray(keep, dtype=np.float64)
    if keep.ndim != 2:
        raise PosymError(f"keep scores must be a layers x KV-heads grid, got shape {keep.shape}")
    if not np.isfinite(keep).all():
        raise PosymError("keep scores must be finite (a head the table lacks has no score)")
    if not 0 <= fraction <= 1:
        raise PosymError(f"the streaming fraction must lie in [0, 1], got {fraction}")
    order = np.argsort(keep.ravel(), kind="stable")  # row-major: ties keep (layer, kv_head) order
    full = np.ones(keep.size, dtype=bool)
    full[order[: round(fraction * keep.size)]] = False
    return KVPolicy(full.reshape(keep.shape), sink, recent, tuple(windows), n_heads, name)


def keep_column(table, policy: str) -> str:
    """The head-table column a policy ranks by ('posym' adds a `keep` column to a copy: see `keep_scores`)."""
    columns = set(table.columns)
    if policy == "posym":
        for pos, sym in (("s_pos_sinkfree", "s_sym_sinkfree"), ("s_pos", "s_sym")):
            if {pos, sym} <= columns:
                return f"{sym} - {pos}"
        raise PosymError("the 'posym' policy needs s_pos and s_sym (or their sink-free columns) in the head table")
    if policy == "retrieval":
        if "retrieval" not in columns:
            raise PosymError("the 'retrieval' policy needs the atlas's retrieval column in the head table")
        return "retrieval"
    if policy == "duo":
        proxies = sorted(c for c in columns if c.startswith("non_streaming_w"))
        if not proxies:
            raise PosymError(
                "the 'duo' policy needs a non_streaming_w* column (posym atlas) or a full_attention_heads.tsv grid"
            )
        return min(proxies, key=lambda c: int(c.removeprefix("non_streaming_w")))  # the atlas's first window
    raise PosymError(f"policy {policy!r} ranks no head-table column; the ranked ones are posym, retrieval, duo")


def keep_scores(table, policy: str, n_layers: int, n_heads: int, n_kv_heads: int) -> np.ndarray:
    """float [layers, kv_heads]: a policy's keep score per KV head, the max over its query heads, from a
    head table with one row per (layer, head) (posym score / llm-study heads / atlas heads tables)."""
    column = keep_column(table, policy)
    if " - " in column:
        sym, pos = column.split(" - ")
        table = table.assign(keep=table[sym] - table[pos])
        column = "keep"
    frame = table[["layer", "head", column]]
    if frame[column].isna().any():
        raise PosymError(f"the head table's {column} is undefined for some heads")
    if frame.duplicated(["layer", "head"]).any():
        raise PosymError("the head table holds a (layer, head) twice (filter it to one prompt set or variant)")
    cells = set(zip(frame.layer.astype(int), frame["head"].astype(int)))
    if cells != {(layer, h) for layer in range(n_layers) for h in range(n_heads)}:
        # a missing query head would leave its KV head pooled over the others: refuse instead
        raise PosymError(
            f"the head table holds {len(cells)} (layer, head) cells, the model {n_layers} x {n_heads}: "
            "every head of every layer is needed"
        )
    pooled = atlas.kv_pool(frame, [column], n_heads, n_kv_heads)
    return atlas.kv_grid(pooled, f"{column}_max", n_layers, n_kv_heads)


def match_groups(reference: KVPolicy, match: str = "layer") -> list[list[int]]:
    """The layers a random draw matches `reference` within: each layer alone ('layer'), or the layers of
    each window, global layers (None) as one more type ('type'; in the order the types first appear).

    >>> policy = KVPolicy(np.ones((4, 1), bool), 4, 8, (None, 512, 512, None), 4)
    >>> match_groups(policy, "layer"), match_groups(policy, "type")
    ([[0], [1], [2], [3]], [[0, 3], [1, 2]])
    """
    if match not in MATCHES:
        raise PosymError(f"random draws match on {' or '.join(MATCHES)}, got {match!r}")
    if match == "layer":
        return [[layer] for layer in range(reference.n_layers)]
    return [[l for l, w in enumerate(reference.windows) if w == window] for window in dict.fromkeys(reference.windows)]


def matched_draws(reference: KVPolicy, match: str = "layer") -> int:
    """How many distinct random draws `match` allows: the product over its groups of (KV heads choose the
    streaming ones). 1 means every draw is `reference` itself, a null that cannot differ from it.

    >>> one_kv = KVPolicy(np.array([[False], [True], [False], [True]]), 4, 8, (None,) * 4, 4)
    >>> matched_draws(one_kv, "layer"), matched_draws(one_kv, "type")   # 4 layers x 1 KV head, 2 streaming
    (1, 6)
    """
    total = 1
    for layers in match_groups(reference, match):
        cells = reference.full[layers]
        total *= math.comb(cells.size, int((~cells).sum()))
    return total


def check_draws(reference: KVPolicy, match: str = "layer") -> None:
    """A PosymError when `reference` streams KV heads but `match` leaves its random draws no choice (every
    draw would be `reference` itself: a null that cannot differ from the policy it tests)."""
    if (~reference.full).any() and matched_draws(reference, match) == 1:
        per_layer = reference.n_kv_heads
        raise PosymError(
            f"every {match}-matched random draw is the {reference.name or 'reference'} policy itself "
            f"({per_layer} KV head{'s' * (per_layer > 1)} per layer); match the draws on layer type instead "
            "(kv-eval: random_match: type; kv-policy: --match type)"
        )


def random_policy(reference: KVPolicy, seed: int, match: str = "layer") -> KVPolicy:
    """A random draw matched to `reference` (`match_groups`): in each layer ('layer') or among the layers of
    each type ('type'), as many streaming KV heads as `reference` streams there, which ones drawn
    uniformly (numpy's default_rng(seed)). Both keep the budget and, per type, the kept-KV fraction."""
    rng = np.random.default_rng(seed)
    full = np.ones_like(reference.full)
    for layers in match_groups(reference, match):
        cells = reference.full[layers]  # [layers of the group, kv]
        block = np.ones(cells.size, dtype=bool)
        block[rng.choice(cells.size, size=int((~cells).sum()), replace=False)] = False
        full[layers] = block.reshape(cells.shape)
    return KVPolicy(full, reference.sink, reference.recent, reference.windows, reference.n_heads, f"random{seed}")


def uniform(full: bool, config, *, sink: int = SINK, recent: int = RECENT) -> KVPolicy:
    """'full' (every KV head keeps its cache) or 'streaming' (every KV head streams) for a config."""
    n_layers, n_heads, n_kv = head_counts(config)
    grid = np.full((n_layers, n_kv), full)
    return KVPolicy(grid, sink, recent, layer_windows(config), n_heads, "full" if full else "streaming")


def policy_from_table(
    policy: str,
    config,
    fraction: float,
    *,
    table=None,
    grid=None,
    sink: int = SINK,
    recent: int = RECENT,
    seed: int = 0,
    reference: str = "posym",
    match: str = "layer",
) -> KVPolicy:
    """The `policy` (one of POLICIES) for a model's transformers `config` at `fraction` of its KV heads
    streaming. table: a head table (pandas, one row per (layer, head)); grid: a layer x KV-head keep
    grid (DuoAttention's full_attention_heads.tsv read by posym.io.read_kv_table), which
    'duo' reads before the table. 'random' matches the `reference` policy built from the same inputs on
    its layers or layer types (`match`, `random_policy`); 'full' and 'streaming' ignore fraction, table and grid."""
    if policy not in POLICIES:
        raise PosymError(f"unknown KV policy {policy!r}; known: {', '.join(POLICIES)}")
    if policy in ("full", "streaming"):
        return uniform(policy == "full", config, sink=sink, recent=recent)
    n_layers, n_heads, n_kv = head_counts(config)
    if policy == "random":
        if reference in ("random", "full", "streaming"):
            raise PosymError(f"a random policy matches the layers of a ranked policy, not {reference!r}")
        base = policy_from_table(
            reference, config, fraction, table=table, grid=grid, sink=sink, recent=recent, seed=seed
        )
        check_draws(base, match)
        return random_policy(base, seed, match)
    if policy == "duo" and grid is not None:
        keep = np.asarray(grid, dtype=np.float64)
        if keep.shape != (n_layers, n_kv):
            raise PosymError(f"the KV grid is {keep.shape[0]} x {keep.shape[1]}, the model {n_layers} x {n_kv}")
    elif table is None:
        raise PosymError(f"the {policy!r} policy needs a head table" + (" or a KV grid" if policy == "duo" else ""))
    else:
        keep = keep_scores(table, policy, n_layers, n_heads, n_kv)
    windows = layer_windows(config)
    return choose(keep, fraction, sink=sink, recent=recent, windows=windows, n_heads=n_heads, name=policy)
