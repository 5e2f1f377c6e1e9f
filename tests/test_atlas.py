"""posym.core.atlas: each score on hand-built heads whose value is known, each fast path against a loop."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_models import random_prompts, tiny_model

from posym.core import atlas, swaps
from posym.core.qk import HeadQK, head_qk
from posym.core.scores import swap_scores
from posym.errors import PosymError


def rope_tables(T: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, T, 2] of one RoPE plane turning by theta per position (theta 0: no position)."""
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta  # [T, 1]
    return angle.cos().expand(T, 2)[None].clone(), angle.sin().expand(T, 2)[None].clone()


def one_head(q: torch.Tensor, k: torch.Tensor, theta: float) -> HeadQK:
    """A one-prompt, one-head layer from pre-rotation q, k [T, d] (the first 2 dims rotate)."""
    cos, sin = rope_tables(q.shape[0], theta)
    return HeadQK(q[None, None].double(), k[None, None].double(), cos, sin, "half", 1.0)


def previous_token_head(T: int = 12, strength: float = 200.0, theta: float = 0.3) -> HeadQK:
    """Every key the same vector (1, 0); every query turned back by one position's angle, so after RoPE
    query p points exactly at key p - 1: cos((p - 1 - j) theta) peaks at j = p - 1."""
    k = torch.tensor([[1.0, 0.0]]).expand(T, 2) * math.sqrt(strength)
    q = torch.tensor([[math.cos(-theta), math.sin(-theta)]]).expand(T, 2) * math.sqrt(strength)
    return one_head(q, k, theta)


def content_head(key_tokens, query_tokens, vocab: int, strength: float = 100.0) -> HeadQK:
    """No position (theta 0): key j is one-hot on key_tokens[j], query p one-hot on query_tokens[p],
    so a query attends to the keys holding its token, wherever they are."""
    eye = torch.eye(vocab, dtype=torch.float64) * math.sqrt(strength)
    return one_head(eye[list(query_tokens)], eye[list(key_tokens)], 0.0)


def head_swap_scores(qk: HeadQK, p: int) -> dict:
    swapped = swaps.swap_logits(qk, torch.tensor([0]), [0], p)  # [1, 1, n, n]
    return swap_scores(swapped.diagonal(dim1=-2, dim2=-1), swapped)


# ---- hand-built heads -----------------------------------------------------------------------------


def test_previous_token_head_scores_one_and_is_positional():
    qk = previous_token_head()
    queries = torch.arange(12)
    probs = atlas.attention(qk, queries)  # [1, 1, 12, 12]
    prev = atlas.previous_token(probs, queries)[0, 0]
    assert math.isnan(prev[0]) and float(prev[1:].min()) > 0.999
    res = head_swap_scores(qk, 11)
    assert float(res["s_pos"]) > 0.999 and float(res["s_sym"]) < 0.01
    # its attention is all in a recent window of 2 keys: a streaming head, no sink
    stream = atlas.streaming(probs, queries, sink=1, window=2)[0, 0]
    assert torch.isnan(stream[:3]).all() and float(stream[3:].min()) > 0.999
    assert float(atlas.sink_mass(probs)[0, 0, 3:].max()) < 1e-3


def test_sink_only_head_is_a_streaming_head():
    T = 16
    k = torch.zeros(T, 2)
    k[0, 0] = 10.0  # only key 0 has content the queries match
    q = torch.tensor([[5.0, 0.0]]).expand(T, 2)  # logit 50 on key 0, 0 elsewhere
    qk = one_head(q, k, 0.0)
    queries = torch.arange(T)
    probs = atlas.attention(qk, queries)
    assert float(atlas.sink_mass(probs, 1)[0, 0].min()) > 1 - 1e-12
    stream = atlas.streaming(probs, queries, sink=1, window=4)[0, 0]
    assert float(stream[5:].min()) > 1 - 1e-12
    assert float(atlas.entropy(probs)[0, 0].max()) < 1e-9
    # without the sink in the kept set the same head needs its far keys: streaming 0
    assert float(atlas.streaming(probs, queries, sink=0, window=4)[0, 0, 4:].max()) < 1e-12


def needle_prompt():
    """ids with a needle (tokens 20..23 at positions 5..8) in a haystack of tokens 1..9, then the answer
    (the needle again), teacher-forced: the step at query p generates ids[p + 1]."""
    hay = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    ids = hay[:5] + [20, 21, 22, 23] + hay[5:] + [30, 31] + [20, 21, 22, 23]
    needle = torch.zeros(len(ids), dtype=torch.bool)
    needle[5:9] = True
    answer_start = len(ids) - 4
    queries = torch.arange(answer_start - 1, len(ids) - 1)  # each step generates one needle token
    return torch.tensor([ids]), needle[None], queries


def test_head_that_copies_the_needle_scores_one_and_is_symbolic():
    ids, needle, queries = needle_prompt()
    tokens = ids[0].tolist()
    wanted = tokens[1:] + [0]  # the query at p looks for the token it is about to generate
    qk = content_head(tokens, wanted, vocab=32)
    probs = atlas.attention(qk, queries)
    assert atlas.copy_events(probs, ids, queries, needle).mean().item() == 1.0
    res = head_swap_scores(qk, int(queries[1]))
    assert float(res["s_sym"]) > 0.999 and float(res["s_pos"]) < 0.01
    # a previous-token head at the same steps never copies the needle
    prev = atlas.attention(previous_token_head(len(tokens)), queries)
    assert atlas.copy_events(prev, ids, queries, needle).max().item() == 0.0


def test_copy_needs_the_generated_token_inside_the_needle():
    ids, needle, queries = needle_prompt()
    probs = torch.zeros(1, 1, len(queries), ids.shape[1], dtype=torch.float64)
    probs[0, 0, :, 5] = 1.0  # always the first needle token: right only at the first step
    assert atlas.copy_events(probs, ids, queries, needle)[0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    outside = needle.clone()
    outside[0, 5] = False  # the same key outside the needle does not count
    assert atlas.copy_events(probs, ids, queries, outside).max().item() == 0.0
    with pytest.raises(PosymError, match="before the last token"):
        atlas.copy_events(probs, ids, torch.tensor([ids.shape[1] - 1]), needle)


def repeated_tokens(period: int = 6, repeats: int = 3, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    once = torch.randperm(30, generator=gen)[:period] + 1
    return torch.cat([torch.tensor([0]), once.repeat(repeats)])[None]  # [1, T]: a BOS, then the repeats


@pytest.mark.parametrize("shift,name", [(0, "echo"), (1, "induction")])
def test_echo_and_induction_heads_on_repeated_random_tokens(shift, name):
    ids = repeated_tokens()
    T = ids.shape[1]
    queries = torch.arange(7, T)  # the second and third repeats
    keys = atlas.match_keys(ids, queries, shift)  # [1, Q, T]
    probs = (keys / keys.sum(-1, keepdim=True)).double()[:, None]  # a head spreading over exactly those keys
    own = atlas.match_mass(probs, ids, queries, shift)
    other = atlas.match_mass(probs, ids, queries, 1 - shift)
    assert torch.allclose(own, torch.ones_like(own)) and float(other.max()) == 0.0, name
    # the echo keys of query p are p - 6 (and p - 12); the induction keys one later
    p = 15
    expected = [j - shift for j in (p - 12, p - 6)] if shift == 0 else [p - 12 + 1, p - 6 + 1]
    assert torch.nonzero(keys[0, p - 7]).flatten().tolist() == sorted(expected)
    # in the first repeat nothing has occurred before: undefined, not 0
    first = atlas.match_mass(probs[..., :1, :], ids, torch.tensor([3]), shift)
    assert torch.isnan(first).all()


# ---- exactness: the model's own attention and slow loops --------------------------------------------


@pytest.mark.parametrize("kind,window", [("llama", None), ("mistral", 4)])
def test_attention_is_the_models_own(kind, window):
    """Against the model's eager attention weights (its softmax runs in float32: 1e-6) and against the
    swapped-logit engine's clean rows (float64, another path: unrotated queries; 1e-12). Llama: GQA and
    YaRN-scaled tables; Mistral: a sliding window of 4 keys."""
    model = tiny_model(kind, window=window)
    ids = torch.tensor(random_prompts([10, 10], seed=1))
    with torch.no_grad():
        own = model(ids, output_attentions=True).attentions  # [B, H, T, T] per layer
    queries = torch.tensor([0, 3, 9])
    for layer, qk in head_qk(model, ids).items():
        ours = atlas.attention(qk, queries)  # [B, H, Q, T]
        assert torch.allclose(ours, own[layer][:, :, queries].double(), atol=1e-6, rtol=0), (kind, layer)
        for i, p in enumerate(queries.tolist()[1:], start=1):
            first = qk.first_key(p)
            clean = torch.softmax(swaps.clean_logits(qk, torch.arange(2), slice(None), p), -1)  # [B, H, n]
            assert torch.allclose(ours[:, :, i, first : p + 1], clean, atol=1e-12, rtol=0)
            assert float(ours[:, :, i, :first].sum()) == 0 and float(ours[:, :, i, p + 1 :].sum()) == 0  # unseen keys


def test_per_query_scores_match_loops():
    gen = torch.Generator().manual_seed(3)
    B, H, T = 2, 3, 14
    probs = torch.softmax(torch.randn(B, H, T, T, generator=gen, dtype=torch.float64) * 3, -1)
    probs = probs.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), 0)
    probs = probs / probs.sum(-1, keepdim=True)
    ids = torch.randint(0, 5, (B, T), generator=gen)
    queries = torch.arange(T)
    sink, window = 2, 3
    prev, stream = atlas.previous_token(probs, queries), atlas.streaming(probs, queries, sink=sink, window=window)
    echo, induction = atlas.match_mass(probs, ids, queries, 0), atlas.match_mass(probs, ids, queries, 1)
    ent = atlas.entropy(probs)
    for b in range(B):
        for h in range(H):
            for p in range(T):
                row = probs[b, h, p].tolist()
                assert prev[b, h, p].item() == pytest.approx(row[p - 1], abs=1e-12) if p else math.isnan(prev[b, h, p])
                want = sum(row[j] for j in range(p + 1) if j < sink or j > p - window)
                assert (
                    math.isnan(stream[b, h, p])
                    if p < sink + window
                    else stream[b, h, p].item() == pytest.approx(want, abs=1e-12)
                )
                assert ent[b, h, p].item() == pytest.approx(-sum(x * math.log(x) for x in row if x > 0), abs=1e-12)
                tok = ids[b].tolist()
                for got, keys in (
                    (echo, [j for j in range(p) if tok[j] == tok[p]]),
                    (induction, [j for j in range(1, p) if tok[j - 1] == tok[p]]),
                ):
                    assert (
                        math.isnan(got[b, h, p])
                        if not keys
                        else got[b, h, p].item() == pytest.approx(sum(row[j] for j in keys), abs=1e-12)
                    )


def test_bad_arguments_are_one_sentence():
    probs = torch.ones(1, 1, 3, 3)
    with pytest.raises(PosymError, match="window"):
        atlas.streaming(probs, torch.arange(3), sink=1, window=0)
    with pytest.raises(PosymError, match="at least 1 key"):
        atlas.sink_mass(probs, 0)
    with pytest.raises(PosymError, match="evenly"):
        atlas.kv_group(0, 9, 2)
    with pytest.raises(PosymError, match="quantile"):
        atlas.full_attention_mask(np.zeros((2, 2)), 1.5)


# ---- pooling, agreement ---------------------------------------------------------------------------


def test_kv_pool_max_and_mean_per_key_value_head():
    heads = pd.DataFrame(
        {"layer": [0, 0, 0, 0, 1, 1, 1, 1], "head": [0, 1, 2, 3] * 2, "score": [0.1, 0.5, 0.2, 0.4, 1.0, 0.0, 0.3, 0.3]}
    )
    pooled = atlas.kv_pool(heads, ["score"], n_heads=4, n_kv_heads=2)  # heads 0,1 -> kv 0; 2,3 -> kv 1
    assert pooled.score_max.tolist() == [0.5, 0.4, 1.0, 0.3]
    assert pooled.score_mean.tolist() == pytest.approx([0.3, 0.3, 0.5, 0.3])
    assert pooled.query_heads.tolist() == [2] * 4
    grid = atlas.kv_grid(pooled, "score_max", 2, 2)
    assert grid.tolist() == [[0.5, 0.4], [1.0, 0.3]]
    assert atlas.full_attention_mask(grid, 0.5).tolist() == [[True, False], [True, False]]
    with pytest.raises(PosymError, match="lacks 1"):
        atlas.kv_grid(pooled.iloc[1:], "score_max", 2, 2)


def test_spearman_pairs_and_top_heads():
    heads = pd.DataFrame({"a": [1.0, 2, 3, 4], "b": [10.0, 20, 30, 40], "c": [4.0, 3, 2, np.nan]})
    rho = atlas.spearman_pairs(heads, ["a", "b", "c"]).set_index(["a", "b"])
    assert rho.loc[("a", "b"), "rho"] == pytest.approx(1.0)
    assert rho.loc[("a", "c"), "rho"] == pytest.approx(-1.0) and rho.loc[("a", "c"), "heads"] == 3
    assert atlas.top_heads([0.1, 0.9, np.nan, 0.5], 0.34).tolist() == [False, True, False, False]
    table = atlas.confusion(["x", "x", "y"], [True, True, False], "label", "top")
    assert table.heads.tolist() == [2, 1]


# ---- the causal check's plan and statistics ----------------------------------------------------------


def test_top_k_skips_nans_and_breaks_ties_by_order():
    heads = [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert atlas.top_k([0.5, math.nan, 0.5, 0.9], heads, 2) == [(0, 0), (1, 1)]
    assert atlas.top_k([math.nan] * 4, heads, 2) == []


def test_plane_ablations_follow_the_plan():
    every = [(layer, h) for layer in range(3) for h in range(4)]
    groups = {"a": [(2, 1), (0, 3)], "b": [(1, 0)]}
    plan = atlas.plane_ablations(groups, every, n_planes=8, planes=3, draws=2, seed=5)
    assert [(r["group"], r["control"], r["draw"]) for r in plan] == [
        ("a", "slowest", 0),
        ("a", "random planes", 0),
        ("a", "random planes", 1),
        ("a", "matched heads", 0),
        ("a", "matched heads", 1),
        ("b", "slowest", 0),
        ("b", "random planes", 0),
        ("b", "random planes", 1),
        ("b", "matched heads", 0),
        ("b", "matched heads", 1),
    ]
    for r in plan:
        group = sorted(groups[r["group"]])
        assert sorted(r["planes"]) == r["heads"]
        if r["control"] == "slowest":
            assert r["heads"] == group and all(p == [5, 6, 7] for p in r["planes"].values())
        elif r["control"] == "random planes":
            assert r["heads"] == group
            assert all(len(set(p)) == 3 and set(p) <= set(range(8)) for p in r["planes"].values())
        else:  # layer-matched heads outside the group, their slowest planes
            assert sorted(l for l, _ in r["heads"]) == sorted(l for l, _ in group)
            assert not set(r["heads"]) & set(group) and all(p == [5, 6, 7] for p in r["planes"].values())
    draws = [r["planes"] for r in plan if r["control"] == "random planes"]
    assert draws[0] != draws[1]  # fresh planes per draw
    assert atlas.plane_ablations(groups, every, 8, 3, 2, seed=5) == plan  # seeded
    with pytest.raises(PosymError, match="cannot ablate 9 of 8"):
        atlas.plane_ablations(groups, every, 8, 9, 1)


def causal_rows(seed: int = 0) -> pd.DataFrame:
    """Per-prompt answers of the clean model and of one group's three controls (two draws of each random one)."""
    rng = np.random.default_rng(seed)
    rows = []
    for group, control, draws, p_recall in (
        ("none", "clean", 1, 0.9),
        ("g", "slowest", 1, 0.3),
        ("g", "random planes", 2, 0.8),
        ("g", "matched heads", 2, 0.7),
    ):
        for draw in range(draws):
            for prompt in range(12):
                words = rng.integers(0, 5) / 4
                rows.append(
                    {
                        "group": group,
                        "control": control,
                        "draw": draw,
                        "prompt": prompt,
                        "recalled": bool(rng.random() < p_recall),
                        "words": words,
                        "logprob": float(-rng.random() * (2 if control == "slowest" else 1)),
                    }
                )
    return pd.DataFrame(rows)


def test_causal_summary_against_a_loop():
    from posym.core.stats import bootstrap_weights, wilson_interval

    rows = causal_rows()
    summary = atlas.causal_summary(rows, draws=200, seed=3).set_index(["group", "control"])
    weights = bootstrap_weights(12, 200, seed=3)  # [draws, prompts]: the summary's resampling

    def per_prompt(group, control, measure):
        mine = rows[(rows.group == group) & (rows.control == control)]
        return np.array([mine[mine.prompt == k][measure].mean() for k in range(12)])

    def boot_means(x):  # the slow obvious bootstrap: each draw's prompts written out
        return np.array([np.mean(np.repeat(x, w.astype(int))) for w in weights])

    clean = {m: per_prompt("none", "clean", m) for m in atlas.MEASURES}
    for (group, control), row in summary.iterrows():
        assert row.n == 12 and row.draws == (2 if control in ("random planes", "matched heads") else 1)
        for m in atlas.MEASURES:
            x = per_prompt(group, control, m)
            assert row[m] == pytest.approx(x.mean(), abs=1e-12)
            if m == "recalled" and row.draws == 1:
                assert (row.recalled_low, row.recalled_high) == pytest.approx(wilson_interval(int(x.sum()), 12))
            else:
                assert (row[f"{m}_low"], row[f"{m}_high"]) == pytest.approx(
                    tuple(np.percentile(boot_means(x), [2.5, 97.5])), abs=1e-12
                )
            if control != "clean":
                drop = clean[m] - x
                assert row[f"{m}_drop"] == pytest.approx(drop.mean(), abs=1e-12)
                lo, hi = np.percentile(boot_means(drop), [2.5, 97.5])
                assert (row[f"{m}_drop_low"], row[f"{m}_drop_high"]) == pytest.approx((lo, hi), abs=1e-12)
            if control == "slowest":
                for other in ("random planes", "matched heads"):
                    tag = other.replace(" ", "_")
                    diff = per_prompt(group, other, m) - x
                    assert row[f"{m}_vs_{tag}"] == pytest.approx(diff.mean(), abs=1e-12)
                    lo, hi = np.percentile(boot_means(diff), [2.5, 97.5])
                    assert (row[f"{m}_vs_{tag}_low"], row[f"{m}_vs_{tag}_high"]) == pytest.approx((lo, hi), abs=1e-12)
    assert math.isnan(summary.loc[("none", "clean"), "recalled_drop"])
