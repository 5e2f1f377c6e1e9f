"""Tests of posym.core.aliasing: the alias gap, the per-plane key gaps against the logits written out one
plane at a time, and the offset histogram and its null by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from tiny_models import random_prompts, tiny_model

from posym.core.aliasing import NEAR, alias_gap, alias_share, key_planes, offset_histogram
from posym.core.qk import head_qk, rotate
from posym.errors import PosymError


def test_alias_gap_by_hand():
    assert alias_gap(44) == pytest.approx(abs(44 - 14 * math.pi), abs=1e-12)  # 0.0177
    assert alias_gap(-44) == pytest.approx(alias_gap(44), abs=1e-12)  # a key 44 nearer: the same angle
    assert alias_gap(19) == pytest.approx(19 - 6 * math.pi, abs=1e-12)
    assert alias_gap(25) == pytest.approx(8 * math.pi - 25, abs=1e-12)
    assert alias_gap(0) == 0.0 and alias_gap(math.pi) == pytest.approx(math.pi)
    assert alias_gap(10, theta=0.5) == pytest.approx(2 * math.pi - 5, abs=1e-12)
    gaps = alias_gap(np.arange(1, 89))
    assert gaps.shape == (88,) and gaps.max() <= math.pi
    assert int(np.argmin(gaps)) + 1 == 44  # the nearest full turn of plane ID 1 below 88
    near = sorted(int(d) for d in np.arange(1, 89)[gaps < NEAR])
    assert near == [19, 25, 44, 63, 69, 88]  # what NEAR's docstring says it holds


def test_offset_histogram_and_null_by_hand():
    rows = pd.DataFrame(
        {
            "query": [10, 10, 10, 6],
            "keys": [11, 11, 11, 7],
            "tracked_key": [8, 8, 8, 2],
            "top_key": [8, 1, 9, 0],  # right, 7 further back, 1 nearer, 2 further back
        }
    )
    hist = offset_histogram(rows).set_index("offset")
    assert hist.observed.to_dict() == {d: (1 if d in (7, -1, 2) else 0) for d in hist.index}
    # null: each wrong row's top key uniform over the other keys its query sees (10 and 6 of them)
    assert sorted(hist.index) == sorted({*range(-2, 9), *range(-4, 3)} - {0})
    assert hist.expected[7] == pytest.approx(2 / 10)
    assert hist.expected[2] == pytest.approx(2 / 10 + 1 / 6)
    assert hist.expected[-4] == pytest.approx(1 / 6)
    assert hist.expected.sum() == pytest.approx(3.0)  # one unit per wrong row
    np.testing.assert_allclose(hist.alias_gap, alias_gap(np.array(hist.index, dtype=float)))
    share = alias_share(hist.reset_index())
    assert share["wrong"] == 3 and share["aliased"] == 0  # none of 7, -1, 2 is near a full turn
    assert share["gap_mean"] == pytest.approx((alias_gap(7) + alias_gap(1) + alias_gap(2)) / 3)
    assert share["expected_share"] == pytest.approx(0.0)  # no reachable offset (-4 .. 8) lies within NEAR
    far = pd.DataFrame({"query": [50, 50], "keys": 51, "tracked_key": 45, "top_key": [1, 45]})  # offset 44
    share = alias_share(offset_histogram(far))
    assert (share["wrong"], share["aliased"], share["share"]) == (1, 1, 1.0)
    near = [d for d in range(-5, 46) if d != 0 and alias_gap(d) < NEAR]  # 19, 25, 44
    assert near == [19, 25, 44] and share["expected_share"] == pytest.approx(3 / 50)


def _written_out(qk, p, j, h):
    """Per-channel logits of query p and key j of head h: each plane's rotated 2-d dot product, then the
    pass-through dims (GPT-J: interleaved planes (2m, 2m + 1))."""
    r = qk.cos.shape[-1]
    rq = rotate(qk.q[0, h, p].double(), qk.cos[0, p].double(), qk.sin[0, p].double(), qk.pairing)
    rk = rotate(qk.k[0, h, j].double(), qk.cos[0, j].double(), qk.sin[0, j].double(), qk.pairing)
    shares = [qk.scale * float(rq[2 * m : 2 * m + 2] @ rk[2 * m : 2 * m + 2]) for m in range(r // 2)]
    return np.array(shares), qk.scale * float(rq[r:] @ rk[r:])


def test_key_planes_equal_the_logits_written_out():
    model = tiny_model("gptj")
    prompts = random_prompts([12, 12, 9], seed=3)
    queries = [[11, 7], [11], [8, 5]]
    tracked = lambda prompt, query: query - 3  # noqa: E731  a fixed key 3 back
    rows = key_planes(model, prompts, queries, tracked)
    assert len(rows) == 5 * 2 * 2  # (prompt, query) pairs x layers x heads
    planes = sorted(c for c in rows.columns if c.startswith("plane_gap_"))
    assert len(planes) == 4  # rotary_dim 8
    for (prompt, layer), group in rows.groupby(["prompt", "layer"]):
        qk = head_qk(model, [prompts[prompt]], layers=[layer])[layer]
        for row in group.itertuples():
            logits = np.array(
                [
                    sum(_written_out(qk, row.query, j, row.head)[0]) + _written_out(qk, row.query, j, row.head)[1]
                    for j in range(row.query + 1)
                ]
            )
            assert row.top_key == int(np.argmax(logits)) and row.tracked_key == row.query - 3
            assert row.logit_top == pytest.approx(logits.max(), abs=1e-9)
            assert row.logit_tracked == pytest.approx(logits[row.tracked_key], abs=1e-9)
            top, want = (
                _written_out(qk, row.query, row.top_key, row.head),
                _written_out(qk, row.query, row.tracked_key, row.head),
            )
            got = np.array([getattr(row, f"plane_gap_{m + 1}") for m in range(4)])
            np.testing.assert_allclose(got, top[0] - want[0], atol=1e-9)
            assert row.free_gap == pytest.approx(top[1] - want[1], abs=1e-9)
            every = np.array([_written_out(qk, row.query, j, row.head)[0] for j in range(row.query + 1)])  # [n, 4]
            others = np.delete(every, row.tracked_key, axis=0).mean(0) - every[row.tracked_key]
            got = np.array([getattr(row, f"plane_others_{m + 1}") for m in range(4)])
            np.testing.assert_allclose(got, others, atol=1e-9)
            free = np.array([_written_out(qk, row.query, j, row.head)[1] for j in range(row.query + 1)])
            assert row.free_others == pytest.approx(np.delete(free, row.tracked_key).mean() - free[row.tracked_key])
    gaps = rows[planes].sum(axis=1) + rows.free_gap
    np.testing.assert_allclose(gaps, rows.logit_top - rows.logit_tracked, atol=1e-9)
    right = rows[rows.top_key == rows.tracked_key]
    wrong = rows[rows.top_key != rows.tracked_key]
    assert len(wrong) > 0 and (wrong.logit_top > wrong.logit_tracked).all()
    assert (right[planes].abs().to_numpy() == 0).all()


def test_key_planes_refuses_a_key_the_query_does_not_see():
    model = tiny_model("gptj")
    with pytest.raises(PosymError, match="not among the keys it sees"):
        key_planes(model, random_prompts([8]), [[6]], lambda prompt, query: query + 1)
