"""Tests of posym.theory: the constructions against loop references of the functions and of the
head (explicit one-hot matrices), exhaustively on small inputs; Theorem 3.2's bounds on a grid; the
beta search; construction scores; the impossibility counterexamples; files and CLI."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from posym import theory as T
from posym.cli import app
from posym.errors import PosymError
from posym.tasks import TaskConfig, generate, task_config

TINY_NUM = TaskConfig("number", target_size=2, pretarget_size=2, max_hops=2, alphabet_size=3, int_range=4)
TINY_LET = TaskConfig("letter", target_size=2, pretarget_size=2, max_hops=2, alphabet_size=3, int_range=1)


# ---- slow, obvious references -------------------------------------------------------------------


def ref_selective_index(cfg, seq):
    out = []
    for p, t in enumerate(seq):
        is_int = 1 <= t <= cfg.int_range
        if is_int and p - t < 0:
            out.append(-1)  # points before the sequence: undefined
        else:
            out.append(seq[p - t] if is_int and seq[p - t] > cfg.int_range else t)
    return out


def _letters(cfg, t):
    """(left letter, looked-up letter), 0-based, of a letter-task id."""
    L, R = cfg.alphabet_size, cfg.int_range
    if t <= L * R:
        return (t - 1) // R, (t - 1) // R
    return (t - 1 - L * R) // L, (t - 1 - L * R) % L


def ref_retrieval(cfg, seq):
    out = []
    for p, t in enumerate(seq):
        left, want = _letters(cfg, t)
        if left == want:
            out.append(t)
            continue
        hits = [seq[j] for j in range(p + 1) if _letters(cfg, seq[j])[0] == want]
        out.append(hits[0] if len(hits) == 1 else -1)
    return out


def ref_forward(head, ids, hard):
    """The layer with explicit one-hot matrices, rotation matrices and a loop over queries."""
    V = head.vocab_size
    x = torch.nn.functional.one_hot(ids, V + 1).double()
    x[..., V] = 1.0  # [B, L, V+1]
    q, k, v = x @ head.w_q, x @ head.w_k, x @ head.w_v
    B, L = ids.shape
    out = torch.zeros(B, L, V + 1, dtype=torch.float64)
    for n in range(L):
        logits = torch.empty(B, n + 1, dtype=torch.float64)
        for j in range(n + 1):
            a = (j - n) * head.theta
            rot = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64)
            logits[:, j] = head.beta * ((q[:, n] @ rot) * k[:, j]).sum(-1)  # q^T R((j-n) theta) k
        attn = torch.nn.functional.one_hot(logits.argmax(1), n + 1).double() if hard else logits.softmax(1)
        out[:, n] = (attn[:, :, None] * v[:, : n + 1]).sum(1) + (x[:, n] if head.residual else 0)
    return out


def _all_sequences(cfg, length):
    tokens = range(1, cfg.vocab_size)
    return torch.tensor(list(itertools.product(tokens, repeat=length)))


# ---- the heads compute the functions -------------------------------------------------------------


def test_functions_match_loop_references():
    for cfg in (task_config("number"), task_config("letter")):
        s = generate(cfg, 300, 1, "test")
        ids = torch.as_tensor(s.input_ids)
        gen = torch.Generator().manual_seed(0)
        ids = torch.cat([ids, torch.randint(1, cfg.vocab_size, (300, 17), generator=gen)])
        fast = (T.selective_index if cfg.task == "number" else T.retrieval)(cfg, ids)
        ref = ref_selective_index if cfg.task == "number" else ref_retrieval
        assert fast.tolist() == [ref(cfg, row) for row in ids.tolist()]
    last = T.retrieval(cfg, ids, last_only=True)[:, 0]
    assert torch.equal(last, fast[:, -1])


@pytest.mark.parametrize("hard", [True, False])
def test_forward_matches_one_hot_reference(hard):
    for cfg, make, theta in [(task_config("number"), T.index_head, 0.866), (task_config("letter"), T.retrieval_head, 0.02)]:
        head = make(cfg, theta, beta=7.0)
        ids = torch.as_tensor(generate(cfg, 40, 2, "test").input_ids)
        fast = T.forward(head, ids, hard=hard)
        assert torch.allclose(fast, ref_forward(head, ids, hard), atol=1e-12)
        assert torch.allclose(T.forward(head, ids, hard=hard, last_only=True)[:, 0], fast[:, -1], atol=1e-12)


def test_logits_are_the_closed_forms():
    n, theta = 12, 0.866
    cfg = task_config("number")
    ids = T.index_inputs(cfg, n)[:: cfg.vocab_size - 1]  # one input per query token class
    logits = T.attention_logits(T.index_head(cfg, theta), ids, last_only=True)[:, 0]
    for row, q in zip(logits.tolist(), ids[:, -1].tolist()):
        sigma = q if q <= cfg.int_range else 0
        assert row == pytest.approx([math.cos((n - j - sigma) * theta) for j in range(n + 1)], abs=1e-12)
    let = task_config("letter")
    ids = torch.as_tensor(generate(let, 50, 3, "test").input_ids)
    logits = T.attention_logits(T.retrieval_head(let, 0.01), ids, last_only=True)[:, 0]
    omega = 2 * math.pi / 8
    for row, seq in zip(logits.tolist(), ids.tolist()):
        y = _letters(let, seq[-1])[1]
        want = [math.cos((_letters(let, t)[0] - y) * omega + (16 - j) * 0.01) for j, t in enumerate(seq)]
        assert row == pytest.approx(want, abs=1e-12)


def test_index_exact_on_every_sequence_of_small_length():
    n0 = 4
    head = T.index_head(TINY_NUM, 0.866)
    for length in range(2, n0 + 2):
        ids = _all_sequences(TINY_NUM, length)  # every token sequence: 7^length
        want = torch.tensor([ref_selective_index(TINY_NUM, s) for s in ids.tolist()])
        defined = want >= 0
        assert torch.equal(T.apply(head, ids)[defined], want[defined])
        beta = max(T.needed_beta(head, TINY_NUM, n, 0.01)[0] for n in range(1, length))
        assert torch.equal(T.apply(T.with_beta(head, beta), ids, hard=False)[defined], want[defined])


def test_retrieval_exact_on_every_sequence_of_small_length():
    n0 = 3
    omega = 2 * math.pi / TINY_LET.alphabet_size
    head = T.retrieval_head(TINY_LET, 0.9 * omega / (2 * n0))
    for length in range(2, n0 + 2):
        ids = _all_sequences(TINY_LET, length)  # every token sequence: 12^length
        want = torch.tensor([ref_retrieval(TINY_LET, s) for s in ids.tolist()])
        defined = want >= 0
        assert defined.float().mean() > 0.3
        assert torch.equal(T.apply(head, ids)[defined], want[defined])
        # softmax: Lemma F.1's setting, exactly one key with the looked-up letter (a leaf whose letter
        # also occurs earlier is answered by hard attention only: its gap is 1 - cos(k theta))
        left, looks_up = T.letter_of(TINY_LET)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        unique = ((left[ids][:, None, :] == looks_up[ids][:, :, None]) & causal).sum(-1) == 1
        beta = max(T.needed_beta(head, TINY_LET, n, 0.01)[0] for n in range(1, length))
        soft = T.apply(T.with_beta(head, beta), ids, hard=False)
        assert unique.float().mean() > 0.3
        assert torch.equal(soft[unique], want[unique])
    # too fast a plane breaks it: the theorem's condition is needed
    fast = T.retrieval_head(TINY_LET, 1.2 * omega)
    ids = _all_sequences(TINY_LET, 4)
    want = torch.tensor([ref_retrieval(TINY_LET, s) for s in ids.tolist()])
    assert not torch.equal(T.apply(fast, ids)[want >= 0], want[want >= 0])


@pytest.mark.parametrize("n", [1, 2, 3])
def test_retrieval_exhaustive_at_paper_alphabet(n):
    let = task_config("letter")
    head = T.retrieval_head(let, T.frequency_angle(42))
    ids, full = T.retrieval_inputs(let, n, head.theta)
    assert full and len(ids) == 8 * (n + 1) * 7**n
    beta, _ = T.needed_beta(head, let, n, 0.01)
    res = T.check_length(head, let, ids, beta)
    assert res["correct"] == 1.0 and res["softmax_correct"] == 1.0
    assert res["min_target_mass"] >= 0.99 - 1e-9


@pytest.mark.parametrize("task", ["number", "letter"])
def test_multihop_composition_answers_the_task(task):
    cfg = task_config(task)
    s = generate(cfg, 400, 5, "test")
    ids, ans, hops = (torch.as_tensor(a) for a in (s.input_ids, s.answer, s.hops))
    head = T.index_head(cfg, 0.866) if task == "number" else T.retrieval_head(cfg, T.frequency_angle(42))
    beta = max(T.needed_beta(head, cfg, n, 0.01)[0] for n in range(1, 17))
    for res in (T.multihop(head, cfg, ids, ans, hops), T.multihop(T.with_beta(head, beta), cfg, ids, ans, hops, hard=False)):
        assert res == {"after_h": 1.0, "after_all": 1.0, "after_h_minus_1": 0.0}


# ---- discrepancy, bounds and beta -----------------------------------------------------------------


def _exhaustive_letters(A, n):
    grid = torch.cartesian_prod(*[torch.arange(A)] * (n + 2)).reshape(-1, n + 2)
    keep = (grid[:, :-1] == grid[:, -1:]).sum(1) == 1
    return grid[keep, :-1], grid[keep, -1]


@pytest.mark.parametrize("A,n", [(5, 4), (8, 3), (6, 5)])
def test_hardest_retrieval_inputs_are_the_worst_of_all(A, n):
    cfg = TaskConfig("letter", alphabet_size=A)
    theta = 0.8 * (2 * math.pi / A) / (2 * n)
    head = T.retrieval_head(cfg, theta)
    letters, y = _exhaustive_letters(A, n)
    ids = T._letter_tokens(cfg, letters, y, torch.Generator().manual_seed(0))
    logits = T.attention_logits(head, ids, last_only=True)[:, 0]
    all_beta = T.min_beta(logits, T.target_key(cfg, ids), 0.01).max().item()
    beta, lemma = T.needed_beta(head, cfg, n, 0.01)
    assert beta == pytest.approx(all_beta, rel=1e-9)
    delta = T.logit_gaps(logits).min().item()
    assert T.logit_gaps(T.attention_logits(head, T.hardest_inputs(cfg, n, theta), last_only=True)[:, 0]).min().item() \
        == pytest.approx(delta, abs=1e-12)
    assert lemma == pytest.approx(math.log(n * 0.99 / 0.01) / delta)


def test_min_beta_is_the_threshold():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 9, generator=gen, dtype=torch.float64)
    target = logits.argmax(1)
    eps = 0.05
    beta = T.min_beta(logits, target, eps)
    mass = lambda b: torch.softmax(b[:, None] * logits, 1).gather(1, target[:, None])[:, 0]  # noqa: E731
    assert torch.allclose(mass(beta), torch.full_like(beta, 1 - eps), atol=1e-9)
    assert (mass(beta * 0.999) < 1 - eps).all()
    gap = T.logit_gaps(logits)
    assert (beta <= T.lemma_beta(gap, 9, eps) + 1e-9).all()
    assert (beta >= math.log((1 - eps) / eps) / gap - 1e-9).all()
    wrong = (target + 1) % 9  # not the argmax: no beta works
    assert torch.isinf(T.min_beta(logits, wrong, eps)).all()


def test_theorem_3_2_bounds_on_a_grid():
    ns = range(1, 101)
    for theta in (2.5, 1.0, 0.866, 0.3, 0.05, 0.0027):
        for r in T.discrepancy_curve(theta, ns):
            if r["valid"]:
                assert r["delta"] <= r["bound"] + 1e-12, r
        # T_Index's minimum over sigma is attained by sigma = n: 1 - max_{k=1..n} cos(k theta)
        for r in T.discrepancy_curve(theta, [7, 40]):
            if r["head"] == "index":
                assert r["delta"] == pytest.approx(1 - max(math.cos(k * theta) for k in range(1, r["n"] + 1)))
    omega = 2 * math.pi / 8
    for r in T.discrepancy_curve(0.0027, ns):  # the retrieval bound is nearly attained
        if r["head"] == "retrieval":
            n = r["n"]
            assert r["delta"] == pytest.approx(math.cos((n - 1) * 0.0027) - math.cos(omega - n * 0.0027), abs=1e-12)
    nope = [r["delta"] for r in T.discrepancy_curve(0.0, ns) if r["head"] == "retrieval"]
    assert nope == pytest.approx([1 - math.cos(omega)] * 100, abs=1e-12)  # NoPE never vanishes


def test_max_over_inputs_would_break_the_index_bound():
    # why Delta is the minimum gap: the largest gap over inputs exceeds 2 pi^2 / n^2 at theta = 0.866
    cfg = TaskConfig("number", int_range=100)
    head = T.index_head(cfg, 0.866)
    broken = [n for n in range(2, 101) if T.logit_gaps(T.attention_logits(
        head, T.hardest_inputs(cfg, n, 0.866), last_only=True)[:, 0]).max().item() > T.index_bound(0.866, n)]
    assert len(broken) > 10


def test_gap_stats_and_errors():
    logits = torch.tensor([[3.0, 1.0, float("-inf")], [0.0, 0.5, 0.25]])
    assert T.logit_gaps(logits).tolist() == [2.0, 0.25]
    stats = T.gap_stats(T.logit_gaps(logits))
    assert stats["delta"] == 0.25 and stats["gap_max"] == 2.0 and stats["inputs"] == 2
    with pytest.raises(PosymError, match="two visible keys"):
        T.logit_gaps(torch.tensor([[1.0, float("-inf")]]))
    with pytest.raises(PosymError, match="frequency ID"):
        T.frequency_angle(65)
    assert T.frequency_angle(2) == pytest.approx(0.866, abs=1e-3)
    assert T.frequency_angle(42) == pytest.approx(0.0027, abs=1e-4)
    with pytest.raises(PosymError, match="number task"):
        T.index_head(task_config("letter"), 0.5)
    with pytest.raises(PosymError, match="n0"):
        T.TheoryConfig(n0=[])
    with pytest.raises(PosymError, match="omega"):
        T.verify(T.TheoryConfig(n0=[200]))


# ---- scores and impossibility ----------------------------------------------------------------------


def test_swap_logits_match_rerunning_the_head():
    cfg = task_config("letter")
    head = T.retrieval_head(cfg, 0.05, beta=3.0)
    ids = torch.as_tensor(generate(cfg, 3, 0, "test").input_ids)
    clean, swapped = T.swap_logits(head, ids)
    assert torch.allclose(clean, T.attention_logits(head, ids, last_only=True)[:, 0])
    for a, b in [(0, 5), (3, 12), (15, 2)]:
        moved = ids.clone()
        moved[:, a] = ids[:, b]  # position a now holds b's token
        assert torch.allclose(swapped[:, a, b], T.attention_logits(head, moved, last_only=True)[:, 0, a])


def test_index_is_positional_and_retrieval_symbolic():
    num, let = task_config("number"), task_config("letter")
    index = T.index_head(num, 0.866)
    retr = T.retrieval_head(let, T.frequency_angle(42))
    b_i = max(T.needed_beta(index, num, n, 0.01)[0] for n in range(1, 17))
    b_r = max(T.needed_beta(retr, let, n, 0.01)[0] for n in range(1, 17))
    s_i = T.construction_scores(T.with_beta(index, b_i), torch.as_tensor(generate(num, 100, 0, "test").input_ids))
    s_r = T.construction_scores(T.with_beta(retr, b_r), torch.as_tensor(generate(let, 100, 0, "test").input_ids))
    assert s_i["s_pos"] > 0.99 and s_i["s_sym"] < 0.05
    assert s_r["s_sym"] > 0.99 and s_r["s_pos"] < 0.05


def _random_head(cfg, gen, theta, *, symbolic):
    """A random symbolic head (NoPE: logits follow contents; any values, residual) or a random
    positional head (content-blind keys; values copy the attended token, as Retrieval's readout)."""
    V = cfg.vocab_size
    w_q, w_k = (torch.randn(V + 1, 2, generator=gen, dtype=torch.float64) for _ in range(2))
    if symbolic:
        return T.Head(w_q, w_k, torch.randn(V + 1, V + 1, generator=gen, dtype=torch.float64), 0.0, 3.0, True)
    w_k[:V] = 0.0  # every key is the constant row: logits ignore key contents
    return T.Head(w_q, w_k, torch.eye(V + 1, dtype=torch.float64), theta, 3.0, residual=False)


@pytest.mark.parametrize("hard", [True, False])
def test_symbolic_head_cannot_index_positional_head_cannot_retrieve(hard):
    gen = torch.Generator().manual_seed(0)
    num, let = task_config("number"), task_config("letter")
    a, b = num.int_range + 1, num.int_range + 2  # two symbols
    x = torch.tensor([[a, b, 2]])  # the integer 2 at position 2 points at position 0: answer a
    x_swapped = torch.tensor([[b, a, 2]])  # same contents, swapped: answer b
    assert T.selective_index(num, x)[0, -1] == a and T.selective_index(num, x_swapped)[0, -1] == b
    # a purely symbolic head (NoPE, theta = 0: logits follow contents) maps both to the same output
    # (T_Index at theta = 0 only with softmax: its logits all tie, and argmax's first-index tie-break
    # would be a positional mechanism)
    heads = [_random_head(num, gen, 0.0, symbolic=True) for _ in range(20)]
    for head in heads + ([] if hard else [T.index_head(num, 0.0)]):
        out = [T.forward(head, s, hard=hard, last_only=True) for s in (x, x_swapped)]
        assert torch.allclose(out[0], out[1], atol=1e-12)
    assert T.apply(T.index_head(num, 0.866), x)[0, -1] == a and T.apply(T.index_head(num, 0.866), x_swapped)[0, -1] == b
    # Retrieval: a1 and b1 swap places; the query ca must follow a1 to wherever it is
    L, R = let.alphabet_size, let.int_range
    a1, b1, ca = 1, 1 + R, 1 + L * R + 2 * L + 0
    x, x_swapped = torch.tensor([[a1, b1, ca]]), torch.tensor([[b1, a1, ca]])
    assert T.retrieval(let, x)[0, -1] == a1 and T.retrieval(let, x_swapped)[0, -1] == a1
    heads = [_random_head(let, gen, theta, symbolic=False) for theta in torch.rand(20, generator=gen).tolist()]
    retr = T.retrieval_head(let, 0.1)
    heads.append(T.Head(retr.w_q, heads[0].w_k, retr.w_v, 0.1, 3.0, residual=False))  # T_Retrieval, blind keys
    for head in heads:
        # a purely positional head puts the same weights on the same positions, so its output moves
        # with the swapped contents: at most one of the two inputs can decode to a1
        got = [T.apply(head, s, hard=hard, last_only=True).item() == a1 for s in (x, x_swapped)]
        assert not all(got)
    assert T.apply(retr, x)[0, -1] == a1 and T.apply(retr, x_swapped)[0, -1] == a1


# ---- files and CLI -----------------------------------------------------------------------------------


def test_run_theory_writes_everything(tmp_path):
    config = T.TheoryConfig(n0=[3, 6], samples=2000, task_samples=60, curve_max_n=12, curve_freq_ids=[2, 42])
    result = T.run_theory(config, tmp_path)
    for name in ("theory.parquet", "discrepancy.parquet", "theory.json", "fig5a.png", "fig5a.svg"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "theory.json").read_text())["summary"] == result["summary"]
    assert all(r["exact"] and r["softmax_exact"] for r in result["summary"])
    assert all(r["beta_needed"] <= r["beta_lemma"] for r in result["summary"])
    assert (tmp_path / "fig5a.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_theory(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["theory", "--n0", "4", "--samples", "500", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "index" in res.output and (tmp_path / "theory.json").exists()
    res = runner.invoke(app, ["theory", "--n0", "500", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and isinstance(res.exception, PosymError)
