"""Tests of posym.scores: the pure swap maths against a loop-per-swap reference, then the model
fast path against re-running the layer once per swap (tests/reference_scores.py)."""

from __future__ import annotations

import math

import pytest
import torch
from reference_scores import reference_blocks, reference_swap_scores

from posym.errors import PosymError
from posym.scores import swap_scores


def _random_row(n, gen, scale=3.0, batch=()):
    clean = torch.randn(*batch, n, generator=gen, dtype=torch.float64) * scale
    swapped = torch.randn(*batch, n, n, generator=gen, dtype=torch.float64) * scale
    swapped.diagonal(dim1=-2, dim2=-1).copy_(clean)
    return clean, swapped


@pytest.mark.parametrize("blocks", [None, 2, 3, 5])
@pytest.mark.parametrize("compare", ["probs", "logits"])
@pytest.mark.parametrize("tau", [1e-4, 0.05])
def test_swap_scores_match_loop_reference(blocks, compare, tau):
    gen = torch.Generator().manual_seed(0)
    clean, swapped = _random_row(12, gen, batch=(3,))
    fast = swap_scores(clean, swapped, tau=tau, blocks=blocks, compare=compare)
    for k in range(3):
        ref = reference_swap_scores(clean[k], swapped[k], tau=tau, blocks=blocks, compare=compare)
        assert fast["s_pos"][k].item() == pytest.approx(ref["s_pos"], abs=1e-12)
        assert fast["s_sym"][k].item() == pytest.approx(ref["s_sym"], abs=1e-12)
        assert fast["entropy"][k].item() == pytest.approx(ref["entropy"], abs=1e-12)
        assert fast["n_swaps"] == ref["n_swaps"]


def test_swap_count_and_blocks():
    gen = torch.Generator().manual_seed(1)
    clean, swapped = _random_row(9, gen)
    assert swap_scores(clean, swapped)["n_swaps"] == math.comb(8, 2)
    assert swap_scores(clean, swapped, blocks=3)["n_swaps"] == 3
    # n-1 blocks of one key each are the single-token swaps
    one, many = swap_scores(clean, swapped, blocks=8), swap_scores(clean, swapped)
    assert torch.equal(one["s_pos"], many["s_pos"]) and torch.equal(one["s_sym"], many["s_sym"])
    # 10 keys in 3 blocks of 3: the oldest key stays put
    assert reference_blocks(10, 3)[0] == ([1, 2, 3], [4, 5, 6])


def test_uniform_attention_scores_one_one():
    out = swap_scores(torch.zeros(7), torch.zeros(7, 7))
    assert out["s_pos"].item() == pytest.approx(1.0, abs=1e-12)
    assert out["s_sym"].item() == pytest.approx(1.0, abs=1e-12)
    assert out["entropy"].item() == pytest.approx(math.log(7), abs=1e-12)


def test_positional_and_symbolic_constructions():
    gen = torch.Generator().manual_seed(2)
    clean = torch.randn(10, generator=gen, dtype=torch.float64) * 4
    by_position = clean[:, None].expand(10, 10)  # logit depends on where the key is
    by_content = clean[None, :].expand(10, 10)  # logit follows the content wherever it goes
    pos = swap_scores(clean, by_position)
    sym = swap_scores(clean, by_content)
    assert pos["s_pos"].item() == pytest.approx(1.0, abs=1e-12) and pos["s_sym"].item() < 0.9
    assert sym["s_sym"].item() == pytest.approx(1.0, abs=1e-12) and sym["s_pos"].item() < 0.9


def test_extreme_logits_stay_finite_and_exact():
    # differences of thousands underflow every probability but the largest: the scores must not
    clean = torch.tensor([0.0, -3000.0, 2000.0, -1000.0, 5.0])
    by_position = clean[:, None].expand(5, 5)
    out = swap_scores(clean, by_position)
    assert out["s_pos"].item() == 1.0
    assert torch.isfinite(out["s_sym"]) and torch.isfinite(out["entropy"])


def test_bad_inputs_are_posym_errors():
    with pytest.raises(PosymError, match="at least 2 earlier keys"):
        swap_scores(torch.zeros(2), torch.zeros(2, 2))
    with pytest.raises(PosymError, match="shape"):
        swap_scores(torch.zeros(4), torch.zeros(4, 5))
    with pytest.raises(PosymError, match="blocks"):
        swap_scores(torch.zeros(5), torch.zeros(5, 5), blocks=5)
    with pytest.raises(PosymError, match="blocks"):
        swap_scores(torch.zeros(5), torch.zeros(5, 5), blocks=1)
    with pytest.raises(PosymError, match="compare"):
        swap_scores(torch.zeros(5), torch.zeros(5, 5), compare="probabilities")
    with pytest.raises(PosymError, match="tau"):
        swap_scores(torch.zeros(5), torch.zeros(5, 5), tau=0.0)
