"""A KV policy (`posym.core.kvpolicy`) run on a transformers model: its exact attention semantics and a
per-head KV cache that really stores less (issue 53).

`policy_attention(model, policy)` is the semantics: within it, every attention layer runs this module's
kernel (`attend`), in which a streaming KV head's query heads see only the first `sink` keys and the last
`recent` keys up to the query (`kvpolicy.visible`), a full KV head's every key; a layer's own sliding
window and the model's mask (padding, windows) hold on both. Logits, soft-capping (Gemma 2) and the
softmax run in the working precision (float32, or float64 for a float64 model), so in float64 the
result is exact to rounding. The kernel replaces the model's (eager or sdpa: one that reads a 4-d mask or
none); it returns no attention weights. Without a `HeadKVCache`, each pass must see every key from
position 0 (one pass over the prompt, use_cache=False, or a cache that drops nothing, such as
DynamicCache on a model without sliding layers): the query of row i sits at position S - T + i. The
batch must be unpadded (the sinks are positions 0 .. sink - 1); where the model passes its position_ids
to the kernel (every family posym supports), positions that disagree are refused.

`HeadKVCache(model, policy)` is the memory: a transformers Cache whose layers keep, per group of KV heads
(full, streaming), only the keys the next query can still see: every key of a full KV head (the last
w - 1 on a layer with window w), the sinks and the last recent - 1 of a streaming one. It works only
inside `policy_attention(model, policy, cache=cache)`, whose kernel reads each group with its positions
(the model's own kernels would read the tensors `update` returns as the whole past); outside, `update`
refuses. `cache_bytes` measures what it holds, `policy_bytes` what it should hold (`KVPolicy.kept`),
`full_cache_bytes` what the model's full cache would.
`generate(model, ids, policy, new_tokens)` decodes greedily with it; transformers' own `model.generate(ids,
cache=cache, ...)` takes it as well, inside `policy_attention(model, policy, cache=cache)`.

>>> import torch, transformers
>>> from posym.core.kvpolicy import KVPolicy
>>> config = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64,
...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
>>> model = transformers.AutoModelForCausalLM.from_config(config).double().eval()
>>> policy = KVPolicy([[True, False], [False, False]], 2, 4, (None, None), n_heads=4)
>>> ids = torch.arange(1, 31)[None]                              # 30 prompt tokens
>>> tokens, cache = generate(model, ids, policy, 5)
>>> with torch.no_grad(), policy_attention(model, policy):       # the same tokens from the masked model
...     for _ in range(5):
...         ids = torch.cat([ids, model(ids, use_cache=False).logits[:, -1:].argmax(-1)], 1)
>>> bool((ids[:, 30:] == tokens).all())
True
>>> # 34 tokens went in (the last new one never does); K and V of 8 dims in float64 = 128 bytes a key:
>>> # the full KV head keeps 34 keys, each of the 3 streaming ones its 2 sinks + the last 3 (recent - 1)
>>> cache_bytes(cache), (34 + 3 * 5) * 128, full_cache_bytes(model, policy, 34, batch=1, dtype=torch.float64)
(6272, 6272, 17408)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from posym.core.kvpolicy import KVPolicy, head_counts, layer_windows, visible
from posym.core.qk import attention_modules
from posym.errors import PosymError

ATTEND_BYTES = 1 << 28
"""The most the logits of one block of queries take in `attend` (256 MiB)."""
UNSUPPORTED_KWARGS = ("s_aux", "sinks")
"""Kernel arguments this kernel cannot honour (learned attention sinks, as in GPT-OSS): refused."""


def check_policy(model, policy: KVPolicy) -> None:
    """A PosymError unless `policy` has the model's layers, heads, KV heads and layer windows."""
    n_layers, n_heads, n_kv = head_counts(model.config)
    if (policy.n_layers, policy.n_heads, policy.n_kv_heads) != (n_layers, n_heads, n_kv):
        raise PosymError(
            f"the policy is for {policy.n_layers} layers x {policy.n_heads} heads ({policy.n_kv_heads} KV heads), "
            f"the model has {n_layers} x {n_heads} ({n_kv})"
        )
    if policy.windows != layer_windows(model.config):
        raise PosymError(
            f"the policy's layer windows {policy.windows} are not the model's {layer_windows(model.config)}"
        )


def query_heads(kv_heads: Tensor, n_rep: int) -> Tensor:
    """The query heads [len(kv_heads) * n_rep] that read `kv_heads` (transformers' repeat_kv order)."""
    return (kv_heads[:, None] * n_rep + torch.arange(n_rep, device=kv_heads.device)).reshape(-1)


def base_visible(mask, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """bool [B|1, 1|H, T, n]: what the model's own mask lets each query see of the keys at `k_pos`
    (None: causal; bool: True = visible; float: 0 = visible, additive)."""
    if mask is None:
        return (k_pos[None, :] <= q_pos[:, None])[None, None]
    if not isinstance(mask, Tensor) or mask.dim() != 4:
        raise PosymError(f"the KV policy's kernel reads a 4-d attention mask or none, got {type(mask).__name__}")
    if mask.shape[-2] != len(q_pos) or mask.shape[-1] <= int(k_pos.max()):
        raise PosymError(
            f"the model's mask is {tuple(mask.shape[-2:])} for {len(q_pos)} queries over keys up to position "
            f"{int(k_pos.max())}: the cache dropped keys the KV policy cannot place (use a HeadKVCache or none)"
        )
    seen = mask if mask.dtype == torch.bool else mask == 0
    return seen[..., k_pos.to(mask.device)]


def attend(
    query: Tensor,
    groups,
    mask,
    q_pos: Tensor,
    *,
    scaling: float,
    softcap,
    window,
    sink: int,
    recent: int,
    biases: dict | None = None,
):
    """Attention output [B, H, T, dv] of query [B, H, T, d] (rotated) over `groups`: tuples (kv_heads [g],
    keys [B, g, n, d], values [B, g, n, dv], k_pos [n], streaming) that together hold every KV head once.
    Query head h reads KV head h // n_rep; the query of row i sits at position q_pos[i] and sees key j of
    its group iff the model's mask allows it and `kvpolicy.visible` (sink + recent if streaming, the
    layer's window) does. Queries run in blocks whose logits take at most ATTEND_BYTES (a long prefill
    never holds a [H, T, T] matrix).

    Without soft-capping a block runs PyTorch's fused `scaled_dot_product_attention` with the policy as an
    additive mask (0 where visible, finfo.min elsewhere: a row with no visible key averages the values, as
    the masked softmax below does); with it (Gemma 2) the logits are written out. `biases`, a dict the
    caller keeps for one forward pass, holds the masks already built: every layer of a pass with the same
    positions, window, mask and streaming flag has the same mask, so it is built once a pass, not once a
    layer (while the held masks take at most ATTEND_BYTES)."""
    B, H, T, _ = query.shape
    n_kv = sum(len(g[0]) for g in groups)
    n_rep = H // n_kv
    work = torch.promote_types(query.dtype, torch.float32)
    itemsize = torch.empty(0, dtype=work).element_size()
    dv = groups[0][2].shape[-1]
    out = torch.zeros(B, H, T, dv, dtype=groups[0][2].dtype, device=query.device)  # [B, H, T, dv]
    for kv_heads, keys, values, k_pos, streaming in groups:
        if not len(kv_heads):
            continue
        heads = query_heads(kv_heads, n_rep)  # [g * n_rep]
        k = keys.repeat_interleave(n_rep, dim=1).to(work)  # [B, g * n_rep, n, d]
        v = values.repeat_interleave(n_rep, dim=1)  # [B, g * n_rep, n, dv]
        rows = max(1, ATTEND_BYTES // (B * len(heads) * len(k_pos) * itemsize))
        for r0 in range(0, T, rows):
            r1 = min(T, r0 + rows)
            q = query[:, heads, r0:r1].to(work)  # [B, g * n_rep, r, d]
            if softcap is None:
                bias = _block_bias(biases, mask, q_pos, k_pos, r0, r1, streaming, window, sink, recent, H, work)
                if bias.shape[1] == H:
                    bias = bias[:, heads.to(bias.device)]
                # [B, g * n_rep, r, dv]: the fused kernel never writes the logits out
                att = torch.nn.functional.scaled_dot_product_attention(q, k, v.to(work), attn_mask=bias, scale=scaling)
                out[:, heads, r0:r1] = att.to(out.dtype)
                continue
            logits = q @ k.transpose(-1, -2) * scaling  # [B, g * n_rep, r, n]
            logits = torch.tanh(logits / softcap) * softcap
            seen = _block_seen(mask, q_pos, k_pos, r0, r1, streaming, window, sink, recent, H)  # [B|1, 1|H, r, n]
            if seen.shape[1] == H:
                seen = seen[:, heads.to(seen.device)]
            # finfo.min as transformers' eager masks: a row with no visible key (a padded query) stays finite
            logits = logits.masked_fill(~seen, torch.finfo(work).min)
            out[:, heads, r0:r1] = torch.softmax(logits, dim=-1).to(v.dtype) @ v
    return out


def _block_seen(mask, q_pos: Tensor, k_pos: Tensor, r0: int, r1: int, streaming: bool, window, sink, recent, H: int):
    """bool [B|1, 1|H, r1 - r0, n]: which keys the queries of rows r0..r1 see (the model's mask and the rule)."""
    rule = visible(
        q_pos[r0:r1, None],
        k_pos[None, :],
        sink=sink if streaming else None,
        recent=recent if streaming else None,
        window=window,
    )  # [r, n]
    rows_mask = mask[..., r0:r1, :] if isinstance(mask, Tensor) and mask.dim() == 4 else mask
    seen = base_visible(rows_mask, q_pos[r0:r1], k_pos) & rule.to(q_pos.device)  # [B|1, 1|H, r, n]
    if seen.shape[1] not in (1, H):
        raise PosymError(f"the model's mask has {seen.shape[1]} heads for {H} query heads")
    return seen


def _block_bias(biases, mask, q_pos, k_pos, r0, r1, streaming, window, sink, recent, H, work) -> Tensor:
    """The additive mask [B|1, 1|H, r, n] of `_block_seen`, from `biases` when a layer before built it."""
    key = (id(mask), r0, r1, streaming, window, len(q_pos), len(k_pos), q_pos.device)
    if biases is not None and key in biases:
        held_q, held_k, bias = biases[key]
        if torch.equal(held_q, q_pos) and torch.equal(held_k, k_pos):  # positions are a cheap exact check
            return bias
    seen = _block_seen(mask, q_pos, k_pos, r0, r1, streaming, window, sink, recent, H)
    bias = torch.zeros(seen.shape, dtype=work, device=seen.device).masked_fill_(~seen, torch.finfo(work).min)
    if biases is not None:
        held = sum(b.numel() * b.element_size() for _, _, b in biases.values())
        if held + bias.numel() * bias.element_size() <= ATTEND_BYTES:
            biases[key] = (q_pos.clone(), k_pos.clone(), bias)
    return bias


def _layer_groups(policy: KVPolicy, layer: int, device) -> list[tuple[Tensor, bool]]:
    """(KV-head indices, streaming) of a layer's full and streaming groups."""
    full = torch.as_tensor(policy.full[layer], device=device)
    every = torch.arange(policy.n_kv_heads, device=device)
    return [(every[full], False), (every[~full], True)]


@contextlib.contextmanager
def policy_attention(model, policy: KVPolicy, cache: HeadKVCache | None = None) -> Iterator[None]:
    """Within the block, every attention layer of `model` runs `attend` under `policy` (see the module
    docstring); with `cache`, over the keys that HeadKVCache holds (and `cache.update` is allowed)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    check_policy(model, policy)
    if cache is not None and cache.policy is not policy:
        raise PosymError("the cache was built for another policy")
    modules = attention_modules(model)
    state: dict = {"layer": None, "biases": {}}
    interface = ALL_ATTENTION_FUNCTIONS.get_interface

    def kernel(attn, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
        layer = state["layer"]
        bad = [name for name in UNSUPPORTED_KWARGS if kwargs.get(name) is not None]
        if bad:
            raise PosymError(f"the KV policy's kernel cannot honour {', '.join(bad)} (layer {layer})")
        window = policy.windows[layer]
        given = kwargs.get("sliding_window")
        if given is not None and given != window:
            raise PosymError(f"layer {layer}'s kernel has a window of {given}, the policy {window}")
        if dropout and attn.training:
            raise PosymError("the KV policy's kernel runs without attention dropout (put the model in eval mode)")
        if query.shape[1] != policy.n_heads:
            raise PosymError(f"layer {layer} has {query.shape[1]} query heads, the policy {policy.n_heads}")
        T = query.shape[-2]
        if cache is None:
            S = key.shape[-2]
            k_pos = torch.arange(S, device=query.device)
            groups = [(i, key[:, i], value[:, i], k_pos, s) for i, s in _layer_groups(policy, layer, key.device)]
            q_pos = torch.arange(S - T, S, device=query.device)
        else:
            held = cache.layers[layer]
            if held.current is None:
                raise PosymError(f"layer {layer} ran without updating the HeadKVCache (pass it as the model's cache)")
            (groups, q_pos), held.current = held.current, None  # read once: a later pass must update again
        given_pos = kwargs.get("position_ids")
        if isinstance(given_pos, Tensor) and not bool((given_pos.reshape(-1, T) == q_pos.to(given_pos.device)).all()):
            raise PosymError(
                f"layer {layer}'s queries are at positions {given_pos.reshape(-1, T)[0].tolist()[:8]}, the KV policy "
                f"places them at {q_pos.tolist()[:8]}: a cache dropped keys or the batch is padded (the policy counts "
                "its sinks and recent keys from position 0 of an unpadded batch; use a HeadKVCache or no cache)"
            )
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = attend(
            query,
            groups,
            attention_mask,
            q_pos,
            scaling=scale,
            softcap=softcap,
            window=window,
            sink=policy.sink,
            recent=policy.recent,
            biases=state["biases"],
        )
        return out.transpose(1, 2).contiguous(), None  # [B, T, H, dv] as the model's kernels return

    def get_interface(implementation, default):
        if state["layer"] is None:
            return interface(implementation, default)
        if implementation is not None and "flash" in str(implementation):
            raise PosymError(f"the KV policy's kernel replaces eager or sdpa attention, not {implementation}")
        return kernel

    def pre(layer: int):
        def hook(module_, args, kwargs):
            state["layer"] = layer
            if layer == 0:  # a new pass: its masks are its own (id(mask) may be reused by a later pass)
                state["biases"] = {}

        return hook

    def post(module_, args, output):
        state["layer"] = None

    handles = []
    for layer, attn in enumerate(modules):
        handles.append(attn.register_forward_pre_hook(pre(layer), with_kwargs=True))
        handles.append(attn.register_forward_hook(post))
    ALL_ATTENTION_FUNCTIONS.get_interface = get_interface
    if cache is not None:
        cache.armed = True
    try:
        yield
    finally:
        del ALL_ATTENTION_FUNCTIONS.get_interface  # the instance attribute: the class method again
        for handle in handles:
            handle.remove()
        if cache is not None:
            cache.armed = False


class HeadKVLayer(CacheLayerMixin):
    """One layer of a HeadKVCache: per group of KV heads (full, streaming), the keys and values [B, g, n, d]
    the next query can still see and their positions [n]; `current` holds the last update's groups
    (every key the queries of that pass see) and those queries' positions, for `policy_attention`'s kernel."""

    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, cache: HeadKVCache, layer: int):
        super().__init__()
        self.cache, self.layer = cache, layer
        self.window = cache.policy.windows[layer]
        self.seen = 0  # tokens this layer has been given (the logical sequence length)
        self.stored: list = []  # per group: [kv_heads, keys, values, positions, streaming]
        self.current = None

    @property
    def is_sliding(self) -> bool:
        return self.window is not None  # the model builds its sliding-window mask for this layer

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device = key_states.device
        B, _, _, d = key_states.shape
        dv = value_states.shape[-1]
        for kv_heads, streaming in _layer_groups(self.cache.policy, self.layer, self.device):
            g = len(kv_heads)
            keys = key_states.new_zeros(B, g, 0, d)
            values = value_states.new_zeros(B, g, 0, dv)
            self.stored.append(
                [kv_heads, keys, values, torch.zeros(0, dtype=torch.long, device=self.device), streaming]
            )
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.cache.armed:
            raise PosymError(
                "a HeadKVCache works only inside policy_attention(model, policy, cache=cache): the model's own "
                "kernels cannot read keys stored per group of heads"
            )
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        T = key_states.shape[-2]
        policy = self.cache.policy
        new_pos = torch.arange(self.seen, self.seen + T, device=self.device)  # [T]
        groups = []
        for slot in self.stored:
            kv_heads, keys, values, pos, streaming = slot
            keys = torch.cat([keys, key_states[:, kv_heads]], dim=-2)  # [B, g, n + T, d]
            values = torch.cat([values, value_states[:, kv_heads]], dim=-2)
            pos = torch.cat([pos, new_pos])
            groups.append((kv_heads, keys, values, pos, streaming))
            # keep what the next query (position seen + T) can see: no later query sees more of the past
            keep = visible(
                self.seen + T,
                pos,
                sink=policy.sink if streaming else None,
                recent=policy.recent if streaming else None,
                window=self.window,
            )  # [n + T]
            if not bool(keep.all()):
                keys, values, pos = keys[:, :, keep].contiguous(), values[:, :, keep].contiguous(), pos[keep]
            slot[1:4] = keys, values, pos
        self.seen += T
        self.current = (groups, new_pos)
        return key_states, value_states  # unread: policy_attention's kernel reads `current`

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0  # the logical length: the kernel picks the stored positions

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def stored_bytes(self) -> int:
        """Bytes of the keys and values this layer keeps between passes."""
        return sum(slot[1].nbytes + slot[2].nbytes for slot in self.stored)

    def reset(self) -> None:
        self.stored, self.current, self.seen, self.is_initialized = [], None, 0, False

    def offload(self):
        raise PosymError("a HeadKVCache does not offload")

    def prefetch(self):
        pass

    def reorder_cache(self, beam_idx: Tensor) -> None:
        for slot in self.stored:
            slot[1] = slot[1].index_select(0, beam_idx.to(slot[1].device))
            slot[2] = slot[2].index_select(0, beam_idx.to(slot[2].device))


class HeadKVCache(Cache):
    """A transformers Cache holding, per (layer, KV head), the full past or only sink + recent keys as
    `policy` says (see the module docstring); use it inside `policy_attention(model, policy, cache=...)`."""

    def __init__(self, model, policy: KVPolicy):
        check_policy(model, policy)
        self.policy, self.armed = policy, False
        super().__init__(layers=[HeadKVLayer(self, layer) for layer in range(policy.n_layers)])


def cache_bytes(cache: HeadKVCache) -> int:
    """Bytes of keys and values a HeadKVCache holds now."""
    return sum(layer.stored_bytes() for layer in cache.layers)


def full_cache_bytes(model, policy: KVPolicy, length: int, *, batch: int, dtype) -> int:
    """Bytes of keys and values the model's full cache holds after `length` tokens: every KV head keeps
    what its layer lets the next query see (all `length` keys; the last w - 1 of a layer with window w),
    as a HeadKVCache under the 'full' policy does."""
    check_policy(model, policy)
    full = KVPolicy(np.ones_like(policy.full), policy.sink, policy.recent, policy.windows, policy.n_heads)
    return policy_bytes(model, full, length, batch=batch, dtype=dtype)


def policy_bytes(model, policy: KVPolicy, length: int, *, batch: int, dtype) -> int:
    """Bytes of keys and values a HeadKVCache under `policy` holds after `length` tokens (`policy.kept`)."""
    config = getattr(model.config, "text_config", None) or model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return 2 * batch * int(policy.kept(length).sum()) * head_dim * itemsize


@torch.no_grad()
def generate(model, input_ids: Tensor, policy: KVPolicy, new_tokens: int) -> tuple[Tensor, HeadKVCache]:
    """Greedy decoding of `new_tokens` tokens after `input_ids` [B, T] (no padding) with a HeadKVCache:
    (the new tokens [B, new_tokens], the cache)."""
    if new_tokens < 1:
        raise PosymError(f"new_tokens must be at least 1, got {new_tokens}")
    cache = HeadKVCache(model, policy)
    out, step = [], input_ids
    with policy_attention(model, policy, cache=cache):
        for _ in range(new_tokens):
            logits = model(step, cache=cache, use_cache=True).logits  # [B, T, V]
            step = logits[:, -1:].argmax(-1)  # [B, 1]
            out.append(step)
    return torch.cat(out, dim=1), cache
