"""Tests of posym.swaps, the swapped-logit engine: its logits against the model's own, soft-capping,
per-plane shares, single swaps, eval mode whoever calls it, and the query batches."""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny_models import KINDS, VOCAB, random_prompts, tiny_model

from posym.core import geometry, swaps
from posym.errors import PosymError
from posym.core.qk import HeadQK, head_qk, rotate
from posym.core.swaps import query_batches


def _hand_made(softcap=None, seed=0, n=7, d=6):
    """A HeadQK of one prompt and two heads with random q/k and real RoPE tables (half pairing)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, 2, n, d, generator=gen, dtype=torch.float64) * 3 for _ in range(2))
    angles = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor([1.0, 0.1])  # [n, 2]
    cos, sin = torch.cat((angles.cos(), angles.cos()), -1)[None], torch.cat((angles.sin(), angles.sin()), -1)[None]
    return HeadQK(q, k, cos, sin, "half", 0.5, softcap)


def _written_out(qk, p):
    """swapped[h, a, b] = scale * (R_p q_p) . (R_a k_b), one dot product at a time (then capped)."""
    out = torch.zeros(qk.q.shape[1], p + 1, p + 1, dtype=torch.float64)
    for h in range(qk.q.shape[1]):
        query = rotate(qk.q[0, h, p], qk.cos[0, p], qk.sin[0, p], qk.pairing)
        for a in range(p + 1):
            for b in range(p + 1):
                raw = qk.scale * query @ rotate(qk.k[0, h, b], qk.cos[0, a], qk.sin[0, a], qk.pairing)
                out[h, a, b] = raw if qk.softcap is None else qk.softcap * torch.tanh(raw / qk.softcap)
    return out


@pytest.mark.parametrize("softcap", [None, 2.5])
def test_engine_logits_written_out_with_and_without_softcap(softcap):
    qk, p = _hand_made(softcap), 5
    rows = torch.tensor([0])
    want = _written_out(qk, p)
    swapped = swaps.swap_logits(qk, rows, slice(None), p)[0]  # [H, n, n]
    assert torch.allclose(swapped, want, atol=1e-12)
    assert torch.allclose(swaps.clean_logits(qk, rows, slice(None), p)[0], want.diagonal(dim1=-2, dim2=-1), atol=1e-12)
    u, k = swaps.unrotated_queries(qk, rows, slice(None), p)
    a, b = torch.tensor([[0], [3]]), torch.tensor([[4], [1]])
    single = swaps.pair_logits(qk, u[0], k[0], torch.tensor([[1], [0]]), a, b)  # head 1 (0 -> 4), head 0 (3 -> 1)
    assert torch.allclose(single[:, 0], torch.stack([want[1, 0, 4], want[0, 3, 1]]), atol=1e-12)
    if softcap is not None:  # capping changes the numbers (the test would pass vacuously otherwise)
        assert swapped.abs().max() < softcap < _written_out(_hand_made(None), p).abs().max()
        with pytest.raises(PosymError, match="soft-capping"):
            swaps.plane_swap_logits(qk, rows, [0, 1], p)


@pytest.mark.parametrize("kind", KINDS)
def test_engine_matches_the_models_logits_and_planes_sum_to_them(kind):
    model = tiny_model(kind)
    ids = random_prompts([8])[0]
    qk = head_qk(model, [ids], layers=[1])[1]
    p = 7
    q = rotate(qk.q[0, :, p], qk.cos[0, p], qk.sin[0, p], qk.pairing)  # [H, d]
    keys = rotate(qk.k[0], qk.cos[0], qk.sin[0], qk.pairing)  # [H, T, d]
    own = qk.scale * (keys @ q[..., None])[..., 0]  # [H, T]: the model's own logits
    swapped = swaps.swap_logits(qk, torch.tensor([0]), slice(None), p)[0]  # [H, n, n]
    assert torch.allclose(swapped.diagonal(dim1=-2, dim2=-1), own.double(), atol=1e-10)
    planes = swaps.plane_swap_logits(qk, torch.tensor([0]), list(range(qk.q.shape[1])), p)[0]  # [H, C, n, n]
    assert torch.allclose(planes.sum(1), swapped, atol=1e-10)
    channels = swaps.channel_logits(qk, torch.tensor([0]), list(range(qk.q.shape[1])), p)[0]  # [H, C, n]
    assert torch.allclose(channels, planes.diagonal(dim1=-2, dim2=-1), atol=1e-10)  # the swaps' diagonal
    assert channels.shape[1] == planes.shape[1] and (channels.abs().amax(-1) > 1e-6).all()  # no channel empty


def test_channel_logits_written_out_plane_by_plane():
    """Plane m's share of the clean row, one 2-d dot product at a time (half pairing: dims m and m + r/2)."""
    qk, p = _hand_made(), 5
    channels = swaps.channel_logits(qk, torch.tensor([0]), slice(None), p)[0]  # [H, 3, n]: 2 planes + free dims
    for h in range(2):
        query = rotate(qk.q[0, h, p], qk.cos[0, p], qk.sin[0, p], qk.pairing)
        for j in range(p + 1):
            key = rotate(qk.k[0, h, j], qk.cos[0, j], qk.sin[0, j], qk.pairing)
            for m, dims in enumerate(([0, 2], [1, 3], [4, 5])):
                assert abs(channels[h, m, j] - qk.scale * (query[dims] @ key[dims])) < 1e-12
    with pytest.raises(PosymError, match="soft-capping"):
        swaps.channel_logits(_hand_made(2.5), torch.tensor([0]), slice(None), p)


def test_eval_mode_whoever_calls_and_the_flag_is_restored():
    config = transformers.GPTJConfig(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=16,
        n_layer=2,
        n_head=2,
        rotary_dim=4,
        embd_pdrop=0.5,
        resid_pdrop=0.5,
        attn_pdrop=0.5,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.GPTJForCausalLM(config).double().train()  # as posym.model.build_model returns it
    ids = random_prompts([9, 9], seed=2)
    first, second = head_qk(model, ids), head_qk(model, ids)
    assert all(torch.equal(first[layer].q, second[layer].q) for layer in first)
    assert model.training
    planes = [geometry.plane_scores(model, ids, "all") for _ in range(2)]
    assert planes[0].equals(planes[1]) and model.training
    with torch.no_grad():  # and the dropout really is there: training-mode passes differ
        assert not torch.equal(model(torch.tensor(ids)).logits, model(torch.tensor(ids)).logits)


def test_query_batches_group_by_length_and_query():
    prompts = [[1] * 5, [1] * 3, [1] * 5, [1] * 5, [1] * 3]
    queries = [[4, 2], "last", [3], "all", [2]]
    # written out: length 3 first ([1, 4]), then length 5 in batches of two ([0, 2], [3])
    assert query_batches(prompts, queries, 2) == [
        ([1, 4], {2: [0, 1]}),
        ([0, 2], {2: [0], 4: [0], 3: [1]}),
        ([3], {2: [0], 3: [0], 4: [0]}),
    ]
    assert query_batches(prompts, "last", 8) == [([1, 4], {2: [0, 1]}), ([0, 2, 3], {4: [0, 1, 2]})]
    with pytest.raises(PosymError, match="3 entries for 5 prompts"):
        query_batches(prompts, [[2], [2], [2]], 2)
    with pytest.raises(PosymError, match="prompt 1"):
        query_batches(prompts, [[2], [3], [2], [2], [2]], 2)


def test_scan_checks_everything_before_the_first_pass():
    model = tiny_model("qwen2", torch.float32)
    calls = []
    with pytest.raises(PosymError, match="prompt 1"):
        list(swaps.scan(model, [[1, 2, 3], [1, VOCAB]], "last", lambda *a: calls.append(a)))
    with pytest.raises(PosymError, match="no prompts"):
        list(swaps.scan(model, [], "last", lambda *a: calls.append(a)))
    assert not calls
