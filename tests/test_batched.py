"""Tests of posym.core.batched: every query of a layer scored in blocks equals the per-query loop (the
reference path, itself checked swap by swap in test_scores/test_pruning) on tiny models of every family,
sliding windows included; a tiny memory budget only makes more blocks; pruned == dense within the bound."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import FAMILIES, KINDS, WINDOWED, random_prompts, tiny_model

from posym.core import batched, pruning
from posym.core.scores import score_model
from posym.errors import PosymError

INTS = ("prompt", "query", "layer", "head", "keys", "n_swaps", "kept", "top_key")
FLOATS = ("s_pos", "s_sym", "entropy", "attn_first", "attn_top")


@pytest.fixture
def blocks(monkeypatch):
    """Record what every `batched.score_block` call did: queries per block, rows done, the most pivots."""
    calls = []
    original = batched.score_block

    def spy(qk, rows, ps, *args, **kwargs):
        res, done = original(qk, rows, ps, *args, **kwargs)
        calls.append(
            {
                "queries": len(ps),
                "done": int(done.sum()),
                "rows": done.numel(),
                "pivots": int(res["pivots"][done].max()) if bool(done.any()) else 0,
            }
        )
        return res, done

    monkeypatch.setattr(batched, "score_block", spy)
    return calls


def assert_same_rows(got, want, tol=1e-12):
    """Equal integer columns (and the NaN pattern of attn_first), floats within tol, bounds within 1e-9
    relative (a bound is ~1e-13: its exponent carries the rounding of two gaps, divided by tau)."""
    assert len(got) == len(want)
    for column in INTS:
        assert got[column].equals(want[column]), column
    assert got["attn_first"].isna().equals(want["attn_first"].isna())
    for column in FLOATS:
        assert np.nanmax(np.abs(got[column] - want[column])) <= tol, column
    assert np.allclose(got["bound"], want["bound"], rtol=1e-9, atol=0)


@pytest.mark.parametrize("kind", KINDS + FAMILIES)
def test_batched_equals_the_per_query_loop_on_every_family(kind, blocks, monkeypatch):
    """Every query of two prompts (12 and 16 tokens); windowed families with a 4-key window (most
    queries past it). SPARSE_LIMIT 1 sends every row whose threshold is positive down the pivot path."""
    monkeypatch.setattr(pruning, "SPARSE_LIMIT", 1.0)
    model = tiny_model(kind, qk_scale=30.0, window=4 if kind in WINDOWED else None)
    prompts = random_prompts([12, 16], seed=5)
    got = score_model(model, prompts, "all")
    assert sum(c["done"] for c in blocks) >= 0.5 * len(got)  # the batched path scored most rows
    assert_same_rows(got, score_model(model, prompts, "all", engine="loop"))


@pytest.mark.parametrize("options", [{"compare": "logits"}, {"exclude_keys": (0, 5)}])
def test_batched_equals_the_loop_with_logits_and_excluded_keys(options, blocks, monkeypatch):
    monkeypatch.setattr(pruning, "SPARSE_LIMIT", 1.0)
    model = tiny_model("llama", qk_scale=30.0)
    prompts = random_prompts([12, 16], seed=5)
    queries = [list(range(4, 12)), list(range(3, 16, 2))]  # per prompt, different positions
    got = score_model(model, prompts, queries, **options)
    assert sum(c["done"] for c in blocks) >= 0.5 * len(got)
    assert_same_rows(got, score_model(model, prompts, queries, engine="loop", **options))


def test_rows_with_several_pivots_and_near_uniform_rows(blocks, monkeypatch):
    """A mildly peaked model (qk_scale 3) at the default SPARSE_LIMIT: rows with several pivots take
    the batched path, near-uniform ones the grid (`score_dense`), and the table is the loop's; a CHUNK
    of 40 elements (blocks of one query, the extra pivots one or two at a time) changes nothing."""
    model = tiny_model("qwen2", qk_scale=3.0)
    prompts = random_prompts([40], seed=2)
    got = score_model(model, prompts, "all")
    assert max(c["pivots"] for c in blocks) >= 4
    done = sum(c["done"] for c in blocks)
    assert 0 < done < len(got)  # both paths ran
    assert_same_rows(got, score_model(model, prompts, "all", engine="loop"))
    monkeypatch.setattr(batched, "CHUNK", 40)
    assert_same_rows(score_model(model, prompts, "all"), got)


def test_a_tiny_budget_forces_one_query_per_block_and_changes_nothing(blocks, monkeypatch):
    monkeypatch.setattr(pruning, "SPARSE_LIMIT", 1.0)
    model = tiny_model("gemma3_text", qk_scale=30.0, window=4)
    prompts = random_prompts([16, 16], seed=7)
    default = score_model(model, prompts, "all")
    assert max(c["queries"] for c in blocks) > 1
    blocks.clear()
    tiny = score_model(model, prompts, "all", budget=1)
    assert {c["queries"] for c in blocks} == {1} and len(
        blocks
    ) == 2 * 4 * 14  # 2 layers x 4 heads (a block each) x 14 queries
    assert_same_rows(tiny, default)


def test_query_blocks_fit_the_budget():
    assert batched.query_blocks([2, 3, 4, 5, 6, 7], lambda p: 0, rows=1, budget=batched.GRIDS * 8 * 12) == [
        [2, 3],
        [4, 5],
        [6],
        [7],
    ]
    window = lambda p: max(0, p - 3)  # a 4-key window: blocks span their queries plus 3 keys
    got = batched.query_blocks(list(range(2, 40)), window, rows=2, budget=batched.GRIDS * 8 * 200)
    assert sum(got, []) == list(range(2, 40))
    assert all(2 * len(b) * (b[-1] - window(b[0]) + 1) <= 200 for b in got if len(b) > 1)
    assert batched.query_blocks([5, 9], lambda p: 0, rows=9, budget=1) == [[5], [9]]


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_batched_pruned_equals_dense_within_its_bound(kind, blocks):
    """40 tokens, every query, the default limits: within each row's bound of weighing every swap."""
    model = tiny_model(kind, qk_scale=30.0)
    prompts = random_prompts([40], seed=3)
    pruned = score_model(model, prompts, "all")
    dense = score_model(model, prompts, "all", exact="dense")
    assert sum(c["done"] for c in blocks) > 0 and (pruned["kept"] < pruned["n_swaps"]).any()
    assert (pruned["bound"] <= 2e-12).all()
    for column in ("s_pos", "s_sym"):
        assert ((pruned[column] - dense[column]).abs() <= pruned["bound"] + 1e-13).all()


@pytest.mark.parametrize("kind", ["gptj", "llama", "gemma2", "gemma3_text"])
def test_the_batched_dense_reference_equals_the_loops(kind):
    """exact="dense" on the batched engine (`score_dense` for every row) gives the per-query loop's
    dense table (`pruning.score_rows`, epsilon None): every query of two prompts, then per-prompt queries
    excluding key 0; interleaved planes and partial rotary (GPT-J), GQA and scaled tables (Llama),
    soft-capping and a 4-key window (Gemma 2), local and global layers (Gemma 3)."""
    model = tiny_model(kind, qk_scale=3.0, window=4 if kind in WINDOWED else None)
    prompts = random_prompts([9, 12], seed=8)
    got = score_model(model, prompts, "all", exact="dense")
    assert (got["kept"] == got["n_swaps"]).all() and (got["bound"] == 0).all()
    assert_same_rows(got, score_model(model, prompts, "all", exact="dense", engine="loop"))
    queries = [list(range(3, 9)), list(range(4, 12))]
    got = score_model(model, prompts, queries, exact="dense", exclude_keys=(0,))
    assert_same_rows(got, score_model(model, prompts, queries, exact="dense", exclude_keys=(0,), engine="loop"))


def test_bad_engine_and_budget_are_one_line_errors():
    model = tiny_model("llama")
    with pytest.raises(PosymError, match="engine must be"):
        score_model(model, random_prompts([8]), "all", engine="fast")
    with pytest.raises(PosymError, match="budget must be"):
        score_model(model, random_prompts([8]), "all", budget=0)


def test_a_chunk_cap_only_makes_more_blocks(blocks, monkeypatch):
    """CHUNK caps a block's grid whatever the budget (cache-sized blocks): a tiny cap makes one-query
    blocks and the same table."""
    monkeypatch.setattr(pruning, "SPARSE_LIMIT", 1.0)
    model = tiny_model("llama", qk_scale=30.0)
    prompts = random_prompts([16, 16], seed=4)
    default = score_model(model, prompts, "all")
    assert max(c["queries"] for c in blocks) > 1
    blocks.clear()
    monkeypatch.setattr(batched, "CHUNK", 1)
    capped = score_model(model, prompts, "all")
    assert {c["queries"] for c in blocks} == {1}
    assert_same_rows(capped, default)


def test_reused_scratch_buffers_change_nothing():
    """Blocks share their work buffers (`Scratch`): a block scored after a larger one wrote different
    values into them gives exactly what it gives with fresh buffers."""
    import torch

    from posym.core.qk import head_qk

    model = tiny_model("qwen2", qk_scale=3.0)
    qk = head_qk(model, torch.tensor(random_prompts([24, 24], seed=1)))[0]
    rows = torch.tensor([0, 1])
    options = {"tau": 1e-4, "compare": "probs", "epsilon": 1e-12}
    shared = batched.prepare(qk, rows, torch.float64)
    batched.score_block(qk, rows, list(range(10, 24)), torch.float64, **options, tables=shared)  # fills them
    again, done = batched.score_block(qk, rows, [5, 6, 7], torch.float64, **options, tables=shared)
    fresh, fresh_done = batched.score_block(qk, rows, [5, 6, 7], torch.float64, **options)
    assert torch.equal(done, fresh_done) and bool(done.any())
    for key in ("s_pos", "s_sym", "entropy", "bound", "kept", "top_key", "attn_top"):
        assert torch.equal(again[key][done], fresh[key][done]), key


def test_grouped_products_are_each_rows_own_product():
    import torch

    gen = torch.Generator().manual_seed(0)
    mats = torch.randn(4, 3, 7, generator=gen, dtype=torch.float64)  # [M, k, W]
    group = torch.tensor([0, 0, 2, 2, 2, 3])
    u = torch.randn(len(group), 3, generator=gen, dtype=torch.float64)
    want = torch.stack([u[i] @ mats[g] for i, g in enumerate(group.tolist())])
    assert torch.allclose(batched._grouped(u, group, mats), want, rtol=0, atol=1e-14)


@pytest.mark.parametrize("options", [{}, {"compare": "logits"}, {"exclude_keys": (0, 3)}, {"smallest": 1.0}])
def test_the_dense_grid_equals_the_dense_reference(options, monkeypatch):
    """`score_dense` (every swap once, on the upper triangle of the grid of key pairs) against
    `pruning.score_rows` with every swap weighed (epsilon=None), windowed layer included; smallest 1.0
    sends every row down the logit-difference branch (`_unit_cosines`, for probabilities too small
    for `_probs_sums`)."""
    import torch

    options = dict(options)
    monkeypatch.setattr(batched, "SMALLEST", options.pop("smallest", batched.SMALLEST))

    from posym.core import swaps
    from posym.core.qk import head_qk

    for kind, window in (("qwen2", None), ("mistral", 5)):
        model = tiny_model(kind, qk_scale=3.0, window=window)
        qk = head_qk(model, torch.tensor(random_prompts([14, 14], seed=6)))[0]
        heads = list(range(qk.q.shape[1]))
        for p in (6, 13):
            keep = {"compare": "probs", **options}
            got = batched.score_dense(qk, 1, heads, p, torch.float64, tau=1e-4, **keep)
            u, k = swaps.unrotated_queries(qk, torch.tensor([1]), heads, p)
            want = pruning.score_rows(qk, u[0], k[0], first=qk.first_key(p), epsilon=None, **keep)
            for key in ("s_pos", "s_sym", "entropy", "attn_top"):
                assert torch.allclose(got[key], want[key], rtol=0, atol=1e-12), (kind, p, key)
            assert got["n_swaps"] == want["n_swaps"] and (got["kept"] == want["kept"]).all()


@pytest.mark.parametrize("kind", KINDS + FAMILIES)
@pytest.mark.parametrize("options", [{}, {"exact": "dense"}, {"engine": "loop"}], ids=["pruned", "dense", "loop"])
def test_forked_workers_give_the_rows_of_one_process(kind, options, monkeypatch):
    """workers=2 (forked 1-thread processes, one (layer, head) each) and workers=1 (this process, each
    layer inside the forward) give the same table, bit for bit, on every family: pruned, dense and the
    per-query loop; windowed families with a 4-key window. torch has two threads here, as on a user's
    2-core machine: this process scores with one (SCORE_THREADS), the workers' floating-point order, and
    gives its threads back to the forward."""
    import pandas as pd
    import torch

    from posym.core import scores

    forked, threads_scoring = [], []
    original, layer = scores._forked_layers, scores._score_layer
    monkeypatch.setattr(scores, "_forked_layers", lambda *a, **k: forked.append(1) or original(*a, **k))
    monkeypatch.setattr(
        scores, "_score_layer", lambda *a, **k: threads_scoring.append(torch.get_num_threads()) or layer(*a, **k)
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = tiny_model(kind, qk_scale=30.0, window=4 if kind in WINDOWED else None)
        prompts = random_prompts([12, 16], seed=5)
        here = score_model(model, prompts, "all", workers=1, **options)
        assert not forked and set(threads_scoring) == {scores.SCORE_THREADS} == {1}
        assert torch.get_num_threads() == 2  # given back
        there = score_model(model, prompts, "all", workers=2, **options)
        assert forked  # the workers scored it
    finally:
        torch.set_num_threads(threads)
    pd.testing.assert_frame_equal(here, there, check_exact=True)


def test_workers_zero_forks_past_the_threshold_as_many_as_torch_threads(monkeypatch):
    """workers=0 (the default) scores in this process below FORK_ELEMENTS (a tiny model's prompts), with
    one torch thread, when the captured layers would outgrow the forward's logits, and in forked workers
    at or past it, as many as torch's threads (capped at the CPUs); a bad workers value is a PosymError."""
    import torch

    from posym import parallel
    from posym.core import scores

    forked = []
    original = scores._forked_layers
    monkeypatch.setattr(
        scores, "_forked_layers", lambda held, workers, *a: forked.append(workers) or original(held, workers, *a)
    )
    if parallel.cpu_workers(0) < 2:
        pytest.skip("one CPU: workers=0 never forks")
    model = tiny_model("llama", qk_scale=30.0)
    prompts = random_prompts([12, 16], seed=5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        here = score_model(model, prompts, "all")
        assert not forked
        monkeypatch.setattr(scores, "FORK_ELEMENTS", 1)
        there = score_model(model, prompts, "all")
        assert forked == [2, 2]  # one forked scoring per batch (two prompt lengths)
        assert_same_rows(there, here)
        forked.clear()
        torch.set_num_threads(1)  # the user's one thread (OMP_NUM_THREADS=1): no second process either
        assert_same_rows(score_model(model, prompts, "all"), here)
        assert not forked
        torch.set_num_threads(2)
        monkeypatch.setattr(scores, "_held_bytes", lambda qk: 1 << 40)  # captured layers past the logits' size
        assert_same_rows(score_model(model, prompts, "all"), here)
        assert not forked
    finally:
        torch.set_num_threads(threads)
    for bad in (-1, 1.5, True):
        with pytest.raises(PosymError, match="workers"):
            score_model(model, prompts, "all", workers=bad)
