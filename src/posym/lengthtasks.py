"""Length-controlled prompt families for real models: the answer is fixed, only the length grows.

The question issue 33 asks of a head label is whether it predicts what happens on longer inputs. That
needs a task the model solves at a base length, lengthened without changing what is asked. Every
prompt here is built from token ids (the model's own tokenizer, one segment at a time, so lengths are
exact and prompts of one length batch without padding):

    [prefix] [facts] <insert point> [question]        variant "between": distractors go here,
    <insert point> [prefix] [facts] [question]        variant "before":  distractors go first,

so in "between" the distance from the facts to the question grows with the length, in "before" only
the absolute positions do. The distractor material is neutral filler sentences (`FILLER`), drawn per
prompt from its own seeded stream, so a prompt's filler at length 2L starts with its filler at L.
Every prompt of a family is padded with filler to the family's base length B (the longest core
prompt plus a little), and the lengths are factor x B for factors 1, 2, 4, 8, 16.

A token of the base prompt at position p sits at `position_map(p)` in every longer version (p below
the insert point stays, the rest move by the inserted count), which is how a head's base-length key
is followed to longer inputs (`posym.core.retention.base_tracking`). The model is judged on its next
token: correct when its argmax is the answer's first token (every answer here is one token, and the
candidate answers of a prompt have distinct first tokens).

Formats (`FORMATS`), each with a marked twin (`markers=True`: every fact carries a unique marker that
the question repeats, the brief's prompt advice):
- kv-code    "The code of river is 7. ... What is the code of river? The code of river is" -> " 7"
- kv-list    "river = 7\\nstone = 3\\n...\\nriver =" -> " 7"
- kv-fewshot "river: 7\\n...\\nQuestion: stone?\\nAnswer: 3\\nQuestion: river?\\nAnswer:" -> " 7"
- copy       "List: a, b, c, ... .\\nThe same list again: a, b," -> " c" (the induction pattern)
- possession "Emma has a cat. ... What does Emma have? Emma has a" -> " cat"
- arithmetic "a = 7. b = 2. ... What is a + b? a + b =" -> " 9" (the brief's arithmetic flavour)

>>> fam = LengthFamily("kv-list", n_facts=2)
>>> core = fam.core(seed=0, index=0)
>>> core.question[-1], core.answer in "123456789"
(' =', True)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from posym.errors import PosymError

FORMATS = ("kv-code", "kv-list", "kv-fewshot", "copy", "possession", "arithmetic")
VARIANTS = ("between", "before")
FACTORS = (1, 2, 4, 8, 16)
"""Length factors of every family: 1x (the base length) to 16x."""

KEYS = ("river", "stone", "chair", "garden", "mirror", "candle", "forest", "window", "bottle", "pencil",
        "rabbit", "castle", "dragon", "planet", "silver", "orange", "violin", "tiger", "lemon", "ocean",
        "rocket", "basket", "button", "apple", "cloud", "horse", "table", "bridge", "flower", "island")
"""Words the key-value and copy formats name (those the model's tokenizer splits are skipped)."""
OWNERS = ("Emma", "Liam", "Olivia", "Noah", "Ava", "Lucas", "Mia", "Ethan", "Sofia", "Jack", "Chloe", "Henry")
OBJECTS = ("cat", "dog", "book", "kite", "hat", "ball", "cup", "key", "map", "pen", "bag", "car", "drum", "lamp")
VARIABLES = ("a", "b", "c", "d", "x", "y", "z", "m", "n", "p")
MARKERS = tuple(f"#{k}" for k in range(11, 100))
"""Markers of the marked variants: each fact of a prompt gets a distinct one."""

FILLER = (
    "The morning was quiet and the streets were still empty.", "A light rain fell over the hills for an hour.",
    "Nobody in the village remembered such a long winter.", "The train left the station a few minutes late.",
    "She opened the window and looked at the garden below.", "The old clock in the hall struck nine.",
    "Two boats were waiting at the end of the pier.", "The road turned north and climbed towards the pass.",
    "He wrote a short letter and put it in the drawer.", "The market was busy with people buying bread.",
    "A cold wind came down from the mountains at night.", "The children played in the park until sunset.",
    "The library closed early on the last day of the month.", "Fresh snow covered the fields by the river.",
    "The meeting was moved to the large room upstairs.", "Birds gathered on the roof of the empty barn.",
    "The kettle whistled while the bread was still warm.", "A narrow path led through the woods to the lake.",
    "The lights of the town appeared one by one.", "They walked slowly along the edge of the cliff.",
    "The shop on the corner sold maps and old postcards.", "Clouds drifted over the valley in the afternoon.",
    "The bus stopped at every village on the way.", "A dog barked somewhere behind the houses.",
    "The painter mixed blue and white on a wooden board.", "Water ran down the stone steps after the storm.",
    "The guests arrived before the soup was ready.", "The bridge was closed for repairs all summer.",
    "A small boat drifted near the rocks at low tide.", "The teacher wrote the date at the top of the board.",
)
"""Neutral distractor sentences: no key, number, name or object of the formats appears in them."""


@dataclass(frozen=True)
class Core:
    """One question before lengthening: text segments and the answer."""

    prefix: str
    facts: list[str]
    question: list[str]
    answer: str
    """The answer as it continues the prompt (one token, leading space included)."""
    candidates: list[str]
    """Every answer the prompt offers (the facts' values), for the one-token check."""


@dataclass
class LengthFamily:
    """A prompt format lengthened one way (what `posym llm-study`'s length stages ask a model)."""

    format: str = "kv-code"
    """One of FORMATS."""
    variant: str = "between"
    """Where the distractors go: 'between' the facts and the question, or 'before' everything."""
    markers: bool = False
    """Tag every fact with a unique marker that the question repeats."""
    n_facts: int = 4
    """Facts (key-value pairs, list items, owners, variables) per prompt."""
    factors: list[int] = field(default_factory=lambda: list(FACTORS))
    """Lengths as multiples of the base length."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise PosymError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.variant not in VARIANTS:
            raise PosymError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if not 2 <= self.n_facts <= 8:
            raise PosymError(f"n_facts must lie in 2..8 (one-digit answers), got {self.n_facts}")
        if not self.factors or min(self.factors) < 1 or 1 not in self.factors:
            raise PosymError(f"factors must be positive and include 1 (the base length), got {self.factors}")

    @property
    def name(self) -> str:
        return f"{self.format}/{self.variant}" + ("/marked" if self.markers else "")

    def core(self, seed: int, index: int, keys=KEYS) -> Core:
        """The index-th question of this family (a pure function of seed, index and the word lists)."""
        rng = random.Random(f"{seed}:{self.format}:{index}")
        n = self.n_facts
        marks = rng.sample(MARKERS, n) if self.markers else [""] * n
        tag = [f"{m} " if m else "" for m in marks]
        if self.format in ("kv-code", "kv-list", "kv-fewshot"):
            words = rng.sample(list(keys), n)
            values = [str(v) for v in rng.sample(range(1, 10), n)]
            asked, shown = rng.sample(range(n), 2)
            if self.format == "kv-code":
                facts = [f" {tag[i]}The code of {w} is {v}." for i, (w, v) in enumerate(zip(words, values))]
                q = words[asked]
                question = [f"\nWhat is the code of {tag[asked]}{q}?", f" The code of {tag[asked]}{q} is"]
                prefix = "Remember the codes."
            elif self.format == "kv-list":
                facts = [f"\n{tag[i]}{w} = {v}" for i, (w, v) in enumerate(zip(words, values))]
                question = [f"\n{tag[asked]}{words[asked]}", " ="]
                prefix = "Values:"
            else:
                facts = [f"\n{tag[i]}{w}: {v}" for i, (w, v) in enumerate(zip(words, values))]
                question = [f"\n\nQuestion: {tag[shown]}{words[shown]}?\nAnswer: {values[shown]}",
                            f"\nQuestion: {tag[asked]}{words[asked]}?", "\nAnswer:"]
                prefix = "Values:"
            return Core(prefix, facts, question, f" {values[asked]}", [f" {v}" for v in values])
        if self.format == "copy":
            words = rng.sample(list(keys), max(n, 2) * 2)
            cut = rng.randrange(1, len(words))
            items = [f" {tag[i % n]}{w}," if i < len(words) - 1 else f" {tag[i % n]}{w}." for i, w in enumerate(words)]
            again = "".join(f" {tag[i % n]}{w}," for i, w in enumerate(words[:cut]))
            lead = f" {tag[cut % n]}".rstrip() if self.markers else ""
            return Core("List:", items, [f"\nThe same list again:{again}{lead}"], f" {words[cut]}",
                        [f" {w}" for w in words])
        if self.format == "possession":
            owners, objects = rng.sample(OWNERS, n), rng.sample(OBJECTS, n)
            asked = rng.randrange(n)
            facts = [f" {tag[i]}{o} has a {x}." for i, (o, x) in enumerate(zip(owners, objects))]
            who = f"{tag[asked]}{owners[asked]}"
            return Core("Here is who has what.", facts, [f"\nWhat does {who} have?", f" {who} has a"],
                        f" {objects[asked]}", [f" {x}" for x in objects])
        names = rng.sample(VARIABLES, n)
        values = rng.sample(range(1, 10), n)
        while True:  # two distinct variables whose sum is one digit
            i, j = rng.sample(range(n), 2)
            if values[i] + values[j] <= 9:
                break
            values = rng.sample(range(1, 10), n)
        facts = [f" {tag[k]}{v} = {x}." for k, (v, x) in enumerate(zip(names, values))]
        return Core("Here are some numbers.", facts,
                    [f"\nWhat is {tag[i]}{names[i]} + {tag[j]}{names[j]}?", f" {tag[i]}{names[i]} + {tag[j]}{names[j]} ="],
                    f" {values[i] + values[j]}", [f" {s}" for s in range(1, 10)])


@dataclass(frozen=True)
class LengthPrompt:
    """One prompt of a family at one length, as token ids."""

    family: str
    index: int
    factor: int
    length: int
    ids: list[int]
    answer: str
    answer_id: int
    insert_at: int
    """Position of the base prompt where distractors are inserted (0 for 'before')."""
    inserted: int
    """Distractor tokens beyond the base prompt's own (0 at the base length)."""
    query: int
    """The query position: the last token."""

    def position_map(self, base_position: int) -> int:
        """Where the token at `base_position` of the base prompt sits in this one."""
        return base_position if base_position < self.insert_at else base_position + self.inserted


class Builder:
    """Token-level prompt builder for one tokenizer: encodes segments one at a time, with the
    tokenizer's own BOS when it adds one, and checks the one-token answers."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        with_special = tokenizer("x").input_ids
        plain = tokenizer("x", add_special_tokens=False).input_ids
        self.bos = with_special[: len(with_special) - len(plain)] if with_special[-len(plain):] == plain else []
        self._cache: dict[str, list[int]] = {}
        self.keys = tuple(w for w in KEYS if len(self.encode(f" {w}")) == 1)
        if len(self.keys) < 16:
            raise PosymError(f"the tokenizer keeps only {len(self.keys)} of the key words whole; the length "
                             "families need 16")

    def encode(self, text: str) -> list[int]:
        if text not in self._cache:
            self._cache[text] = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        return self._cache[text]

    def filler(self, stream: str, n: int) -> list[int]:
        """The first n tokens of a prompt's own filler stream (seeded by `stream`)."""
        rng = random.Random(f"filler:{stream}")
        out: list[int] = []
        while len(out) < n:
            out += self.encode(" " + rng.choice(FILLER))
        return out[:n]

    def core_ids(self, core: Core) -> tuple[list[int], list[int], int]:
        """(ids before the insert point, ids after it, answer token) for the 'between' layout.

        The candidates' common leading tokens (SmolLM2 writes " 7" as " " + "7") end the prompt, so the
        answer is judged on its first token after them, which must differ from every other candidate's."""
        tokens = {c: self.encode(c) for c in dict.fromkeys([core.answer, *core.candidates])}
        common = 0
        while all(len(t) > common + 1 for t in tokens.values()) and len({t[common] for t in tokens.values()}) == 1:
            common += 1
        answer_id = tokens[core.answer][common]
        if sum(t[common] == answer_id for t in tokens.values()) > 1:
            raise PosymError(f"answer {core.answer!r} shares its first token with another candidate")
        head = self.bos + self.encode(core.prefix) + [t for f in core.facts for t in self.encode(f)]
        tail = [t for q in core.question for t in self.encode(q)] + tokens[core.answer][:common]
        return head, tail, answer_id


def base_length(family: LengthFamily, builder: Builder, n: int, seed: int) -> int:
    """The family's base length: its longest core prompt (over n questions) plus 2 tokens, rounded up to 8."""
    longest = max(sum(map(len, builder.core_ids(family.core(seed, i, builder.keys))[:2])) for i in range(n)) + 1
    return -(-(longest + 2) // 8) * 8


def build(family: LengthFamily, builder: Builder, n: int, *, seed: int = 0, base: int | None = None,
          max_positions: int | None = None) -> dict[int, list[LengthPrompt]]:
    """{factor: n prompts} of the family at every factor x the base length (the same questions).

    base: the base length (default `base_length`); a length past max_positions is a PosymError.
    """
    base = base or base_length(family, builder, n, seed)
    top = max(family.factors) * base
    if max_positions is not None and top > max_positions:
        raise PosymError(f"the {family.name} family reaches {top} tokens but the model has {max_positions} positions")
    out: dict[int, list[LengthPrompt]] = {f: [] for f in sorted(family.factors)}
    for i in range(n):
        core = family.core(seed, i, builder.keys)
        head, tail, answer_id = builder.core_ids(core)
        brk = builder.encode("\n") if family.variant == "before" else []  # ends the filler's last line
        own = base - len(head) - len(tail) - len(brk)  # filler of the base prompt itself
        if own < 0:
            raise PosymError(f"base length {base} is shorter than question {i} of {family.name}")
        bos = len(builder.bos)
        for factor in out:
            length = factor * base
            pad = builder.filler(f"{seed}:{family.format}:{i}", length - len(head) - len(tail) - len(brk))
            if family.variant == "between":
                ids, insert_at = head + pad + tail, len(head) + own
            else:  # the filler goes first (after the BOS, which stays the first token), then a line break
                ids, insert_at = head[:bos] + pad + brk + head[bos:] + tail, bos + own
            # the base prompt's own filler keeps its place; the extra tokens enter after it
            out[factor].append(LengthPrompt(family.name, i, factor, length, ids, core.answer, answer_id, insert_at,
                                            length - base, length - 1))
    return out
