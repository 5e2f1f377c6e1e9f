"""posym.core.tasks: worked examples, chain checker, exact balance, determinism, knobs (files: test_data.py)."""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posym.commands.data import content_hash
from posym.core.tasks import (
    SPLIT_SIZES,
    TASKS,
    ChainError,
    Samples,
    TaskConfig,
    concat,
    decode,
    encode,
    follow_chain,
    generate,
    iter_batches,
    task_config,
    token_names,
)
from posym.errors import PosymError

NUMBER_EXAMPLE = "n h n v h y r s | 6 3 2 7 7 8 4 7 | 2"
LETTER_EXAMPLE = "e1 b2 e1 g6 a2 b2 e1 g6 | be db ca ge eb hc dg fh | eh"
FIELDS = ("input_ids", "answer", "hops", "chain", "answer_pos")


def assert_same(a: Samples, b: Samples) -> None:
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


def check_structure(config: TaskConfig, s: Samples) -> None:
    """Reference check from the task definition, row by row, without `follow_chain`."""
    E, T = config.extra_target, config.target_size
    q = config.query_pos
    names = token_names(config)
    assert s.input_ids.shape == (len(s), config.seq_len) and s.input_ids.dtype == np.int64
    assert s.input_ids.min() >= 1 and s.input_ids.max() < config.vocab_size
    for ids, answer, h, chain, apos in zip(
        s.input_ids.tolist(), s.answer.tolist(), s.hops.tolist(), s.chain.tolist(), s.answer_pos.tolist()
    ):
        path = chain[: h + 1]
        assert 1 <= h <= config.max_hops and all(c == -1 for c in chain[h + 1 :])
        assert path[0] == q and path[-1] == apos and ids[apos] == answer
        assert all(a > b for a, b in zip(path, path[1:]))  # strictly leftward, so distinct
        assert all(E + T <= c < q for c in path[1:-1])  # intermediates in the pre-target window
        assert E <= apos < E + T  # the last hop lands in the effective target window
        if config.task == "number":
            R = config.int_range
            for a, b in zip(path, path[1:]):
                assert ids[a] == a - b  # each chain integer points to the next chain position
            assert all(v > R for v in ids[: E + T]) and all(v <= R for v in ids[E + T :])
            for p in range(E + T, q + 1):  # decoys: backward offsets 1..p (positions before E)
                assert 1 <= ids[p] <= p - E
        else:
            text = [names[i] for i in ids]
            assert all(t[1:].isdigit() for t in text[: E + T])
            assert all(t.isalpha() and len(t) == 2 for t in text[E + T :])
            hop_letters = [text[c][0] for c in path[1:]]  # y_1 .. y_h
            assert len(set(hop_letters)) == h
            for k, c in enumerate(path[:-1]):
                assert text[c][1] == hop_letters[k]  # chain token k looks up y_{k+1}
            for j, t in enumerate(text):  # everything off the chain avoids the hop letters
                letters = t[0] if j == q or j < E + T else t
                if j not in path[1:]:
                    assert not set(letters) & set(hop_letters), (j, t, hop_letters)


# ---- worked examples and vocabulary ---------------------------------------------------------------


def test_number_worked_example():
    c = task_config("number")
    ids = encode(c, NUMBER_EXAMPLE)
    assert len(ids) == c.seq_len == 17
    assert ids[8:] == [6, 3, 2, 7, 7, 8, 4, 7, 2] and ids[0] == 17 + 13  # 'n' is symbol 13
    answer, chain = follow_chain(c, ids)
    assert chain == [16, 14, 10, 8, 2] and decode(c, [answer]) == "n"
    assert decode(c, ids) == NUMBER_EXAMPLE.replace("| ", "")


def test_letter_worked_example():
    c = task_config("letter")
    ids = encode(c, LETTER_EXAMPLE)
    assert len(ids) == 17
    answer, chain = follow_chain(c, ids)
    assert chain == [16, 13, 10, 4] and decode(c, [answer]) == "a2" and answer == 1 + 0 * 8 + 1
    assert decode(c, ids) == LETTER_EXAMPLE.replace("| ", "")


def test_vocabulary_layout():
    num, let = token_names(task_config("number")), token_names(task_config("letter"))
    assert len(num) == task_config("number").vocab_size == 137
    assert num[0] == "<pad>" and num[1:17] == tuple(str(v) for v in range(1, 17))
    assert num[17 : 17 + 27] == tuple("abcdefghijklmnopqrstuvwxyz") + ("aa",) and num[136] == "dp"
    assert len(set(num)) == len(num)
    assert len(let) == task_config("letter").vocab_size == 129
    assert let[1] == "a1" and let[8] == "a8" and let[9] == "b1" and let[64] == "h8"
    assert let[65] == "aa" and let[66] == "ab" and let[128] == "hh" and len(set(let)) == 129


def test_encode_rejects_unknown_tokens():
    with pytest.raises(PosymError, match="'i1' is not a token"):
        encode(task_config("letter"), "a1 i1")
    with pytest.raises(PosymError, match="outside"):
        decode(task_config("number"), [137])


# ---- the checker itself -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "task, text, message",
    [
        ("letter", "e1 a2 a2 | ca hc | eh", "2 \\(1, 2\\) earlier matches"),  # two start with a
        ("letter", "e1 b2 | ca hc | eh", "no earlier matches"),
        ("letter", "e1 b2 | hc ca | e1", "not a \\(letter, letter\\) pointer"),
        ("number", "a b | 3 | 4", "jumps before position 0"),
        ("number", "a b | 3 | c", "query is a symbol"),
    ],
)
def test_follow_chain_rejects_ill_defined_chains(task, text, message):
    with pytest.raises(ChainError, match=message):
        follow_chain(task_config(task), encode(task_config(task), text))
    with pytest.raises(ChainError, match="PAD"):
        follow_chain(task_config(task), [0, 5])


# ---- generated samples: checker, structure, balance ---------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_follow_chain_confirms_ten_thousand_samples(task):
    c = task_config(task)
    s = generate(c, 10_000, seed=3)
    for ids, answer, h, chain in zip(s.input_ids, s.answer.tolist(), s.hops.tolist(), s.chain.tolist()):
        got_answer, got_chain = follow_chain(c, ids)  # raises unless every lookup is unique
        assert got_answer == answer and got_chain == chain[: h + 1]
    check_structure(c, s[:3000])


@pytest.mark.parametrize("task, block", [("number", 480), ("letter", 32)])
def test_balance_is_exact_per_block(task, block):
    c = task_config(task)
    assert c.block_size == block and all(size % block == 0 for size in SPLIT_SIZES.values())
    n = 10 * block
    s = generate(c, n, seed=11, split="val", start=7 * block)
    assert np.bincount(s.hops, minlength=5)[1:].tolist() == [n // 4] * 4
    for h in range(1, 5):
        rows = s.hops == h
        pos, ans = s.answer_pos[rows], s.answer[rows]
        assert np.bincount(pos, minlength=8).tolist() == [n // 4 // 8] * 8
        if task == "number":
            values = [ans - 17]
        else:
            values = [(ans - 1) // 8, (ans - 1) % 8]  # answer letter, answer number
        for v, size in zip(values, (c.alphabet_size, c.int_range)):
            counts = np.bincount(v, minlength=size)
            assert len(counts) == size and counts.min() == counts.max() == n // 4 // size


@pytest.mark.parametrize("task", TASKS)
def test_answer_position_and_value_are_not_tied(task):
    # marginal balance alone would allow value = f(position); the schedule draws them independently
    c = task_config(task)
    s = generate(c, 10 * c.block_size, seed=0)
    for h in range(1, 5):
        rows = s.hops == h
        pairs = set(zip(s.answer_pos[rows].tolist(), s.answer[rows].tolist()))
        possible = c.target_size * c.num_values
        expected = possible * (1 - math.exp(-rows.sum() / possible))  # distinct pairs if independent
        assert len(pairs) > 0.9 * expected, (len(pairs), expected)


def test_neighbouring_samples_are_not_periodic():
    s = generate(task_config("number"), 4800, seed=0)
    # a plain i mod 4 schedule would make this 1.0; a random one makes it about 1/4
    assert 0.2 < np.mean(s.hops[:-4] == s.hops[4:]) < 0.3
    assert 0.08 < np.mean(s.answer_pos[:-8] == s.answer_pos[8:]) < 0.17


def test_off_chain_randomness_is_uniform():
    c = task_config("number")
    s = generate(c, 48_000, seed=5)
    two = s.hops == 2
    # the one intermediate position of a 2-hop chain is uniform over the 8 pre-target positions
    counts = np.bincount(s.chain[two, 1] - 8, minlength=8)
    assert len(counts) == 8 and np.abs(counts / two.sum() - 1 / 8).max() < 0.01
    # a decoy at position 8 is uniform over 1..8 (position 8 is off the chain in 1-hop samples)
    one = s.hops == 1
    counts = np.bincount(s.input_ids[one, 8], minlength=9)[1:]
    assert len(counts) == 8 and np.abs(counts / one.sum() - 1 / 8).max() < 0.01


# ---- determinism ------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_any_slice_gives_the_same_samples(task):
    c = task_config(task)
    whole = generate(c, 1000, seed=7)
    assert_same(generate(c, 10, seed=7, start=5), whole[5:15])
    assert_same(generate(c, 40, seed=7, start=470), whole[470:510])  # across a block boundary
    assert_same(generate(c, 1000, seed=7), whole)
    parts = list(iter_batches(c, 300, seed=7, stop=1000))
    assert [len(p) for p in parts] == [300, 300, 300, 100]
    assert_same(concat(parts), whole)
    stream = iter_batches(c, 64, seed=7, start=100)
    next(stream)
    assert_same(next(stream), whole[164:228])
    for other in (generate(c, 1000, seed=8), generate(c, 1000, seed=7, split="test")):
        assert np.mean(np.all(other.input_ids == whole.input_ids, axis=1)) < 0.01


@pytest.mark.parametrize(
    "task, digest",
    [
        ("number", "232e3469e0017e7282fcbd1faa096abeab5d7c1302b8215d8c611ee7d275ecd7"),
        ("letter", "17f7865bf89667182c0fdeb7b12dddf18194179d3a721cf5b7ebf3aa00c0bcf5"),
    ],
)
def test_generator_output_is_pinned(task, digest):
    # saved datasets and cached batches stay valid only while this does not change; a deliberate
    # change of the generator must update these digests (and say so in its commit)
    assert content_hash(generate(task_config(task), 64, seed=0)) == digest


def test_generate_rejects_bad_arguments():
    c = task_config("number")
    with pytest.raises(PosymError, match="split must be one of"):
        generate(c, 5, seed=0, split="dev")
    for kwargs in ({"n": -1, "seed": 0}, {"n": 5, "seed": -2}, {"n": 5, "seed": 0, "start": 1.5}):
        with pytest.raises(PosymError, match="must be an integer"):
            generate(c, **kwargs)
    with pytest.raises(PosymError, match="below 2\\*\\*63"):
        generate(c, 5, seed=2**64)
    assert len(generate(c, 0, seed=0)) == 0


# ---- knobs, impossible configs, length extension --------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        dict(task="number", target_size=3, pretarget_size=12, max_hops=6, alphabet_size=5, int_range=15),
        dict(task="number", target_size=20, pretarget_size=0, max_hops=1, alphabet_size=500, int_range=30),
        dict(task="letter", target_size=5, pretarget_size=3, max_hops=4, alphabet_size=5, int_range=3),
        dict(task="letter", target_size=16, pretarget_size=20, max_hops=8, alphabet_size=26, int_range=12),
    ],
)
def test_knobs_vary_independently(overrides):
    c = TaskConfig(**overrides)
    s = generate(c, 2 * c.block_size, seed=1)
    check_structure(c, s[:500])
    for ids, answer in zip(s.input_ids[:500], s.answer[:500]):
        assert follow_chain(c, ids)[0] == answer
    assert np.bincount(s.hops)[1:].tolist() == [2 * c.block_size // c.max_hops] * c.max_hops


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(task="letter", alphabet_size=3, max_hops=4), "needs max_hops \\+ 1 = 5 letters"),
        (dict(task="letter", alphabet_size=4, max_hops=4), "needs max_hops \\+ 1 = 5 letters"),
        (dict(task="letter", alphabet_size=27, max_hops=4), "at most 26 letters"),
        (dict(task="number", int_range=15), "cannot reach the whole target window"),
        (dict(task="number", pretarget_size=30), "cannot reach the whole target window"),
        (dict(task="number", max_hops=10), "only 8"),
        (dict(task="letter", pretarget_size=2, max_hops=4), "only 2"),
        (dict(task="numbers"), "task must be one of"),
        (dict(task="number", target_size=0), "target_size must be an integer >= 1"),
        (dict(task="number", max_hops=True), "max_hops must be an integer"),
        (dict(task="number", extra_target=-1), "extra_target must be an integer >= 0"),
    ],
)
def test_impossible_configs_raise(overrides, message):
    with pytest.raises(PosymError, match=message):
        TaskConfig(**overrides)


def test_paper_defaults_per_task():
    assert (task_config("number").alphabet_size, task_config("number").int_range) == (120, 16)
    assert (task_config("letter").alphabet_size, task_config("letter").int_range) == (8, 8)
    assert task_config("number", pretarget_size=20, int_range=28).seq_len == 29


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("extra", [1, 40])
def test_length_extension_keeps_answers_and_chains(task, extra):
    base_config = task_config(task)
    c = replace(base_config, extra_target=extra)
    assert c.seq_len == 17 + extra
    base, ext = generate(base_config, 600, seed=2), generate(c, 600, seed=2)
    np.testing.assert_array_equal(ext.input_ids[:, extra:], base.input_ids)
    np.testing.assert_array_equal(ext.answer, base.answer)
    np.testing.assert_array_equal(ext.chain, np.where(base.chain >= 0, base.chain + extra, -1))
    np.testing.assert_array_equal(ext.answer_pos, base.answer_pos + extra)
    check_structure(c, ext)
    for ids, answer, h, chain in zip(ext.input_ids, ext.answer.tolist(), ext.hops.tolist(), ext.chain.tolist()):
        assert follow_chain(c, ids) == (answer, chain[: h + 1])


# ---- hypothesis: any valid config --------------------------------------------------------------------


@st.composite
def configs(draw):
    task = draw(st.sampled_from(TASKS))
    T, P = draw(st.integers(1, 10)), draw(st.integers(0, 10))
    H = draw(st.integers(1, min(P + 1, 6)))
    E = draw(st.integers(0, 12))
    if task == "number":
        return TaskConfig(task, T, P, H, draw(st.integers(1, 150)), draw(st.integers(T + P, T + P + 5)), E)
    return TaskConfig(task, T, P, H, draw(st.integers(H + 1, 26)), draw(st.integers(1, 12)), E)


@settings(max_examples=200, deadline=None)
@given(config=configs(), seed=st.integers(0, 2**32), start=st.integers(0, 10**9), n=st.integers(1, 60))
def test_generator_agrees_with_checker_on_any_config(config, seed, start, n):
    s = generate(config, n, seed, start=start)
    check_structure(config, s)
    for ids, answer, h, chain in zip(s.input_ids, s.answer.tolist(), s.hops.tolist(), s.chain.tolist()):
        assert follow_chain(config, ids) == (answer, chain[: h + 1])
    assert_same(generate(config, 1, seed, start=start + n - 1), s[n - 1 :])


def test_paper_split_sizes():
    assert SPLIT_SIZES == {"train": 432_000, "val": 2_400, "test": 45_600}
    assert math.isclose(sum(SPLIT_SIZES.values()), 480_000)


# ---- slot markers ---------------------------------------------------------------------------------------


def test_marker_vocabulary():
    for task, plain, marked in [("number", 137, 1097), ("letter", 129, 641)]:
        c = task_config(task, markers=True)
        names = token_names(c)
        assert c.marker_base == plain and c.vocab_size == len(names) == marked and len(set(names)) == marked
        assert names[:plain] == token_names(task_config(task))
    assert token_names(task_config("number", markers=True))[137] == "a@0"
    assert token_names(task_config("letter", markers=True))[129 + 64 * 3 + 9] == "b2@3"
    with pytest.raises(PosymError, match="markers must be true or false"):
        TaskConfig("number", markers="yes")


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("extra", [0, 11])
def test_marked_samples_are_the_plain_ones_with_slots(task, extra):
    c = task_config(task, markers=True, extra_target=extra)
    plain = replace(c, markers=False)
    m, p = generate(c, 400, seed=4), generate(plain, 400, seed=4)
    for f in ("answer", "hops", "chain", "answer_pos"):
        np.testing.assert_array_equal(getattr(m, f), getattr(p, f))
    marked_names, plain_names = token_names(c), token_names(plain)
    T = c.target_size
    for mids, pids, answer, apos, h, chain in zip(
        m.input_ids.tolist(),
        p.input_ids.tolist(),
        m.answer.tolist(),
        m.answer_pos.tolist(),
        m.hops.tolist(),
        m.chain.tolist(),
    ):
        for j, (a, b) in enumerate(zip(mids, pids)):  # reference: token by token, through the names
            if j < extra + T:
                assert marked_names[a] == f"{plain_names[b]}@{(j - extra) % T}"
            else:
                assert a == b
        assert answer == pids[apos] and marked_names[mids[apos]] == f"{plain_names[answer]}@{(apos - extra) % T}"
        assert follow_chain(c, mids) == (answer, chain[: h + 1])
        assert encode(c, decode(c, mids)) == mids


def test_marked_letter_lookup_counts_marked_matches():
    c = task_config("letter", markers=True)
    assert follow_chain(c, encode(c, "e1@0 a2@1 b2@2 | ca hc | eh"))[1] == [5, 4, 3, 1]
    with pytest.raises(ChainError, match="2 \\(1, 2\\) earlier matches"):
        follow_chain(c, encode(c, "e1@0 a2@1 a3@2 | ca hc | eh"))


def test_data_command_writes_marked_samples(tmp_path, monkeypatch):
    from cli_runner import run_posym

    from posym.commands.data import load_dataset

    out = tmp_path / "marked.jsonl"
    assert (
        run_posym(
            monkeypatch, "data", "--task", "letter", "--n", 40, "--format", "jsonl", "--markers", "on", "--out", out
        )
        == 0
    )
    config, samples = load_dataset(out)
    assert config == task_config("letter", markers=True)
    assert_same(samples, generate(config, 40, seed=0))
