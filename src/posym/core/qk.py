"""Per-head queries and keys of Hugging Face RoPE models, with the model's own rotary tables.

Every attention logit of a supported model is scale * (R_p q_p) . (R_j k_j): `head_qk` (or, one
layer at a time, `capture`) returns the pre-rotation queries q and keys k of every head (projection
outputs, grouped-query keys repeated per query head) and the cos/sin tables and plane pairing the
model itself rotates with, from one forward pass that stops after the last requested layer.
`rotate` applies RoPE (or its transpose) and `pair_planes` splits vectors into RoPE planes, so
`posym.core.scores` (swap scores) and `posym.core.geometry` (per-plane scores) compute any logit exactly.

Supported: GPT-J (interleaved planes, partial rotary_dim), GPT-NeoX/Pythia (half-split, partial
rotary, fused qkv), Llama, Mistral, Qwen2 (half-split, grouped-query attention, the configured rope
scaling via the model's own rotary tables). Others (e.g. GPT-2, no RoPE) are a PosymError.
`check_prompt` / `as_batch` validate ids (vocabulary, positions, sliding window) and
`check_layers` layer indices before any pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posym.errors import PosymError


_ARCHS = {
    # model_type: (base model attribute, layers attribute, attention attribute, pairing)
    "gptj": ("transformer", "h", "attn", "interleaved"),
    "gpt_neox": ("gpt_neox", "layers", "attention", "half"),
    "llama": ("model", "layers", "self_attn", "half"),
    "mistral": ("model", "layers", "self_attn", "half"),
    "qwen2": ("model", "layers", "self_attn", "half"),
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
    """Multiplier of the dot products (1/sqrt(head_dim) in all supported architectures)."""
    softcap: float | None = None
    """Attention-logit soft-capping (Gemma 2): the logit is softcap * tanh(raw / softcap); None = none."""


def _rotate_pairs(x: Tensor, pairing: str) -> Tensor:
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
    turned = head * cos + _rotate_pairs(head, pairing) * (-sin if inverse else sin)
    return torch.cat((turned, rest.expand(*turned.shape[:-1], -1)), dim=-1)  # broadcast like the tables


def pair_planes(x: Tensor, pairing: str, rotary_dim: int) -> Tensor:
    """The RoPE planes of x [..., d] as [..., rotary_dim / 2, 2] (plane m = frequency ID m + 1)."""
    head = x[..., :rotary_dim]
    if pairing == "interleaved":
        return head.unflatten(-1, (rotary_dim // 2, 2))
    return torch.stack((head[..., : rotary_dim // 2], head[..., rotary_dim // 2 :]), dim=-1)


def _arch(model) -> tuple:
    kind = getattr(model.config, "model_type", None)
    if kind not in _ARCHS:
        raise PosymError(
            f"model type {kind!r} is not supported (scores need rotary embeddings); "
            f"supported: {', '.join(sorted(_ARCHS))}"
        )
    return _ARCHS[kind]


def _layers(model):
    base, layers, _, _ = _arch(model)
    return getattr(getattr(model, base), layers)


class _Done(Exception):
    """Raised from a hook once the last requested layer is captured: the rest of the pass is skipped."""


def capture(model, ids: Tensor, layers: list[int], on_layer) -> None:
    """One forward pass over ids [batch, T]; calls on_layer(layer, HeadQK) inside the pass, one layer
    at a time, so only one layer's queries and keys are alive at once (`head_qk` keeps them all).
    The pass runs in eval mode (no dropout) and the model's training flag is restored afterwards."""
    base, _, attn_name, pairing = _arch(model)
    kind = model.config.model_type
    found: dict = {}
    handles = []

    def grab(key):
        def hook(module, args, output):
            found[key] = output
        return hook

    def pre(module, args, kwargs):
        found["rope"] = kwargs["position_embeddings"]

    def post(layer):
        def hook(module, args, output):
            heads = model.config.num_attention_heads
            if kind == "gpt_neox":  # fused projection: per head [q | k | v]
                qkv = found.pop("qkv").unflatten(-1, (heads, 3 * attn.head_size))  # [B, T, H, 3d]
                q, k, _ = qkv.chunk(3, dim=-1)
            else:
                q = found.pop("q").unflatten(-1, (heads, -1))  # [B, T, H, d]
                k = found.pop("k").unflatten(-1, (-1, q.shape[-1]))  # [B, T, KVH, d]
            k = k.repeat_interleave(heads // k.shape[2], dim=2)  # GQA: query head h reads key head h // groups
            first, second = found.pop("rope")
            cos, sin = (second, first) if kind == "gptj" else (first, second)  # GPT-J passes (sin, cos)
            if kind == "gptj":  # GPT-J tables hold one value per plane; its planes are interleaved
                cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
            batch = q.shape[0]  # the tables come as [1, T, r] when every prompt starts at position 0
            cos, sin = cos.expand(batch, -1, -1), sin.expand(batch, -1, -1)
            qk = HeadQK(q.transpose(1, 2), k.transpose(1, 2), cos, sin, pairing, float(module.scaling))
            on_layer(layer, qk)
            if layer == layers[-1]:
                raise _Done
        return hook

    was_training = model.training
    model.eval()  # dropout off: whoever calls, the numbers are those of the deterministic model
    try:
        for layer in layers:
            attn = getattr(_layers(model)[layer], attn_name)
            handles.append(attn.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(attn.register_forward_hook(post(layer)))
            if kind == "gpt_neox":
                handles.append(attn.query_key_value.register_forward_hook(grab("qkv")))
            else:
                handles.append(attn.q_proj.register_forward_hook(grab("q")))
                handles.append(attn.k_proj.register_forward_hook(grab("k")))
        with torch.inference_mode():
            getattr(model, base)(input_ids=ids, use_cache=False)
    except _Done:
        pass
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)


def check_layers(model, layers) -> list[int]:
    """Sorted distinct layer indices of `model` (None = every layer), or a PosymError for bad ones."""
    total = len(_layers(model))
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
    if limit is not None and len(ids) > limit:
        raise PosymError(f"{where}: {len(ids)} tokens exceed the model's {limit} positions")
    window = getattr(model.config, "sliding_window", None)
    if window is not None and getattr(model.config, "use_sliding_window", True) and len(ids) > window:
        raise PosymError(f"{where}: {len(ids)} tokens exceed the sliding window ({window}); scores need every key visible")
    return ids.long()


def as_batch(model, input_ids) -> Tensor:
    """input_ids [batch, T] (a 2-D array or equal-length sequences) as a checked LongTensor."""
    rows = [check_prompt(model, row, f"prompt {k}") for k, row in enumerate(input_ids)]
    if not rows or len({len(r) for r in rows}) != 1:
        raise PosymError("head_qk needs one or more prompts of equal length")
    return torch.stack(rows).to(model.device)
