"""Interventions on heads: ablation (and pruned checkpoints) and freezing during fine-tuning.

Head h of a layer owns dims [h*d, (h+1)*d) (d = head dim) of the attention output, i.e. the input of
the output projection (GPT-J out_proj, Llama/Mistral/Qwen2 o_proj, GPT-NeoX dense): `head_means` and
`ablated` work on all of them; folding and freezing below are GPT-J's (posym's own models).

- Zero-ablation sets that head's slice of the out_proj input to 0; mean-ablation sets it to the
  head's mean output over reference data (train-split samples, every position, so one vector per
  head that applies at any length). Both run as a forward pre-hook on out_proj (`ablated`).
- Saving (`fold_ablation`): zero-ablation = zeroing the head's out_proj columns. GPT-J's out_proj has
  no bias, but the block adds attention output, MLP output and residual, and `mlp.fc_out` HAS a
  bias, so mean-ablation folds exactly into that layer's fc_out bias (+= W_O[:, head] @ mean) with
  the columns zeroed. Both give a plain GPT-J checkpoint any `transformers` loads, equal to the hooked
  model in eval mode (with dropout in train mode the folded constant skips attention dropout).
- RoPE planes (`ablated_planes`): within one head, the query's components on chosen RoPE planes are
  zeroed, so those frequencies add nothing to that head's attention logits (the frequency story's
  causal check, `posym atlas --causal`); `far_planes_removed` removes them only from the logits of keys
  farther back than a distance (the number cliff's check, GPT-J).
- Freezing (`HeadFreezer`): gradient hooks zero the head's q/k/v rows and out_proj columns (so clipping
  and Adam moments never see them), and after every optimizer step the frozen slices are copied back
  (AdamW's decoupled weight decay moves weights even at zero gradient): they stay bit-identical.

Which heads: "positional" / "symbolic" / "mixed" pick by the label of `posym.core.scores.summarize_heads`
(the prompt-mean scores at every hop query of test prompts of the checkpoint itself: the rule and
the numbers of `posym dynamics`' hop-query table), "L.H,L.H" by index, "L" = every
head of layer L. The experiment drivers (ablation table, fine-tune comparison) are in
`posym.commands.ablate` and `posym.commands.finetune`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch

from posym.core.paper import GAMMA
from posym.core.qk import attention_modules, pairing_of, plane_dims, rotary_module
from posym.core.scores import LABELS, score_model, summarize_heads, task_prompts
from posym.errors import PosymError

Head = tuple[int, int]
"""(layer, head) index of one attention head."""
_INDEX_RE = re.compile(r"^(\d+)(?:\.(\d+))?$")


# ---- which heads -------------------------------------------------------------------------------


def parse_heads(spec: str, n_layer: int, n_head: int) -> list[Head]:
    """Heads of an index spec "L.H,L.H,L" ("L" = every head of layer L), sorted and distinct."""
    heads: set[Head] = set()
    for part in (p.strip() for p in spec.split(",")):
        match = _INDEX_RE.match(part)
        if not match:
            raise PosymError(f"head {part!r} is not LAYER or LAYER.HEAD (e.g. 3 or 3.0)")
        layer = int(match.group(1))
        if layer >= n_layer:
            raise PosymError(f"head {part!r}: layer {layer} does not exist (layers 0..{n_layer - 1})")
        if match.group(2) is None:
            heads.update((layer, h) for h in range(n_head))
        elif int(match.group(2)) >= n_head:
            raise PosymError(f"head {part!r}: head {match.group(2)} does not exist (heads 0..{n_head - 1})")
        else:
            heads.add((layer, int(match.group(2))))
    return sorted(heads)


LABEL_QUERIES = "hops"
"""Query mode the positional/symbolic labels of ablate and finetune are scored at."""


def label_heads(model, task_config, *, n_prompts: int = 100, seed: int = 0, gamma: float = GAMMA):
    """`posym.core.scores.summarize_heads` of the model's scores at every hop query of `n_prompts` test
    prompts (the dynamics "hops" mode, the same prompt-mean rule): one row per (layer, head) with
    s_pos, s_sym and label."""
    ids, queries = task_prompts(task_config, n_prompts, seed, queries=LABEL_QUERIES)
    return summarize_heads(score_model(model, ids, queries), gamma=gamma)


def select_heads(spec: str, model, labels=None) -> list[Head]:
    """Heads named by `spec`: a label (needs `labels`, the `label_heads` table) or an index spec."""
    if spec in LABELS:
        if labels is None:
            raise PosymError(f"selecting {spec!r} heads needs their scores (labels)")
        chosen = labels[labels["label"] == spec]
        return sorted(zip(chosen["layer"].astype(int), chosen["head"].astype(int)))
    return parse_heads(spec, model.config.n_layer, model.config.n_head)


def head_slice(model, head: Head) -> slice:
    """Dims of `head` in its layer's attention output (the input of the output projection)."""
    layer, h = head
    config = model.config
    n_layer, n_head = config.num_hidden_layers, config.num_attention_heads
    if not (0 <= layer < n_layer and 0 <= h < n_head):
        raise PosymError(f"head {layer}.{h} does not exist (layers 0..{n_layer - 1}, heads 0..{n_head - 1})")
    d = getattr(config, "head_dim", None) or config.hidden_size // n_head
    return slice(h * d, (h + 1) * d)


def _attn(model, layer: int):
    return model.transformer.h[layer].attn


def _out_proj(model, layer: int):
    """The attention output projection of `layer`, whose input holds the heads side by side."""
    if hasattr(model, "transformer"):  # GPT-J
        return _attn(model, layer).out_proj
    if hasattr(model, "gpt_neox"):
        return model.gpt_neox.layers[layer].attention.dense
    return model.model.layers[layer].self_attn.o_proj  # Llama, Mistral, Qwen2


# ---- ablation ----------------------------------------------------------------------------------


def head_means(model, input_ids, heads: list[Head], batch_size: int = 256) -> dict[Head, torch.Tensor]:
    """Mean output [head_dim] of each head over every position of input_ids ([n, T], or 1-D sequences
    of any lengths), in eval mode."""
    sums: dict[Head, torch.Tensor] = {}
    count = 0
    handles = []

    def grab(layer: int):
        def hook(module, args):
            for head in heads:
                if head[0] == layer:  # args[0]: [batch, T, n_embd], the heads' concatenated outputs
                    part = args[0][..., head_slice(model, head)].double().sum((0, 1))  # [head_dim]
                    sums[head] = sums.get(head, 0) + part

        return hook

    was_training = model.training
    model.eval()
    try:
        for layer in sorted({h[0] for h in heads}):
            handles.append(_out_proj(model, layer).register_forward_pre_hook(grab(layer)))
        by_length: dict[int, list[torch.Tensor]] = {}  # ragged prompts run in equal-length batches
        for ids in input_ids:
            ids = torch.as_tensor(ids, dtype=torch.long)  # [T]
            by_length.setdefault(len(ids), []).append(ids)
        with torch.no_grad():
            for group in by_length.values():
                for lo in range(0, len(group), batch_size):
                    batch = torch.stack(group[lo : lo + batch_size]).to(model.device)  # [b, T]
                    model(input_ids=batch)
                    count += batch.numel()
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return {head: (sums[head] / count).to(model.dtype) for head in heads}


ABLATION_MODES = ("zero", "mean")
"""How an ablated head's output is replaced: by zeros, or by its mean output over prompts."""


def _check_mode(mode: str, means) -> None:
    if mode not in ABLATION_MODES:
        raise PosymError(f"ablation mode must be zero or mean, got {mode!r}")
    if mode == "mean" and means is None:
        raise PosymError("mean-ablation needs the heads' mean outputs (head_means)")


@contextlib.contextmanager
def ablated(model, heads: list[Head], mode: str = "zero", means: dict | None = None) -> Iterator[None]:
    """Within the block, the chosen heads' outputs are replaced by 0 (zero) or their mean (mean)."""
    _check_mode(mode, means)
    by_layer: dict[int, list[Head]] = {}
    for head in heads:
        head_slice(model, head)  # validates the index
        by_layer.setdefault(head[0], []).append(head)

    def replace(layer_heads: list[Head]):
        def hook(module, args):
            out = args[0].clone()  # [batch, T, n_embd]
            for head in layer_heads:
                out[..., head_slice(model, head)] = 0.0 if mode == "zero" else means[head].to(out)
            return (out, *args[1:])

        return hook

    handles = [_out_proj(model, layer).register_forward_pre_hook(replace(hs)) for layer, hs in by_layer.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def fold_ablation(model, heads: list[Head], mode: str = "zero", means: dict | None = None) -> None:
    """Make the ablation part of the weights (in place): zero the heads' out_proj columns and, for
    mean-ablation, add W_O[:, head] @ mean to that layer's mlp.fc_out bias (same block output)."""
    _check_mode(mode, means)
    with torch.no_grad():
        for head in heads:
            layer, span = head[0], head_slice(model, head)
            block = model.transformer.h[layer]
            weight = block.attn.out_proj.weight  # [n_embd, n_embd]: columns = attention-output dims
            if mode == "mean":
                block.mlp.fc_out.bias += weight[:, span] @ means[head].to(weight)  # [n_embd]
            weight[:, span] = 0.0


# ---- RoPE planes of single heads -----------------------------------------------------------------


def gptj_rotary_dim(config) -> int:
    """Rotated dimensions per head of a Hugging Face GPT-J config: its `rotary_dim`, or the whole head
    when that is null. Plane m (0-based, frequency ID m + 1) exists for m < gptj_rotary_dim(config) // 2.

    >>> from types import SimpleNamespace
    >>> gptj_rotary_dim(SimpleNamespace(rotary_dim=None, n_embd=128, n_head=4))
    32
    >>> gptj_rotary_dim(SimpleNamespace(rotary_dim=8, n_embd=128, n_head=4))
    8
    """
    return config.rotary_dim or config.n_embd // config.n_head


@contextlib.contextmanager
def ablated_planes(model, planes: dict[Head, list[int]]) -> Iterator[None]:
    """Within the block, query head (l, h) has zero components on the RoPE planes `planes[(l, h)]`
    (0-based: plane m is frequency ID m + 1, so the slowest of r/2 planes is m = r/2 - 1): those
    planes add nothing to that head's attention logits, its other planes are untouched, and so are its
    keys (shared by the query heads of a KV group under GQA), its values and every other head.

    Works on every model `posym.core.qk.capture` reads, through the same door: the modeling module's
    `apply_rotary_pos_emb` is wrapped, and the wrapper zeroes the planes of the rotated queries it
    returns, which equals zeroing them before the rotation (RoPE turns each plane within itself, after
    any q-norm: Gemma 3, Qwen3). The plane layout of each layer is read off its own rotation
    (`posym.core.qk.pairing_of`). Calls: (q, k, cos, sin, ...) -> (q, k) on [B, H, T, r] (Llama and
    most), or GPT-J's two calls (k, then q) of (x [B, T, H, r], sin, cos).
    """
    by_layer: dict[int, list[tuple[int, list[int]]]] = {}
    for head, chosen in planes.items():
        head_slice(model, head)  # validates the index
        by_layer.setdefault(head[0], []).append((head[1], sorted({int(m) for m in chosen})))
    module = rotary_module(model)
    rotary, kind = module.apply_rotary_pos_emb, getattr(model.config, "model_type", None)
    state: dict = {"layer": None, "calls": 0}
    masks: dict[tuple, torch.Tensor] = {}  # (layer, pairing, rotary dim, heads) -> [H, r] 1 = kept

    def mask(layer: int, pairing: str, r: int, n_heads: int, like: torch.Tensor) -> torch.Tensor:
        key = (layer, pairing, r, n_heads)
        if key not in masks:
            keep = torch.ones(n_heads, r, dtype=like.dtype, device=like.device)  # [H, r]
            for h, chosen in by_layer[layer]:
                keep[h, plane_dims(chosen, pairing, r)] = 0
            masks[key] = keep
        return masks[key]

    def wrapper(*args, **kwargs):
        out = rotary(*args, **kwargs)
        layer = state["layer"]
        if layer not in by_layer:
            return out
        state["calls"] += 1
        if isinstance(out, tuple):  # (q, k, cos, sin) -> (q_rot, k_rot), q [B, H, T, r]
            q, cos, sin = args[0], args[2], args[3]
            r = cos.shape[-1]
            pairing = pairing_of(q[..., :r], cos, sin, out[0][..., :r], kind, layer)
            keep = mask(layer, pairing, r, q.shape[1], out[0])  # [H, r]
            q_rot = torch.cat((out[0][..., :r] * keep[None, :, None], out[0][..., r:]), dim=-1)  # [B, H, T, d]
            return (q_rot, *out[1:])
        if len(args) == 3 and state["calls"] == 2:  # GPT-J: the second call rotates the queries [B, T, H, r]
            return out * mask(layer, "interleaved", out.shape[-1], out.shape[2], out)[None, None]
        if len(args) != 3:
            raise PosymError(f"a {type(model).__name__} layer calls apply_rotary_pos_emb in a form posym does not know")
        return out

    module.apply_rotary_pos_emb = wrapper
    try:
        with _tracking_layers(model, state, calls=0):
            yield
    finally:
        module.apply_rotary_pos_emb = rotary


@contextlib.contextmanager
def _tracking_layers(model, state: dict, **reset):
    """While open, state["layer"] is the index of the attention module running (None between them);
    entering one also sets `reset`'s keys in `state`."""

    def pre(layer: int):
        def hook(module_, args, kwargs):
            state.update(layer=layer, **reset)

        return hook

    def post(module_, args, output):
        state["layer"] = None

    handles = []
    for layer, attn in enumerate(attention_modules(model)):
        handles.append(attn.register_forward_pre_hook(pre(layer), with_kwargs=True))
        handles.append(attn.register_forward_hook(post))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def far_planes_removed(
    model, planes: dict[Head, list[int]], max_distance: int, *, penalty: dict[Head, float] | None = None
) -> Iterator[None]:
    """Within the block, RoPE planes `planes[(l, h)]` (0-based, as `ablated_planes`) of head (l, h) add
    nothing to its logit of a key more than `max_distance` positions before the query (n - j > max_distance);
    their share of the logits of nearer keys, the other planes, the values and every other head are untouched.

    The number cliff's causal check (docs/results.md, issue 28): with max_distance = the longest distance
    of the training prompts (16 in the paper's 17 tokens), it is exactly the identity at the training length
    and removes a plane's aliasing (plane ID 1 turns once per 2 pi positions) from the keys only a longer
    prompt holds. max_distance = -1 removes the planes for every key: `ablated_planes`.
    penalty: a constant subtracted from head (l, h)'s logit of every such far key as well (its control:
    the same average shift of the far keys without a plane's selectivity; `planes` may then map it to []).

    GPT-J models (posym's own: interleaved planes, no grouped keys) in one pass without a key-value cache;
    the chosen layers' attention runs in this module's float32 (or float64) kernel: the model's eager
    kernel with the planes' share `scale * q_m . k_m` of the far keys subtracted before the mask and softmax.
    """
    if getattr(model.config, "model_type", None) != "gptj":
        raise PosymError("far_planes_removed works on GPT-J models (posym's own), not this one")
    if max_distance < -1:
        raise PosymError(f"max_distance must be -1 (every key) or more, got {max_distance}")
    penalty = dict(penalty or {})
    by_layer: dict[int, list[tuple[int, list[int], float]]] = {}
    for head in sorted(set(planes) | set(penalty)):
        head_slice(model, head)  # validates the index
        chosen = sorted({int(m) for m in planes.get(head, [])})
        by_layer.setdefault(head[0], []).append((head[1], chosen, float(penalty.get(head, 0.0))))
    r = gptj_rotary_dim(model.config)
    dims = {
        layer: [(h, plane_dims(chosen, "interleaved", r), shift) for h, chosen, shift in heads]
        for layer, heads in by_layer.items()
    }

    def adjust(layer, logits, q, k, scaling):  # logits [B, H, T, T], q and k [B, H, T, d]
        T = q.shape[-2]
        gap = torch.arange(T, device=q.device)[:, None] - torch.arange(T, device=q.device)[None, :]  # [T, T] n - j
        far = (gap > max_distance).to(q.dtype)  # [T, T] 1 = the planes are removed for this key
        for h, hd, shift in dims[layer]:
            share = q[:, h][..., hd] @ k[:, h][..., hd].transpose(-1, -2) * scaling  # [B, T, T] (0 without planes)
            logits[:, h] = logits[:, h] - (share + shift) * far

    with _eager_attention(model, set(dims), adjust, "far_planes_removed"):
        yield


@contextlib.contextmanager
def keys_hidden(model, heads: list[Head], count: int) -> Iterator[None]:
    """Within the block, head (l, h) of `heads` gives no attention to keys 0 .. count - 1 from any query at
    position count or later (the queries before count see their keys as before); every other head is untouched.

    The letter model's length check (docs/results.md, issue 56): lengthgen's extra target-window tokens
    are positions 0 .. E - 1, so `count` = E hides them from the chosen heads. Hidden from every head,
    the positions from E on compute what the E-free prompt computes (RoPE sees only distances), so the
    answer logits equal those of the training-length prompt. GPT-J models (posym's own), one pass.
    """
    if getattr(model.config, "model_type", None) != "gptj":
        raise PosymError("keys_hidden works on GPT-J models (posym's own), not this one")
    if count < 0:
        raise PosymError(f"count must be 0 or more, got {count}")
    by_layer: dict[int, list[int]] = {}
    for head in sorted(set(heads)):
        head_slice(model, head)  # validates the index
        by_layer.setdefault(head[0], []).append(head[1])

    def adjust(layer, logits, q, k, scaling):  # logits [B, H, T, T]
        for h in by_layer[layer]:
            logits[:, h, count:, :count] = torch.finfo(logits.dtype).min

    with _eager_attention(model, set(by_layer), adjust, "keys_hidden"):
        yield


@contextlib.contextmanager
def _eager_attention(model, layers: set[int], adjust, name: str) -> Iterator[None]:
    """Within the block, the attention of `layers` runs in this module's float32 (or float64) kernel: the
    model's eager kernel with `adjust(layer, logits, q, k, scaling)` changing the logits [B, H, T, T] in place
    before the causal mask and softmax (q, k [B, H, T, d] rotated, in the working precision)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    state: dict = {"layer": None}
    interface = ALL_ATTENTION_FUNCTIONS.get_interface

    def kernel(attn, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        T, S = query.shape[-2], key.shape[-2]  # query, key [B, H, T, d], rotated
        if T != S:
            raise PosymError(f"{name} needs one pass over the whole prompt (no key-value cache)")
        work = torch.promote_types(query.dtype, torch.float32)
        q, k = query.to(work), key.to(work)
        logits = q @ k.transpose(-1, -2) * scaling  # [B, H, T, T]
        adjust(state["layer"], logits, q, k, scaling)
        if attention_mask is None:
            gap = torch.arange(T, device=q.device)[:, None] - torch.arange(T, device=q.device)[None, :]  # [T, T]
            logits = logits.masked_fill(gap < 0, torch.finfo(work).min)
        elif attention_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attention_mask, torch.finfo(work).min)
        else:
            logits = logits + attention_mask
        probs = torch.softmax(logits, dim=-1).to(value.dtype)  # [B, H, T, T]
        probs = torch.nn.functional.dropout(probs, p=dropout, training=attn.training)
        return (probs @ value).transpose(1, 2).contiguous(), probs

    def get_interface(implementation, default):
        return kernel if state["layer"] in layers else interface(implementation, default)

    ALL_ATTENTION_FUNCTIONS.get_interface = get_interface
    try:
        with _tracking_layers(model, state):
            yield
    finally:
        del ALL_ATTENTION_FUNCTIONS.get_interface  # the instance attribute: the class method again


# ---- freezing ----------------------------------------------------------------------------------


class HeadFreezer:
    """Keeps the chosen heads' q/k/v rows and out_proj columns fixed while the rest trains.

    Use: `freezer = HeadFreezer(model, heads)`, call `freezer.restore()` after every optimizer step,
    `freezer.remove()` at the end.
    """

    def __init__(self, model, heads: list[Head]):
        self.model = model
        self.heads = list(heads)
        self._saved: list[tuple[torch.Tensor, tuple, torch.Tensor]] = []
        self._handles = []
        masks: dict[int, dict[str, torch.Tensor]] = {}
        for head in self.heads:
            layer, span = head[0], head_slice(model, head)
            attn = _attn(model, layer)
            for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
                weight = getattr(attn, name).weight  # [out, in]
                mask = masks.setdefault(layer, {}).setdefault(name, torch.ones_like(weight))
                index = (slice(None), span) if name == "out_proj" else (span, slice(None))
                mask[index] = 0.0
                self._saved.append((weight, index, weight.detach()[index].clone()))
        for layer, named in masks.items():
            for name, mask in named.items():
                weight = getattr(_attn(model, layer), name).weight
                self._handles.append(weight.register_hook(lambda grad, m=mask: grad * m))

    @property
    def frozen_elements(self) -> int:
        """Number of weight entries held fixed."""
        return sum(saved.numel() for _, _, saved in self._saved)

    def restore(self) -> None:
        """Copy the frozen slices back (undoes weight decay, the only thing that moves them)."""
        with torch.no_grad():
            for weight, index, saved in self._saved:
                weight[index] = saved

    def remove(self) -> None:
        """Drop the gradient hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
