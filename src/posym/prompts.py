"""Prompts: every prompt set posym scores a model on or judges it by, built or read from files.

- Prompt files (JSONL): token prompts for `posym score` / geometry / discrepancy (`read_token_prompts`;
  a line may hold "text" for the model's tokenizer instead of "input_ids") and text prompts for real
  models (`read_text_prompts`), both parsed by `jsonl_records`.
- Task prompts: `score_prompts` draws test-split samples of a task config (or reads a prompt file) with
  their query positions.
- Real-model prompt sets: the entity-attribute binding task of arXiv 2511.11579 (`binding_prompts`),
  the 1-hop number/letter puzzles of Appendix H of 2605.31558 (`bench_prompts`), `llm_prompts` (any
  of these, a JSONL file or one text) and `query_position` (which token is the query).
- Length-controlled families (`LengthFamily`, `Builder`, `build`), below.
- The atlas's prompt sets (`posym atlas`): needle-in-a-haystack prompts (`needle_prompts`), natural
  text (`natural_text`) and repeated random tokens (`repeated_tokens`).
- RULER-shaped long-context tasks (`posym kv-eval`): multi-key needles and variable tracking
  (`RulerTask`, `ruler_prompts`), lengthened as the families are, at the end.

Length-controlled prompt families for real models: the answer is fixed, only the length grows.

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
token: correct when its argmax is the answer's first token (the candidate answers of a prompt have
distinct first tokens), except the arithmetic-reasoning formats of `WHOLE`, whose answers have several
digits: those are judged on the whole answer (every answer token greedy, and no digit after it).

Formats (`FORMATS`), each with a marked twin (`markers=True`: every fact carries a unique marker that
the question repeats, the brief's prompt advice):
- kv-code    "The code of river is 7. ... What is the code of river? The code of river is" -> " 7"
- kv-list    "river = 7\\nstone = 3\\n...\\nriver =" -> " 7"
- kv-fewshot "river: 7\\n...\\nQuestion: stone?\\nAnswer: 3\\nQuestion: river?\\nAnswer:" -> " 7"
- copy       "List: a, b, c, ... .\\nThe same list again: a, b," -> " c" (the induction pattern)
- possession "Emma has a cat. ... What does Emma have? Emma has a" -> " cat"
- arithmetic "a = 7. b = 2. ... What is a + b? a + b =" -> " 9" (the brief's arithmetic flavour)
- arith-facts "Emma has 34 coins. ... How many coins do Emma and Liam have together? Together they have"
             -> " 86" (two-operand addition of two-digit operands stated as facts; whole answer)
- arith-chain "y = 9. b = 8. p = y + 9. x = p + 7. What is x? x =" -> " 25" (a three-step chain of
             assignments with distractor variables among them; whole answer)

A format spec (`parse_format`) adds difficulty knobs and the chat form: `kv-code:facts=8` (more facts),
`kv-code:facts=6:competing=3` (stale values of three keys, the asked one among them: "The old code of
river was 3."), `arith-facts:chat` (the model's chat template: the question as the user's turn, the
answer opening the assistant's).

>>> fam = LengthFamily("kv-list", n_facts=2)
>>> core = fam.core(seed=0, index=0)
>>> core.question[-1], core.answer
(' =', ' 7')
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from posym.core.qk import check_prompt
from posym.core.scores import check_query_mode, queries_for, task_prompts
from posym.core.swaps import resolve_queries
from posym.core.tasks import decode, generate, task_config
from posym.errors import PosymError
from posym.io import parse_json, quote
from posym.models import LoadedModel
from posym.resources import SAMPLE_BYTES_PER_TOKEN, check_bounds, check_count, sequence_bytes

# ---- prompt files (JSONL) and task prompts -------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, the expected continuation and where to query it."""

    text: str
    answer: str | None = None
    focus: str | None = None  # substring whose LAST occurrence's final token is the 'name' query
    meta: dict = field(default_factory=dict)


def read_text_prompts(path: str | os.PathLike) -> list[Prompt]:
    """Prompts from a JSONL file: one object per line with "text" and optional "answer" and "focus"."""
    path = Path(path)
    prompts = []
    for number, obj in jsonl_records(path):
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise PosymError(f'{path} line {number} must be an object with a "text" string')
        unknown = sorted(set(obj) - {"text", "answer", "focus"})
        if unknown:
            raise PosymError(f"{path} line {number} has unknown key {unknown[0]!r} (text, answer, focus)")
        for key, value in obj.items():
            if isinstance(value, str) and not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:  # JSON's "\\ud800": no tokenizer reads it
                    raise PosymError(
                        f'{path} line {number}: "{key}" holds a lone surrogate (U+{ord(value[exc.start]):04X}), '
                        "which is not Unicode text"
                    ) from None
        prompts.append(Prompt(obj["text"], obj.get("answer"), obj.get("focus"), {"set": path.name, "index": number}))
    return prompts


def jsonl_records(path) -> list[tuple[int, object]]:
    """The parsed non-blank lines of a JSONL prompt file, each with its line number (from 1).

    A missing file, a line that is not JSON or a file without records is a PosymError; what a
    record must hold is the caller's to check (`read_token_prompts`, `read_text_prompts`)."""
    path = Path(path)
    if not path.is_file():
        raise PosymError(f"prompt file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PosymError(f"prompt file {path} is not UTF-8 text (byte {exc.start} cannot be decoded)") from None
    records = []
    # lines end at \n only: str.splitlines() would also split at a raw U+2028 inside a JSON string
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        records.append((number, parse_json(line, f"{path} line {number}")))
    if not records:
        raise PosymError(f"prompt file {path} holds no prompts")
    return records


def read_token_prompts(path, model, encode=None) -> list[dict]:
    """A prompt file: one JSON object per line with "input_ids" (or "text", encoded by `encode`, the
    model's tokenizer) and optional "queries" (positions) and "chain" (posym data JSONL); returns
    [{"input_ids", "queries", "chain"}] (None when absent). Every problem is a PosymError naming the line."""
    prompts = []
    for number, record in jsonl_records(path):
        where = f"{path} line {number}"
        if isinstance(record, dict) and record.get("input_ids") is None and isinstance(record.get("text"), str):
            if encode is None:
                raise PosymError(f'{where} is text, but this model has no tokenizer; give "input_ids"')
            record = {**record, "input_ids": encode(record["text"])}
        if not isinstance(record, dict) or record.get("input_ids") is None:
            raise PosymError(f'{where} must be a JSON object with an "input_ids" list or a "text" string')
        fields = {}
        for key in ("input_ids", "queries", "chain"):
            value = record.get(key)
            if value is not None and (not isinstance(value, list) or not all(type(v) is int for v in value)):
                raise PosymError(f"{where}: {key} must be a list of integers")
            if value is not None and not all(-(2**63) <= v < 2**63 for v in value):  # beyond any tensor's integers
                raise PosymError(f"{where}: {key} holds an integer out of range ({quote(max(value, key=abs))})")
            fields[key] = value
        if len(fields["input_ids"]) < 3:
            raise PosymError(
                f"{where}: a prompt needs at least 3 tokens (two keys to swap before the query), got "
                f"{len(fields['input_ids'])}"
            )
        ids = check_prompt(model, fields["input_ids"], where)
        if fields["queries"] is not None:
            resolve_queries(fields["queries"], len(ids), where)
        prompts.append({**fields, "input_ids": ids.tolist()})
    return prompts


def score_prompts(model, *, task_config=None, n_prompts=100, seed=0, prompts_file=None, queries=None, encode=None):
    """(input_ids, per-prompt queries) for `posym score`, geometry and discrepancy: test-split task
    samples or a prompt file (text lines encoded by `encode`, the model's tokenizer).

    queries: "last", "all", "hops" (needs chains: task samples or a "chain" on every file line) or
    None (a file's own "queries" where given, else the last token).
    """
    check_query_mode(queries)
    if prompts_file is not None:
        records = read_token_prompts(prompts_file, model, encode)
        return [r["input_ids"] for r in records], queries_for(records, queries)
    if task_config is None:
        raise PosymError("give --task or --prompts: the model carries no posym task config")
    check_count("--n", n_prompts, sequence_bytes(task_config), what="prompt")
    return task_prompts(task_config, n_prompts, seed, queries)


# ---- real-model prompt sets: binding (2511) and Appendix H (2605) ---------------------------


NAMES = ("Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack", "Laura", "Mark")
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink", "brown")


def binding_prompts(n: int, *, n_facts: int = 4, seed: int = 0) -> list[Prompt]:
    """Entity-attribute binding prompts of 2511: 'Alice likes red. ... What colour does Alice like? Alice likes'."""
    if not 2 <= n_facts <= min(len(NAMES), len(COLOURS)):
        raise PosymError(f"n_facts must be between 2 and {min(len(NAMES), len(COLOURS))}, got {n_facts}")
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        names, colours = rng.sample(NAMES, n_facts), rng.sample(COLOURS, n_facts)
        asked = rng.randrange(n_facts)
        facts = " ".join(f"{a} likes {c}." for a, c in zip(names, colours))
        text = f"{facts} What colour does {names[asked]} like? {names[asked]} likes"
        prompts.append(Prompt(text, colours[asked], names[asked], {"set": "binding", "index": i}))
    return prompts


QUERIES = ("last", "name")
"""The query position of a prompt that llm-scores scores: its last token, or the final token of its focus."""


def query_position(loaded: LoadedModel, prompt: Prompt, query: str) -> int:
    """Token index scored as the query: 'last' token, or the final token of the prompt's focus ('name')."""
    if query == "last":
        return len(loaded.tokenizer(prompt.text).input_ids) - 1
    if query not in QUERIES:
        raise PosymError(f"query must be 'last' or 'name', got {query!r}")
    if not prompt.focus or prompt.focus not in prompt.text:
        raise PosymError("--query name needs prompts with a focus name (the binding set, or a JSONL 'focus')")
    if not loaded.tokenizer.is_fast:
        raise PosymError("--query name needs a fast tokenizer (tokenizer.json) to map characters to tokens")
    last_char = prompt.text.rindex(prompt.focus) + len(prompt.focus) - 1
    return loaded.tokenizer(prompt.text).char_to_token(last_char)


def llm_prompts(name: str, *, text: str | None = None, n: int = 20, size: int = 12, seed: int = 0) -> list[Prompt]:
    """--text, a built-in set (binding, number, letter) or a JSONL file, as Prompts."""
    if text is not None:
        if name != "binding":  # the default set: any other --prompts was asked for and would be ignored
            raise PosymError(f"--text and --prompts {name} both say which prompts to score; give one of them")
        return [Prompt(text, meta={"set": "text", "index": 0})]
    check_bounds({"--n": n, "--size": size, "--seed": seed})
    if name == "binding":
        return binding_prompts(n, seed=seed)
    if name in ("number", "letter"):
        return bench_prompts(name, size, n, seed=seed)
    if name.endswith(".jsonl") or Path(name).is_file():
        return read_text_prompts(name)
    raise PosymError(f"--prompts must be binding, number, letter or a JSONL file, got {name!r}")


INSTRUCTIONS = {
    "number": (
        "Each puzzle below is one line of tokens separated by spaces. The first {target} tokens are "
        "symbols, the next {pretarget} are whole numbers, and the final token is a whole number n. "
        "Start at the final token, step n tokens to the left, and give the symbol you reach. "
        "Reply with that symbol and nothing else."
    ),
    "letter": (
        "Each puzzle below is one line of tokens separated by spaces. The first {target} tokens are a "
        "letter followed by a digit, and every later token is a pair of letters. Read the second letter "
        "of the final token, find the one earlier token that begins with that letter, and give that "
        "token. Reply with that token and nothing else."
    ),
}


MARKER_NOTE = {
    "number": (
        " Each symbol is tagged with @ and its place in the line, counting from 0, so the symbol n steps "
        "to the left of the final token is the one tagged @{last} minus n. Reply without the tag."
    ),
    "letter": (
        " Each of the first {target} tokens is tagged with @ and its place in the line, counting from 0; "
        "the tag is not part of the token. Reply without the tag."
    ),
}


def bench_prompts(task: str, size: int, n: int, *, seed: int = 0, markers: bool = False) -> list[Prompt]:
    """1-hop Appendix H prompts (our wording): instructions, three worked examples, then the puzzle.

    `size` is the target-window size; the pre-target window keeps the paper's 8 tokens. Puzzles
    come from the test split and worked examples from the train split, both of `seed` (= run).
    `markers` tags the target-window tokens with their slot (module docstring); the puzzles, and
    the answers (always untagged), are the same as without it.
    """
    if task not in INSTRUCTIONS:
        raise PosymError(f"task must be number or letter, got {task!r}")
    check_count("--size", size, 4 * 2 * SAMPLE_BYTES_PER_TOKEN, what="target-window token of one prompt")
    extra = {"int_range": size + 8} if task == "number" else {}
    config = task_config(task, target_size=size, max_hops=1, markers=bool(markers), **extra)
    check_count(
        "--n", n, 4 * sequence_bytes(config), what=f"prompt of target-window size {size}"
    )  # 3 examples + the puzzle
    puzzles = generate(config, n, seed, "test")
    examples = generate(config, 3 * n, seed, "train")
    head = INSTRUCTIONS[task] + (MARKER_NOTE[task] if markers else "")
    head = head.format(target=size, pretarget=config.pretarget_size, last=config.query_pos)

    def answer(samples, i: int) -> str:  # the plain token, also with markers (posym.core.tasks)
        return decode(config, samples.answer[i : i + 1])

    prompts = []
    for i in range(n):
        shots = [
            f"Example {k + 1}: {decode(config, examples.input_ids[3 * i + k])}\nAnswer: {answer(examples, 3 * i + k)}"
            for k in range(3)
        ]
        body = "\n\n".join([head, *shots, f"Puzzle: {decode(config, puzzles.input_ids[i])}\nAnswer:"])
        prompts.append(
            Prompt(body, answer(puzzles, i), None, {"set": task, "size": size, "index": i, "markers": bool(markers)})
        )
    return prompts


# ---- length-controlled families ----------------------------------------------------------------


FORMATS = ("kv-code", "kv-list", "kv-fewshot", "copy", "possession", "arithmetic", "arith-facts", "arith-chain")
WHOLE = ("arith-facts", "arith-chain")
"""Formats judged on the whole answer (several tokens: every one greedy, then no digit that would go on),
not on the next token alone."""
KNOBS = ("facts", "competing", "chat")
"""What a format spec may add to a format (`parse_format`): FORMAT[:facts=N][:competing=K][:chat]."""
VARIANTS = ("between", "before")
FACTORS = (1, 2, 4, 8, 16)
"""Length factors of every family: 1x (the base length) to 16x."""

KEYS = (
    "river",
    "stone",
    "chair",
    "garden",
    "mirror",
    "candle",
    "forest",
    "window",
    "bottle",
    "pencil",
    "rabbit",
    "castle",
    "dragon",
    "planet",
    "silver",
    "orange",
    "violin",
    "tiger",
    "lemon",
    "ocean",
    "rocket",
    "basket",
    "button",
    "apple",
    "cloud",
    "horse",
    "table",
    "bridge",
    "flower",
    "island",
)
"""Words the key-value and copy formats name (those the model's tokenizer splits are skipped)."""
OWNERS = ("Emma", "Liam", "Olivia", "Noah", "Ava", "Lucas", "Mia", "Ethan", "Sofia", "Jack", "Chloe", "Henry")
OBJECTS = ("cat", "dog", "book", "kite", "hat", "ball", "cup", "key", "map", "pen", "bag", "car", "drum", "lamp")
VARIABLES = ("a", "b", "c", "d", "x", "y", "z", "m", "n", "p")
MARKERS = tuple(f"#{k}" for k in range(11, 100))
"""Markers of the marked variants: each fact of a prompt gets a distinct one."""

FILLER = (
    "The morning was quiet and the streets were still empty.",
    "A light rain fell over the hills for an hour.",
    "Nobody in the village remembered such a long winter.",
    "The train left the station a few minutes late.",
    "She opened the window and looked at the garden below.",
    "The old clock in the hall struck nine.",
    "Two boats were waiting at the end of the pier.",
    "The road turned north and climbed towards the pass.",
    "He wrote a short letter and put it in the drawer.",
    "The market was busy with people buying bread.",
    "A cold wind came down from the mountains at night.",
    "The children played in the park until sunset.",
    "The library closed early on the last day of the month.",
    "Fresh snow covered the fields by the river.",
    "The meeting was moved to the large room upstairs.",
    "Birds gathered on the roof of the empty barn.",
    "The kettle whistled while the bread was still warm.",
    "A narrow path led through the woods to the lake.",
    "The lights of the town appeared one by one.",
    "They walked slowly along the edge of the cliff.",
    "The shop on the corner sold maps and old postcards.",
    "Clouds drifted over the valley in the afternoon.",
    "The bus stopped at every village on the way.",
    "A dog barked somewhere behind the houses.",
    "The painter mixed blue and white on a wooden board.",
    "Water ran down the stone steps after the storm.",
    "The guests arrived before the soup was ready.",
    "The bridge was closed for repairs all summer.",
    "A small boat drifted near the rocks at low tide.",
    "The teacher wrote the date at the top of the board.",
)
"""Neutral distractor sentences: no key, number, name or object of the formats appears in them."""


def parse_format(spec: str) -> dict:
    """The fields of `LengthFamily` a format spec names: FORMAT, then optionally `:facts=N` (facts per
    prompt), `:competing=K` (kv-code: K stale values of the keys, the asked one first) and `:chat` (the
    model's chat format: the question as the user's turn, the answer as the assistant's).

    >>> parse_format("kv-code:facts=8:competing=1")
    {'format': 'kv-code', 'n_facts': 8, 'competing': 1}
    >>> parse_format("arith-facts:chat")
    {'format': 'arith-facts', 'chat': True}
    >>> parse_format("kv-code:size=3")
    Traceback (most recent call last):
    posym.errors.PosymError: format spec 'kv-code:size=3': each option is one of facts=N, competing=K, chat
    """
    base, *options = spec.split(":")
    out: dict = {"format": base}
    for option in options:
        key, eq, value = option.partition("=")
        if key == "chat" and not eq:
            out["chat"] = True
        elif key in ("facts", "competing") and eq and value.isdigit():
            out["n_facts" if key == "facts" else "competing"] = int(value)
        else:
            raise PosymError(f"format spec {spec!r}: each option is one of facts=N, competing=K, chat")
    return out


@dataclass(frozen=True)
class Core:
    """One question before lengthening: text segments and the answer."""

    prefix: str
    facts: list[str]
    question: list[str]
    answer: str
    """The answer as it continues the prompt (leading space included; one token unless `whole`)."""
    candidates: list[str]
    """Every answer the prompt offers (the facts' values), for the one-token check."""
    answer_facts: tuple[int, ...] = ()
    """The facts that bear the answer (indices into facts): the asked key's fact, or both operands'."""
    answer_values: tuple[str, ...] = ()
    """Per answer fact, the text in it whose last token bears the answer (the value as the fact spells it)."""
    cue: int = 1
    """How many trailing question segments are the completion cue (dropped in the chat form; 0: none, so
    the format has no chat form)."""
    reply: str = "Answer with the number only."
    """What the chat form asks for in place of the cue."""
    whole: bool = False
    """Judged on the whole answer (`WHOLE`)."""
    chat: bool = False
    """In the model's chat format (`Builder` wraps the question in it)."""


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
    competing: int = 0
    """kv-code only: stale values ("The old code of river was 3.") of this many keys, the asked key first,
    among the facts: values the answer competes with."""
    chat: bool = False
    """Ask in the model's chat format (the tokenizer's chat template): the question is the user's turn
    with the completion cue replaced by `Core.reply`, and the answer opens the assistant's."""

    def __post_init__(self) -> None:
        if ":" in self.format:  # a format spec (`parse_format`): its options set the fields
            for key, value in parse_format(self.format).items():
                setattr(self, key, value)
        if self.format not in FORMATS:
            raise PosymError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.variant not in VARIANTS:
            raise PosymError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if not 2 <= self.n_facts <= 8:
            raise PosymError(f"n_facts must lie in 2..8 (one-digit answers), got {self.n_facts}")
        if self.format == "arith-chain" and self.n_facts < 3:
            raise PosymError(f"arith-chain needs n_facts >= 3 (its chain has three steps), got {self.n_facts}")
        if self.competing and (self.format != "kv-code" or self.n_facts + self.competing > 9):
            raise PosymError(
                f"competing keys are a kv-code option with n_facts + competing <= 9 (distinct one-digit values), "
                f"got {self.format} with {self.n_facts} + {self.competing}"
            )
        if self.chat and self.format == "copy":
            raise PosymError("copy has no chat form (its question is its own completion cue)")
        if not self.factors or min(self.factors) < 1 or 1 not in self.factors:
            raise PosymError(f"factors must be positive and include 1 (the base length), got {self.factors}")

    @property
    def spec(self) -> str:
        """The format spec of this family (`parse_format`): the format, then the options that differ from
        the defaults."""
        return (
            self.format
            + (f":facts={self.n_facts}" if self.n_facts != 4 else "")
            + (f":competing={self.competing}" if self.competing else "")
            + (":chat" if self.chat else "")
        )

    @property
    def name(self) -> str:
        return f"{self.spec}/{self.variant}" + ("/marked" if self.markers else "")

    def core(self, seed: int, index: int, keys=KEYS) -> Core:
        """The index-th question of this family (a pure function of seed, index and the word lists), in the
        chat form when `chat`."""
        core = self._core(seed, index, keys)
        if not self.chat:
            return core
        question = core.question[: len(core.question) - core.cue]
        question[-1] += " " + core.reply
        return Core(
            core.prefix,
            core.facts,
            question,
            core.answer.lstrip(),  # the assistant's turn opens with the answer
            [c.lstrip() for c in core.candidates],
            core.answer_facts,
            core.answer_values,
            cue=0,
            reply=core.reply,
            whole=core.whole,
            chat=True,
        )

    def _core(self, seed: int, index: int, keys=KEYS) -> Core:
        rng = random.Random(f"{seed}:{self.format}:{index}")
        n = self.n_facts
        # the markers come from their own stream: a marked question is the unmarked one with tags (paired tests)
        marks = random.Random(f"{seed}:{self.format}:{index}:markers").sample(MARKERS, n) if self.markers else [""] * n
        tag = [f"{m} " if m else "" for m in marks]
        if self.format in ("kv-code", "kv-list", "kv-fewshot"):
            words = rng.sample(list(keys), n)
            values = [str(v) for v in rng.sample(range(1, 10), n)]
            asked, shown = rng.sample(range(n), 2)
            answer_fact, offered = asked, values  # the competing form moves the one and adds to the other
            if self.format == "kv-code":
                facts = [f" {tag[i]}The code of {w} is {v}." for i, (w, v) in enumerate(zip(words, values))]
                q = words[asked]
                question = [f"\nWhat is the code of {tag[asked]}{q}?", f" The code of {tag[asked]}{q} is"]
                prefix = "Remember the codes."
                if self.competing:  # stale codes of the asked key and competing - 1 others, shuffled in
                    stale = rng.sample(sorted(set(range(1, 10)) - {int(v) for v in values}), self.competing)
                    which = [asked, *rng.sample([k for k in range(n) if k != asked], self.competing - 1)]
                    fresh = facts[asked]  # the answer's fact, found again after the shuffle
                    facts += [f" {tag[k]}The old code of {words[k]} was {v}." for k, v in zip(which, stale)]
                    rng.shuffle(facts)
                    answer_fact, offered = facts.index(fresh), values + [str(v) for v in stale]
            elif self.format == "kv-list":
                facts = [f"\n{tag[i]}{w} = {v}" for i, (w, v) in enumerate(zip(words, values))]
                question = [f"\n{tag[asked]}{words[asked]}", " ="]
                prefix = "Values:"
            else:
                facts = [f"\n{tag[i]}{w}: {v}" for i, (w, v) in enumerate(zip(words, values))]
                question = [
                    f"\n\nQuestion: {tag[shown]}{words[shown]}?\nAnswer: {values[shown]}",
                    f"\nQuestion: {tag[asked]}{words[asked]}?",
                    "\nAnswer:",
                ]
                prefix = "Values:"
            return Core(
                prefix,
                facts,
                question,
                f" {values[asked]}",
                [f" {v}" for v in offered],
                (answer_fact,),
                (f" {values[asked]}",),
            )
        if self.format == "copy":
            words = rng.sample(list(keys), max(n, 2) * 2)
            cut = rng.randrange(1, len(words))
            items = [f" {tag[i % n]}{w}," if i < len(words) - 1 else f" {tag[i % n]}{w}." for i, w in enumerate(words)]
            again = "".join(f" {tag[i % n]}{w}," for i, w in enumerate(words[:cut]))
            lead = f" {tag[cut % n]}".rstrip() if self.markers else ""
            return Core(
                "List:",
                items,
                [f"\nThe same list again:{again}{lead}"],
                f" {words[cut]}",
                [f" {w}" for w in words],
                (cut,),
                (f" {words[cut]}",),
                cue=0,
            )
        if self.format == "possession":
            owners, objects = rng.sample(OWNERS, n), rng.sample(OBJECTS, n)
            asked = rng.randrange(n)
            facts = [f" {tag[i]}{o} has a {x}." for i, (o, x) in enumerate(zip(owners, objects))]
            who = f"{tag[asked]}{owners[asked]}"
            return Core(
                "Here is who has what.",
                facts,
                [f"\nWhat does {who} have?", f" {who} has a"],
                f" {objects[asked]}",
                [f" {x}" for x in objects],
                (asked,),
                (f" {objects[asked]}",),
                reply="Answer with one word.",
            )
        if self.format == "arith-facts":
            owners = rng.sample(OWNERS, n)
            counts = rng.sample(range(10, 50), n)  # two digits each, so the sum has two
            i, j = rng.sample(range(n), 2)
            facts = [f" {tag[k]}{o} has {c} coins." for k, (o, c) in enumerate(zip(owners, counts))]
            a, b = f"{tag[i]}{owners[i]}", f"{tag[j]}{owners[j]}"
            return Core(
                "Here is how many coins everyone has.",
                facts,
                [f"\nHow many coins do {a} and {b} have together?", " Together they have"],
                f" {counts[i] + counts[j]}",
                [f" {counts[i] + counts[j]}"],
                (i, j),
                (f" {counts[i]}", f" {counts[j]}"),
                whole=True,
            )
        if self.format == "arith-chain":
            names = rng.sample(VARIABLES, n)
            while True:  # x = a, y = x + b, z = y +- c, with z positive
                a, b, c = (rng.randrange(2, 10) for _ in range(3))
                sign = rng.choice("+-")
                if (z := a + b + (c if sign == "+" else -c)) > 0:
                    break
            x, y, w = names[:3]
            chain = [f" {tag[0]}{x} = {a}.", f" {tag[1]}{y} = {x} + {b}.", f" {tag[2]}{w} = {y} {sign} {c}."]
            facts = list(chain)
            for k, other in enumerate(names[3:], 3):  # distractor assignments anywhere among the chain's steps
                facts.insert(rng.randrange(len(facts) + 1), f" {tag[k]}{other} = {rng.randrange(2, 10)}.")
            return Core(
                "Work out the values.",
                facts,
                [f"\nWhat is {tag[2]}{w}?", f" {tag[2]}{w} ="],
                f" {z}",
                [f" {z}"],
                whole=True,
            )
        names = rng.sample(VARIABLES, n)
        values = rng.sample(range(1, 10), n)
        while True:  # two distinct variables whose sum is one digit
            i, j = rng.sample(range(n), 2)
            if values[i] + values[j] <= 9:
                break
            values = rng.sample(range(1, 10), n)
        facts = [f" {tag[k]}{v} = {x}." for k, (v, x) in enumerate(zip(names, values))]
        return Core(
            "Here are some numbers.",
            facts,
            [f"\nWhat is {tag[i]}{names[i]} + {tag[j]}{names[j]}?", f" {tag[i]}{names[i]} + {tag[j]}{names[j]} ="],
            f" {values[i] + values[j]}",
            [f" {s}" for s in range(1, 10)],
            (i, j),
            (f" {values[i]}", f" {values[j]}"),
        )


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
    answer_ids: tuple[int, ...] = ()
    """A format judged on its whole answer (`WHOLE`): the answer's tokens from `answer_id` on; () for the
    others (judged on `answer_id` alone)."""
    stops: tuple[int, ...] = ()
    """With `answer_ids`: tokens that would carry the answer on (digits), which the model must not
    continue it with."""
    answer_keys: tuple[int, ...] = ()
    """Positions of the answer-bearing tokens in this prompt (`Builder.answer_positions`, moved past any
    filler put before them): the keys a head must read to answer; empty where a format names none."""

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
        self.bos = with_special[: len(with_special) - len(plain)] if with_special[-len(plain) :] == plain else []
        self._cache: dict[str, list[int]] = {}
        self.chat = chat_parts(tokenizer, self.bos)
        """The chat template's text before and after the user's message, or None (no template)."""
        pairs = [self.encode(f"1{d}") for d in "0123456789"]
        # digits that carry a number on, when the tokenizer writes one digit per token (the WHOLE formats' stops)
        self.digits = tuple(p[-1] for p in pairs) if all(len(p) == 2 for p in pairs) else ()
        self.keys = tuple(w for w in KEYS if len(self.encode(f" {w}")) == 1)
        if len(self.keys) < 16:
            raise PosymError(
                f"the tokenizer keeps only {len(self.keys)} of the key words whole; the length families need 16"
            )

    def asks(self, spec: str) -> bool:
        """Whether this tokenizer can ask a format spec: not a chat form (`LengthFamily.chat`) without a
        chat template."""
        return self.chat is not None or not LengthFamily(spec).chat

    def encode(self, text: str) -> list[int]:
        if text not in self._cache:
            self._cache[text] = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        return self._cache[text]

    def answer_positions(self, core: Core) -> tuple[int, ...]:
        """Positions, in the 'between' layout's ids, of the tokens that bear the answer: per answer fact,
        the last occurrence in it of the last token of its answer value (a one-token check as the
        answer's own). A PosymError when the tokenizer splits the fact so that the value's token is absent."""
        position = len(self.bos) + len(self.encode(core.prefix))
        starts = []
        for fact in core.facts:
            starts.append(position)
            position += len(self.encode(fact))
        out = []
        for k, value in zip(core.answer_facts, core.answer_values):
            tokens, wanted = self.encode(core.facts[k]), self.encode(value)[-1]
            hits = [j for j, token in enumerate(tokens) if token == wanted]
            if not hits:
                raise PosymError(
                    f"the answer {value!r} is not a token of its fact {core.facts[k]!r} for this tokenizer"
                )
            out.append(starts[k] + hits[-1])
        return tuple(out)

    def filler(self, stream: str, n: int) -> list[int]:
        """The first n tokens of a prompt's own filler stream (seeded by `stream`)."""
        return self.filler_sentences(stream, n)[0]

    def filler_sentences(self, stream: str, n: int) -> tuple[list[int], list[int]]:
        """(`filler`'s n tokens, the offsets in them where a sentence starts)."""
        rng = random.Random(f"filler:{stream}")
        out: list[int] = []
        starts: list[int] = []
        while len(out) < n:
            starts.append(len(out))
            out += self.encode(" " + rng.choice(FILLER))
        return out[:n], [k for k in starts if k < n]

    def core_ids(self, core: Core) -> tuple[list[int], list[int], int]:
        """(ids before the insert point, ids after it, answer token) for the 'between' layout."""
        head, tail, answer = self.core_parts(core)[:3]
        return head, tail, answer[0]

    def core_parts(self, core: Core) -> tuple[list[int], list[int], list[int], int]:
        """(ids before the insert point, ids after it, the answer's ids, the leading ids that stay first).

        The candidates' common leading tokens (SmolLM2 writes " 7" as " " + "7") end the prompt, so the
        answer is judged on its first token after them, which must differ from every other candidate's;
        a WHOLE answer keeps all its tokens but the leading whitespace ones. In the chat form the
        template's text before the user's message follows the BOS (and stays first: the leading ids)."""
        tokens = {c: self.encode(c) for c in dict.fromkeys([core.answer, *core.candidates])}
        common = 0
        if core.whole:
            answer = tokens[core.answer]
            while common < len(answer) - 1 and not self.tokenizer.decode(answer[: common + 1]).strip():
                common += 1
        else:
            while all(len(t) > common + 1 for t in tokens.values()) and len({t[common] for t in tokens.values()}) == 1:
                common += 1
        answer_id = tokens[core.answer][common]
        if not core.whole and sum(t[common] == answer_id for t in tokens.values()) > 1:
            raise PosymError(f"answer {core.answer!r} shares its first token with another candidate")
        before, after = [], []
        if core.chat:
            if self.chat is None:
                raise PosymError("the model's tokenizer has no chat template: a format with :chat needs one")
            before, after = self.encode(self.chat[0]), self.encode(self.chat[1])
        lead = self.bos + before
        head = lead + self.encode(core.prefix) + [t for f in core.facts for t in self.encode(f)]
        tail = [t for q in core.question for t in self.encode(q)] + after + tokens[core.answer][:common]
        answer = tokens[core.answer][common:] if core.whole else [answer_id]
        return head, tail, answer, len(lead)


def chat_parts(tokenizer, bos: list[int]) -> tuple[str, str] | None:
    """(the text before, the text after) the user's message in the tokenizer's chat template with the
    generation prompt (the assistant's turn opened), or None without a template. A BOS the template
    writes is left out where the tokenizer adds its own (`Builder.bos`)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    mark = "POSYMUSERMESSAGE"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": mark}], add_generation_prompt=True, tokenize=False
    )
    before, _, after = text.partition(mark)
    if bos and tokenizer.bos_token and before.startswith(tokenizer.bos_token):
        before = before[len(tokenizer.bos_token) :]
    return before, after


def base_length(family: LengthFamily, builder: Builder, n: int, seed: int) -> int:
    """The family's base length: its longest core prompt (over n questions) plus 2 tokens, rounded up to 8."""
    longest = max(sum(map(len, builder.core_ids(family.core(seed, i, builder.keys))[:2])) for i in range(n)) + 1
    return -(-(longest + 2) // 8) * 8


def build(
    family: LengthFamily,
    builder: Builder,
    n: int,
    *,
    seed: int = 0,
    base: int | None = None,
    max_positions: int | None = None,
) -> dict[int, list[LengthPrompt]]:
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
        head, tail, answer, bos = builder.core_parts(core)
        answer_id = answer[0]
        whole = (tuple(answer), builder.digits) if core.whole else ((), ())
        brk = builder.encode("\n") if family.variant == "before" else []  # ends the filler's last line
        own = base - len(head) - len(tail) - len(brk)  # filler of the base prompt itself
        if own < 0:
            raise PosymError(f"base length {base} is shorter than question {i} of {family.name}")
        keys = () if family.chat else builder.answer_positions(core)  # 'between' layout: the facts never move
        for factor in out:
            length = factor * base
            pad = builder.filler(f"{seed}:{family.format}:{i}", length - len(head) - len(tail) - len(brk))
            if family.variant == "between":
                ids, insert_at = head + pad + tail, len(head) + own
            else:  # the filler goes first (after the BOS and a chat header, which stay first), then a line break
                ids, insert_at = head[:bos] + pad + brk + head[bos:] + tail, bos + own
            shift = 0 if family.variant == "between" else len(pad) + len(brk)  # 'before': the facts move
            # the base prompt's own filler keeps its place; the extra tokens enter after it
            out[factor].append(
                LengthPrompt(
                    family.name,
                    i,
                    factor,
                    length,
                    ids,
                    core.answer,
                    answer_id,
                    insert_at,
                    length - base,
                    length - 1,
                    *whole,
                    tuple(k + shift for k in keys),
                )
            )
    return out


# ---- the atlas's prompt sets: needle in a haystack, natural text, repeated tokens ----------------

NEEDLE_PREFIX, QUESTION = " The secret words are", " What are the secret words? The secret words are"
"""The needle sentence (its words follow the prefix) and the question that asks for them."""


@dataclass
class Needle:
    """One needle-in-a-haystack prompt with its teacher-forced answer (the needle's words)."""

    ids: list[int]
    needle: list[int]
    """Positions of the needle's words in the haystack."""
    queries: list[int]
    """Answer steps: query p generates ids[p + 1], one of the needle's words."""
    length: int
    depth: float
    words: list[str]
    index: int = 0
    """Its number within its (length, depth) cell: the prompt is a function of (seed, length, depth, index)."""


def needle_prompts(
    loaded: LoadedModel, *, lengths: list[int], depths: list[float], per_cell: int, n_words: int, seed: int
) -> list[Needle]:
    """Haystack (`FILLER` sentences) with the needle sentence (`n_words` single-token key words) at each
    depth, then the question and the needle words as the answer, exactly `length` tokens each: `per_cell`
    per (length, depth); a larger per_cell adds prompts and keeps the first ones."""
    builder = Builder(loaded.tokenizer)
    out = []
    for length in lengths:
        for depth in depths:
            for k in range(per_cell):
                rng = random.Random(f"needle:{seed}:{length}:{depth}:{k}")
                words = rng.sample(builder.keys, n_words)
                word_ids = [builder.encode(f" {w}")[0] for w in words]  # Builder.keys are single tokens
                prefix, dot, question = builder.encode(NEEDLE_PREFIX), builder.encode("."), builder.encode(QUESTION)
                fixed = len(builder.bos) + len(prefix) + len(word_ids) + len(dot) + len(question) + len(word_ids)
                if length - fixed < 1:
                    raise PosymError(f"a needle prompt of {length} tokens cannot hold the needle and the question")
                hay = builder.filler(f"needle:{seed}:{length}:{depth}:{k}", length - fixed)
                cut = round(depth * len(hay))
                head = builder.bos + hay[:cut] + prefix
                ids = head + word_ids + dot + hay[cut:] + question + word_ids
                answer = len(ids) - len(word_ids)
                out.append(
                    Needle(
                        ids,
                        list(range(len(head), len(head) + len(word_ids))),
                        list(range(answer - 1, len(ids) - 1)),
                        length,
                        depth,
                        words,
                        k,
                    )
                )
    return out


def natural_text(loaded: LoadedModel, *, length: int, n: int) -> list[list[int]]:
    """`n` consecutive stretches of `length` tokens of the Python reference documentation (English prose
    with code, in every CPython: `pydoc_data.topics`), each after the tokenizer's BOS."""
    from pydoc_data.topics import topics

    builder = Builder(loaded.tokenizer)
    body = length - len(builder.bos)
    text, ids = "", []
    names = iter(sorted(topics))
    while len(ids) < body * n:
        chosen = [topics[name] for name, _ in zip(names, range(20))]
        if not chosen:  # the whole documentation is used up
            raise PosymError(  # named by the atlas settings that ask for it
                f"stream_prompts x stream_length asks for {body * n:,} tokens of natural "
                f"text, more than the {len(ids):,} of the Python documentation posym draws them from"
            )
        chunk = "\n\n".join(chosen)
        text += chunk + "\n\n"
        ids = builder.encode(text)
    return [builder.bos + ids[k * body : (k + 1) * body] for k in range(n)]


def repeated_tokens(loaded: LoadedModel, *, period: int, repeats: int, n: int, seed: int) -> list[list[int]]:
    """`n` prompts of `period` random tokens (distinct within a repeat, no special tokens) repeated
    `repeats` times, after the BOS."""
    builder = Builder(loaded.tokenizer)
    special = set(loaded.tokenizer.all_special_ids)
    pool = [t for t in range(min(len(loaded.tokenizer), loaded.model.config.vocab_size)) if t not in special]
    if len(pool) < period:
        raise PosymError(f"the vocabulary has {len(pool)} ordinary tokens, fewer than repeat_period {period}")
    rng = random.Random(f"repeats:{seed}")
    return [builder.bos + rng.sample(pool, period) * repeats for _ in range(n)]


# ---- RULER-shaped long-context tasks: multi-key needles and variable tracking (issue 53) ----------

RULER_TASKS = ("multikey", "vartrack")
"""The RULER-shaped tasks (`RulerTask`): several key -> value needles, one key asked ('multikey', RULER's
niah_multikey); chains of variable assignments among distractor chains, one chain's value asked through
its last variable ('vartrack', RULER's variable tracking in a single-answer form)."""
RULER_DIGITS = {"multikey": 7, "vartrack": 5}
"""Digits of the values RULER uses (7-digit magic numbers; 5-digit variable values)."""
MULTIKEY_INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards.\n"
)
VARTRACK_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"


@dataclass(frozen=True)
class RulerCore:
    """One RULER-shaped question before lengthening: text pieces, placed in the filler at their depths."""

    intro: str
    inserts: list[list[str]]
    """The needles / assignment statements in order, each as pieces encoded one at a time (so the answer
    value's tokens are the same tokens in the needle and in the answer)."""
    depths: list[float]
    """Per insert (ascending), the share of the filler before it."""
    question: str
    answer: str
    """The answer as it continues the prompt (leading space included; judged on all its tokens)."""
    answer_piece: tuple[int, int]
    """(insert, piece) whose tokens bear the answer: the asked needle's value, the chain's first value."""


@dataclass(frozen=True)
class RulerPrompt:
    """One RULER-shaped prompt at one length, as token ids (the fields `LengthPrompt` shares mean the same:
    a scorer reads ids, answer_id, answer_ids, stops and answer_keys of either)."""

    task: str
    index: int
    factor: int
    length: int
    """Tokens of the prompt with its answer (len(ids) + len(answer_ids)): every prompt of a length has
    exactly this many, so they batch without padding when teacher-forced."""
    ids: list[int]
    answer: str
    answer_id: int
    answer_ids: tuple[int, ...]
    """The answer's tokens (whitespace-only leading tokens end the prompt instead): judged all greedy."""
    stops: tuple[int, ...]
    """Tokens that would carry the number on (single digits, where the tokenizer writes one per token)."""
    answer_keys: tuple[int, ...]
    """Positions in ids of the tokens that bear the answer (`RulerCore.answer_piece`)."""
    inserts: tuple[int, ...]
    """Position in ids where each insert starts."""


def _magic(rng: random.Random, digits: int, taken: set) -> int:
    while True:  # a fresh number of exactly `digits` digits
        value = rng.randrange(10 ** (digits - 1), 10**digits)
        if value not in taken:
            taken.add(value)
            return value


def _variable(rng: random.Random, taken: set) -> str:
    while True:  # RULER's names: five random capital letters
        name = "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=5))
        if name not in taken:
            taken.add(name)
            return name


@dataclass
class RulerTask:
    """A RULER-shaped task (one of RULER_TASKS) and its difficulty knobs.

    >>> core = RulerTask("vartrack", chains=1, hops=2).core(0, 0, KEYS)
    >>> [" ".join(piece.strip() for piece in insert) for insert in core.inserts]
    ['VAR TJFWL = 76314 .', 'VAR TTYNU = VAR TJFWL .', 'VAR PMDHJ = VAR TTYNU .']
    >>> core.answer
    ' 76314'
    """

    task: str = "multikey"
    """One of RULER_TASKS."""
    needles: int = 4
    """multikey: key -> value needles per prompt (one asked, the others distractors)."""
    chains: int = 2
    """vartrack: assignment chains per prompt (one asked, the others distractors)."""
    hops: int = 4
    """vartrack: assignments after a chain's first (VAR B = VAR A, ...): its last variable is asked."""
    digits: int = 0
    """Digits of every value (0: RULER's, `RULER_DIGITS`)."""

    def __post_init__(self) -> None:
        if self.task not in RULER_TASKS:
            raise PosymError(f"a RULER-shaped task is one of {', '.join(RULER_TASKS)}, got {self.task!r}")
        if not 1 <= self.needles <= 16 or not 1 <= self.chains <= 8 or not 1 <= self.hops <= 16:
            raise PosymError(
                f"needles must lie in 1..16, chains in 1..8 and hops in 1..16, got {self.needles}, {self.chains}, "
                f"{self.hops}"
            )
        if not 0 <= self.digits <= 12:
            raise PosymError(f"digits must lie in 0..12 (0: RULER's), got {self.digits}")

    @property
    def value_digits(self) -> int:
        return self.digits or RULER_DIGITS[self.task]

    def core(self, seed: int, index: int, keys=KEYS) -> RulerCore:
        """The index-th question (a pure function of seed, index, the knobs and `keys`, the key words the
        tokenizer keeps whole: `Builder.keys`)."""
        rng = random.Random(f"{seed}:{self.task}:{index}")
        taken: set = set()
        if self.task == "multikey":
            names = rng.sample(list(keys), self.needles)
            values = [_magic(rng, self.value_digits, taken) for _ in names]
            asked = rng.randrange(self.needles)
            inserts = [[f" One of the special magic numbers for {k} is:", f" {v}", "."] for k, v in zip(names, values)]
            depths = sorted(rng.random() for _ in inserts)
            question = (
                f"\nWhat is the special magic number for {names[asked]} mentioned in the provided text? "
                f"The special magic number for {names[asked]} mentioned in the provided text is:"
            )
            return RulerCore(MULTIKEY_INTRO, inserts, depths, question, f" {values[asked]}", (asked, 1))
        used: set = set()
        chains = []
        for _ in range(self.chains):
            names = [_variable(rng, used) for _ in range(self.hops + 1)]
            chains.append((names, _magic(rng, self.value_digits, taken)))
        order = [c for c in range(self.chains) for _ in range(self.hops + 1)]
        rng.shuffle(order)  # the chains interleaved, each in its own order
        inserts, step, first = [], [0] * self.chains, 0
        for c in order:
            names, value = chains[c]
            h = step[c]
            if h == 0:
                first = len(inserts) if c == 0 else first
                inserts.append([f" VAR {names[0]} =", f" {value}", "."])
            else:
                inserts.append([f" VAR {names[h]} = VAR {names[h - 1]}", "."])
            step[c] += 1
        depths = sorted(rng.random() for _ in inserts)
        last = chains[0][0][-1]
        question = (
            f"\nQuestion: What value is VAR {last} assigned in the text above? Answer: According to the chain(s) "
            f"of variable assignment in the text above, VAR {last} is assigned the value"
        )
        return RulerCore(VARTRACK_INTRO, inserts, depths, question, f" {chains[0][1]}", (first, 1))


def ruler_parts(core: RulerCore, builder: Builder) -> tuple[list[int], list[list[int]], list[int], list[int]]:
    """(ids before the filler: BOS + intro, each insert's ids, ids after the filler: the question and the
    answer's leading whitespace-only tokens, the answer's ids)."""
    answer = builder.encode(core.answer)
    lead = 0
    while lead < len(answer) - 1 and not builder.tokenizer.decode(answer[: lead + 1]).strip():
        lead += 1
    head = builder.bos + builder.encode(core.intro)
    inserts = [[t for piece in insert for t in builder.encode(piece)] for insert in core.inserts]
    return head, inserts, builder.encode(core.question) + answer[:lead], answer[lead:]


def ruler_base_length(task: RulerTask, builder: Builder, n: int, seed: int) -> int:
    """The task's base length: its longest prompt with no filler (over n questions, answer included) plus
    2 tokens, rounded up to 8 (as `base_length`)."""
    longest = 0
    for i in range(n):
        head, inserts, tail, answer = ruler_parts(task.core(seed, i, builder.keys), builder)
        longest = max(longest, len(head) + sum(map(len, inserts)) + len(tail) + len(answer))
    return -(-(longest + 2) // 8) * 8


def ruler_prompts(
    task: RulerTask,
    builder: Builder,
    n: int,
    factors: list[int],
    *,
    seed: int = 0,
    base: int | None = None,
    max_positions: int | None = None,
) -> dict[int, list[RulerPrompt]]:
    """{factor: n prompts} of the task at every factor x the base length (default `ruler_base_length`):
    the same questions, the filler (`FILLER`, each prompt's own seeded stream, so a prompt's filler at
    length 2L starts with its filler at L) growing around the inserts, which keep their depths (RULER's
    placement: at 16x the needles lie spread over the whole context), each put between two filler
    sentences (the sentence boundary nearest its depth). A prompt of length L holds exactly
    L tokens with its answer."""
    if not factors or min(factors) < 1:
        raise PosymError(f"factors must be positive, got {factors}")
    base = base or ruler_base_length(task, builder, n, seed)
    top = max(factors) * base
    if max_positions is not None and top > max_positions:
        raise PosymError(f"the {task.task} task reaches {top} tokens but the model has {max_positions} positions")
    stops = builder.digits
    out: dict[int, list[RulerPrompt]] = {f: [] for f in sorted(factors)}
    for i in range(n):
        core = task.core(seed, i, builder.keys)
        head, inserts, tail, answer = ruler_parts(core, builder)
        fixed = len(head) + sum(map(len, inserts)) + len(tail) + len(answer)
        for factor in out:
            length = factor * base
            if length - fixed < 0:
                raise PosymError(f"length {length} is shorter than question {i} of {task.task} ({fixed} tokens)")
            hay, sentences = builder.filler_sentences(f"{seed}:{task.task}:{i}", length - fixed)
            # each insert goes between two filler sentences: the sentence start nearest its depth
            bounds = [*sentences, len(hay)]
            cuts = [min(bounds, key=lambda b: (abs(b - d * len(hay)), b)) for d in core.depths]
            ids, starts, previous = list(head), [], 0
            for cut, insert in zip(cuts, inserts):
                ids += hay[previous:cut]
                starts.append(len(ids))
                ids += insert
                previous = cut
            ids += hay[previous:] + tail
            k, piece = core.answer_piece
            offset = starts[k] + sum(len(builder.encode(p)) for p in core.inserts[k][:piece])
            keys = tuple(range(offset, offset + len(builder.encode(core.inserts[k][piece]))))
            out[factor].append(
                RulerPrompt(
                    task.task,
                    i,
                    factor,
                    length,
                    ids,
                    core.answer,
                    answer[0],
                    tuple(answer),
                    stops,
                    keys,
                    tuple(starts),
                )
            )
    return out
