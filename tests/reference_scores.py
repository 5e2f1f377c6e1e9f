"""Slow, obvious reference implementations of the head scores (docs/method.md section 3).

Importable from any test in tests/ (pytest puts this folder on sys.path):
    from reference_scores import reference_swap_scores, reference_model_scores

`reference_swap_scores` loops over swaps with an explicit softmax of the modified row.
`reference_model_scores` is the definition itself: for every swap it exchanges the residual
vectors entering the layer (a pre-hook on the decoder layer), re-runs that layer and reads the
query's attention row, computed alone (one row, so long prompts stay cheap) by a recording attention
function in the model's own dtype (Hugging Face's eager attention rounds logits/softmax to float32 even
in float64 models); the layers before it run the model's own attention implementation (eager or SDPA).
"""

from __future__ import annotations

import itertools
import sys

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.masking_utils import eager_mask

RECORDED: list[torch.Tensor] = []
VISIBLE: list[torch.Tensor] = []
"""Per recorded pass: [T, T] bool, which keys each query of the target layer sees under the model's
own attention mask (its causal sliding window on local layers) and the written-out causal mask."""
TARGET = {"layer": None, "own": False, "query": None, "kernel": None}
"""The layer being recorded, whether it runs the model's own eager kernel, the one query row to compute
(None: every row) and the kernel of every other layer (the model's own attention implementation)."""


def _visible(attention_mask, t: int) -> torch.Tensor:
    """[t, t] bool: the keys each query sees, from the additive (0 = visible) or boolean mask the
    layer received, and causality written out (no trust in the mask plumbing for that part)."""
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    if attention_mask is None:
        return causal
    mask = attention_mask[0, 0, :, :t].cpu()
    return causal & (mask if mask.dtype == torch.bool else mask == 0)


def _recording_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Plain attention in the input dtype that records its weights [batch, heads, q, k], in the
    target layer only; every other layer runs the model's own eager kernel, so the residual stream
    entering the target layer is exactly the one the fast path's forward pass sees. With
    TARGET["own"] the target layer runs the model's own eager kernel too and its weights are recorded
    (float32 softmax in most families). Every other layer runs the model's own attention implementation
    (TARGET["kernel"]: eager, or SDPA for a model set to it). With TARGET["query"] = q only query q's
    row of the target layer is computed ([batch, heads, 1, k]; the layer's other outputs are zeros, and
    the pass stops after the layer), so a long prompt costs one row, not a [T, T] map."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    if module.layer_idx == TARGET["layer"]:
        VISIBLE.append(_visible(attention_mask, key.shape[-2]))
    if module.layer_idx != TARGET["layer"]:
        kernel = TARGET["kernel"] or eager
        return kernel(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if TARGET["own"]:
        out = eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        RECORDED.append(out[1].detach())
        return out
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: each key head serves `groups`
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    visible = VISIBLE[-1]
    row = TARGET["query"]
    if row is not None:
        query, visible = query[:, :, row : row + 1], visible[row : row + 1]
    logits = query @ key.transpose(2, 3) * scaling  # [batch, heads, q, k]
    if kwargs.get("softcap") is not None:  # Gemma 2: logits soft-capped before the softmax
        logits = kwargs["softcap"] * torch.tanh(logits / kwargs["softcap"])
    logits = logits.masked_fill(~visible.to(logits.device), float("-inf"))  # causal (+ the model's window)
    weights = torch.softmax(logits, dim=-1)
    RECORDED.append(weights.detach())
    out = weights @ value  # [batch, heads, q, d]
    if row is not None:  # the other rows are never read: the pass ends with this layer
        out = torch.zeros_like(value).index_copy_(2, torch.tensor([row], device=out.device), out)
    return out.transpose(1, 2).contiguous(), weights


AttentionInterface.register("posym_reference", _recording_attention)
AttentionMaskInterface.register("posym_reference", eager_mask)  # the additive masks eager layers expect


def reference_blocks(keys: int, blocks: int | None) -> list[tuple[list[int], list[int]]]:
    """The swaps as (block A, block B) lists of key positions, written out naively."""
    if blocks is None:
        return [([i], [j]) for i, j in itertools.combinations(range(keys), 2)]
    size = keys // blocks
    start = keys - size * blocks
    chunks = [list(range(start + k * size, start + (k + 1) * size)) for k in range(blocks)]
    return list(itertools.combinations(chunks, 2))


def _scores_from_rows(d, rows_after, swaps, tau):
    """s_pos, s_sym from the clean row d and one modified row per swap (lists of floats)."""
    gaps, pos, sym = [], [], []
    for (a, b), d2 in zip(swaps, rows_after):
        v = torch.stack([d[a].mean(), d[b].mean()])
        v2 = torch.stack([d2[a].mean(), d2[b].mean()])
        gaps.append((v[0] - v[1]).abs())
        pos.append(F.cosine_similarity(v2, v, dim=0, eps=1e-300))
        sym.append(F.cosine_similarity(v2, v.flip(0), dim=0, eps=1e-300))
    alpha = torch.softmax(torch.stack(gaps) / tau, dim=0)
    return float((alpha * torch.stack(pos)).sum()), float((alpha * torch.stack(sym)).sum())


def reference_swap_scores(clean, swapped, *, tau=1e-4, blocks=None, compare="probs", exclude_keys=()):
    """The scores of one query row [n] from its swapped-logit matrix [n, n], one swap at a time
    (swaps touching a key of exclude_keys are left out), and the clean row's sink view."""
    clean, swapped = clean.double(), swapped.double()
    n = clean.shape[0]
    swaps = [(a, b) for a, b in reference_blocks(n - 1, blocks) if not set(a + b) & set(exclude_keys)]
    rows = []
    for a, b in swaps:
        row = clean.clone()
        for x, y in zip(a, b):
            row[x], row[y] = swapped[x, y], swapped[y, x]
        rows.append(row if compare == "logits" else torch.softmax(row, 0))
    d = clean if compare == "logits" else torch.softmax(clean, 0)
    s_pos, s_sym = _scores_from_rows(d, rows, swaps, tau)
    p = torch.softmax(clean, 0)
    top = max(range(n), key=lambda k: p[k])
    return {
        "s_pos": s_pos,
        "s_sym": s_sym,
        "entropy": float(-(p * p.log()).sum()),
        "n_swaps": len(swaps),
        "attn_first": float(p[0]),
        "top_key": top,
        "attn_top": float(p[top]),
    }


def channel_dims(pairing: str, rotary: int, head_dim: int) -> list[list[int]]:
    """Dims of each RoPE plane (frequency order: plane m of GPT-J is dims 2m, 2m + 1, of the
    half-split models dims m, m + rotary / 2), then of the non-rotary rest, written out naively."""
    half = rotary // 2
    planes = [[2 * m, 2 * m + 1] if pairing == "interleaved" else [m, m + half] for m in range(half)]
    return planes + ([list(range(rotary, head_dim))] if head_dim > rotary else [])


def decoder_layers(model):
    """The decoder layers of a causal LM: its base model's `layers` (or GPT-J's `h`)."""
    base = model.base_model
    return base.h if hasattr(base, "h") else base.layers


def attention_rows(model, ids, layer, swap=None, own=False, query=None):
    """Attention weights [heads, T, T] of `layer` on prompt `ids` after exchanging the residual
    vectors entering that layer at the positions swap = (A, B) (lists, element-wise): recomputed in
    the model's dtype from the layer's own rotated queries and keys, or with own=True the weights of
    the model's own eager kernel. query: only that query's row, [heads, T] (recomputed alone, unless
    own=True). The layers before `layer` run the model's own attention implementation."""

    def exchange(module, args, kwargs):
        hidden = (args[0] if args else kwargs["hidden_states"]).clone()  # [1, T, width]
        if swap is not None:
            a, b = torch.tensor(swap[0]), torch.tensor(swap[1])
            hidden[:, a], hidden[:, b] = hidden[:, b].clone(), hidden[:, a].clone()
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}

    def stop(module, args, output):
        raise _Recorded  # later layers cannot change this one's attention

    previous = model.config._attn_implementation
    kernel = None if previous == "eager" else ALL_ATTENTION_FUNCTIONS[previous]
    handles = [
        decoder_layers(model)[layer].register_forward_pre_hook(exchange, with_kwargs=True),
        decoder_layers(model)[layer].register_forward_hook(stop),
    ]
    RECORDED.clear()
    VISIBLE.clear()
    TARGET.update(layer=layer, own=own, query=None if own else query, kernel=kernel)
    model.set_attn_implementation("posym_reference")
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    except _Recorded:
        pass
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(previous)
        TARGET.update(query=None, kernel=None)
    weights = RECORDED[0][0]  # [heads, T, T], or [heads, 1, T] for one recomputed row
    if query is None:
        return weights
    return weights[:, query] if own else weights[:, 0]


class _Recorded(Exception):
    """Ends a reference pass once the target layer has run."""


def visible_keys_of(model, ids, query, layer) -> list[int]:
    """The key positions `query` sees in `layer` under the model's own attention mask (one pass)."""
    attention_rows(model, ids, layer)
    return VISIBLE[0][query].nonzero()[:, 0].tolist()


def reference_model_scores(
    model, ids, query, layer, *, tau=1e-4, blocks=None, own=False, rows=None, exclude_keys=(), window=None
):
    """Per-head scores of one (prompt, query, layer) by re-running the layer once per swap
    (own: read the model's own eager attention weights, see `attention_rows`; rows: another
    function (model, ids, layer, swap) -> [heads, T, T], e.g. for TransformerLens models; exclude_keys:
    positions no swap may move). The swaps are those of keys the query sees under the model's own mask
    (both keys inside a sliding window: the pairs a re-run can tell apart), and the row is over those keys;
    a `rows` function records no mask, so its layer's window is given as `window` (keys query - window + 1
    .. query)."""
    if rows is None:  # the query's row alone (recomputed by itself from the layer's q/k, or the eager kernel's)
        row = lambda m, i, layer_, swap=None: attention_rows(m, i, layer_, swap, own=own, query=query)  # noqa: E731
    else:
        row = lambda m, i, layer_, swap=None: rows(m, i, layer_, swap)[:, query]  # noqa: E731
    ids = list(ids)  # the whole prompt, as the fast path runs it (the same shapes: the same float rounding upstream)
    VISIBLE.clear()  # filled by attention_rows; another `rows` function leaves it empty: every key 0..query
    full = row(model, ids, layer)  # [heads, T]
    seen = (
        VISIBLE[0][query].nonzero()[:, 0].tolist()
        if VISIBLE
        else list(range(max(0, query - window + 1) if window else 0, query + 1))
    )
    first = seen[0]
    assert seen == list(range(first, query + 1)), seen  # a causal window ending at the query
    clean = full[:, first : query + 1]  # [heads, n]
    # swaps of visible keys only, written in positions; the rows are indexed from `first`
    swaps = [([first + x for x in a], [first + y for y in b]) for a, b in reference_blocks(query - first, blocks)]
    swaps = [(a, b) for a, b in swaps if not set(a + b) & set(exclude_keys)]
    after = [row(model, ids, layer, s)[:, first : query + 1] for s in swaps]
    swaps = [([x - first for x in a], [y - first for y in b]) for a, b in swaps]  # indices into the rows
    out = []
    for h in range(clean.shape[0]):
        s_pos, s_sym = _scores_from_rows(clean[h].double(), [r[h].double() for r in after], swaps, tau)
        p = clean[h].double()
        top = int(p.argmax())
        out.append(
            {
                "head": h,
                "s_pos": s_pos,
                "s_sym": s_sym,
                "entropy": float(-(p * p.clamp_min(1e-300).log()).sum()),
                "n_swaps": len(swaps),
                "keys": len(seen),
                "attn_first": float(p[0]) if first == 0 else float("nan"),
                "top_key": top + first,
                "attn_top": float(p[top]),
            }
        )
    return out
