"""Per-head queries and keys of Hugging Face RoPE models, with the model's own rotary tables.

Every attention logit of a supported model is scale * (R_p q_p) . (R_j k_j): `head_qk` (or, one
layer at a time, `capture`) returns the pre-rotation queries q and keys k of every head (projection
outputs, grouped-query keys repeated per query head) and the cos/sin tables and plane pairing the
model itself rotates with, from one forward pass that stops at the last requested layer's attention
kernel (that kernel, the rest of the pass and the LM head never run).
`rotate` applies RoPE (or its transpose) and `pair_planes` splits vectors into RoPE planes, so
`posym.core.scores` (swap scores) and `posym.core.geometry` (per-plane scores) compute any logit exactly.

Supported: any transformers causal LM whose attention rotates queries and keys with its modeling
module's `apply_rotary_pos_emb` and calls its kernel through `ALL_ATTENTION_FUNCTIONS` (one general
capture, no table per family): `capture` spies on both during the pass, so it gets the pre-rotation
rotary dims (after any q/k norm: Qwen3, OLMo 2, Gemma 3), the pass-through dims (partial rotary:
GPT-NeoX, Phi-3, StableLM, GPT-J), the layer's own cos/sin (Gemma 3's local and global bases), its
scale (Gemma 2's query_pre_attn_scalar, Granite's attention multiplier), its soft-cap (Gemma 2) and
sliding window; the plane layout (half-split or interleaved) is read off the layer's own rotation,
which must be reproduced to float rounding. Tested: GPT-J, GPT-NeoX, Llama, Mistral, Qwen2, Qwen3,
Gemma, Gemma 2, Gemma 3 (text), Phi-3, OLMo 2, StableLM, Starcoder2, Granite, Mixtral, Qwen2-MoE,
Qwen3-MoE, Cohere, Phi. Not decomposable: DeepSeek V2/V3 and Kimi K2 (decoupled RoPE; `check_rope` says so).
Models without RoPE (e.g. GPT-2) are a PosymError. Sliding windows (Gemma 2/3's local layers, Mistral,
Qwen2, Starcoder2, ...): a layer with window w lets query p see keys p - w + 1 .. p only (`HeadQK.window`,
`first_key`), and every engine works over the keys a query sees (docs/windows.md); `capture` checks
that the attention mask the layer actually applies is exactly that causal window, so any other
pattern (chunked or bidirectional attention) is a PosymError rather than a silently wrong score.
`check_prompt` / `as_batch` validate ids (vocabulary, positions) and `check_layers` layer indices
before any pass.
"""

from __future__ import annotations

import contextvars
import importlib
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from posym.errors import PosymError

# Model types with rotary embeddings that the per-head decomposition cannot express, and why.
UNDECOMPOSABLE = {
    kind: "its multi-head latent attention rotates a separate, head-shared key slice (decoupled RoPE) "
    "that posym cannot split into per-head pre-rotation queries and keys"
    for kind in ("deepseek_v2", "deepseek_v3", "kimi_k2")
} | {
    kind: "it rotates queries and keys as complex numbers (apply_rotary_emb with freqs_cis), not through "
    "apply_rotary_pos_emb, which posym's capture reads, and its local layers attend in chunks"
    for kind in ("llama4", "llama4_text")
}


@dataclass
class HeadQK:
    """What one layer's attention logits are made of, for a batch of equal-length prompts.

    logit(query p, key j) = scale * rotate(q[:, h, p], p) . rotate(k[:, h, j], j), where `rotate`
    applies the model's RoPE (the first `rotary_dim` dims, paired by `pairing`; the rest pass through).
    """

    q: Tensor
    """Pre-rotation queries [batch, heads, T, head_dim] (projection output, biases included)."""
    k: Tensor
    """Pre-rotation keys [batch, heads, T, head_dim], already repeated per query head under GQA."""
    cos: Tensor
    """The model's rotary cosines [batch, T, rotary_dim], in the layout `pairing` expects."""
    sin: Tensor
    """The model's rotary sines [batch, T, rotary_dim]."""
    pairing: str
    """'interleaved' (GPT-J: planes (2m, 2m+1)) or 'half' (NeoX/Llama: planes (m, m + rotary_dim/2))."""
    scale: float
    """Multiplier of the dot products: the layer's own `scaling` (usually 1/sqrt(head_dim); Gemma 2:
    query_pre_attn_scalar^-1/2; Granite: attention_multiplier)."""
    softcap: float | None = None
    """Attention-logit soft-capping (Gemma 2): the logit is softcap * tanh(raw / softcap); None = none."""
    window: int | None = None
    """The layer's sliding window w: query p sees keys max(0, p - w + 1) .. p (w keys, itself included);
    None = every key 0 .. p (global attention)."""

    def first_key(self, p: int) -> int:
        """The first key position query p sees (0 unless the layer's window excludes earlier keys)."""
        return 0 if self.window is None else max(0, p - self.window + 1)

    def first_keys(self, positions: Tensor) -> Tensor:
        """`first_key` of every query position in `positions` (a long tensor; same shape and device)."""
        return torch.zeros_like(positions) if self.window is None else (positions - self.window + 1).clamp_min(0)


def rotate_pairs(x: Tensor, pairing: str) -> Tensor:
    """J x: each RoPE plane (x1, x2) -> (-x2, x1) (rotate_every_two or rotate_half)."""
    if pairing == "interleaved":
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, pairing: str, *, inverse: bool = False) -> Tensor:
    """R x = x cos + J x sin on the first cos.shape[-1] dims of x [..., d] (R^T x if inverse).

    R^T = cos - J sin because J is antisymmetric; with scaled tables (e.g. YaRN) R is not orthogonal
    and R^T is still exactly its transpose, which is what q . R k = (R^T q) . k needs.
    """
    r = cos.shape[-1]
    head, rest = x[..., :r], x[..., r:]
    turned = head * cos + rotate_pairs(head, pairing) * (-sin if inverse else sin)
    return torch.cat((turned, rest.expand(*turned.shape[:-1], -1)), dim=-1)  # broadcast like the tables


def pair_planes(x: Tensor, pairing: str, rotary_dim: int) -> Tensor:
    """The RoPE planes of x [..., d] as [..., rotary_dim / 2, 2] (plane m = frequency ID m + 1)."""
    head = x[..., :rotary_dim]
    if pairing == "interleaved":
        return head.unflatten(-1, (rotary_dim // 2, 2))
    return torch.stack((head[..., : rotary_dim // 2], head[..., rotary_dim // 2 :]), dim=-1)


def plane_dims(planes, pairing: str, rotary_dim: int) -> list[int]:
    """The head dims of RoPE planes `planes` (0-based: plane m is frequency ID m + 1, the layout of
    `pair_planes`): (2m, 2m + 1) interleaved, (m, m + rotary_dim / 2) half-split; sorted.

    >>> plane_dims([0, 3], "half", 8), plane_dims([0, 3], "interleaved", 8)
    ([0, 3, 4, 7], [0, 1, 6, 7])
    """
    half = rotary_dim // 2
    bad = [m for m in planes if not 0 <= int(m) < half]
    if bad:
        raise PosymError(
            f"RoPE planes must lie in 0..{half - 1} ({half} planes of {rotary_dim} rotary dims), got {bad}"
        )
    if pairing == "interleaved":
        return sorted(d for m in planes for d in (2 * int(m), 2 * int(m) + 1))
    return sorted(d for m in planes for d in (int(m), int(m) + half))


def modeling_module(kind: str | None):
    """The transformers modeling module of a model type, or None if transformers has none."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    if kind not in CONFIG_MAPPING_NAMES:
        return None
    name = model_type_to_module_name(kind)
    try:
        return importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except ImportError:
        return None


def check_rope(kind: str | None, where: str) -> None:
    """A PosymError unless models of type `kind` rotate queries and keys in the form posym decomposes."""
    import transformers

    if kind in UNDECOMPOSABLE:
        raise PosymError(f"{where} holds a {kind!r} model, which has rotary embeddings but {UNDECOMPOSABLE[kind]}")
    module = modeling_module(kind)
    if module is None:
        raise PosymError(
            f"{where} holds a {kind!r} model, which transformers {transformers.__version__} does not implement"
        )
    if not hasattr(module, "apply_rotary_pos_emb"):
        raise PosymError(
            f"{where} holds a {kind!r} model, which posym cannot score: head scores need rotary "
            "position embeddings (RoPE) and this architecture has none"
        )


def _decoder_layers(model):
    """The decoder layers of a causal LM (or of its base model): the ModuleList `layers` or `h`."""
    for owner in (getattr(model, "base_model", model), model):
        for name in ("layers", "h"):
            layers = getattr(owner, name, None)
            if isinstance(layers, torch.nn.ModuleList):
                return layers
    raise PosymError(f"cannot find the decoder layers of a {_kind(model)!r} model")


def _attention(layer_module):
    """The attention module of one decoder layer."""
    for name in ("self_attn", "attn", "attention"):
        module = getattr(layer_module, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise PosymError(f"cannot find the attention module of {type(layer_module).__name__}")


def attention_modules(model) -> list[torch.nn.Module]:
    """The attention module of every decoder layer, in layer order."""
    return [_attention(layer) for layer in _decoder_layers(model)]


def rotary_module(model):
    """The module whose `apply_rotary_pos_emb` the model's attention calls (patched by `capture` and by
    `posym.core.interventions.ablated_planes`)."""
    check_rope(_kind(model), "this model")
    return sys.modules[type(_attention(_decoder_layers(model)[0])).__module__]


def _kind(model) -> str | None:
    return getattr(model.config, "model_type", None)


class _Done(Exception):
    """Raised by the kernel spy of the last requested layer once it holds that layer's queries and keys:
    the rest of the pass (that layer's attention kernel and output projection, its MLP, every later
    layer, the final norm; the LM head never runs, `capture` calls the base model) is skipped."""


@contextmanager
def _spying(model, state: dict):
    """Within: the modeling module's `apply_rotary_pos_emb` and the attention kernel every layer asks
    `ALL_ATTENTION_FUNCTIONS` for append what they receive to state["rope"] / state["kernel"] while
    state["layer"] is set (by the attention pre-hooks of `capture`); the kernel of layer state["last"]
    raises _Done instead of running."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    module = rotary_module(model)
    rotary, interface = module.apply_rotary_pos_emb, ALL_ATTENTION_FUNCTIONS.get_interface

    def rotary_spy(*args, **kwargs):
        if state["layer"] is not None:
            state["rope"].append(args)
        return rotary(*args, **kwargs)

    def get_interface(implementation, default):
        kernel = interface(implementation, default)

        def kernel_spy(attn, query, key, *args, **kwargs):
            if state["layer"] is not None:
                mask = args[1] if len(args) > 1 else kwargs.get("attention_mask")  # (value, attention_mask, ...)
                state["kernel"] = (query, key, {**kwargs, "attention_mask": mask})
                if state["layer"] == state["last"]:
                    raise _Done  # scores need nothing the kernel computes: the pass can stop here
            return kernel(attn, query, key, *args, **kwargs)

        return kernel_spy

    module.apply_rotary_pos_emb, ALL_ATTENTION_FUNCTIONS.get_interface = rotary_spy, get_interface
    try:
        yield
    finally:
        module.apply_rotary_pos_emb = rotary
        del ALL_ATTENTION_FUNCTIONS.get_interface  # the instance attribute: the class method again


def _pre_rotation(state: dict, kind) -> tuple:
    """(q, k [B, H or KVH, T, d] before rotation, cos, sin [B|1, T, r]) from one layer's spied calls.

    The kernel receives the rotated heads (q/k norms applied, non-rotary dims passed through); the
    rotary function received the pre-rotation rotary dims. Standard form: one call (q, k, cos, sin) on
    [B, H, T, >= r]; GPT-J form: two calls (k then q) of (x [B, T, H, r], sin, cos [B, T, r / 2])."""
    calls, (q_post, k_post, _) = state["rope"], state["kernel"]
    if len(calls) == 1 and len(calls[0]) >= 4:
        q_in, k_in, cos, sin = calls[0][:4]
    elif len(calls) == 2 and all(len(c) == 3 for c in calls):
        (k_in, sin, cos), (q_in, _, _) = calls
        q_in, k_in = q_in.transpose(1, 2), k_in.transpose(1, 2)
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)  # one value per plane
    else:
        raise PosymError(f"a {kind!r} layer calls apply_rotary_pos_emb in a form posym does not know")
    r = cos.shape[-1]
    q = torch.cat((q_in[..., :r], q_post[..., r:]), dim=-1)  # the non-rotary dims pass through RoPE
    k = torch.cat((k_in[..., :r], k_post[..., r:]), dim=-1)
    return q, k, cos, sin, q_post, k_post


def pairing_of(q, cos, sin, q_post, kind, layer) -> str:
    """The plane layout under which rotate(q) reproduces the model's own rotated queries."""
    cos, sin = cos[:, None].to(q.dtype), sin[:, None].to(q.dtype)  # [B, 1, T, r]
    scale = q_post.abs().max().clamp_min(torch.finfo(q_post.dtype).tiny)
    tol = max(1e-5, 4 * torch.finfo(q_post.dtype).eps)
    for pairing in ("half", "interleaved"):
        if float((rotate(q, cos, sin, pairing) - q_post).abs().max() / scale) <= tol:
            return pairing
    raise PosymError(
        f"layer {layer} of this {kind!r} model rotates its queries differently from RoPE on "
        "half-split or interleaved planes of the leading head dims; posym cannot decompose it"
    )


def capture(model, ids: Tensor, layers: list[int], on_layer) -> None:
    """One forward pass over ids [batch, T]; calls on_layer(layer, HeadQK) inside the pass, one layer
    at a time, so only one layer's queries and keys are alive at once (`head_qk` keeps them all).

    Works on any model whose attention rotates with its modeling module's `apply_rotary_pos_emb` and
    calls a kernel from `ALL_ATTENTION_FUNCTIONS` (module docstring); each layer's rotation is checked
    against the model's own (`pairing_of`), its scale, soft-cap and sliding window read from the kernel call
    (and its attention mask checked against that window: `check_mask`, once per distinct mask).
    The pass stops when the last requested layer's kernel is called (it does not run: scores need
    only its inputs), so that layer's output projection and MLP, later layers and the final norm never
    run; the LM head never does (the base model is called).
    The pass runs in eval mode (no dropout) and the model's training flag is restored afterwards.
    """
    if hasattr(model, "posym_capture"):  # a model from another library (posym.core.interop)
        return model.posym_capture(ids, layers, on_layer)
    kind = _kind(model)
    state: dict = {"layer": None, "rope": [], "kernel": None, "last": layers[-1], "masks": []}
    handles = []

    def pre(layer):
        def hook(module, args, kwargs):
            state.update(layer=layer, rope=[], kernel=None)

        return hook

    def finish(layer):
        """Build the layer's HeadQK from the spied calls and hand it to on_layer."""
        state["layer"] = None
        q, k, cos, sin, q_post, _ = _pre_rotation(state, kind)
        options = state["kernel"][2]
        window = options.get("sliding_window")
        window = None if window is None or window >= ids.shape[1] else int(window)  # a window past T hides nothing
        mask = options.get("attention_mask")
        # layers of one kind share one mask tensor: check each (mask, window) once per pass
        if not any(seen is mask and w == window for seen, w in state["masks"]):
            check_mask(mask, ids.shape[1], window, layer)
            state["masks"].append((mask, window))
        pairing = pairing_of(q, cos, sin, q_post, kind, layer)
        heads = q.shape[1]
        k = k.repeat_interleave(heads // k.shape[1], dim=1)  # GQA: query head h reads key head h // groups
        batch = q.shape[0]  # the tables come as [1, T, r] when every prompt starts at position 0
        scale = options.get("scaling")
        qk = HeadQK(
            q,
            k,
            cos.expand(batch, -1, -1),
            sin.expand(batch, -1, -1),
            pairing,
            float(q.shape[-1] ** -0.5 if scale is None else scale),
            options.get("softcap"),
            window,
        )
        on_layer(layer, qk)

    def post(layer):
        def hook(module, args, output):
            finish(layer)

        return hook

    decoder = _decoder_layers(model)
    was_training = model.training
    model.eval()  # dropout off: whoever calls, the numbers are those of the deterministic model
    stopped = False
    try:
        with _spying(model, state):
            for layer in layers:
                attn = _attention(decoder[layer])
                handles.append(attn.register_forward_pre_hook(pre(layer), with_kwargs=True))
                handles.append(attn.register_forward_hook(post(layer)))
            with torch.inference_mode():
                getattr(model, "base_model", model)(input_ids=ids, use_cache=False)
    except _Done:  # the last layer's kernel stopped the pass: its queries and keys are in state
        stopped = True
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if stopped:
        with torch.inference_mode():
            finish(layers[-1])


def visible_keys(T: int, window: int | None, device=None) -> Tensor:
    """[T, T] bool: query p sees key j iff j <= p and (no window or j > p - window) (transformers'
    causal mask and `sliding_window_overlay`)."""
    p = torch.arange(T, device=device)[:, None]  # [T, 1]
    j = torch.arange(T, device=device)[None, :]  # [1, T]
    return (j <= p) & (j > p - window) if window is not None else j <= p  # [T, T]


def check_mask(mask, T: int, window: int | None, layer: int) -> None:
    """A PosymError unless the attention mask a layer's kernel received (None: causal, the kernel's own
    flag; bool: True = visible; float: 0 = visible, additive) is the causal window `visible_keys`
    for every prompt of the batch. A mask the kernel gets in another form (a flex BlockMask) is not
    read; the window then comes from the kernel's `sliding_window` alone."""
    if not isinstance(mask, Tensor) or mask.dim() != 4 or mask.shape[-2:] != (T, T):
        return
    seen = mask if mask.dtype == torch.bool else mask == 0  # [B, 1 or H, T, T]
    if not bool((seen == visible_keys(T, window, mask.device)).all()):
        expected = f"a sliding window of {window} keys" if window is not None else "causal attention"
        raise PosymError(
            f"layer {layer}'s attention mask is not {expected} over {T} tokens (chunked, bidirectional "
            "or padded attention); posym scores only causal and sliding-window layers"
        )


def check_layers(model, layers) -> list[int]:
    """Sorted distinct layer indices of `model` (None = every layer), or a PosymError for bad ones."""
    total = model.config.num_hidden_layers
    if layers is None:
        return list(range(total))
    layers = sorted(set(layers))
    bad = [layer for layer in layers if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < total]
    if bad or not layers:
        raise PosymError(f"layers must be indices in 0..{total - 1}, got {bad or 'none'}")
    return layers


def head_qk(model, input_ids, layers: list[int] | None = None) -> dict[int, HeadQK]:
    """Per-layer pre-rotation queries/keys and rotary tables for input_ids [batch, T] (one pass).

    Example (per-plane logits of layer 0, head 0, query p, key j):
        qk = head_qk(model, ids)[0]
        qp = pair_planes(rotate(qk.q[0, 0, p], qk.cos[0, p], qk.sin[0, p], qk.pairing), qk.pairing, r)
        kj = pair_planes(rotate(qk.k[0, 0, j], qk.cos[0, j], qk.sin[0, j], qk.pairing), qk.pairing, r)
        per_plane = qk.scale * (qp * kj).sum(-1)      # [r / 2], sums to the logit (+ the unrotated dims)
    """
    ids = as_batch(model, input_ids)
    out: dict[int, HeadQK] = {}
    capture(model, ids, check_layers(model, layers), lambda layer, qk: out.__setitem__(layer, qk))
    return out


# ---- prompts -------------------------------------------------------------------------------------


_PAST_POSITIONS = contextvars.ContextVar("posym_past_positions", default=False)


@contextmanager
def past_trained_positions():
    """Inside this block a prompt may run past the model's max_position_embeddings where its rotary
    embedding computes any position (`fixed_position_table` is None), so a model can be asked past the
    context it was trained at (the extrapolation test of `posym llm-study`'s past_context). Outside it, or on
    a model with a fixed table, such a prompt is refused (`check_prompt`)."""
    token = _PAST_POSITIONS.set(True)
    try:
        yield
    finally:
        _PAST_POSITIONS.reset(token)


def fixed_position_table(model) -> int | None:
    """Rows of a rotary table the model precomputed for a fixed number of positions (GPT-J's
    `embed_positions`), which no prompt can run past; None where the rotary embedding computes any position
    from the position ids (Llama, Qwen2, Mistral, GPT-NeoX, Gemma 3), so that `past_trained_positions` may."""
    for name, buffer in model.named_buffers():
        if name.endswith("embed_positions"):
            return int(buffer.shape[0])
    return None


def _max_positions(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)


def check_prompt(model, ids, where: str = "prompt") -> Tensor:
    """One prompt as a 1-D LongTensor, or a PosymError naming `where` (bad ids, too long)."""
    ids = torch.as_tensor(ids)
    if ids.dim() != 1 or ids.numel() == 0 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise PosymError(f"{where}: input ids must be a non-empty list of integers")
    vocab = model.config.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise PosymError(f"{where}: token ids must lie in 0..{vocab - 1} (the model's vocabulary)")
    limit = _max_positions(model)
    if limit is not None and len(ids) > limit and not (_PAST_POSITIONS.get() and fixed_position_table(model) is None):
        raise PosymError(f"{where}: {len(ids)} tokens exceed the model's {limit} positions")
    return ids.long()


def as_batch(model, input_ids) -> Tensor:
    """input_ids [batch, T] (a 2-D array or equal-length sequences) as a checked LongTensor."""
    rows = [check_prompt(model, row, f"prompt {k}") for k, row in enumerate(input_ids)]
    if not rows or len({len(r) for r in rows}) != 1:
        raise PosymError("head_qk needs one or more prompts of equal length")
    return torch.stack(rows).to(model.device)
