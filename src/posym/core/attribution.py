"""Every head's causal effect from gradients: attribution patching (AtP) and AtP*'s GradDrop.

Ablating one head costs a forward pass per head and prompt (`ablation_effects`, the exact reference).
Attribution patching (Nanda 2022; Kramár et al. 2024, "AtP*", arXiv 2403.00745) estimates the effect of
ablating every head at once from one forward and one backward pass: with z the heads' outputs (the
input of the attention output projection, head h owning dims [h*d, (h+1)*d)), a their ablated values
(0, or the mean over a reference set of prompts of the same length at the same position) and M the
metric at the last position,

    AtP(l, h) = sum over positions t and dims i of head h:  dM/dz[t, i] * (a[t, i] - z[t, i])

the first-order change of M when head (l, h) is ablated at every position (as `ablated` does).

AtP* adds two fixes. Its QK fix recomputes the attention softmax exactly when a *query or key* node is
patched; the nodes here are head outputs (after the softmax), for which the paper applies no QK fix,
so it is a no-op and AtP*'s signed estimate is AtP's. Its GradDrop fights cancellation between a
head's direct and indirect paths: for every layer l the gradient through layer l's contribution to the
residual stream is dropped (the layer passes gradient only through its identity path), giving
AtP_l(n), and

    AtP*(n) = 1/(L - 1) * sum over l of |AtP_l(n)|

(L layers; the term of n's own layer is 0, since every path of n leaves through it). It is a magnitude
for ranking heads, not a signed effect: `magnitude` in the tables (|AtP| for plain AtP). A one-layer
model has no other layer: its GradDrop magnitude is |AtP|.

The cost: one forward and one backward pass for AtP (a no-grad forward more for mean-ablation when the
reference set is not the batch itself); GradDrop adds, for each dropped layer l, a backward pass through
the layers below l only (about L/2 backward passes in all), all from the one forward pass.

Metrics (`METRICS`), read at the last position: "logprob", the answer's log-probability; "margin", the
answer's logit minus the logit of the clean run's best other token (a fixed contrast token, so the
metric is a logit difference; the answer is the greedy next token exactly when the clean margin is
positive). The exact ablation uses the same contrast token.

>>> METHODS, METRICS, MODES
(('atp', 'atp*'), ('logprob', 'margin'), ('zero', 'mean'))
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from posym.core.interventions import ABLATION_MODES, Head
from posym.core.qk import _attention, _decoder_layers
from posym.errors import PosymError

METHODS = ("atp", "atp*")
"""Attribution patching, and AtP* (GradDrop; the QK fix is a no-op for head outputs)."""
METRICS = ("logprob", "margin")
"""What the effect is a change of: the answer's log-probability, or its logit margin over the clean
run's best other token."""
MODES = ABLATION_MODES
"""How a head is ablated: its output set to zero, or to the reference set's mean at each position."""
OUT_PROJECTIONS = ("o_proj", "out_proj", "dense")
"""Names of the attention output projection across families (Llama-likes, GPT-J, GPT-NeoX/Phi)."""
TOKEN_BUDGET = 16384
"""Tokens per forward pass of the exact ablation (groups x prompts x length)."""


# ---- the model's parts -------------------------------------------------------------------------------


def out_projection(attention: torch.nn.Module) -> torch.nn.Module:
    """The output projection of an attention module: its input holds the heads' outputs side by side."""
    for name in OUT_PROJECTIONS:
        module = getattr(attention, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise PosymError(f"cannot find the output projection of {type(attention).__name__}")


def layout(model) -> tuple[list[torch.nn.Module], list[torch.nn.Module], int, int]:
    """(decoder layers, their output projections, heads per layer, head dim)."""
    layers = list(_decoder_layers(model))
    config = model.config
    n_head = config.num_attention_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // n_head
    projections = [out_projection(_attention(layer)) for layer in layers]
    return layers, projections, int(n_head), int(d)


def _hidden(output):
    """A decoder layer's output hidden states (a tensor, or the first item of a tuple)."""
    return output[0] if isinstance(output, tuple) else output


def _check(mode: str, metric: str, method: str = "atp") -> None:
    if mode not in MODES:
        raise PosymError(f"ablation mode must be one of {', '.join(MODES)}, got {mode!r}")
    if metric not in METRICS:
        raise PosymError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if method not in METHODS:
        raise PosymError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


# ---- metrics -----------------------------------------------------------------------------------------


def contrast_tokens(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """The best token other than the answer per row of logits [B, vocab] (the margin's contrast).

    >>> contrast_tokens(torch.tensor([[1.0, 3.0, 2.0]]), torch.tensor([1])).tolist()
    [2]
    """
    masked = logits.detach().clone()  # [B, vocab]
    masked[torch.arange(len(answers)), answers] = -torch.inf
    return masked.argmax(-1)


def metric_values(logits: torch.Tensor, answers: torch.Tensor, contrast: torch.Tensor, metric: str) -> torch.Tensor:
    """The metric [B] of last-position logits [B, vocab].

    >>> logits = torch.tensor([[0.0, 2.0, 1.0]])
    >>> round(float(metric_values(logits, torch.tensor([1]), torch.tensor([2]), "margin")[0]), 3)
    1.0
    """
    rows = torch.arange(len(answers))
    if metric == "logprob":
        return logits.log_softmax(-1)[rows, answers]
    return logits[rows, answers] - logits[rows, contrast]


# ---- hooks -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _hooked(model, on_heads=None, on_layer_output=None, on_embedding=None) -> Iterator[None]:
    """Within: on_heads(l, z) may replace layer l's heads' outputs z [B, T, H*d] (returns the new z or
    None), on_layer_output(l, y) sees each decoder layer's output, on_embedding(e) may replace the
    input embeddings."""
    layers, projections, _, _ = layout(model)
    handles = []
    if on_heads is not None:
        for l, projection in enumerate(projections):

            def pre(module, args, l=l):
                new = on_heads(l, args[0])
                return None if new is None else (new, *args[1:])

            handles.append(projection.register_forward_pre_hook(pre))
    if on_layer_output is not None:
        for l, layer in enumerate(layers):
            handles.append(layer.register_forward_hook(lambda m, a, out, l=l: on_layer_output(l, _hidden(out))))
    if on_embedding is not None:
        handles.append(model.get_input_embeddings().register_forward_hook(lambda m, a, out: on_embedding(out)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _last_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, vocab] at the last position of ids [B, T], in float64."""
    return model(input_ids=ids, logits_to_keep=1).logits[:, -1].double()


def position_means(model, ids: torch.Tensor, batch_size: int = 8) -> list[torch.Tensor]:
    """Per layer, the mean over prompts ids [N, T] (one length) of the heads' outputs at each position:
    [T, H*d] (the reference of mean-ablation at that length)."""
    sums: dict[int, torch.Tensor] = {}

    def grab(l, z):
        sums[l] = sums.get(l, 0) + z.detach().double().sum(0)  # [T, H*d]

    with torch.no_grad(), _hooked(model, on_heads=grab):
        for lo in range(0, len(ids), batch_size):
            _last_logits(model, ids[lo : lo + batch_size])
    return [sums[l] / len(ids) for l in sorted(sums)]


# ---- attribution patching ----------------------------------------------------------------------------


def _attribute_batch(model, ids, answers, means, mode: str, metric: str, graddrop: bool):
    """(clean metric [B], contrast [B], AtP [B, L, H], GradDrop magnitude [B, L, H] or None) of one
    batch ids [B, T]; means: per layer [T, H*d] (mean mode)."""
    layers, _, n_head, d = layout(model)
    n_layer = len(layers)
    zs: dict[int, torch.Tensor] = {}
    ys: dict[int, torch.Tensor] = {}

    def leaf(e):  # the graph starts at the embeddings, also where the weights need no gradient
        return e.detach().requires_grad_(True)

    def keep_z(l, z):
        zs[l] = z

    def keep_y(l, y):
        ys[l] = y

    with torch.enable_grad(), _hooked(model, on_heads=keep_z, on_layer_output=keep_y, on_embedding=leaf):
        logits = _last_logits(model, ids)  # [B, vocab]
        contrast = contrast_tokens(logits, answers)
        values = metric_values(logits, answers, contrast, metric)  # [B]
        z_list = [zs[l] for l in range(n_layer)]
        y_list = [ys[l] for l in range(n_layer)]
        grads = torch.autograd.grad(values.sum(), z_list + y_list, retain_graph=graddrop, allow_unused=True)
        g_z, g_y = grads[:n_layer], grads[n_layer:]
        deltas = [
            (means[l].to(z) if mode == "mean" else torch.zeros_like(z)) - z.detach() for l, z in enumerate(z_list)
        ]  # [B, T, H*d] each

        def per_head(g, delta):  # [B, T, H*d] x2 -> [B, H]
            if g is None:
                return torch.zeros(delta.shape[0], n_head, dtype=torch.float64)
            return (g.double() * delta.double()).reshape(*delta.shape[:2], n_head, d).sum((1, 3))

        atp = torch.stack([per_head(g, delta) for g, delta in zip(g_z, deltas)], 1)  # [B, L, H]
        magnitude = None
        if graddrop:
            if n_layer == 1:
                magnitude = atp.abs()
            else:
                total = torch.zeros_like(atp)  # [B, L, H]
                for drop in range(n_layer):
                    # heads above the dropped layer keep their estimate; its own heads get 0
                    total[:, drop + 1 :] += atp[:, drop + 1 :].abs()
                    if drop == 0 or g_y[drop] is None:
                        continue
                    # layer `drop` passes its output gradient straight to its input (the identity path)
                    below = torch.autograd.grad(
                        y_list[drop - 1], z_list[:drop], grad_outputs=g_y[drop], retain_graph=True, allow_unused=True
                    )
                    for l in range(drop):
                        total[:, l] += per_head(below[l], deltas[l]).abs()
                magnitude = total / (n_layer - 1)
    return values.detach(), contrast, atp.detach(), None if magnitude is None else magnitude.detach()


def _by_length(prompts) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for k, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(k)
    return groups


def _means_for(model, prompts, members, reference, batch_size, means=None):
    """Mean-ablation reference at one length: means[length] when given (`reference_means`), else the mean
    over the reference prompts of that length, else over the prompts."""
    length = len(prompts[members[0]])
    if means is not None and length in means:
        return means[length]
    pool = [r for r in reference if len(r) == length] if reference is not None else [prompts[k] for k in members]
    if len(pool) < 2:
        raise PosymError(
            f"mean-ablation at {length} tokens needs a reference set of at least 2 prompts of that length, got "
            f"{len(pool)}"
        )
    device = next(model.parameters()).device
    return position_means(model, torch.tensor(pool, device=device), batch_size)


def reference_means(
    model, prompts: list[list[int]], *, reference: list[list[int]] | None = None, batch_size: int = 8
) -> dict[int, list[torch.Tensor]]:
    """{length: per layer [T, H*d]}: the mean-ablation reference of every length among `prompts` (the mean
    over the reference prompts of that length, else over the prompts of that length), as `attribute` and
    `ablation_effects` compute it. Pass it to both as `means=` when they run on the same prompts: one
    forward pass per length instead of one in each (the causal stage of `posym llm-study` does).
    """
    lengths = _by_length(prompts)
    return {length: _means_for(model, prompts, members, reference, batch_size) for length, members in lengths.items()}


def attribute(
    model,
    prompts: list[list[int]],
    answer_ids: list[int],
    *,
    mode: str = "mean",
    method: str = "atp*",
    metric: str = "margin",
    reference: list[list[int]] | None = None,
    means: dict[int, list[torch.Tensor]] | None = None,
    batch_size: int = 4,
    progress=None,
) -> dict[str, np.ndarray]:
    """Every head's estimated effect of its ablation on each prompt's metric.

    prompts: token ids (any lengths: equal lengths batch together); answer_ids: the answer token of each.
    reference: the mean-ablation reference prompts (default: the prompts of the same length); means: that
    reference already computed (`reference_means` of these prompts and reference), used where it has the
    length; mode, method, metric: `MODES`, `METHODS`, `METRICS`. progress(n) is called after each batch
    of n prompts.

    Returns {"effect": [P, L, H] AtP's signed estimate of metric(ablated) - metric(clean),
    "magnitude": [P, L, H] (AtP*: the GradDrop magnitude; AtP: |effect|), "clean": [P] the metric,
    "contrast": [P] the margin's contrast token}.
    """
    _check(mode, metric, method)
    if len(prompts) != len(answer_ids) or not prompts:
        raise PosymError(f"need one answer per prompt, got {len(prompts)} prompts and {len(answer_ids)} answers")
    layers, _, n_head, _ = layout(model)
    device = next(model.parameters()).device
    shape = (len(prompts), len(layers), n_head)
    effect, magnitude = np.zeros(shape), np.zeros(shape)
    clean, contrast = np.zeros(len(prompts)), np.zeros(len(prompts), dtype=np.int64)
    was_training = model.training
    model.eval()
    try:
        for members in _by_length(prompts).values():
            here = _means_for(model, prompts, members, reference, batch_size, means) if mode == "mean" else None
            for lo in range(0, len(members), batch_size):
                chunk = members[lo : lo + batch_size]
                ids = torch.tensor([prompts[k] for k in chunk], device=device)  # [b, T]
                answers = torch.tensor([answer_ids[k] for k in chunk], device=device)
                values, con, atp, drop = _attribute_batch(model, ids, answers, here, mode, metric, method == "atp*")
                effect[chunk] = atp.cpu().numpy()
                magnitude[chunk] = (drop if drop is not None else atp.abs()).cpu().numpy()
                clean[chunk], contrast[chunk] = values.cpu().numpy(), con.cpu().numpy()
                if progress:
                    progress(len(chunk))
    finally:
        model.train(was_training)
    return {"effect": effect, "magnitude": magnitude, "clean": clean, "contrast": contrast}


def head_effects(
    model,
    prompts: list[list[int]],
    answer_ids: list[int],
    *,
    mode: str = "mean",
    method: str = "atp*",
    metric: str = "margin",
    reference: list[list[int]] | None = None,
    batch_size: int = 4,
    progress=None,
):
    """`attribute` as a table: one row per (prompt, layer, head) with effect (AtP's signed estimate of
    metric(ablated) - metric(clean)), magnitude (AtP*: GradDrop; AtP: |effect|), clean (the prompt's
    metric), length, and for the margin metric correct (the clean answer is the greedy token) and
    correct_est (it still is at the estimated ablated margin: clean + effect > 0).

    >>> import transformers
    >>> torch.manual_seed(0) and None
    >>> config = transformers.LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    >>> model = transformers.LlamaForCausalLM(config).eval()
    >>> frame = head_effects(model, [[1, 2, 3], [4, 5, 6]], [7, 8])
    >>> len(frame), list(frame.columns[:4])
    (8, ['prompt', 'layer', 'head', 'effect'])
    """
    import pandas as pd

    out = attribute(
        model,
        prompts,
        answer_ids,
        mode=mode,
        method=method,
        metric=metric,
        reference=reference,
        batch_size=batch_size,
        progress=progress,
    )
    n_prompt, n_layer, n_head = out["effect"].shape
    prompt, layer, head = np.meshgrid(np.arange(n_prompt), np.arange(n_layer), np.arange(n_head), indexing="ij")
    frame = pd.DataFrame(
        {
            "prompt": prompt.ravel(),
            "layer": layer.ravel(),
            "head": head.ravel(),
            "effect": out["effect"].ravel(),
            "magnitude": out["magnitude"].ravel(),
            "clean": np.repeat(out["clean"], n_layer * n_head),
            "length": np.repeat([len(p) for p in prompts], n_layer * n_head),
        }
    )
    if metric == "margin":
        frame["correct"] = frame.clean > 0
        frame["correct_est"] = frame.clean + frame.effect > 0
    return frame.assign(method=method, mode=mode, metric=metric)


def group_estimates(effect: np.ndarray, groups: list[list[Head]]) -> np.ndarray:
    """Sum-of-heads estimate [P, G] of each group's ablation from per-head effects [P, L, H].

    >>> group_estimates(np.arange(8.0).reshape(1, 2, 4), [[(0, 1), (1, 3)]]).tolist()
    [[8.0]]
    """
    return np.stack([sum(effect[:, l, h] for l, h in group) for group in groups], 1)


# ---- the exact reference: real ablations -------------------------------------------------------------


def ablation_effects(
    model,
    prompts: list[list[int]],
    answer_ids: list[int],
    groups: list[list[Head]],
    *,
    mode: str = "mean",
    metric: str = "margin",
    reference: list[list[int]] | None = None,
    means: dict[int, list[torch.Tensor]] | None = None,
    scale: float = 1.0,
    token_budget: int = TOKEN_BUDGET,
    progress=None,
) -> dict[str, np.ndarray]:
    """Real ablations: metric(ablated) - metric(clean) of every group of heads on every prompt.

    Each group's heads are replaced at every position (by zero, or by the reference mean at that
    position, as `attribute`; means: that reference already computed, as `attribute` takes it), a
    forward pass per group and prompt, vectorised over groups and prompts
    (`token_budget` tokens per pass). Layers below a chunk's lowest ablated layer are not recomputed:
    their outputs are the clean run's (causal and unchanged). scale < 1 moves the heads only that far
    towards their ablated values (finite differences of `attribute`'s derivative). The margin's contrast
    token is the clean run's best other token, as in `attribute`.

    Returns {"effect": [P, G], "correct": [P, G] whether the answer is the ablated model's greedy token,
    "clean": [P], "clean_correct": [P]}.
    """
    _check(mode, metric)
    layers, _, n_head, d = layout(model)
    for group in groups:
        for l, h in group:
            if not (0 <= l < len(layers) and 0 <= h < n_head):
                raise PosymError(f"head {l}.{h} does not exist ({len(layers)} layers of {n_head} heads)")
    device = next(model.parameters()).device
    effect = np.zeros((len(prompts), len(groups)))
    correct = np.zeros((len(prompts), len(groups)), dtype=bool)
    clean = np.zeros(len(prompts))
    clean_correct = np.zeros(len(prompts), dtype=bool)
    order = sorted(range(len(groups)), key=lambda g: min(l for l, _ in groups[g]) if groups[g] else len(layers))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for members in _by_length(prompts).values():
                length = len(prompts[members[0]])
                here = _means_for(model, prompts, members, reference, 8, means) if mode == "mean" else None
                ids = torch.tensor([prompts[k] for k in members], device=device)  # [B, T]
                answers = torch.tensor([answer_ids[k] for k in members], device=device)
                outputs: dict[int, torch.Tensor] = {}
                with _hooked(model, on_layer_output=outputs.__setitem__):
                    logits = _last_logits(model, ids)  # [B, vocab]
                contrast = contrast_tokens(logits, answers)
                base = metric_values(logits, answers, contrast, metric)
                clean[members] = base.cpu().numpy()
                clean_correct[members] = (logits.argmax(-1) == answers).cpu().numpy()
                step = max(1, token_budget // (len(members) * length))
                for lo in range(0, len(order), step):
                    chunk = order[lo : lo + step]
                    values, best = _ablated_run(
                        model, ids, answers, contrast, [groups[g] for g in chunk], here, outputs, metric, scale, d
                    )
                    effect[np.ix_(members, chunk)] = (values - base[None]).T.cpu().numpy()
                    correct[np.ix_(members, chunk)] = (best == answers[None]).T.cpu().numpy()
                    if progress:
                        progress(len(chunk) * len(members))
    finally:
        model.train(was_training)
    return {"effect": effect, "correct": correct, "clean": clean, "clean_correct": clean_correct}


def _ablated_run(model, ids, answers, contrast, groups, means, outputs, metric, scale, d):
    """Metric [G, B] and greedy token [G, B] of ids [B, T] with each of G groups ablated (one pass)."""
    layers, _, n_head, _ = layout(model)
    n_group, n_batch = len(groups), len(ids)
    masks = torch.zeros(len(layers), n_group, n_head * d, dtype=torch.bool, device=ids.device)  # [L, G, H*d]
    for g, group in enumerate(groups):
        for l, h in group:
            masks[l, g, h * d : (h + 1) * d] = True
    first = min((l for group in groups for l, _ in group), default=len(layers))

    def replace(l, z):  # z [G*B, T, H*d]
        if not masks[l].any():
            return None
        target = means[l].to(z) if means is not None else torch.zeros_like(z[0])  # [T, H*d]
        z = z.view(n_group, n_batch, *z.shape[1:])  # [G, B, T, H*d]
        moved = z + scale * (target[None, None] - z)
        return torch.where(masks[l][:, None, None, :], moved, z).flatten(0, 1)

    skipped = {}
    for l in range(first):  # the clean outputs of the layers below every ablation
        cached = outputs[l].repeat(n_group, *([1] * (outputs[l].dim() - 1)))  # [G*B, T, hidden]
        skipped[l] = layers[l].__dict__.get("forward")
        layers[l].forward = lambda *a, _c=cached, **k: _c
    try:
        with _hooked(model, on_heads=replace):
            logits = _last_logits(model, ids.repeat(n_group, 1)).view(n_group, n_batch, -1)  # [G, B, vocab]
    finally:
        for l, forward in skipped.items():
            del layers[l].forward  # back to the class's method (or the instance's own, if it had one)
            if forward is not None:
                layers[l].forward = forward
    rows = [metric_values(logits[g], answers, contrast, metric) for g in range(n_group)]
    return torch.stack(rows), logits.argmax(-1)
