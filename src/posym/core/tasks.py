"""The two multi-hop pointer-chasing tasks of the paper (docs/method.md section 1), generated and checked.

Every sequence has a target window (answers live here), a pre-target window (hop instructions) and
one query token, which starts a chain of 1..max_hops hops that moves strictly leftwards and ends in
the target window; the model reads the sequence and predicts the token the chain lands on.

Number task (positional), 17 tokens::

    n h n v h y r s | 6 3 2 7 7 8 4 7 | 2
    0 1 2 3 4 5 6 7   8 9 ...      15   16      <- positions

An integer k at position p means "jump to position p - k". The query 2 at 16 jumps to 14 (4), then
to 10 (2), then to 8 (7), then to 2 (`n`): chain 16 -> 14 -> 10 -> 8 -> 2, 4 hops, answer `n`.
Integers not on the chain are decoys: a random backward offset 1..p.

Letter task (symbolic), 17 tokens::

    e1 b2 e1 g6 a2 b2 e1 g6 | be db ca ge eb hc dg fh | eh

Target tokens are (letter, number) pairs, pre-target and query tokens are (letter, letter) pairs; a
pair (x, y) means "go to the earlier token whose FIRST letter is y". The query eh looks up h: hc at
13, which looks up c: ca at 10, which looks up a: a2 at 4, a target token, so the answer is `a2`
(3 hops). The hop letters (h, c, a) are distinct and are the first letter of exactly one token each.
Our generator draws every other letter (the query's first letter, both letters of a distractor
pair, the letters of the other target tokens) from the letters that are not hop letters. (The
paper's example has `fh`, a distractor whose second letter is a hop letter; `follow_chain` accepts
it because uniqueness only concerns first letters.)

Token ids (PAD is always 0; `TaskConfig.vocab_size` counts it):
- number task, R = int_range, A = alphabet_size: integers 1..R have ids 1..R; symbol k (0-based;
  names a..z, aa..az, ba.. i.e. bijective base 26, so A = 120 ends at `dp`) has id R + 1 + k.
  Paper: ints 1..16, symbols 17..136, vocabulary 137 with PAD.
- letter task, L = alphabet_size, R = int_range: target pair (letter x, number n), x in 0..L-1,
  n in 1..R, has id 1 + x*R + (n-1); pointer pair (x, y) has id 1 + L*R + x*L + y.
  Paper: pairs a1..h8 are 1..64, pairs aa..hh are 65..128, vocabulary 129 with PAD.
- with markers: marked ids follow (see "Slot markers"); paper: number 137..1096, letter 129..640.

Slot markers (`markers=True`, the seed summary's "explicit token markers"). Every target-window
token (a symbol the chain can copy) carries its slot s = (p - extra_target) mod target_size, the
place of position p in the effective target window (0..T-1), counted on cyclically into the extra
tokens before it; it has the id of (plain token, s) in a range after the plain vocabulary:
marker_base + s * S + (plain id - first symbol id), S = symbols per slot (number: A symbols; letter:
the L*R (letter, number) pairs), text `<plain>@<s>` (`n@2`, `a2@4`). Nothing moves: positions,
offsets, hop letters, chains and answers are those of the unmarked sample with the same index: the
answer is the plain token (the symbol, without its slot), so marked and unmarked models are scored
on the same answers (a first version answered with the marked token, 960 / 512 classes, and learned
almost nothing in 1,000 quick steps; docs/results.md). Why slots: the number task's lookup "the token k places
back" is positional; with slots the target of a 1-hop query k is also "the symbol marked slot
(T + P - k) mod T", a lookup by content, so a symbolic head could do it (the letter task already is
one; its marks are redundant information). Slots are cyclic so that length extension reuses marked
ids seen in training (an extra token shares its slot with the effective-window token T places right).
With markers off (the default) the generator is exactly the unmarked one (pinned by sha256 in tests).

Layout with `extra_target` = E (length extension, docs/method.md section 6): positions 0..E-1 hold extra target-window
tokens (number task: random symbols; letter task: (non-hop letter, number) pairs), then the
effective target window, pre-target window and query exactly as in the E = 0 sample with the same
index, so every chain position shifts by E and the answer is unchanged.

Exact balance. Sample indices are cut into blocks of `config.block_size` = max_hops * M samples,
M = lcm(target_size, alphabet_size) (number) or lcm(target_size, alphabet_size, int_range) (letter).
In block b a seeded random permutation maps each index to a slot s: hop = 1 + s % max_hops, and
j = s // max_hops runs over 0..M-1 exactly once per hop class. Answer position = pi_pos[j] % T,
answer value = pi_val[j] % A (letter: answer letter and answer number likewise), with independent
seeded permutations pi_* of 0..M-1 per block and hop class. So every full block holds each hop
exactly M times and, within a hop class, each answer position, value (letter, number) exactly
M / T, M / A (M / L, M / R) times, while neighbouring samples still look random. The paper's split
(432,000 / 2,400 / 45,600) is a whole number of blocks for both tasks (480 and 32 samples).

Reproducibility. All randomness comes from a counter-based hash (splitmix64) of (seed, split,
stream, sample or block index, column): sample i depends only on (config, seed, split, i), so any
slice can be generated on its own, vectorised over samples (generate(c, 10, s, start=5) equals
generate(c, 20, s)[5:15]).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from posym.errors import PosymError

TASKS = ("number", "letter")
SPLITS = ("train", "val", "test")
SPLIT_SIZES = {"train": 432_000, "val": 2_400, "test": 45_600}  # the paper's split
PAD = 0
_PAPER_DEFAULTS = {"number": (120, 16), "letter": (8, 8)}  # (alphabet_size, int_range)


def check_int(name: str, value, low: int) -> int:
    """`value` as an int, or a PosymError when it is not an integer >= low."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise PosymError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


class ChainError(PosymError):
    """A sequence whose pointer chain is not well defined (no or several matches, out of range)."""


@dataclass(frozen=True)
class TaskConfig:
    """One task and its window sizes; `task_config` fills in the paper's values per task."""

    task: str = "number"
    """Which task: "number" (positional, integers are backward offsets) or "letter" (symbolic,
    pairs look up letters)."""
    target_size: int = 8
    """Tokens in the target window, which holds the answer."""
    pretarget_size: int = 8
    """Tokens in the pre-target window, which holds the chain's intermediate hops and decoys."""
    max_hops: int = 4
    """Hops run 1..max_hops in equal shares; needs max_hops - 1 <= pretarget_size."""
    alphabet_size: int | None = None
    """Number task: symbols in the target window (paper 120: a..z, aa..dp). Letter task: letters
    (paper 8: a..h, at most 26). None means the paper's value for the task."""
    int_range: int | None = None
    """Number task: offsets 1..int_range (paper 16; must be >= target_size + pretarget_size so the
    query can reach position 0). Letter task: numbers 1..int_range in target pairs (paper 8).
    None means the paper's value for the task."""
    extra_target: int = 0
    """Length extension (docs/method.md section 6): extra target-window tokens placed BEFORE the effective target
    window; hop instructions, offsets and answers are unchanged, chain positions shift by this."""
    markers: bool = False
    """Slot markers (module docstring): every target-window token carries its slot (position in the
    target window, cyclic over extra tokens) as a separate token id, so the "symbol to copy" role and
    its slot are explicit in the token; positions and chains are unchanged."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise PosymError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        alphabet, ints = _PAPER_DEFAULTS[self.task]
        if self.alphabet_size is None:
            object.__setattr__(self, "alphabet_size", alphabet)
        if self.int_range is None:
            object.__setattr__(self, "int_range", ints)
        for name, low in [
            ("target_size", 1),
            ("pretarget_size", 0),
            ("max_hops", 1),
            ("alphabet_size", 1),
            ("int_range", 1),
            ("extra_target", 0),
        ]:
            object.__setattr__(self, name, check_int(name, getattr(self, name), low))
        if not isinstance(self.markers, (bool, np.bool_)):
            raise PosymError(f"markers must be true or false, got {self.markers!r}")
        if self.max_hops > self.pretarget_size + 1:
            raise PosymError(
                f"max_hops={self.max_hops} needs {self.max_hops - 1} distinct intermediate "
                f"positions but the pre-target window has only {self.pretarget_size}"
            )
        if self.task == "number" and self.int_range < self.target_size + self.pretarget_size:
            raise PosymError(
                f"int_range={self.int_range} cannot reach the whole target window: a 1-hop query "
                f"must jump back up to target_size + pretarget_size = "
                f"{self.target_size + self.pretarget_size} positions"
            )
        if self.task == "letter":
            if self.alphabet_size > 26:
                raise PosymError(f"the letter task has at most 26 letters, got alphabet_size={self.alphabet_size}")
            if self.alphabet_size < self.max_hops + 1:
                raise PosymError(
                    f"the letter task needs max_hops + 1 = {self.max_hops + 1} letters ({self.max_hops} "
                    f"distinct hop letters and one other letter for the query and distractors), "
                    f"got alphabet_size={self.alphabet_size}"
                )

    @property
    def seq_len(self) -> int:
        """Tokens per input sequence: extra_target + target_size + pretarget_size + 1 (the query)."""
        return self.extra_target + self.target_size + self.pretarget_size + 1

    prompt_len = seq_len

    @property
    def pad_id(self) -> int:
        """Id of the padding token (never appears in generated samples)."""
        return PAD

    @property
    def marker_base(self) -> int:
        """First marked id = the plain vocabulary size, PAD included (paper: number 137, letter 129)."""
        if self.task == "number":
            return 1 + self.int_range + self.alphabet_size
        return 1 + self.alphabet_size * self.int_range + self.alphabet_size**2

    @property
    def symbol_ids(self) -> range:
        """Plain ids of target-window tokens: symbols (number) or (letter, number) pairs (letter)."""
        if self.task == "number":
            return range(1 + self.int_range, 1 + self.int_range + self.alphabet_size)
        return range(1, 1 + self.alphabet_size * self.int_range)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, PAD included (paper: number 137, letter 129; with markers 1097, 641)."""
        return self.marker_base + (self.target_size * len(self.symbol_ids) if self.markers else 0)

    @property
    def target_start(self) -> int:
        """First position of the effective target window (= extra_target)."""
        return self.extra_target

    @property
    def pretarget_start(self) -> int:
        """First position of the pre-target window."""
        return self.extra_target + self.target_size

    @property
    def query_pos(self) -> int:
        """Position of the query token (the last one)."""
        return self.seq_len - 1

    @property
    def num_values(self) -> int:
        """Distinct answer tokens: alphabet_size (number) or alphabet_size * int_range (letter)."""
        return self.alphabet_size * (1 if self.task == "number" else self.int_range)

    @property
    def block_size(self) -> int:
        """Samples per balance block (see the module docstring); paper: number 480, letter 32."""
        m = math.lcm(self.target_size, self.alphabet_size)
        if self.task == "letter":
            m = math.lcm(m, self.int_range)
        return self.max_hops * m


def task_config(task: str, **overrides) -> TaskConfig:
    """The paper's configuration of `task` ("number" or "letter") with `overrides` applied."""
    return TaskConfig(task=task, **overrides)


@dataclass(eq=False)
class Samples:
    """A batch of generated sequences and their ground truth (positions include extra_target)."""

    input_ids: np.ndarray  # int64 [n, seq_len]
    answer: np.ndarray  # int64 [n]  token id of the answer (the token after the sequence)
    hops: np.ndarray  # int64 [n]
    chain: np.ndarray  # int64 [n, max_hops + 1]  positions from the query to the answer, -1 padded
    answer_pos: np.ndarray  # int64 [n]

    def __len__(self) -> int:
        return len(self.answer)

    def __getitem__(self, index) -> "Samples":
        """Rows `index` (a slice, an integer array or a boolean mask) as a new `Samples`."""
        if isinstance(index, (int, np.integer)):
            index = slice(index, index + 1 if index != -1 else None)
        return Samples(*(getattr(self, f)[index] for f in SAMPLE_FIELDS))


SAMPLE_FIELDS = ("input_ids", "answer", "hops", "chain", "answer_pos")  # `Samples` fields, in order


def concat(parts: Sequence[Samples]) -> Samples:
    """Rows of several `Samples` (same config) stacked in order."""
    return Samples(*(np.concatenate([getattr(p, f) for p in parts]) for f in SAMPLE_FIELDS))


# ---- counter-based randomness --------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
# Stream tags keep the draws for different purposes independent.
(
    _S_SLOT,
    _S_POS,
    _S_VAL,
    _S_ANS_NUM,
    _S_SUBSET,
    _S_TARGET,
    _S_DECOY,
    _S_LETTERS,
    _S_X,
    _S_Y,
    _S_NUM,
    _S_EXTRA,
    _S_EXTRA_NUM,
) = range(1, 14)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64: a bijective, well-mixing map of uint64 (Steele et al. 2014)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _hash(*keys) -> np.ndarray:
    """uint64 random bits for a tuple of integer keys/arrays (broadcast together)."""
    with np.errstate(over="ignore"):
        h = np.zeros((), dtype=np.uint64)
        for key in keys:
            h = _mix(h ^ np.asarray(key).astype(np.uint64))
    return h


def _below(bits: np.ndarray, n) -> np.ndarray:
    """Integers in [0, n) from uint64 bits (multiply-shift; bias <= n / 2**32)."""
    n = np.asarray(n).astype(np.uint64)
    return (((bits >> np.uint64(32)) * n) >> np.uint64(32)).astype(np.int64)


def _split_id(split: str) -> int:
    if split not in SPLITS:
        raise PosymError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return SPLITS.index(split)


# ---- generation ----------------------------------------------------------------------------------


def _schedule(config: TaskConfig, key: tuple, index: np.ndarray) -> tuple[np.ndarray, ...]:
    """Hop, answer position (in the effective window) and answer value index(es) per sample.

    Returns (hops, pos, values) where values is [n] symbol index (number) or [n, 2] (letter,
    number index). Exact balance per block: see the module docstring.
    """
    H, T = config.max_hops, config.target_size
    bsz = config.block_size
    m = bsz // H
    block, offset = index // bsz, index % bsz  # [n]
    blocks, inverse = np.unique(block, return_inverse=True)  # [nb]
    # A random permutation per block: argsort of hashed keys (ties have probability ~2**-64).
    slot = np.argsort(_hash(*key, _S_SLOT, blocks[:, None], np.arange(bsz)), axis=1)  # [nb, bsz]
    s = slot[inverse, offset]  # [n]
    hops, j = s % H + 1, s // H

    def balanced(stream: int, size: int) -> np.ndarray:
        # [nb, H, m] independent permutations of 0..m-1 per block and hop class
        perm = np.argsort(_hash(*key, stream, blocks[:, None, None], np.arange(H)[:, None], np.arange(m)), axis=2)
        return perm[inverse, hops - 1, j] % size  # [n]

    pos = balanced(_S_POS, T)
    if config.task == "number":
        return hops, pos, balanced(_S_VAL, config.alphabet_size)
    return hops, pos, np.stack([balanced(_S_VAL, config.alphabet_size), balanced(_S_ANS_NUM, config.int_range)], axis=1)


def _chains(config: TaskConfig, key: tuple, index: np.ndarray, hops: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Base chain positions (no extra_target) [n, max_hops + 1]: query, intermediates, answer."""
    T, P, H = config.target_size, config.pretarget_size, config.max_hops
    n = len(index)
    rows = np.arange(n)
    chain = np.full((n, H + 1), -1, dtype=np.int64)
    chain[:, 0] = T + P
    if H > 1:
        # A uniformly random (h-1)-subset of the pre-target positions, visited right to left.
        order = np.argsort(_hash(*key, _S_SUBSET, index[:, None], np.arange(P)), axis=1)  # [n, P]
        picked = T + order[:, : H - 1]  # [n, H-1]
        picked[np.arange(H - 1) >= (hops - 1)[:, None]] = -1
        chain[:, 1:H] = -np.sort(-picked, axis=1)  # descending; -1 padding goes last
    chain[rows, hops] = pos
    return chain


def _number(config, key, index, hops, pos, values, chain):
    """Number-task base ids [n, T+P+1], answers [n] and extra-target ids [n, E]."""
    T, P, R, A = config.target_size, config.pretarget_size, config.int_range, config.alphabet_size
    n, rows = len(index), np.arange(len(index))
    col = np.arange(T + P + 1)
    ids = np.empty((n, T + P + 1), dtype=np.int64)
    ids[:, :T] = R + 1 + _below(_hash(*key, _S_TARGET, index[:, None], col[:T]), A)  # [n, T]
    # decoy at position p: a backward offset 1..p (R >= T + P > p, so it is a valid integer)
    ids[:, T:] = 1 + _below(_hash(*key, _S_DECOY, index[:, None], col[T:]), col[T:])  # [n, P+1]
    for k in range(config.max_hops):
        on = hops > k  # rows whose chain has a k-th hop
        ids[rows[on], chain[on, k]] = chain[on, k] - chain[on, k + 1]
    answer = R + 1 + values
    ids[rows, pos] = answer
    extra_cols = np.arange(config.extra_target)
    extra = R + 1 + _below(_hash(*key, _S_EXTRA, index[:, None], extra_cols), A)  # [n, E]
    return ids, answer, extra


def _letter_ids(config: TaskConfig, first, second, target: bool):
    """Token ids of (letter, number index) target pairs or (letter, letter) pointer pairs."""
    L, R = config.alphabet_size, config.int_range
    return 1 + first * R + second if target else 1 + L * R + first * L + second


def _letter(config, key, index, hops, pos, values, chain):
    """Letter-task base ids [n, T+P+1], answers [n] and extra-target ids [n, E]."""
    T, P, L, R = config.target_size, config.pretarget_size, config.alphabet_size, config.int_range
    n, rows = len(index), np.arange(len(index))
    col = np.arange(T + P + 1)
    letter, number = values[:, 0], values[:, 1]
    # Random letter order with the answer letter first: perm[:, 0] = y_h, perm[:, h-k] = y_k,
    # perm[:, h:] = the non-hop letters, the pool for everything off the chain.
    keys = _hash(*key, _S_LETTERS, index[:, None], np.arange(L)) | np.uint64(1)  # [n, L]
    keys[rows, letter] = 0
    perm = np.argsort(keys, axis=1)  # [n, L]

    def other(stream: int, cols: np.ndarray) -> np.ndarray:  # [n, len(cols)] non-hop letters
        pick = _below(_hash(*key, stream, index[:, None], cols), (L - hops)[:, None])
        return perm[rows[:, None], hops[:, None] + pick]

    def numbers(stream: int, cols: np.ndarray) -> np.ndarray:  # [n, len(cols)] in 0..R-1
        return _below(_hash(*key, stream, index[:, None], cols), R)

    ids = np.empty((n, T + P + 1), dtype=np.int64)
    ids[:, :T] = _letter_ids(config, other(_S_X, col[:T]), numbers(_S_NUM, col[:T]), target=True)
    x = other(_S_X, col[T:])  # [n, P+1]; x[:, -1] is the query's first letter
    ids[:, T:] = _letter_ids(config, x, other(_S_Y, col[T:]), target=False)
    for k in range(config.max_hops):
        on = hops > k  # rows whose chain has a k-th hop
        # chain token k is (y_k, y_{k+1}), with y_0 the query's non-hop first letter
        first = x[on, -1] if k == 0 else perm[rows[on], hops[on] - k]
        second = perm[rows[on], hops[on] - k - 1]
        ids[rows[on], chain[on, k]] = _letter_ids(config, first, second, target=False)
    answer = _letter_ids(config, letter, number, target=True)
    ids[rows, pos] = answer
    # extra target tokens: non-hop letters only, so no lookup gains a second match
    extra_cols = np.arange(config.extra_target)
    extra = _letter_ids(config, other(_S_EXTRA, extra_cols), numbers(_S_EXTRA_NUM, extra_cols), target=True)
    return ids, answer, extra


def generate(config: TaskConfig, n: int, seed: int, split: str = "train", start: int = 0) -> Samples:
    """Samples start .. start+n-1 of (config, seed, split); each depends only on its own index.

    Sample i is the same whatever n and start select it, and with extra_target = E it is the
    E = 0 sample i with E extra target tokens in front (chain positions shifted by E).
    """
    for name, value in [("n", n), ("seed", seed), ("start", start)]:
        if check_int(name, value, 0) >= 2**63:
            raise PosymError(f"{name} must be below 2**63, got {value}")
    key = (int(seed), _split_id(split))
    index = np.arange(start, start + n, dtype=np.int64)  # [n]
    hops, pos, values = _schedule(config, key, index)
    chain = _chains(config, key, index, hops, pos)  # [n, H+1] base positions
    build = _number if config.task == "number" else _letter
    base, answer, extra = build(config, key, index, hops, pos, values, chain)
    E = config.extra_target
    input_ids = np.concatenate([extra, base], axis=1)  # [n, seq_len]
    return Samples(
        input_ids=mark(config, input_ids) if config.markers else input_ids,
        answer=answer,
        hops=hops,
        chain=np.where(chain >= 0, chain + E, -1),  # [n, H+1]
        answer_pos=pos + E,
    )


def mark(config: TaskConfig, input_ids: np.ndarray) -> np.ndarray:
    """Unmarked [n, seq_len] ids with every target-window token replaced by its slot-marked id."""
    E, T, symbols = config.extra_target, config.target_size, config.symbol_ids
    window = E + T
    slot = (np.arange(window) - E) % T  # [E+T] cyclic slot of each target-window position
    out = input_ids.copy()
    out[:, :window] = config.marker_base + slot * len(symbols) + (input_ids[:, :window] - symbols.start)
    return out


def unmark(config: TaskConfig, ids: np.ndarray) -> np.ndarray:
    """Token ids with every slot-marked id replaced by its plain token (others unchanged)."""
    ids = np.asarray(ids, dtype=np.int64)
    marked = ids >= config.marker_base
    plain = config.symbol_ids.start + (ids - config.marker_base) % len(config.symbol_ids)
    return np.where(marked, plain, ids)


def iter_batches(
    config: TaskConfig, batch_size: int, seed: int, split: str = "train", start: int = 0, stop: int | None = None
) -> Iterator[Samples]:
    """Consecutive batches of samples from index `start` on, forever or until index `stop`."""
    check_int("batch_size", batch_size, 1)
    while stop is None or start < stop:
        size = batch_size if stop is None else min(batch_size, stop - start)
        yield generate(config, size, seed, split, start)
        start += size


# ---- text and checking ---------------------------------------------------------------------------


def _symbol_name(k: int) -> str:
    """Bijective base-26 name of symbol k (0-based): a..z, aa..az, ba.., so 119 -> dp."""
    name, k = "", k + 1
    while k:
        k, r = divmod(k - 1, 26)
        name = chr(97 + r) + name
    return name


def offset_ids(config: TaskConfig) -> dict[int, int]:
    """Number task: token id -> the backward offset it encodes (integers 1..R have ids 1..R); {} for letter."""
    return {i: i for i in range(1, config.int_range + 1)} if config.task == "number" else {}


@functools.lru_cache(maxsize=32)
def token_names(config: TaskConfig) -> tuple[str, ...]:
    """Text of every token id (index = id); PAD is "<pad>"."""
    names = ["<pad>"]
    if config.task == "number":
        names += [str(v) for v in range(1, config.int_range + 1)]
        names += [_symbol_name(k) for k in range(config.alphabet_size)]
    else:
        letters = [chr(97 + x) for x in range(config.alphabet_size)]
        names += [f"{x}{v}" for x in letters for v in range(1, config.int_range + 1)]
        names += [x + y for x in letters for y in letters]
    if config.markers:
        names += [f"{names[i]}@{s}" for s in range(config.target_size) for i in config.symbol_ids]
    return tuple(names)


@functools.lru_cache(maxsize=32)
def _token_ids(config: TaskConfig) -> dict[str, int]:
    return {name: i for i, name in enumerate(token_names(config))}


def encode(config: TaskConfig, text: str) -> list[int]:
    """Token ids of whitespace-separated token text; "|" window separators are ignored."""
    table = _token_ids(config)
    ids = []
    for word in text.split():
        if word == "|":
            continue
        if word not in table:
            raise PosymError(f"{word!r} is not a token of the {config.task} task with this config")
        ids.append(table[word])
    return ids


def decode(config: TaskConfig, ids) -> str:
    """Space-separated text of a sequence of token ids."""
    names = token_names(config)
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
        if not 0 <= i < len(names):
            raise PosymError(f"token id {i} is outside the {config.task} vocabulary (0..{len(names) - 1})")
        out.append(names[i])
    return " ".join(out)


def texts(config: TaskConfig, input_ids: np.ndarray) -> list[str]:
    """`decode` of every row of [n, seq_len] ids (vectorised lookup)."""
    names = np.asarray(token_names(config), dtype=object)
    return [" ".join(row) for row in names[input_ids].tolist()]


@functools.lru_cache(maxsize=32)
def _letter_tables(config: TaskConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per token id: first letter, second letter (-1 for target pairs and PAD), is-target flag."""
    L, R = config.alphabet_size, config.int_range
    first = np.full(config.vocab_size, -1, dtype=np.int64)
    second = np.full(config.vocab_size, -1, dtype=np.int64)
    ids = np.arange(1, 1 + L * R)
    marked = np.arange(config.marker_base, config.vocab_size)  # empty without markers
    first[ids] = (ids - 1) // R
    first[marked] = (marked - config.marker_base) % (L * R) // R  # pair (letter, number) in a slot
    ids = np.concatenate([ids, marked])
    ptr = np.arange(1 + L * R, config.marker_base)
    first[ptr], second[ptr] = (ptr - 1 - L * R) // L, (ptr - 1 - L * R) % L
    is_target = np.zeros(config.vocab_size, dtype=bool)
    is_target[ids] = True
    return first, second, is_target


def follow_chain(config: TaskConfig, input_ids) -> tuple[int, list[int]]:
    """Follow the pointer chain from the last token using the tokens alone.

    Returns (answer token id, positions from the query to the answer); with slot markers the answer
    is the plain token the chain lands on, without its slot. Raises `ChainError` when
    the chain is not well defined: a non-pointer query, a jump before position 0, a PAD or unknown
    token, or (letter task) a lookup with no or several earlier matches.
    """
    ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)  # [seq]
    if len(ids) == 0:
        raise ChainError("the sequence is empty")
    if ids.min() < 1 or ids.max() >= config.vocab_size:
        raise ChainError(f"the sequence holds PAD or ids outside 1..{config.vocab_size - 1}")
    pos = len(ids) - 1
    chain = [pos]
    if config.task == "number":
        R = config.int_range
        if ids[pos] > R:
            raise ChainError("the query is a symbol, not an offset")
        while ids[pos] <= R:  # an integer: jump back
            nxt = pos - int(ids[pos])
            if nxt < 0:
                raise ChainError(f"the offset {ids[pos]} at position {pos} jumps before position 0")
            pos = nxt
            chain.append(pos)
        return int(unmark(config, ids[pos])), chain
    first, second, is_target = _letter_tables(config)
    if is_target[ids[pos]]:
        raise ChainError("the query is a (letter, number) token, not a (letter, letter) pointer")
    letters = first[ids]  # [seq]
    while not is_target[ids[pos]]:
        want = second[ids[pos]]
        matches = np.flatnonzero(letters[:pos] == want)
        if len(matches) != 1:
            where = "no" if len(matches) == 0 else f"{len(matches)} ({', '.join(map(str, matches))})"
            raise ChainError(f"the lookup of letter {chr(97 + want)!r} from position {pos} has {where} earlier matches")
        pos = int(matches[0])
        chain.append(pos)
    return int(unmark(config, ids[pos])), chain


# ---- answers of a judged model (Appendix H) -----------------------------------------------------


MAX_STORED = 200
"""Characters of a predicted answer kept in bench.parquet: a runaway answer is stored as its prefix."""


def reply_answer(reply: str) -> str:
    """The first word of a chat reply (inside a ``` fence if it opens with one), without surrounding
    punctuation or quotes, at most MAX_STORED characters."""
    text = reply.strip()
    if text.startswith("```"):  # ```\nanswer\n``` or ```text\nanswer```: the fenced body
        body = text[3:].split("```", 1)[0]
        lines = body.split("\n", 1)
        text = lines[1] if len(lines) > 1 and lines[1].strip() else lines[0]
    words = text.split()
    return words[0].strip(".,;:!?\"'`*()[]")[:MAX_STORED] if words else ""


def same_answer(predicted: str, answer: str) -> bool:
    """Appendix H's rule: the reply's first word (`reply_answer`) is the whole answer, case-insensitive.

    >>> same_answer(reply_answer("E3."), "e3"), same_answer(reply_answer("e3x"), "e3")
    (True, False)
    """
    return predicted.lower() == answer.lower()
