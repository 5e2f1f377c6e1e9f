"""Every RoPE family (tests/tiny_models.py KINDS and FAMILIES): posym's scores and gaps against the
per-swap reference that re-runs the decoder layer with two residual vectors exchanged
(tests/reference_scores.py), on tiny random-init models built from configs; the first five families'
other engines are tested in test_scores, test_geometry and test_discrepancy."""

from __future__ import annotations

import pytest
import torch
from reference_scores import attention_rows, reference_model_scores
from tiny_models import FAMILIES, KINDS, random_prompts, tiny_model

from posym.core.discrepancy import head_gaps
from posym.core.geometry import plane_angles
from posym.core.qk import head_qk, rotate
from posym.core.scores import score_model
from posym.core.swaps import soft_capped
from posym.errors import PosymError
from posym.models import check_rope


def _worst(model, prompts, frame, **options) -> float:
    """Largest |posym - reference| over every (prompt, query, layer, head) and score of frame."""
    worst = 0.0
    for (prompt, query, layer), rows in frame.groupby(["prompt", "query", "layer"]):
        ref = reference_model_scores(model, prompts[prompt], query, layer, **options)
        for row, r in zip(rows.itertuples(), ref):
            worst = max(worst, *(abs(getattr(row, c) - r[c]) for c in ("s_pos", "s_sym", "entropy")))
    return worst


@pytest.mark.parametrize("kind", KINDS + FAMILIES)
def test_scores_equal_the_per_swap_reference(kind):
    """float64: the reference recomputes the attention row in float64 from the layer's own rotated
    q/k (<= 1e-9); float32: the reference reads the model's own eager attention weights (<= 1e-4)."""
    model = tiny_model(kind)
    prompts = random_prompts([6, 8])
    frame = score_model(model, prompts, [[3, 5], [7]])
    assert frame["s_pos"].min() < 0.9 or frame["s_sym"].min() < 0.9  # peaked enough to mean something
    assert _worst(model, prompts, frame) <= 1e-9
    model32 = tiny_model(kind, torch.float32, seed=1)
    prompts = random_prompts([7], seed=1)
    frame = score_model(model32, prompts, [[4, 6]])
    assert _worst(model32, prompts, frame, own=True) <= 1e-4


@pytest.mark.parametrize("kind", FAMILIES)
def test_captured_logits_and_gaps_are_the_models_own(kind):
    """The captured q/k rebuild every layer's attention (soft-cap, scale, per-layer RoPE bases
    included) and the discrepancy gaps equal the log-ratio of its two largest weights."""
    model = tiny_model(kind)
    ids = random_prompts([7], seed=2)[0]
    gaps = head_gaps(model, [ids], "all")
    for layer, qk in head_qk(model, [ids]).items():
        q = rotate(qk.q[0], qk.cos[0], qk.sin[0], qk.pairing)  # [H, T, d]
        k = rotate(qk.k[0], qk.cos[0], qk.sin[0], qk.pairing)
        logits = soft_capped(qk.scale * q @ k.transpose(-1, -2), qk.softcap) + torch.full((7, 7), float("-inf")).triu(1)
        probs = attention_rows(model, ids, layer)  # [H, T, T]
        torch.testing.assert_close(torch.softmax(logits, -1), probs, atol=1e-12, rtol=0)
        for r in gaps[gaps.layer == layer].itertuples():
            top = probs[r.head, r.query, : r.query + 1].topk(2).values
            assert r.gap == pytest.approx(float(top[0].log() - top[1].log()), abs=1e-9)


@pytest.mark.parametrize("kind", KINDS + FAMILIES)
def test_the_capture_pass_stops_at_the_last_layers_kernel(kind):
    """Scoring layer 0 of a 2-layer model runs only what its queries and keys need: the embedding, the
    rotary tables, layer 0's input norm and q/k/v projections (and q/k norms). Its attention kernel,
    output projection and MLP, layer 1, the final norm and the LM head never run, and the scores equal
    those of a pass that runs layer 0 to the end (scoring layers 0 and 1), bit for bit."""
    model = tiny_model(kind)
    prompts = random_prompts([9, 9], seed=4)
    called = []
    hooks = [
        module.register_forward_hook(lambda m, a, o, name=name: called.append(name))
        for name, module in model.named_modules()
        if name
    ]
    try:
        alone = score_model(model, prompts, "all", layers=[0])
    finally:
        for hook in hooks:
            hook.remove()
    names = dict(model.named_modules())
    layer0 = next(name for name in names if name.endswith((".layers.0", ".h.0")))
    attention = next(
        name
        for name in names
        if name.startswith(layer0 + ".")
        and name.count(".") == layer0.count(".") + 1
        and name.rsplit(".", 1)[1] in ("self_attn", "attn", "attention")
    )
    ran = set(called)
    assert all(
        name.startswith(layer0 + ".") or "." not in name.split(".", 1)[1] for name in ran
    )  # layer 0, or embeddings
    assert not any(
        names[name] is model.get_output_embeddings() or name.endswith(("norm", "ln_f")) and layer0 not in name
        for name in ran
    )
    before = {
        name.rsplit(".", 1)[1] for name in ran if name.startswith(layer0 + ".") and not name.startswith(attention)
    }
    assert all(("norm" in leaf or leaf.startswith("ln_")) and "post" not in leaf for leaf in before)  # no MLP
    outputs = {
        name for name in names if name.startswith(attention + ".") and name.endswith(("o_proj", "out_proj", "dense"))
    }
    assert outputs and not outputs & ran
    assert all(
        any(tag in name[len(attention) + 1 :].split(".")[0] for tag in ("q_", "k_", "v_", "qkv", "query_key_value"))
        for name in ran
        if name.startswith(attention + ".")
    )  # the attention's inputs only
    both = score_model(model, prompts, "all", layers=[0, 1])
    assert alone.equals(both[both.layer == 0].reset_index(drop=True))


def test_family_specifics_are_read_from_the_layers():
    """Gemma 2: query_pre_attn_scalar and soft-cap; Granite: attention multiplier; Gemma 3: a local
    and a global RoPE base; Cohere: interleaved planes; Phi-3 / StableLM: partial rotary."""
    ids = [random_prompts([6])[0]]
    gemma2 = head_qk(tiny_model("gemma2"), ids)[0]
    assert (gemma2.scale, gemma2.softcap) == (24**-0.5, 6.0)
    assert head_qk(tiny_model("granite"), ids)[0].scale == 0.2
    local, full = head_qk(tiny_model("gemma3_text"), ids).values()  # layer 0 sliding, layer 1 global
    assert float(plane_angles(local.cos[0], local.sin[0], "half")[1]) == pytest.approx(100.0 ** (-2 / 8))
    assert float(plane_angles(full.cos[0], full.sin[0], "half")[1]) == pytest.approx(10000.0 ** (-2 / 8))
    assert head_qk(tiny_model("cohere"), ids)[0].pairing == "interleaved"
    for kind in ("phi3", "stablelm", "phi"):
        qk = head_qk(tiny_model(kind), ids)[0]
        assert qk.cos.shape[-1] == qk.q.shape[-1] // 2


def test_unsupported_models_say_why():
    with pytest.raises(PosymError, match="has none"):
        check_rope("gpt2", "here")
    with pytest.raises(PosymError, match="has rotary embeddings but .*decoupled RoPE"):
        check_rope("deepseek_v3", "here")
    with pytest.raises(PosymError, match="has rotary embeddings but it rotates queries and keys as complex numbers"):
        check_rope("llama4_text", "here")  # not "has none": Llama 4 has RoPE, in another form
    with pytest.raises(PosymError, match="does not implement"):
        check_rope("no_such_model", "here")
    for kind in KINDS + FAMILIES:
        check_rope(kind, "here")


@pytest.mark.parametrize("kind", KINDS)
def test_prompts_past_the_trained_context_only_when_asked(kind):
    """A prompt past max_position_embeddings is refused, except inside `past_trained_positions` on a model
    whose rotary embedding computes any position (every family but GPT-J, whose table is fixed)."""
    from posym.core.qk import past_trained_positions

    from posym.core.qk import fixed_position_table

    model = tiny_model(kind)
    ids = torch.randint(2, model.config.vocab_size, (1, model.config.max_position_embeddings + 8))  # [1, T]
    with pytest.raises(PosymError, match="exceed the model's"):
        head_qk(model, ids, [0])
    if kind == "gptj":  # its sin/cos table has max_positions rows: nothing can run past them
        assert fixed_position_table(model) == model.config.max_position_embeddings
        with past_trained_positions(), pytest.raises(PosymError, match="exceed the model's"):
            head_qk(model, ids, [0])
        return
    assert fixed_position_table(model) is None
    with past_trained_positions():
        qk = head_qk(model, ids, [0])[0]
    assert qk.q.shape[-2] == ids.shape[1]
    with pytest.raises(PosymError, match="exceed the model's"):  # the permission ended with the block
        head_qk(model, ids, [0])
