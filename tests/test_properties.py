"""Property-based tests (hypothesis) of the task generators and the score definitions.

Each property is an invariance the definitions imply, checked on arbitrary inputs:
- tasks: relabelling symbols (number task) or letters (letter task) relabels the answer and keeps the
  chain; decode/encode round-trips; generation is a pure function of (config, seed, split, index).
- `swap_scores`: scores lie in [0, 1]; a head whose logits ignore key contents is positional
  (s_pos = 1), one whose logits follow the contents is symbolic (s_sym = 1), uniform attention is
  (1, 1); relabelling key positions and shifting all logits change nothing.
- models: layer 0 of a GPT-J whose token embeddings are all equal has content-free keys, so s_pos = 1
  at every query of any prompt; relabelling the vocabulary (ids and embedding rows together) leaves
  every score of every head unchanged.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posym.core.model import ModelConfig, build_model
from posym.core.scores import score_model, swap_scores
from posym.core.tasks import decode, encode, follow_chain, generate, task_config, token_names

FAST = settings(max_examples=60, deadline=None)
MODEL = settings(max_examples=15, deadline=None)


# ---- tasks ---------------------------------------------------------------------------------------


@st.composite
def samples(draw, task: str):
    """(config, one generated sample's ids, answer, chain) of a small random config of `task`."""
    T, P = draw(st.integers(1, 8)), draw(st.integers(0, 8))
    H = draw(st.integers(1, min(P + 1, 5)))
    if task == "number":
        config = task_config(
            "number",
            target_size=T,
            pretarget_size=P,
            max_hops=H,
            alphabet_size=draw(st.integers(2, 40)),
            int_range=draw(st.integers(T + P, T + P + 4)),
            extra_target=draw(st.integers(0, 6)),
        )
    else:
        config = task_config(
            "letter",
            target_size=T,
            pretarget_size=P,
            max_hops=H,
            alphabet_size=draw(st.integers(H + 1, 12)),
            int_range=draw(st.integers(1, 9)),
            extra_target=draw(st.integers(0, 6)),
        )
    s = generate(
        config,
        1,
        draw(st.integers(0, 2**32)),
        split=draw(st.sampled_from(["train", "val", "test"])),
        start=draw(st.integers(0, 10**6)),
    )
    chain = s.chain[0][: s.hops[0] + 1].tolist()
    return config, s.input_ids[0], int(s.answer[0]), chain


@FAST
@given(sample=samples("number"), data=st.data())
def test_number_task_relabelling_symbols_relabels_the_answer(sample, data):
    config, ids, answer, chain = sample
    R, A = config.int_range, config.alphabet_size
    perm = np.arange(config.vocab_size)  # offsets 1..R stay, symbols R+1..R+A are permuted
    perm[R + 1 :] = R + 1 + np.array(data.draw(st.permutations(range(A))))
    assert follow_chain(config, ids) == (answer, chain)
    assert follow_chain(config, perm[ids]) == (perm[answer], chain)


@FAST
@given(sample=samples("letter"), data=st.data())
def test_letter_task_relabelling_letters_relabels_the_answer(sample, data):
    config, ids, answer, chain = sample
    letters = "".join(chr(97 + x) for x in range(config.alphabet_size))
    table = str.maketrans(letters, "".join(data.draw(st.permutations(letters))))
    relabel = lambda i: encode(config, decode(config, i).translate(table))  # noqa: E731
    assert follow_chain(config, relabel(ids)) == (relabel([answer])[0], chain)


@FAST
@given(sample=samples("letter") | samples("number"))
def test_decode_encode_round_trip_and_vocabulary(sample):
    config, ids, answer, _ = sample
    assert encode(config, decode(config, ids)) == ids.tolist()
    assert len(token_names(config)) == config.vocab_size
    assert 1 <= ids.min() and ids.max() < config.vocab_size and 1 <= answer < config.vocab_size
    assert len(ids) == config.seq_len


@FAST
@given(
    seed=st.integers(0, 2**40),
    start=st.integers(0, 10**9),
    n=st.integers(1, 20),
    task=st.sampled_from(["number", "letter"]),
)
def test_generation_is_a_pure_function_of_its_index(seed, start, n, task):
    config = task_config(task)
    a, b = generate(config, n, seed, "val", start), generate(config, n, seed, "val", start)
    one = generate(config, 1, seed, "val", start + n - 1)  # the last row, generated on its own
    for field in ("input_ids", "answer", "hops", "chain", "answer_pos"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
        assert np.array_equal(getattr(a, field)[-1:], getattr(one, field))


# ---- swap_scores ---------------------------------------------------------------------------------

logits = st.floats(-8.0, 8.0, allow_nan=False, allow_infinity=False)


@st.composite
def heads(draw, min_keys: int = 3, max_keys: int = 9):
    """(clean [n], swapped [n, n]) logits of one query over n keys, with swapped's diagonal = clean."""
    n = draw(st.integers(min_keys, max_keys))
    swapped = torch.tensor(
        draw(st.lists(st.lists(logits, min_size=n, max_size=n), min_size=n, max_size=n)), dtype=torch.float64
    )  # [n, n]
    return swapped.diagonal().clone(), swapped


def scores_of(clean, swapped, **kw):
    out = swap_scores(clean, swapped, **kw)
    return float(out["s_pos"]), float(out["s_sym"]), float(out["entropy"])


@FAST
@given(head=heads(), tau=st.sampled_from([1e-4, 1e-2, 1.0]), blocks=st.sampled_from([None, 2]))
def test_scores_lie_in_the_unit_interval(head, tau, blocks):
    clean, swapped = head
    s_pos, s_sym, entropy = scores_of(clean, swapped, tau=tau, blocks=blocks)
    assert 0.0 <= s_pos <= 1.0 + 1e-12 and 0.0 <= s_sym <= 1.0 + 1e-12
    assert -1e-12 <= entropy <= math.log(len(clean)) + 1e-12


@FAST
@given(row=st.lists(logits, min_size=3, max_size=10), tau=st.sampled_from([1e-4, 1e-1]))
def test_content_free_logits_are_positional(row, tau):
    # Keys that are all equal: the logit at position a is the same whatever content sits there.
    clean = torch.tensor(row, dtype=torch.float64)  # [n]
    swapped = clean[:, None].expand(-1, len(row))  # [n, n]: swapped[a, b] = clean[a]
    assert scores_of(clean, swapped, tau=tau)[0] == pytest.approx(1.0, abs=1e-12)


@FAST
@given(row=st.lists(logits, min_size=3, max_size=10), tau=st.sampled_from([1e-4, 1e-1]))
def test_content_following_logits_are_symbolic(row, tau):
    # The logit travels with the content: key position a holding b's content scores like b did.
    clean = torch.tensor(row, dtype=torch.float64)  # [n]
    swapped = clean[None, :].expand(len(row), -1)  # [n, n]: swapped[a, b] = clean[b]
    assert scores_of(clean, swapped, tau=tau)[1] == pytest.approx(1.0, abs=1e-12)


@FAST
@given(n=st.integers(3, 12), value=logits)
def test_uniform_attention_is_one_one(n, value):
    clean = torch.full((n,), value, dtype=torch.float64)
    swapped = torch.full((n, n), value, dtype=torch.float64)
    s_pos, s_sym, entropy = scores_of(clean, swapped)
    assert (s_pos, s_sym) == (pytest.approx(1.0, abs=1e-12), pytest.approx(1.0, abs=1e-12))
    assert entropy == pytest.approx(math.log(n))


@FAST
@given(head=heads(min_keys=4), data=st.data(), shift=logits)
def test_relabelling_keys_and_shifting_logits_change_nothing(head, data, shift):
    clean, swapped = head
    n = len(clean)
    # Relabel the swappable keys 0..n-2 (the query, last, stays): pairs map to pairs, swaps to swaps.
    perm = torch.tensor([*data.draw(st.permutations(range(n - 1))), n - 1])
    inverse = torch.argsort(perm)
    relabelled = scores_of(clean[inverse], swapped[inverse][:, inverse])
    shifted = scores_of(clean + shift, swapped + shift)
    base = scores_of(clean, swapped)
    assert relabelled == pytest.approx(base, abs=1e-9)
    assert shifted == pytest.approx(base, abs=1e-9)


# ---- model level -----------------------------------------------------------------------------------

VOCAB = 13


@pytest.fixture(scope="module")
def gptj():
    model = build_model(ModelConfig(n_layer=2, n_head=2, n_embd=16, dropout=0.0, n_positions=64), VOCAB, seed=3)
    return model.eval()


prompts = st.lists(st.integers(1, VOCAB - 1), min_size=4, max_size=14)


@MODEL
@given(ids=prompts)
def test_equal_embeddings_make_layer_zero_positional(gptj, ids):
    import copy

    model = copy.deepcopy(gptj)
    with torch.no_grad():
        model.transformer.wte.weight[:] = model.transformer.wte.weight[1]  # every token looks the same
    frame = score_model(model, [ids], queries="all")
    first = frame[frame.layer == 0]
    assert len(first) == 2 * (len(ids) - 2)  # heads x queries with two earlier keys
    assert np.allclose(first.s_pos, 1.0, atol=1e-9)


def test_distinct_embeddings_make_layer_zero_content_dependent(gptj):
    # the property above is not vacuous: with its own embeddings, layer 0 is not purely positional
    frame = score_model(gptj, [[1, 5, 2, 9, 3, 12, 7, 4]], queries="all")
    assert (frame[frame.layer == 0].s_pos < 1 - 1e-6).any()


@MODEL
@given(ids=prompts, perm=st.permutations(range(VOCAB)))
def test_relabelling_the_vocabulary_leaves_every_score_unchanged(gptj, ids, perm):
    import copy

    perm = torch.tensor(perm)  # old id -> new id
    model = copy.deepcopy(gptj)
    with torch.no_grad():
        model.transformer.wte.weight[perm] = gptj.transformer.wte.weight.clone()
        model.lm_head.weight[perm] = gptj.lm_head.weight.clone()
        model.lm_head.bias[perm] = gptj.lm_head.bias.clone()
    before = score_model(gptj, [ids], queries="all")
    after = score_model(model, [perm[ids].tolist()], queries="all")
    for column in ("s_pos", "s_sym", "entropy"):
        assert np.allclose(before[column], after[column], atol=1e-9, rtol=0), column
