"""posym.core.interop: an nnsight LanguageModel, a TransformerLens TransformerBridge and a TransformerLens 3
HookedTransformer with rotary embeddings, scored from Python (tiny models built from configs; skipped
without the optional extras, and the HookedTransformer tests under TransformerLens 4, which removed it)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from reference_scores import reference_model_scores
from tiny_llms import tokenizer
from tiny_models import random_prompts, tiny_model

from posym.core.discrepancy import head_gaps
from posym.errors import PosymError
from posym.core.geometry import plane_scores
from posym.core.scores import score_model

# nnsight 0.8 suggests TransformersModel, TransformerLens 3.x announces TransformerBridge (tested here too)
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:LanguageModel is deprecated"),
]


def test_nnsight_language_model_scores_as_its_transformers_model():
    nnsight = pytest.importorskip("nnsight")
    model = tiny_model("llama")
    wrapped = nnsight.LanguageModel(model, tokenizer=tokenizer())
    prompts = random_prompts([6, 8])
    pd.testing.assert_frame_equal(score_model(wrapped, prompts, "all"), score_model(model, prompts, "all"))
    pd.testing.assert_frame_equal(head_gaps(wrapped, prompts), head_gaps(model, prompts))
    pd.testing.assert_frame_equal(plane_scores(wrapped, prompts, layers=[1]), plane_scores(model, prompts, layers=[1]))


def _hooked_lens():
    """transformer_lens where it has HookedTransformer (3.x); the test is skipped under 4.x, which removed it."""
    lens = pytest.importorskip("transformer_lens")
    try:
        lens.HookedTransformer  # noqa: B018 (4.x raises ImportError here)
    except (ImportError, AttributeError):
        pytest.skip("TransformerLens 4 removed HookedTransformer (pip install 'transformer-lens>=3.9,<4' to test it)")
    return lens


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma3_text"])
def test_transformer_bridge_scores_as_its_transformers_model(kind, tmp_path):
    """A TransformerBridge booted on a tiny model (TransformerLens 4; 3.9 has the same bridge): every engine
    gives the transformers path's tables bit for bit, and the bridge is left as it was (its components in
    place, its forward the model's)."""
    pytest.importorskip("transformer_lens")
    from transformer_lens.model_bridge import TransformerBridge

    from posym.core.interop import BridgeModel, scorable

    model, plain = tiny_model(kind), tiny_model(kind)  # the same weights (seeded): one is wrapped by the bridge
    model.save_pretrained(tmp_path)
    bridge = TransformerBridge.boot_transformers(
        str(tmp_path), hf_model=model, dtype=torch.float64, tokenizer=tokenizer()
    )
    components = [type(m) for m in bridge.original_model.modules()]
    assert isinstance(scorable(bridge), BridgeModel) and type(model.model.layers[0].self_attn).__module__.startswith(
        "transformer_lens"
    )
    prompts = random_prompts([12, 12])  # past the tiny Gemma 3's local window
    pd.testing.assert_frame_equal(
        score_model(bridge, prompts, "all"), score_model(plain, prompts, "all"), check_exact=True
    )
    pd.testing.assert_frame_equal(head_gaps(bridge, prompts), head_gaps(plain, prompts), check_exact=True)
    pd.testing.assert_frame_equal(
        plane_scores(bridge, prompts, layers=[1]), plane_scores(plain, prompts, layers=[1]), check_exact=True
    )
    assert [type(m) for m in bridge.original_model.modules()] == components  # the bridge restored
    ids = torch.tensor(prompts)
    with torch.no_grad():
        torch.testing.assert_close(bridge(ids), plain(ids).logits, rtol=0, atol=0)


def _lens(adjacent: bool, kv_heads: int | None = None, seed: int = 0, qk_scale: float = 4.0, window: int | None = None):
    lens = _hooked_lens()
    local = {"use_local_attn": True, "window_size": window, "attn_types": ["local", "global"]} if window else {}
    cfg = lens.HookedTransformerConfig(
        n_layers=2,
        d_model=32,
        n_ctx=64,
        d_head=8,
        n_heads=4,
        d_vocab=40,
        act_fn="gelu",
        positional_embedding_type="rotary",
        rotary_dim=4,
        rotary_adjacent_pairs=adjacent,
        n_key_value_heads=kv_heads,
        normalization_type="LN",
        dtype=torch.float64,
        seed=seed,
        device="cpu",
        **local,
    )
    model = lens.HookedTransformer(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:  # peaked attention: the scores then tell heads apart
            for name in ("W_Q", "W_K", "_W_K"):
                if isinstance(getattr(block.attn, name, None), torch.nn.Parameter):
                    getattr(block.attn, name).mul_(qk_scale)
    return model


def _lens_rows(model, ids, layer, swap=None):
    """The model's own attention pattern [heads, T, T] of `layer` after exchanging the residual
    vectors entering it at swap = (A, B) (TransformerLens hooks)."""
    seen = {}

    def exchange(resid, hook):
        if swap is None:
            return resid
        resid = resid.clone()
        a, b = torch.tensor(swap[0]), torch.tensor(swap[1])
        resid[:, a], resid[:, b] = resid[:, b].clone(), resid[:, a].clone()
        return resid

    def record(pattern, hook):
        seen["pattern"] = pattern[0].detach()

    model.run_with_hooks(
        torch.tensor([ids]),
        stop_at_layer=layer + 1,
        fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", exchange), (f"blocks.{layer}.attn.hook_pattern", record)],
    )
    return seen["pattern"]


@pytest.mark.parametrize("adjacent,kv_heads", [(False, None), (True, 2)])
def test_hooked_transformer_scores_equal_the_per_swap_reference(adjacent, kv_heads):
    """Half-split and interleaved (rotary_adjacent_pairs) planes, partial rotary, grouped-query keys."""
    model = _lens(adjacent, kv_heads)
    prompts = random_prompts([6, 8], seed=3)
    frame = score_model(model, prompts, [[3, 5], [7]])
    assert frame["s_pos"].min() < 0.9 or frame["s_sym"].min() < 0.9
    worst = 0.0
    for (prompt, query, layer), rows in frame.groupby(["prompt", "query", "layer"]):
        ref = reference_model_scores(model, prompts[prompt], query, layer, rows=_lens_rows)
        for row, r in zip(rows.itertuples(), ref):
            worst = max(
                worst, abs(row.s_pos - r["s_pos"]), abs(row.s_sym - r["s_sym"]), abs(row.entropy - r["entropy"])
            )
    assert worst <= 1e-9, worst
    gaps = head_gaps(model, prompts[:1], "all")
    pattern = _lens_rows(model, prompts[0], 1)
    for r in gaps[gaps.layer == 1].itertuples():
        top = pattern[r.head, r.query, : r.query + 1].topk(2).values
        assert r.gap == pytest.approx(float(top[0].log() - top[1].log()), abs=1e-9)


def test_hooked_transformer_local_layers_are_scored_over_their_window():
    """A TransformerLens model whose layer 0 is local (window 4) at 10 tokens: the keys, the row (the
    model's own pattern inside the window, 0 outside) and the scores of the per-swap reference."""
    model = _lens(False, window=4)
    prompts = random_prompts([10], seed=4)
    frame = score_model(model, prompts, [[3, 6, 9]])
    assert frame.groupby("layer")["keys"].apply(list).to_dict() == {
        0: [4] * 4 + [4] * 4 + [4] * 4,
        1: [4] * 4 + [7] * 4 + [10] * 4,
    }
    assert frame[(frame.layer == 0) & (frame["query"] > 3)].attn_first.isna().all()
    worst = 0.0
    for (prompt, query, layer), rows in frame.groupby(["prompt", "query", "layer"]):
        ref = reference_model_scores(
            model, prompts[prompt], query, layer, rows=_lens_rows, window=4 if layer == 0 else None
        )
        for row, r in zip(rows.itertuples(), ref):
            assert (row.keys, row.top_key) == (r["keys"], r["top_key"])
            worst = max(
                worst, abs(row.s_pos - r["s_pos"]), abs(row.s_sym - r["s_sym"]), abs(row.entropy - r["entropy"])
            )
    assert worst <= 1e-9, worst
    pattern = _lens_rows(model, prompts[0], 0)  # [heads, T, T]
    assert torch.all(pattern[:, 9, :6] == 0)


def test_hooked_transformer_without_rope_is_refused():
    lens = _hooked_lens()
    cfg = lens.HookedTransformerConfig(
        n_layers=1,
        d_model=16,
        n_ctx=16,
        d_head=8,
        n_heads=2,
        d_vocab=40,
        act_fn="gelu",
        positional_embedding_type="standard",
        device="cpu",
    )
    with pytest.raises(PosymError, match="need rotary"):
        score_model(lens.HookedTransformer(cfg), random_prompts([5]))
