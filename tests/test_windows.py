"""Sliding-window layers (docs/windows.md): prompts longer than a layer's window are scored over the keys
each query sees, and every engine (scores pruned and dense, per-plane geometry, discrepancy gaps, the
sink view) agrees with the per-swap reference that re-runs the layer under the model's own mask
(tests/reference_scores.py), on tiny Mistral, Qwen2, Starcoder2, Gemma 2 and Gemma 3 models whose
local layers have a window of WINDOW keys."""

from __future__ import annotations

import math

import pytest
import torch
from reference_scores import attention_rows, channel_dims, reference_model_scores, reference_swap_scores
from tiny_models import WINDOWED, random_prompts, tiny_model

from posym.core import geometry
from posym.core.discrepancy import head_gaps
from posym.core.qk import check_mask, head_qk, rotate, visible_keys
from posym.core.scores import score_model
from posym.errors import PosymError

WINDOW = 4
PROMPTS = [11, 9]
QUERIES = [[2, 3, 6, 10], [5, 8]]  # queries 2 and 3 still see token 0; the others do not
COMPARED = ("s_pos", "s_sym", "entropy", "attn_top")


def _worst(model, prompts, frame, **options) -> float:
    """Largest |posym - reference| over the rows of frame; keys, top_key, n_swaps and the token-0 sink
    (NaN past the window) must be equal."""
    worst = 0.0
    for (prompt, query, layer), rows in frame.groupby(["prompt", "query", "layer"]):
        ref = reference_model_scores(model, prompts[prompt], query, layer, **options)
        for row, r in zip(rows.itertuples(), ref):
            assert (row.keys, row.top_key, row.n_swaps) == (r["keys"], r["top_key"], r["n_swaps"])
            assert math.isnan(row.attn_first) == math.isnan(r["attn_first"])
            if not math.isnan(r["attn_first"]):
                worst = max(worst, abs(row.attn_first - r["attn_first"]))
            worst = max(worst, *(abs(getattr(row, c) - r[c]) for c in COMPARED))
    return worst


@pytest.mark.parametrize("kind", WINDOWED)
def test_windowed_scores_equal_the_per_swap_reference(kind):
    """float64: the reference recomputes the row from the layer's own rotated q/k under its own mask
    (<= 1e-9); float32: it reads the model's own eager attention weights (<= 1e-4)."""
    model = tiny_model(kind, window=WINDOW)
    prompts = random_prompts(PROMPTS)
    frame = score_model(model, prompts, QUERIES)
    local = frame[frame.layer == 0]
    assert set(local[local["query"] >= WINDOW]["keys"]) == {WINDOW}  # layer 0 is a local layer in every family
    assert local[local["query"] >= WINDOW].attn_first.isna().all()
    assert local[local["query"] < WINDOW].attn_first.notna().all()
    assert frame["s_pos"].min() < 0.9 or frame["s_sym"].min() < 0.9  # peaked enough to mean something
    assert _worst(model, prompts, frame) <= 1e-9
    model32 = tiny_model(kind, torch.float32, seed=1, window=WINDOW)
    prompts = random_prompts([10], seed=1)
    frame = score_model(model32, prompts, [[5, 9]])
    assert _worst(model32, prompts, frame, own=True) <= 1e-4


def test_global_layers_keep_every_key():
    """Gemma 2 and 3 alternate local (window) and global layers: layer 1 sees every key."""
    for kind in ("gemma2", "gemma3_text"):
        frame = score_model(tiny_model(kind, window=WINDOW), random_prompts([12]), [[11]])
        assert frame.groupby("layer")["keys"].unique().map(list).to_dict() == {0: [WINDOW], 1: [12]}
        assert [qk.window for qk in head_qk(tiny_model(kind, window=WINDOW), random_prompts([12])).values()] == [
            WINDOW,
            None,
        ]


@pytest.mark.parametrize("kind", ["mistral", "gemma3_text"])
def test_pruned_equals_dense_within_the_recorded_bound(kind):
    """At 40 tokens and a window of 8 (many queries past it), block swaps and single swaps, sinks excluded
    or not: every pruned row lies within its bound of weighing every swap in the window."""
    model = tiny_model(kind, window=8)
    prompts = random_prompts([40, 40], seed=3)
    queries = list(range(4, 40))  # every query with 3 earlier keys (3 blocks)
    for options in ({}, {"blocks": 3}, {"exclude_keys": (0,)}):
        pruned = score_model(model, prompts, queries, **options)
        dense = score_model(model, prompts, queries, exact="dense", **options)
        assert (dense.bound == 0).all() and (pruned["keys"] <= 40).all()
        for column in ("s_pos", "s_sym"):
            assert ((pruned[column] - dense[column]).abs() <= pruned.bound + 1e-12).all()
        for column in ("top_key", "keys", "n_swaps"):
            assert pruned[column].equals(dense[column])
        assert pruned["attn_first"].isna().equals(dense["attn_first"].isna())
        for column in ("entropy", "attn_first", "attn_top"):  # batched (pruned) vs per-query (dense) rounding
            assert (pruned[column] - dense[column]).abs().max() <= 1e-12


def test_excluded_keys_outside_the_window_change_nothing():
    """A sink excluded at token 0 only matters to queries that see token 0."""
    model = tiny_model("mistral", window=WINDOW)
    prompts = random_prompts([10], seed=4)
    plain = score_model(model, prompts, [[3, 7, 9]], exact="dense")
    free = score_model(model, prompts, [[3, 7, 9]], exact="dense", exclude_keys=(0,))
    late = plain["query"] >= WINDOW
    assert plain[late][["s_pos", "s_sym", "n_swaps"]].equals(free[late][["s_pos", "s_sym", "n_swaps"]])
    assert (free[~late].n_swaps < plain[~late].n_swaps).all()
    assert _worst(model, prompts, free, exclude_keys=(0,)) <= 1e-9


@pytest.mark.parametrize("kind", ["mistral", "gemma3_text"])
def test_windowed_plane_scores_and_gaps_are_the_models_own(kind):
    """Per-plane scores over the window equal the swap-by-swap reference from explicitly rotated keys,
    the channels sum to the model's own attention row (masked by its window), and the discrepancy gaps
    are the log-ratio of the two largest weights the model gives inside the window."""
    model = tiny_model(kind, window=WINDOW, qk_scale=4.0)
    ids = random_prompts([9], seed=5)[0]
    queries = [[3, 6, 8]]
    tau = 1e-2
    planes = geometry.plane_scores(model, [ids], queries, tau=tau)
    gaps = head_gaps(model, [ids], queries)
    for layer, qk in head_qk(model, [ids]).items():
        d, r = qk.q.shape[-1], qk.cos.shape[-1]
        channels = channel_dims(qk.pairing, r, d)

        def rotated(x, at):
            return rotate(x.double(), qk.cos[0, at].double(), qk.sin[0, at].double(), qk.pairing)

        probs = attention_rows(model, ids, layer)  # [H, T, T], the model's own mask
        for p in queries[0]:
            first = max(0, p - WINDOW + 1) if qk.window else 0
            keys = range(first, p + 1)
            assert torch.all(probs[:, p, :first] == 0)
            for head in range(qk.q.shape[1]):
                q_rot = rotated(qk.q[0, head, p], p)
                rows = planes[(planes["query"] == p) & (planes.layer == layer) & (planes["head"] == head)]
                total = torch.zeros(len(keys), dtype=torch.float64)
                for c, row in zip(channels, rows.itertuples()):
                    swapped = torch.tensor(
                        [
                            [float(qk.scale * (q_rot[c] * rotated(qk.k[0, head, b], a)[c]).sum()) for b in keys]
                            for a in keys
                        ],
                        dtype=torch.float64,
                    )
                    ref = reference_swap_scores(swapped.diagonal(), swapped, tau=tau)
                    assert row.keys == len(keys)
                    assert (row.s_pos, row.s_sym) == pytest.approx((ref["s_pos"], ref["s_sym"]), abs=1e-9)
                    assert row.max_logit == pytest.approx(float(swapped.diagonal().max()), abs=1e-9)
                    total += swapped.diagonal()
                torch.testing.assert_close(torch.softmax(total, 0), probs[head, p, first : p + 1], atol=1e-12, rtol=0)
                gap = gaps[(gaps["query"] == p) & (gaps.layer == layer) & (gaps["head"] == head)].iloc[0]
                top = probs[head, p, first : p + 1].topk(2)
                assert gap["keys"] == len(keys) and gap.top_key == first + int(top.indices[0])
                assert gap.gap == pytest.approx(float(top.values[0].log() - top.values[1].log()), abs=1e-9)


def test_sdpa_gives_the_eager_scores():
    """The SDPA kernel receives a boolean window mask instead of an additive one: the same scores on the
    local layer 0 (its input, the embeddings, is the same; the eager kernel's float32 softmax moves
    later layers' inputs by ~1e-7) and the same keys everywhere."""
    eager = tiny_model("gemma3_text", window=WINDOW)
    sdpa = tiny_model("gemma3_text", window=WINDOW)
    sdpa.set_attn_implementation("sdpa")
    prompts = random_prompts(PROMPTS)
    a, b = score_model(eager, prompts, QUERIES), score_model(sdpa, prompts, QUERIES)
    first = a.layer == 0
    assert (a.s_pos - b.s_pos)[first].abs().max() <= 1e-12 and (a.s_sym - b.s_sym)[first].abs().max() <= 1e-12
    assert a["keys"].equals(b["keys"]) and (a.s_pos - b.s_pos).abs().max() <= 1e-6


def test_masks_other_than_the_causal_window_are_refused():
    """check_mask reads the mask the kernel got: a chunked or bidirectional one is a PosymError."""
    T = 8
    window = visible_keys(T, 3)
    check_mask(window[None, None], T, 3, 0)
    additive = torch.zeros(T, T, dtype=torch.float64).masked_fill(~window, torch.finfo(torch.float64).min)
    check_mask(additive[None, None], T, 3, 0)  # the eager kernels' form
    check_mask(None, T, 3, 0)  # no mask: the kernel's own causal flag and window
    chunked = visible_keys(T, None) & (torch.arange(T)[:, None] // 4 == torch.arange(T)[None, :] // 4)
    with pytest.raises(PosymError, match="not a sliding window of 3 keys"):
        check_mask(chunked[None, None], T, 3, 2)
    with pytest.raises(PosymError, match="not causal attention"):
        check_mask(torch.ones(1, 1, T, T, dtype=torch.bool), T, None, 0)


def test_a_window_without_two_earlier_keys_is_refused():
    with pytest.raises(PosymError, match="window of 2 keys leaves query 5 fewer than 2 earlier keys"):
        score_model(tiny_model("mistral", window=2), random_prompts([6]))


@pytest.mark.parametrize("length", [1024, pytest.param(4096, marks=pytest.mark.slow)])  # 4,096: ~10x 1,024's time
@pytest.mark.parametrize("kind", WINDOWED)
def test_long_prompts_past_the_window(kind, length):
    """Issue 26's acceptance on the tiny families: a 1,024- and a 4,096-token prompt (positions=4096; SDPA,
    as posym loads real models, so no [T, T] map is built; Gemma 2 eager), last query: local rows see WINDOW keys, global
    ones all; pruned == dense within the recorded bound; float64 scores equal the per-swap reference that
    recomputes the query's row from the layer's own rotated q/k under the model's own mask (<= 1e-9), with
    single swaps on local layers and 3 block swaps on Gemma's global layer (C(T - 1, 2) single ones there)."""
    model = tiny_model(kind, window=WINDOW, positions=4096)
    if kind != "gemma2":  # transformers has no SDPA kernel for Gemma 2 (its logit soft-capping): eager there
        model.set_attn_implementation("sdpa")
    prompts = random_prompts([length], seed=length)
    query = [[length - 1]]
    global_layers = [1] if kind.startswith("gemma") else []
    for layers, blocks in (([0, 1][: 2 - len(global_layers)], None), (global_layers, 3)):
        if not layers:
            continue
        pruned = score_model(model, prompts, query, layers=layers, blocks=blocks)
        dense = score_model(model, prompts, query, layers=layers, blocks=blocks, exact="dense")
        assert set(pruned["keys"]) == {length if blocks else WINDOW} and len(pruned) == 4 * len(layers)
        assert pruned.attn_first.isna().all() != bool(blocks)  # token 0 only on the global layer
        for column in ("s_pos", "s_sym"):
            assert ((pruned[column] - dense[column]).abs() <= pruned.bound + 1e-12).all()
        assert _worst(model, prompts, pruned, blocks=blocks) <= 1e-9
