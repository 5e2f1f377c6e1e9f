"""Models already in memory in other interpretability libraries: nnsight and TransformerLens.

`scorable(model)` is what `posym.core.scores.score_model`, `posym.core.geometry.plane_scores` and
`posym.core.discrepancy.head_gaps` call first, so any of these works as their `model` argument:
- a transformers causal LM (returned as is);
- an nnsight `LanguageModel` (optional extra `posym-rope[nnsight]`): the transformers model it wraps
  (nnsight only traces it; posym's own capture reads it);
- a TransformerLens 4 `TransformerBridge` (optional extra `posym-rope[lens]`, TransformerLens 4.x): the
  transformers model it wraps (`original_model`), read as `BridgeModel` with the modules the bridge put in
  place of the model's own (attention, norms, MLPs: TransformerLens components holding the original as
  `_original_component`) swapped back for the pass, so the scores are those of the transformers path on
  the same weights (bit for bit) and the bridge is left as it was;
- a TransformerLens 3 `HookedTransformer` with rotary embeddings (TransformerLens 4 removed it: install
  `transformer-lens>=3.9,<4` to score one): wrapped as a `LensModel`, whose capture reads each layer's
  pre-rotation queries and keys (hook_q / hook_k), checks them against the rotated ones (hook_rot_q: the
  plane layout is read off, as in `posym.core.qk`), and takes the layer's own rotary tables, scale
  (1 / attn_scale) and soft-cap.

    from transformer_lens.model_bridge import TransformerBridge
    from posym.core.scores import score_model
    frame = score_model(TransformerBridge.boot_transformers(path), [[1, 5, 9, 2, 7]])
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import torch

from posym.core.qk import HeadQK, capture, pairing_of
from posym.errors import PosymError


def _is(model, package: str, name: str | None = None) -> bool:
    return any(c.__module__.split(".")[0] == package and name in (None, c.__name__) for c in type(model).__mro__)


def scorable(model):
    """The object posym's engines read: the model itself, nnsight's wrapped model, or a LensModel."""
    if _is(model, "nnsight"):
        # nnsight (LanguageModel, TransformersModel) keeps the module it traces in _module; read it from
        # __dict__, past nnsight's attribute proxy
        inner = model.__dict__.get("_module", model.__dict__.get("_model"))
        if inner is None:
            raise PosymError(f"this nnsight {type(model).__name__} holds no model posym can read")
        return scorable(inner)
    if _is(model, "transformer_lens", "HookedTransformer"):
        return LensModel(model)
    if _is(model, "transformer_lens", "TransformerBridge"):
        return BridgeModel(model)
    return model


class BridgeModel(torch.nn.Module):
    """A TransformerLens TransformerBridge seen by posym's engines: the transformers model it wraps, read
    through posym's own capture (`posym.core.qk.capture`) with the bridge's components swapped back for
    the transformers modules they hold (`_original_component`) during the pass and restored after it."""

    def __init__(self, bridge):
        super().__init__()
        inner = bridge.__dict__.get("_modules", {}).get("original_model", getattr(bridge, "original_model", None))
        if not isinstance(inner, torch.nn.Module) or not hasattr(inner, "config"):
            raise PosymError(
                f"this {type(bridge).__name__} holds no transformers model posym can read "
                "(posym reads TransformerLens 4 bridges: pip install 'transformer-lens>=4'"
            )
        self.__dict__["bridge"] = bridge  # not a submodule: posym never moves or trains it
        self.__dict__["inner"] = inner
        self.config = inner.config

    @property
    def device(self):
        return next(self.inner.parameters()).device

    def posym_capture(self, ids, layers: list[int], on_layer) -> None:
        with unbridged(self.inner):
            capture(self.inner, ids, layers, on_layer)


@contextmanager
def unbridged(model):
    """Within: every TransformerLens component inside `model` (a module with `_original_component`)
    replaced by the module it wraps, recursively; restored on exit, whatever happens."""
    swapped = []

    def walk(module):
        for name, child in list(module._modules.items()):
            original = getattr(child, "_original_component", None) if child is not None else None
            if isinstance(original, torch.nn.Module):
                swapped.append((module, name, child))
                module._modules[name] = original
                child = original
            if child is not None:
                walk(child)

    try:
        walk(model)
        yield model
    finally:
        for module, name, child in reversed(swapped):
            module._modules[name] = child


class LensModel(torch.nn.Module):
    """A TransformerLens HookedTransformer seen by posym's engines: `config` (vocab_size,
    max_position_embeddings, num_attention_heads, num_hidden_layers), `device` and `posym_capture`."""

    def __init__(self, lens):
        super().__init__()
        cfg = lens.cfg
        if cfg.positional_embedding_type != "rotary":
            raise PosymError(
                f"this HookedTransformer uses {cfg.positional_embedding_type!r} position embeddings; "
                "head scores need rotary ones (RoPE)"
            )
        self.lens = lens
        self.config = SimpleNamespace(
            model_type="hooked_transformer",
            vocab_size=cfg.d_vocab,
            max_position_embeddings=cfg.n_ctx,
            num_attention_heads=cfg.n_heads,
            num_hidden_layers=cfg.n_layers,
            sliding_window=None,
        )

    @property
    def device(self):
        return self.lens.cfg.device

    def posym_capture(self, ids, layers: list[int], on_layer) -> None:
        """`posym.core.qk.capture` for TransformerLens: one pass stopping after the last requested layer."""
        seen: dict = {}

        def keep(tensor, hook):
            seen[hook.name.rsplit(".", 1)[-1]] = tensor

        def build(layer):
            def hook(rot_k, hook):
                attn = self.lens.blocks[layer].attn
                q, k = seen.pop("hook_q").transpose(1, 2), seen.pop("hook_k").transpose(1, 2)  # [B, H|KVH, T, d]
                rot_q = seen.pop("hook_rot_q").transpose(1, 2)
                r, t = self.lens.cfg.rotary_dim, q.shape[2]
                cos, sin = attn.rotary_cos[None, :t, :r], attn.rotary_sin[None, :t, :r]  # [1, T, r]
                pairing = pairing_of(q, cos, sin, rot_q, "HookedTransformer", layer)
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # GQA: as TransformerLens repeats
                cap = self.lens.cfg.attn_scores_soft_cap
                # local layers (Gemma 2, GPT-Neo style): TransformerLens masks keys j <= q - window_size, as
                # transformers does; a window past the prompt hides nothing
                window = self.lens.cfg.window_size if getattr(attn, "attn_type", "global") == "local" else None
                window = int(window) if window is not None and window < t else None
                on_layer(
                    layer,
                    HeadQK(
                        q,
                        k,
                        cos.expand(q.shape[0], -1, -1),
                        sin.expand(q.shape[0], -1, -1),
                        pairing,
                        float(1.0 / attn.attn_scale),
                        cap if cap and cap > 0 else None,
                        window,
                    ),
                )

            return hook

        hooks = []
        for layer in layers:
            hooks += [(f"blocks.{layer}.attn.{name}", keep) for name in ("hook_q", "hook_k", "hook_rot_q")]
            hooks.append((f"blocks.{layer}.attn.hook_rot_k", build(layer)))
        with torch.inference_mode():
            self.lens.run_with_hooks(ids, fwd_hooks=hooks, stop_at_layer=layers[-1] + 1)
