"""RoPE frequency control (2511's frequency-control experiment): base, per-layer bands, NoPE layers.

Hugging Face GPT-J builds ONE sin/cos table for every layer, as a non-persistent buffer with base
10,000 that `from_pretrained` rebuilds. posym's variants live in `ModelConfig` (`rope_base`,
`rope_bands`, `nope_from`, plus the existing `rotary_dim` for partial rotary) and are applied here
whenever posym builds or loads a model (`posym.core.model.build_model` / `posym.models.load_checkpoint`,
which reads the model config from `posym.json`):

- a different base replaces the shared table (same formula as GPT-J, base^(-2(k-1)/rotary_dim));
- a band or NoPE layer gets a forward pre-hook on its attention module that sets, in that layer's
  copy of the table, angle 0 (cos 1, sin 0) for every plane outside the band: those planes then
  pass through unrotated, exactly as NoPE. The hook edits the `position_embeddings` argument, so
  every reader of the attention inputs (posym.core.scores, posym.core.geometry) sees the variant.

Plain `transformers` loading of such a checkpoint IGNORES the variant (it has no field for it and
rebuilds the base-10,000 table): load variant checkpoints with `posym.models.load_checkpoint`. Frequency
ID k (1 = fastest) is plane k - 1 of the rotated dims, as everywhere in posym.
"""

from __future__ import annotations

import torch

from posym.errors import PosymError


def layer_bands(config) -> list[tuple[int, int] | None]:
    """Per layer, the inclusive (first, last) frequency IDs that rotate; None = no rotation (NoPE).

    `config` is a `posym.core.model.ModelConfig`; without bands every layer rotates all its planes.
    """
    planes = config.resolved_rotary_dim // 2
    if config.rope_bands is None:
        bands = [(1, planes)] * config.n_layer
    elif len(config.rope_bands) == 1:
        bands = [tuple(config.rope_bands[0])] * config.n_layer
    else:
        bands = [tuple(b) for b in config.rope_bands]
    nope = config.n_layer if config.nope_from is None else config.nope_from
    return [band if layer < nope else None for layer, band in enumerate(bands)]


def check_variant(config) -> None:
    """PosymError unless the RoPE fields of a ModelConfig describe a valid variant."""
    planes = config.resolved_rotary_dim // 2
    if not config.rope_base > 1.0:
        raise PosymError(f"model.rope_base must be a number > 1, got {config.rope_base}")
    if config.rope_bands is not None:
        if len(config.rope_bands) not in (1, config.n_layer):
            raise PosymError(
                f"model.rope_bands must hold 1 band (every layer) or {config.n_layer} "
                f"(one per layer), got {len(config.rope_bands)}"
            )
        for band in config.rope_bands:
            if len(band) != 2 or not 1 <= band[0] <= band[1] <= planes:
                raise PosymError(
                    f"each model.rope_bands entry must be [first, last] frequency IDs with "
                    f"1 <= first <= last <= {planes}, got {list(band)}"
                )
    if config.nope_from is not None and not 0 <= config.nope_from <= config.n_layer:
        raise PosymError(f"model.nope_from must be a layer index in 0..{config.n_layer}, got {config.nope_from}")


def is_default(config) -> bool:
    """True when the config is GPT-J's own RoPE (plain transformers loads it faithfully)."""
    return config.rope_base == 10000.0 and config.rope_bands is None and config.nope_from is None


def sincos_table(n_positions: int, rotary_dim: int, base: float) -> torch.Tensor:
    """GPT-J's table [n_positions, rotary_dim] = [sin | cos] of position x frequency, for any base."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64) / rotary_dim))  # [r/2]
    angles = torch.arange(n_positions, dtype=torch.int64).float()[:, None] * inv_freq  # [pos, r/2]
    return torch.cat((torch.sin(angles), torch.cos(angles)), dim=1)


def _band_hook(band: tuple[int, int] | None, planes: int):
    keep = torch.zeros(planes, dtype=torch.bool)  # [r/2] planes that rotate in this layer
    if band is not None:
        keep[band[0] - 1 : band[1]] = True

    def hook(module, args, kwargs):
        sin, cos = kwargs["position_embeddings"]  # GPT-J passes (sin, cos), each [B, T, r/2]
        mask = keep.to(sin.device)
        kwargs["position_embeddings"] = (sin * mask, torch.where(mask, cos, torch.ones_like(cos)))
        return args, kwargs

    return hook


def apply_variant(model, config) -> None:
    """Give a GPT-J `model` the RoPE variant of `config` (a ModelConfig); a no-op for the default.

    Call once per model object (hooks are not saved with the weights; posym's loaders call it).
    """
    check_variant(config)
    if is_default(config):
        return
    rotary = model.transformer.rotary_emb
    rotary.embed_positions = sincos_table(rotary.max_positions, rotary.pos_embd_dim, config.rope_base).to(
        rotary.embed_positions.device
    )
    planes = config.resolved_rotary_dim // 2
    for layer, band in enumerate(layer_bands(config)):
        if band != (1, planes):
            model.transformer.h[layer].attn.register_forward_pre_hook(_band_hook(band, planes), with_kwargs=True)
