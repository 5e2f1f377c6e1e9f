"""Tests of posym.core.constructions: T_Index and T_Retrieval against loop references of the functions
and of the head (explicit one-hot matrices), exhaustively on small inputs; multi-hop composition;
swap logits and construction scores; the impossibility counterexamples."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from posym.core import constructions as C
from posym.core import theory as T
from posym.core.tasks import TaskConfig, generate, task_config

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
        fast = (C.selective_index if cfg.task == "number" else C.retrieval)(cfg, ids)
        ref = ref_selective_index if cfg.task == "number" else ref_retrieval
        assert fast.tolist() == [ref(cfg, row) for row in ids.tolist()]
    last = C.retrieval(cfg, ids, last_only=True)[:, 0]
    assert torch.equal(last, fast[:, -1])


@pytest.mark.parametrize("hard", [True, False])
def test_forward_matches_one_hot_reference(hard):
    for cfg, make, theta in [
        (task_config("number"), C.index_head, 0.866),
        (task_config("letter"), C.retrieval_head, 0.02),
    ]:
        head = make(cfg, theta, beta=7.0)
        ids = torch.as_tensor(generate(cfg, 40, 2, "test").input_ids)
        fast = C.forward(head, ids, hard=hard)
        assert torch.allclose(fast, ref_forward(head, ids, hard), atol=1e-12)
        assert torch.allclose(C.forward(head, ids, hard=hard, last_only=True)[:, 0], fast[:, -1], atol=1e-12)


def test_logits_are_the_closed_forms():
    n, theta = 12, 0.866
    cfg = task_config("number")
    ids = T.index_inputs(cfg, n)[:: cfg.vocab_size - 1]  # one input per query token class
    logits = C.attention_logits(C.index_head(cfg, theta), ids, last_only=True)[:, 0]
    for row, q in zip(logits.tolist(), ids[:, -1].tolist()):
        sigma = q if q <= cfg.int_range else 0
        assert row == pytest.approx([math.cos((n - j - sigma) * theta) for j in range(n + 1)], abs=1e-12)
    let = task_config("letter")
    ids = torch.as_tensor(generate(let, 50, 3, "test").input_ids)
    logits = C.attention_logits(C.retrieval_head(let, 0.01), ids, last_only=True)[:, 0]
    omega = 2 * math.pi / 8
    for row, seq in zip(logits.tolist(), ids.tolist()):
        y = _letters(let, seq[-1])[1]
        want = [math.cos((_letters(let, t)[0] - y) * omega + (16 - j) * 0.01) for j, t in enumerate(seq)]
        assert row == pytest.approx(want, abs=1e-12)


def test_index_exact_on_every_sequence_of_small_length():
    n0 = 4
    head = C.index_head(TINY_NUM, 0.866)
    for length in range(2, n0 + 2):
        ids = _all_sequences(TINY_NUM, length)  # every token sequence: 7^length
        want = torch.tensor([ref_selective_index(TINY_NUM, s) for s in ids.tolist()])
        defined = want >= 0
        assert torch.equal(C.apply(head, ids)[defined], want[defined])
        beta = max(T.needed_beta(head, TINY_NUM, n, 0.01)[0] for n in range(1, length))
        assert torch.equal(C.apply(C.with_beta(head, beta), ids, hard=False)[defined], want[defined])


def test_retrieval_exact_on_every_sequence_of_small_length():
    n0 = 3
    omega = 2 * math.pi / TINY_LET.alphabet_size
    head = C.retrieval_head(TINY_LET, 0.9 * omega / (2 * n0))
    for length in range(2, n0 + 2):
        ids = _all_sequences(TINY_LET, length)  # every token sequence: 12^length
        want = torch.tensor([ref_retrieval(TINY_LET, s) for s in ids.tolist()])
        defined = want >= 0
        assert defined.float().mean() > 0.3
        assert torch.equal(C.apply(head, ids)[defined], want[defined])
        # softmax: Lemma F.1's setting, exactly one key with the looked-up letter (a leaf whose letter
        # also occurs earlier is answered by hard attention only: its gap is 1 - cos(k theta))
        left, looks_up = C.letter_of(TINY_LET)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        unique = ((left[ids][:, None, :] == looks_up[ids][:, :, None]) & causal).sum(-1) == 1
        beta = max(T.needed_beta(head, TINY_LET, n, 0.01)[0] for n in range(1, length))
        soft = C.apply(C.with_beta(head, beta), ids, hard=False)
        assert unique.float().mean() > 0.3
        assert torch.equal(soft[unique], want[unique])
    # too fast a plane breaks it: the theorem's condition is needed
    fast = C.retrieval_head(TINY_LET, 1.2 * omega)
    ids = _all_sequences(TINY_LET, 4)
    want = torch.tensor([ref_retrieval(TINY_LET, s) for s in ids.tolist()])
    assert not torch.equal(C.apply(fast, ids)[want >= 0], want[want >= 0])


@pytest.mark.parametrize("n", [1, 2, 3])
def test_retrieval_exhaustive_at_paper_alphabet(n):
    let = task_config("letter")
    head = C.retrieval_head(let, T.frequency_angle(42))
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
    head = C.index_head(cfg, 0.866) if task == "number" else C.retrieval_head(cfg, T.frequency_angle(42))
    beta = max(T.needed_beta(head, cfg, n, 0.01)[0] for n in range(1, 17))
    for res in (
        C.multihop(head, cfg, ids, ans, hops),
        C.multihop(C.with_beta(head, beta), cfg, ids, ans, hops, hard=False),
    ):
        assert res == {"after_h": 1.0, "after_all": 1.0, "after_h_minus_1": 0.0}


# ---- scores and impossibility ----------------------------------------------------------------------


def test_swap_logits_match_rerunning_the_head():
    cfg = task_config("letter")
    head = C.retrieval_head(cfg, 0.05, beta=3.0)
    ids = torch.as_tensor(generate(cfg, 3, 0, "test").input_ids)
    clean, swapped = C.swap_logits(head, ids)
    assert torch.allclose(clean, C.attention_logits(head, ids, last_only=True)[:, 0])
    for a, b in [(0, 5), (3, 12), (15, 2)]:
        moved = ids.clone()
        moved[:, a] = ids[:, b]  # position a now holds b's token
        assert torch.allclose(swapped[:, a, b], C.attention_logits(head, moved, last_only=True)[:, 0, a])


def test_index_is_positional_and_retrieval_symbolic():
    num, let = task_config("number"), task_config("letter")
    index = C.index_head(num, 0.866)
    retr = C.retrieval_head(let, T.frequency_angle(42))
    b_i = max(T.needed_beta(index, num, n, 0.01)[0] for n in range(1, 17))
    b_r = max(T.needed_beta(retr, let, n, 0.01)[0] for n in range(1, 17))
    s_i = C.construction_scores(C.with_beta(index, b_i), torch.as_tensor(generate(num, 100, 0, "test").input_ids))
    s_r = C.construction_scores(C.with_beta(retr, b_r), torch.as_tensor(generate(let, 100, 0, "test").input_ids))
    assert s_i["s_pos"] > 0.99 and s_i["s_sym"] < 0.05
    assert s_r["s_sym"] > 0.99 and s_r["s_pos"] < 0.05


def _random_head(cfg, gen, theta, *, symbolic):
    """A random symbolic head (NoPE: logits follow contents; any values, residual) or a random
    positional head (content-blind keys; values copy the attended token, as Retrieval's readout)."""
    V = cfg.vocab_size
    w_q, w_k = (torch.randn(V + 1, 2, generator=gen, dtype=torch.float64) for _ in range(2))
    if symbolic:
        return C.Head(w_q, w_k, torch.randn(V + 1, V + 1, generator=gen, dtype=torch.float64), 0.0, 3.0, True)
    w_k[:V] = 0.0  # every key is the constant row: logits ignore key contents
    return C.Head(w_q, w_k, torch.eye(V + 1, dtype=torch.float64), theta, 3.0, residual=False)


@pytest.mark.parametrize("hard", [True, False])
def test_symbolic_head_cannot_index_positional_head_cannot_retrieve(hard):
    gen = torch.Generator().manual_seed(0)
    num, let = task_config("number"), task_config("letter")
    a, b = num.int_range + 1, num.int_range + 2  # two symbols
    x = torch.tensor([[a, b, 2]])  # the integer 2 at position 2 points at position 0: answer a
    x_swapped = torch.tensor([[b, a, 2]])  # same contents, swapped: answer b
    assert C.selective_index(num, x)[0, -1] == a and C.selective_index(num, x_swapped)[0, -1] == b
    # a purely symbolic head (NoPE, theta = 0: logits follow contents) maps both to the same output
    # (T_Index at theta = 0 only with softmax: its logits all tie, and argmax's first-index tie-break
    # would be a positional mechanism)
    heads = [_random_head(num, gen, 0.0, symbolic=True) for _ in range(20)]
    for head in heads + ([] if hard else [C.index_head(num, 0.0)]):
        out = [C.forward(head, s, hard=hard, last_only=True) for s in (x, x_swapped)]
        assert torch.allclose(out[0], out[1], atol=1e-12)
    assert C.apply(C.index_head(num, 0.866), x)[0, -1] == a and C.apply(C.index_head(num, 0.866), x_swapped)[0, -1] == b
    # Retrieval: a1 and b1 swap places; the query ca must follow a1 to wherever it is
    L, R = let.alphabet_size, let.int_range
    a1, b1, ca = 1, 1 + R, 1 + L * R + 2 * L + 0
    x, x_swapped = torch.tensor([[a1, b1, ca]]), torch.tensor([[b1, a1, ca]])
    assert C.retrieval(let, x)[0, -1] == a1 and C.retrieval(let, x_swapped)[0, -1] == a1
    heads = [_random_head(let, gen, theta, symbolic=False) for theta in torch.rand(20, generator=gen).tolist()]
    retr = C.retrieval_head(let, 0.1)
    heads.append(C.Head(retr.w_q, heads[0].w_k, retr.w_v, 0.1, 3.0, residual=False))  # T_Retrieval, blind keys
    for head in heads:
        # a purely positional head puts the same weights on the same positions, so its output moves
        # with the swapped contents: at most one of the two inputs can decode to a1
        got = [C.apply(head, s, hard=hard, last_only=True).item() == a1 for s in (x, x_swapped)]
        assert not all(got)
    assert C.apply(retr, x)[0, -1] == a1 and C.apply(retr, x_swapped)[0, -1] == a1
