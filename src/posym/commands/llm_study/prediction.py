"""What a head type predicts on a real model: a length task it solves, head retention, causal tests.

The three stages `posym llm-study` runs after its first six (`posym.commands.llm_study`), each on the
length-controlled prompt families of `posym.prompts` (answer fixed, only the length grows):

screen   every format of `PredictionConfig.formats` at the base length ('between' layout), with its
         accuracy, n and Wilson 95% interval; none is hidden. Each is probed on n_probe prompts, the
         candidates then on n_screen (`screen`). The task of the next stages is the first format (in the
         listed order) whose base accuracy reaches `min_accuracy` on n_screen prompts; if none does, the
         stages say so and measure the best one (its results then describe a task the model fails).
lengths  for that task: accuracy at every factor x the base length in both layouts ('between': the
         fact-to-question distance grows; 'before': it does not) and with markers (the brief's prompt
         advice); every head's sink-free and plain scores at the base length (last token) with and
         without markers; and per head and length the margin and the attention on the key it attended
         at the base length (`posym.core.retention`), summarised per label and for layer-matched random
         draws with paired-bootstrap 95% intervals over prompts.
causal   mean-ablation (zero as an option) of the top-k symbolic and top-k positional heads (ranked
         by the sink-free scores; the plain ranking beside on request), and of `causal_draws` layer-matched
         random sets of k heads per group: accuracy at each causal factor (1x and 16x by default);
         drop(L) = acc(clean) - acc(ablated), the length effect drop(L) - drop(base), each group against
         its matched random heads, with paired-bootstrap intervals, randomization p and Holm
         (`causal_table`). The ablations are the estimates' real ones (`estimates.causal_estimates`: each
         set once, the same-length prompts' mean at each position), beside the estimated null of
         `estimate_draws` sets that the verdicts read.

The model is judged on its next token (`posym.prompts`: the answer's distinguishing token). Every
length of a question is answered from one key-value cache of its longest prompt (`last_logits`: the
lengths share all but the question's tail), the questions split over forked CPU workers
(`posym.parallel`); for SmolLM2 that is about 1.8x fewer tokens than a forward per length (the
workers add 1.08x on 2 cores).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from posym.core.interventions import ABLATION_MODES
from posym.core.paper import GAMMA, TAU
from posym.core.retention import RANDOM, base_tracking, head_measures, matched_random
from posym.core.scores import score_model, summarize_heads
from posym.core.stats import (
    ALPHA,
    N_BOOT,
    POWER,
    bootstrap_weights,
    detectable_effect,
    holm,
    holm_floor,
    mcnemar_p,
    percentile_interval,
    prompts_for_effect,
    randomization_p,
    wilson_interval,
)
from posym.core.study import find_sinks
from posym.errors import PosymError
from posym.figures import subplots
from posym.parallel import forked_map
from posym.prompts import FACTORS, FORMATS, Builder, LengthFamily, LengthPrompt, build

SCREENED = (
    *("kv-code", "copy", "kv-list", "kv-fewshot", "possession", "arithmetic"),
    # issue 52: harder key-value questions (more facts, stale values), arithmetic reasoning judged on the
    # whole answer, and the model's chat format where it has one
    *("kv-code:facts=8", "kv-code:facts=6:competing=3", "kv-code:chat", "kv-code:facts=6:competing=3:chat"),
    *("arith-facts", "arith-chain", "arith-facts:chat", "arith-chain:chat"),
)
"""The screen's formats by default, in order of preference (`PredictionConfig.formats`)."""
LABEL_GROUPS = ("positional", "symbolic", "mixed")
RANKINGS = ("sink-free", "plain")
"""Which scores rank the heads of the causal groups: with the attention sinks left out of the swaps
(the default: most plain 'symbolic' labels of a real model are the sink), or plainly."""
CAUSAL_GROUPS = ("symbolic", "positional")
"""The named groups of each ranking (the k most symbolic and the k most positional heads), in the order
whose index seeds each pool's random draws (`causal_groups`)."""
CAUSAL_MEASURES = ("acc_drop", "margin_change", "length_effect")
"""What the estimated causal tests test (`posym.commands.llm_study.estimates`): acc clean - acc ablated;
mean metric(ablated) - metric(clean) of the margin; acc_drop at the length minus at the base length (from
the second length on)."""


def estimate_family(factors, rankings=RANKINGS) -> int:
    """Tests in one Holm family of the estimated causal tests (one source, k and mode): per ranking and
    named group (rankings x 2), an accuracy drop and a margin change at every causal length and a length
    effect at every length but the base. With D draws no p goes below 1 / (D + 1), so no Holm p below
    family / (D + 1).

    >>> estimate_family([1, 2, 4, 8, 16]), estimate_family([1, 16], ["sink-free"])
    (56, 10)
    """
    return len(rankings) * len(CAUSAL_GROUPS) * (len(CAUSAL_MEASURES) * len(factors) - 1)


KERNELS = ("eager", "sdpa")
"""Attention kernels the lengths stage can run (`PredictionConfig.kernel`; transformers' names)."""
MOST_FACTOR = 1024
"""Largest length factor: the model's positions (or, past them, `check_sizes`' memory estimate) bound it."""


@contextmanager
def attention_kernel(model, name: str | None):
    """Run the block with the model's attention kernel set to `name` (transformers' attn_implementation;
    None: leave it), then restore the one it had. posym's captures read queries and keys at the kernel's
    call, so every measure works with either kernel."""
    before = model.config._attn_implementation
    if name is None or name == before:  # None: the model's own
        yield model
        return
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


def eager_attention_bytes(model, length: int, workers: int = 1) -> int:
    """Peak bytes of the eager kernel's attention in one forward of `length` tokens, `workers` at once: per
    layer the float32 scores, their masked copy and their softmax ([heads, L, L] each, alive together) and the
    [L, L] mask. Weights and the key-value cache are small beside it from a few thousand tokens on.

    >>> smollm2 = type("M", (), {"config": type("C", (), {"num_attention_heads": 9})})  # 9 heads a layer
    >>> round(eager_attention_bytes(smollm2, 9216) / 2**30, 1)  # GiB at 9,216 tokens
    8.9
    """
    heads = model.config.num_attention_heads
    return workers * (3 * heads + 1) * length * length * 4


@dataclass
class PredictionConfig:
    """What the screen, lengths and causal stages of `posym llm-study` measure (part of study.yaml)."""

    formats: list[str] = field(default_factory=lambda: list(SCREENED))
    """Formats screened, in order of preference: `posym.prompts` format specs (`parse_format`); those in the
    chat form are skipped for a model without a chat template."""
    n_screen: int = 200
    """Prompts a format needs at the base length to be the task (`screen`)."""
    n_probe: int = 32
    """Prompts every format is first asked in the screen (at most n_screen): the 14 formats' probes are most of
    the screen's cost, and a format whose Wilson upper bound still reaches min_accuracy is completed to
    n_screen before it can be chosen, so the probe only sorts out the hopeless ones and reports each format's
    accuracy with its n. 32 (was 50) is one of issue 50's cuts to the default study's ~20 minutes."""
    min_accuracy: float = 0.8
    """Base-length accuracy a format needs to be the task of the length and causal stages."""
    factors: list[int] = field(default_factory=lambda: list(FACTORS))
    """Lengths of the lengths stage, as multiples of the base length."""
    n_length: int = 24
    """Prompts per layout and length for the accuracy curves (also those the head scores, n_scores, and the
    causal stage, n_causal, take their first prompts from). 24 (was 32) is one of issue 50's cuts toward the
    default study's ~20 minutes; at 32 no accuracy test of the committed SmolLM2 study passed Holm (each
    needs 48-563 prompts for 80% power at a 0.1 difference: accuracy_tests.parquet's `needed`), so the tables
    state the effect they can detect (`mde`); examples/llm-study-powered.yaml (96) is where a verdict can
    come from."""
    n_heads: int = 8
    """Prompts per layout and length for the head measures (a capture pass each)."""
    n_scores: int = 24
    """Base-length prompts whose scores label and rank the heads."""
    draws: int = 1000
    """Layer-matched random head sets per group of the head-retention tests (cheap: the measures are taken
    once, a draw only picks heads), the randomization p's null; its smallest p is 1 / (draws + 1)."""
    causal_draws: int = 1
    """Layer-matched random head sets per group whose real ablation the causal rows (causal.parquet and its
    summary) compare each named group with; its randomization p cannot go below 1 / (causal_draws + 1)
    (0.5 by default, 0.33 at the 2 before issue 50's cut to the study's ~20 minutes: neither can reach a
    verdict, which comes from the estimated null of `estimate_draws`; the committed studies ran 10, the
    powered preset 250). They are the first sets of the estimated pools (`causal_groups` draws
    the same sets for any count), ablated once with the calibration's (`calibration_draws`: the stage
    ablates max(causal_draws, calibration_draws) per pool, one pass per set, prompt and length, ~24 CPU s
    per set on SmolLM2 at 1x + 16x)."""
    causal_rankings: list[str] = field(default_factory=lambda: ["sink-free"])
    """Which rankings' groups the causal stage ablates (`RANKINGS`): the sink-free one by default, the one
    every verdict reads; add "plain" to ablate the plainly ranked groups and their own random pools too
    (twice the stage's ablation passes). The studies committed before this field ran both."""
    estimate_draws: int = 10_000
    """Layer(+kind)-matched random head sets per causal group whose ablation is ESTIMATED (the sum of their
    heads' attribution-patching effects, `posym.commands.llm_study.estimates`): the null of the estimated
    causal tests. Cheap (every head's effect is known once per prompt; a draw only sums heads); the first
    calibration_draws of them are also ablated for real. Its smallest p, 1 / (draws + 1), times the tests of
    a Holm family (`estimate_family`: 56 for both rankings at five causal lengths) must stay below 0.05, or
    no verdict could be reached: 1,000 draws could not (56 / 1,001 = 0.056)."""
    calibration_draws: int = 1
    """Of each pool's estimated random sets, how many (the first ones) are also ablated for real, beside the
    named groups, to validate the estimate at every causal length (causal/calibration.parquet: by default
    the 2 named groups and 2 random sets, n_causal prompts each, per length); the same real ablations as
    the causal rows' (`causal_draws`): the stage ablates max(causal_draws, calibration_draws) sets per pool
    once. The committed studies used 20, the powered preset does; the default was 2 before issue 50's cut."""
    effect: float = 0.2
    """Retention difference (group against its random heads) whose needed prompt count the tables state
    (80% power at the Holm-family level)."""
    accuracy_effect: float = 0.1
    """Accuracy difference whose needed prompt count the paired accuracy tests state (80% power)."""
    causal_factors: list[int] = field(default_factory=lambda: [1, 16])
    """Lengths of the causal stage (multiples of the base length; must include 1): the base and the longest
    by default, the length effect the verdicts test. The real ablations cost little more at every length
    than at the longest alone (`last_logits` shares each question's prefix), but the estimates and their
    calibration pay each length in full. The committed studies ran every length (1, 2, 4, 8, 16)."""
    n_causal: int = 12
    """Prompts per length in the causal stage."""
    causal_ks: list[int] = field(default_factory=lambda: [8])
    """Sizes k of the ablated groups (about 3% of SmolLM2's 270 heads)."""
    causal_modes: list[str] = field(default_factory=lambda: ["mean"])
    """Ablation modes: mean and/or zero (`posym.core.interventions.ablated`)."""
    n_boot: int = N_BOOT
    """Bootstrap draws of every interval."""
    workers: int = 0
    """CPU processes every stage's answers are split over (the whole-answer judge of the scores, bench and
    ablation stages, the length and causal answers; 0: one per CPU this process may use; always 1 on a GPU;
    `posym.parallel`). Machine only: results are the same up to float rounding."""
    past_context: bool = False
    """Let the lengths stage's prompts run past the model's trained context (its max_position_embeddings):
    RoPE extrapolation, the seed's subject. The screen's and the causal stage's prompts must still fit it."""
    kernel: str | None = None
    """Attention kernel of the lengths stage's passes: None, the one the model was loaded with (sdpa for GGUF
    files and Hugging Face directories, eager for posym runs); "eager" (matmul-softmax, materialising [heads,
    L, L] scores per layer: memory checked before the stage) or "sdpa" (PyTorch's fused attention: O(L)
    memory and about 8x faster than eager at 9,216 tokens on 2 CPU cores). Both give the same answers and
    measures up to float rounding (tested); `KERNELS`."""

    def __post_init__(self) -> None:
        if not self.formats:
            raise PosymError(f"formats must be among {', '.join(FORMATS)}, got {self.formats}")
        for spec in self.formats:
            LengthFamily(spec)  # a PosymError for an unknown format or option
        if self.kernel is not None and self.kernel not in KERNELS:
            raise PosymError(f"kernel must be one of {', '.join(KERNELS)}, got {self.kernel!r}")
        if not 0 <= self.workers <= 1024:
            raise PosymError(f"workers must lie in 0..1024 (0: one per CPU), got {self.workers}")
        counts = {
            "n_screen": self.n_screen,
            "n_probe": self.n_probe,
            "n_length": self.n_length,
            "n_heads": self.n_heads,
            "n_scores": self.n_scores,
            "draws": self.draws,
            "causal_draws": self.causal_draws,
            "estimate_draws": self.estimate_draws,
            "calibration_draws": self.calibration_draws,
            "n_causal": self.n_causal,
            "n_boot": self.n_boot,
        }
        for name, value in counts.items():
            if not 1 <= value <= 100_000:
                raise PosymError(f"{name} must lie in 1..100000, got {value}")
        rankings = self.causal_rankings
        if not rankings or len(set(rankings)) != len(rankings) or not set(rankings) <= set(RANKINGS):
            raise PosymError(f"causal_rankings must name distinct rankings of {', '.join(RANKINGS)}, got {rankings}")
        family = estimate_family(self.causal_factors, self.causal_rankings)
        if holm_floor(family, self.estimate_draws) >= ALPHA:
            raise PosymError(
                f"estimate_draws {self.estimate_draws:,} cannot separate anything: its smallest p, "
                f"1 / {self.estimate_draws + 1:,}, times the {family} tests of a Holm family is not below {ALPHA}; "
                f"use at least {math.ceil(family / ALPHA):,}"
            )
        for name in ("causal_draws", "calibration_draws"):
            if getattr(self, name) > self.estimate_draws:
                raise PosymError(
                    f"{name} ({getattr(self, name)}) cannot exceed estimate_draws ({self.estimate_draws}): "
                    "the sets ablated for real are the first of the estimated ones"
                )
        if self.n_probe > self.n_screen:
            raise PosymError(f"n_probe ({self.n_probe}) cannot exceed n_screen ({self.n_screen})")
        if self.n_heads > self.n_length or self.n_causal > self.n_length:
            raise PosymError("n_heads and n_causal cannot exceed n_length (they reuse its prompts)")
        for name, factors in (("factors", self.factors), ("causal_factors", self.causal_factors)):
            if 1 not in factors or min(factors) < 1 or max(factors) > MOST_FACTOR:
                raise PosymError(f"{name} must lie in 1..{MOST_FACTOR} and include 1 (the base length), got {factors}")
        if not set(self.causal_factors) <= set(self.factors):
            raise PosymError(f"causal_factors {self.causal_factors} must be among factors {self.factors}")
        if not self.causal_ks or min(self.causal_ks) < 1:
            raise PosymError(f"causal_ks must be positive head counts, got {self.causal_ks}")
        if any(m not in ABLATION_MODES for m in self.causal_modes) or not self.causal_modes:
            raise PosymError(f"causal_modes must be zero and/or mean, got {self.causal_modes}")
        if "mean" in self.causal_modes and self.n_causal < 2:
            # the estimates' mean-ablation reference is the prompts of each length (`attribution.attribute`)
            raise PosymError(
                f"mean-ablation needs n_causal >= 2 (the reference: each length's prompts), got {self.n_causal}"
            )
        if not (0 < self.effect <= 10 and 0 < self.accuracy_effect <= 1):
            raise PosymError(
                f"effect must lie in (0, 10] and accuracy_effect in (0, 1], got {self.effect}, {self.accuracy_effect}"
            )
        if not 0 < self.min_accuracy <= 1:
            raise PosymError(f"min_accuracy must lie in (0, 1], got {self.min_accuracy}")


# ---- the model's answers --------------------------------------------------------------------------


def next_token_correct(model, prompts: list[LengthPrompt], *, batch_tokens: int = 8192) -> list[bool]:
    """Whether the model's greedy next token is each prompt's answer token (equal-length batches,
    no-grad, logits at the last positions only). A prompt judged on its whole answer (`answer_ids`) is
    run with its answer appended: correct when every answer token is the greedy one after the tokens
    before it (so greedy decoding writes the answer) and the greedy token after it is none of `stops`."""
    out: dict[int, bool] = {}
    by_length: dict[tuple[int, int], list[int]] = {}
    for k, p in enumerate(prompts):
        by_length.setdefault((len(p.ids) + len(p.answer_ids), len(p.answer_ids)), []).append(k)
    device = next(model.parameters()).device
    with torch.no_grad():
        for (length, extra), members in by_length.items():
            step = max(1, batch_tokens // length)
            for lo in range(0, len(members), step):
                chunk = members[lo : lo + step]
                ids = torch.tensor(
                    [prompts[k].ids + list(prompts[k].answer_ids) for k in chunk], device=device
                )  # [b, T]
                best = model(input_ids=ids, logits_to_keep=extra + 1).logits.argmax(-1).tolist()  # [b, extra + 1]
                for k, greedy in zip(chunk, best):
                    p = prompts[k]
                    if p.answer_ids:
                        out[k] = greedy[:-1] == list(p.answer_ids) and greedy[-1] not in p.stops
                    else:
                        out[k] = greedy[-1] == p.answer_id
    return [out[k] for k in range(len(prompts))]


def shared_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two id lists, kept below len(a) (a needs one token of its own)."""
    n = min(len(a) - 1, len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _croppable(cache) -> bool:
    """Whether every layer of a transformers cache holds all past keys (so cropping it to a prefix is
    that prefix's cache): not a sliding-window, chunked, linear or quantized layer."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def last_logits(model, prompts: dict[int, list[LengthPrompt]]):
    """Yield (factor, i, logits [vocab]) at the last position of prompts[factor][i], for families whose
    lengths share prefixes (`posym.prompts.build`: a question's filler at length L starts its filler
    at 2L, so in the 'between' layout everything up to the question is a prefix of the longer prompt).

    Per question i one forward over its longest prompt keeps the key-value cache; every shorter length
    then runs only the tokens after its common prefix with the longest, on the cache cropped to that
    prefix (descending lengths, so each crop only removes). Causal attention makes this exact: a
    prefix's keys and values do not depend on what follows. About 1.8x fewer tokens than a forward per
    length for factors 1-16. The cache keeps every key of every layer, also of sliding-window layers
    (the model's own mask applies the window to it, as in a full forward); should a model return a cache
    that cannot be cropped exactly, each length runs its own forward. Ablation hooks apply to every call."""
    from transformers import DynamicCache

    factors = sorted(prompts, reverse=True)
    n = min(len(prompts[f]) for f in factors)
    device = next(model.parameters()).device
    with torch.no_grad():
        for i in range(n):
            longest = prompts[factors[0]][i].ids
            # a cache of full layers even where a layer has a window: the model's mask applies the window
            out = model(
                input_ids=torch.tensor([longest], device=device), cache=DynamicCache(), use_cache=True, logits_to_keep=1
            )
            yield factors[0], i, out.logits[0, -1]  # [vocab]
            cache = out.cache
            share = _croppable(cache)
            for factor in factors[1:]:
                ids = prompts[factor][i].ids
                if not share:
                    yield factor, i, model(input_ids=torch.tensor([ids], device=device), logits_to_keep=1).logits[0, -1]
                    continue
                keep = shared_prefix(ids, longest)
                cache.crop(keep - cache.get_seq_length())  # a negative count: drop everything after the prefix
                rest = torch.tensor([ids[keep:]], device=device)  # [1, T - keep]
                out = model(input_ids=rest, cache=cache, use_cache=True, logits_to_keep=1)
                yield factor, i, out.logits[0, -1]


def correct_by_length(model, prompts: dict[int, list[LengthPrompt]], *, workers: int = 1) -> dict[int, list[bool]]:
    """{factor: whether the greedy next token is the answer} for every prompt of every length, through
    `last_logits` (the shared-prefix path), the questions split over `workers` forked CPU processes
    (`posym.parallel.forked_map`; hooks on the model, such as an ablation, apply in each)."""
    n = min(len(group) for group in prompts.values())

    def answers(i: int) -> dict[int, bool]:
        one = {factor: [group[i]] for factor, group in prompts.items()}
        return {
            factor: int(logits.argmax()) == one[factor][0].answer_id for factor, _, logits in last_logits(model, one)
        }

    found = forked_map(answers, range(n), workers=workers)
    return {factor: [found[i][factor] for i in range(n)] for factor in prompts}


def accuracy_by(frame, by):
    """Accuracy per group of `by` with n and the Wilson 95% interval (columns acc, lo, hi, n)."""
    rows = []
    for key, group in frame.groupby(by, sort=False):
        k, n = int(group.correct.sum()), len(group)
        lo, hi = wilson_interval(k, n)
        rows.append(
            {**dict(zip(by, key if isinstance(key, tuple) else (key,))), "acc": k / n, "lo": lo, "hi": hi, "n": n}
        )
    import pandas as pd

    return pd.DataFrame(rows)


# ---- stages' work ---------------------------------------------------------------------------------


def screen(model, builder: Builder, config: PredictionConfig, *, seed: int, max_positions: int, progress=None):
    """Per-prompt rows of every screened format at its base length: format, index, base_length, correct.

    Every format is asked its first n_probe questions; then, in config order, a format whose probe could
    still reach min_accuracy (its Wilson 95% upper bound does) is asked the rest of its n_screen, until one
    format reaches min_accuracy on all n_screen. So every format is tried and reported (with its own n),
    and only the candidates pay for the full count (about a third of screening every format fully)."""
    import pandas as pd

    prompts = {
        fmt: build(LengthFamily(fmt, factors=[1]), builder, config.n_screen, seed=seed, max_positions=max_positions)[1]
        for fmt in config.formats
        if builder.asks(fmt)
    }
    correct = {}
    for fmt, ps in prompts.items():
        correct[fmt] = next_token_correct(model, ps[: config.n_probe])
        if progress:
            progress(1)
    for fmt in prompts:
        found = correct[fmt]
        if wilson_interval(sum(found), len(found))[1] >= config.min_accuracy:  # the probe leaves it possible
            found += next_token_correct(model, prompts[fmt][len(found) :])
            if sum(found) >= config.min_accuracy * len(found):
                break
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "format": fmt,
                    "index": [p.index for p in prompts[fmt][: len(found)]],
                    "base_length": prompts[fmt][0].length,
                    "correct": found,
                }
            )
            for fmt, found in correct.items()
        ],
        ignore_index=True,
    )


def choose_format(summary, config: PredictionConfig) -> dict:
    """The first format (config order) whose base accuracy reaches min_accuracy on n_screen prompts,
    else the most accurate."""
    acc, n = dict(zip(summary.format, summary.acc)), dict(zip(summary.format, summary.n))
    passing = [f for f in config.formats if acc.get(f, 0.0) >= config.min_accuracy and n.get(f, 0) >= config.n_screen]
    chosen = passing[0] if passing else max((f for f in config.formats if f in acc), key=acc.__getitem__)
    return {
        "format": chosen,
        "accuracy": float(acc[chosen]),
        "prompts": int(n[chosen]),
        "passes": bool(passing),
        "rule": f"the first of {config.formats} with base accuracy >= {config.min_accuracy} on {config.n_screen} "
        f"prompts (each format probed on {config.n_probe} first)",
    }


def families(fmt: str, config: PredictionConfig) -> dict[str, LengthFamily]:
    """The lengths stage's three layouts of a format, by name."""
    return {
        name: LengthFamily(fmt, variant=variant, markers=markers, factors=list(config.factors))
        for name, variant, markers in (
            ("between", "between", False),
            ("before", "before", False),
            ("marked", "between", True),
        )
    }


def plain_scores(model, prompts: list[LengthPrompt], *, tau: float = TAU):
    """Every head's scores (rows of `score_model`) at the last token of base-length prompts, every key swapped."""
    return score_model(model, [p.ids for p in prompts], [[p.query] for p in prompts], tau=tau)


def score_heads(model, prompts: list[LengthPrompt], *, gamma: float = GAMMA, tau: float = TAU, plain=None, sinks=None):
    """Every head's plain and sink-free scores at the last token of base-length prompts: rows of
    `summarize_heads` with a `variant` column ('plain', 'sink-free') and the sinks left out. plain: the
    prompts' `plain_scores` when already computed; sinks: the keys to leave out (default: those
    `find_sinks` finds on these prompts; a caller that scores several prompt sets of one model passes the
    sinks found on any of them, since the sink is the model's, not one prompt set's)."""
    import pandas as pd

    plain = plain_scores(model, prompts, tau=tau) if plain is None else plain
    sinks = find_sinks(plain) if sinks is None else list(sinks)
    ids, queries = [p.ids for p in prompts], [[p.query] for p in prompts]
    free = score_model(model, ids, queries, tau=tau, exclude_keys=sinks) if sinks else plain
    heads = pd.concat(
        [
            summarize_heads(plain, gamma=gamma).assign(variant="plain"),
            summarize_heads(free, gamma=gamma).assign(variant="sink-free"),
        ],
        ignore_index=True,
    )
    return heads, sinks


SINK = "sink"
"""Group of the sink-tracking heads: the plain top key at the base length is an attention sink in at least
half of the prompts. They are their own group, apart from the labels (their attention is the sink's)."""
RETENTION_STATISTIC = {"margin": "median", "attn_tracked": "pooled", "attn_answer": "pooled"}
"""How each measure's group retention is made (`posym.core.retention.STATISTICS`)."""
KIND_NAMES = {"sliding_attention": "local", "full_attention": "global"}


def layer_kinds(model) -> dict[int, str] | None:
    """{layer: 'local' / 'global' / the config's own name} where the model has layers of more than one kind
    (Gemma 2/3's sliding-window and full layers: `config.layer_types`), else None."""
    config = getattr(model, "config", None)
    types = list(getattr(getattr(config, "text_config", config), "layer_types", None) or [])
    if len(set(types)) < 2:
        return None
    return {layer: KIND_NAMES.get(kind, kind) for layer, kind in enumerate(types)}


def sink_heads(base, sinks) -> list[tuple[int, int]]:
    """Heads whose plain top key at the base length (`head_measures` rows) is a sink in >= half the prompts."""
    if not sinks:
        return []
    on_sink = base.assign(sink=base.top_key.isin(list(sinks))).groupby(["layer", "head"]).sink.mean()
    return [(int(a), int(b)) for (a, b), share in on_sink.items() if share >= 0.5]


def label_groups(
    heads, variant: str, draws: int, seed: int, *, sinks: list[tuple[int, int]] = (), kinds: dict | None = None
) -> dict[str, list[tuple[int, int]]]:
    """Heads per label (LABEL_GROUPS) of one score variant, the sink-tracking heads not among them but in
    their own group SINK, and `draws` random sets per group matched on layer and layer kind, named
    'random:<group>:<i>' (`posym.core.retention.group_retention` pools them). Where the model has layers of
    two kinds (`layer_kinds`), each group is also split by kind ('symbolic@local', ...), each part with its
    own pool. A group whose heads cannot be matched (too few other heads of its layers' kind) comes without one."""
    rows = heads[heads.variant == variant]
    every = [(int(a), int(b)) for a, b in zip(rows.layer, rows["head"])]
    sinks = {tuple(h) for h in sinks}
    named: dict[str, list[tuple[int, int]]] = {}
    for label in LABEL_GROUPS:
        members = [
            (int(a), int(b))
            for a, b in zip(rows.layer[rows.label == label], rows["head"][rows.label == label])
            if (int(a), int(b)) not in sinks
        ]
        if members:
            named[label] = members
    if sinks:
        named[SINK] = sorted(sinks)
    if kinds:
        for name, members in list(named.items()):
            for kind in sorted({kinds[l] for l, _ in members}):
                named[f"{name}@{kind}"] = [h for h in members if kinds[h[0]] == kind]
    groups: dict[str, list[tuple[int, int]]] = {}
    for k, (name, members) in enumerate(named.items()):
        groups[name] = members
        try:
            draw = matched_random(every, members, draws, seed=seed + 97 * k, kinds=kinds)
        except PosymError:  # not enough other heads of its layers' kind: reported without random heads
            continue
        for i, d in enumerate(draw):
            groups[f"{RANDOM}:{name}:{i}"] = d
    return groups


def measures_by_length(model, prompts: dict[int, list[LengthPrompt]], n: int, *, sinks=(), progress=None):
    """head_measures of the first n prompts at every factor: the attention on the answer-bearing keys
    (attn_answer), and on each head's top key at the base length with the sinks left out (`top_free`,
    moved to its place by `LengthPrompt.position_map`: attn_tracked); a `length` and `factor` column."""
    import pandas as pd

    base = prompts[1][:n]
    ids, queries = [p.ids for p in base], [[p.query] for p in base]
    first = head_measures(model, ids, queries, exclude=sinks, batch_size=n)
    # the base length's tracked key is each head's own free top key: a second (short) pass reads it
    frames = [
        head_measures(
            model,
            ids,
            queries,
            tracked=base_tracking(first, lambda k, pos: pos, key="top_free"),
            answer=lambda k: base[k].answer_keys or None,
            exclude=sinks,
            batch_size=n,
        ).assign(length=base[0].length, factor=1)
    ]
    for factor, group in prompts.items():
        if factor == 1:
            continue
        chosen = group[:n]
        frame = head_measures(
            model,
            [p.ids for p in chosen],
            [[p.query] for p in chosen],
            tracked=base_tracking(first, lambda k, pos: chosen[k].position_map(pos), key="top_free"),
            answer=lambda k: chosen[k].answer_keys or None,
            exclude=sinks,
            batch_size=max(1, min(n, 16384 // len(chosen[0].ids))),
        )
        frames.append(frame.assign(length=chosen[0].length, factor=factor))
        if progress:
            progress(0)
    return pd.concat(frames, ignore_index=True)


def accuracy_tests(accuracy, *, effect: float, alpha: float = ALPHA, power: float = POWER, inside: int | None = None):
    """Paired accuracy comparisons on the same questions (`accuracy` rows: layout, factor, length, prompt,
    correct), one Holm family: each layout at every factor against its base length; 'marked' against
    'between' and 'before' against 'between' at every factor (a marked question is the unmarked one with
    tags, at the same length); with `inside` (the longest factor inside the model's trained context, in a
    past_context study) also each layout at every factor past it against `inside` (extrapolation against the
    nearest trained length, not against the short base). Per comparison: n, both accuracies, diff = a - b, the discordant counts,
    the exact McNemar p, p_holm, separated (p_holm < alpha), the minimal detectable difference at n (80%
    power at alpha / family) and the prompts `effect` would need."""
    import pandas as pd

    table = accuracy.pivot_table(index="prompt", columns=["layout", "factor"], values="correct", aggfunc="first")
    pairs = []
    layouts, factors = list(dict.fromkeys(accuracy.layout)), sorted(accuracy.factor.unique())
    for layout in layouts:
        pairs += [(f"{layout} at {f}x vs 1x", (layout, f), (layout, 1)) for f in factors if f != 1]
        if inside is not None and inside != 1:
            pairs += [(f"{layout} at {f}x vs {inside}x", (layout, f), (layout, inside)) for f in factors if f > inside]
    for other in (x for x in ("marked", "before") if x in layouts and "between" in layouts):
        pairs += [(f"{other} vs between at {f}x", (other, f), ("between", f)) for f in factors]
    rows = []
    for name, a, b in pairs:
        both = table[[a, b]].dropna()
        x, y = both[a].astype(bool).to_numpy(), both[b].astype(bool).to_numpy()
        d = x.astype(float) - y.astype(float)
        rows.append(
            {
                "comparison": name,
                "layout_a": a[0],
                "factor_a": int(a[1]),
                "layout_b": b[0],
                "factor_b": int(b[1]),
                "n": len(d),
                "acc_a": float(x.mean()),
                "acc_b": float(y.mean()),
                "diff": float(d.mean()),
                "only_a": int((x & ~y).sum()),
                "only_b": int((~x & y).sum()),
                "p": mcnemar_p(int((x & ~y).sum()), int((~x & y).sum())),
                "sd": float(d.std(ddof=1)) if len(d) > 1 else float("nan"),
            }
        )
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out.p.to_numpy())
    out["family"] = len(out)
    out["separated"] = out.p_holm < alpha
    level = alpha / max(len(out), 1)
    # a difference that never varied (sd 0) gives no spread to size a test with: use the binomial worst case
    spread = out.sd.where(out.sd > 0, 1.0)
    out["mde"] = [detectable_effect(s, int(n), alpha=level, power=power) for s, n in zip(spread, out.n)]
    out["needed"] = [prompts_for_effect(s, effect, alpha=level, power=power) for s in spread]
    return out


def ranked_group(heads, ranking: str, group: str, k: int) -> list[tuple[int, int]]:
    """The k most symbolic (lowest s_pos - s_sym) or most positional heads of one ranking's rows of a heads
    table, ties broken by layer then head, returned sorted.

    >>> import pandas as pd
    >>> h = pd.DataFrame({"variant": "plain", "layer": [0, 0, 1], "head": [0, 1, 0], "s_pos": [0.9, 0.1, 0.5],
    ...                   "s_sym": [0.1, 0.8, 0.5]})
    >>> ranked_group(h, "plain", "symbolic", 1), ranked_group(h, "plain", "positional", 2)
    ([(0, 1)], [(0, 0), (1, 0)])
    """
    rows = heads[heads.variant == ranking]
    order = rows.assign(b=rows.s_pos - rows.s_sym).sort_values(["b", "layer", "head"])
    pairs = [(int(a), int(b)) for a, b in zip(order.layer, order["head"])]
    return sorted(pairs[:k] if group == "symbolic" else pairs[::-1][:k])


def every_head(heads) -> list[tuple[int, int]]:
    """Every (layer, head) of a heads table (its sink-free rows: one per head of the model)."""
    rows = heads[heads.variant == "sink-free"]
    return [(int(a), int(b)) for a, b in zip(rows.layer, rows["head"])]


def causal_groups(
    heads, k: int, draws: int, seed: int, *, kinds: dict | None = None, rankings=RANKINGS
) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """{(ranking, group): heads}: the top-k symbolic and positional heads by each ranking's behaviour
    (s_pos - s_sym), and per ranking and group its own `draws` random sets matched on layer and layer kind
    ('random:<group>:<i>' under that ranking). rankings: those wanted (a subset of `RANKINGS`; each keeps
    the draws it has with both)."""
    out: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for ranking in rankings:
        for group in CAUSAL_GROUPS:
            out[(ranking, group)] = ranked_group(heads, ranking, group, k)
    every = every_head(heads)
    for ranking in rankings:
        r = RANKINGS.index(ranking)
        for g, group in enumerate(CAUSAL_GROUPS):
            # the sink-free pools keep the seeds they always had (same draws as before for the same heads)
            drawn = matched_random(every, out[(ranking, group)], draws, seed=seed + 31 * g + k + 1009 * r, kinds=kinds)
            for i, draw in enumerate(drawn):
                out[(ranking, f"{RANDOM}:{group}:{i}")] = draw
    return out


def causal_rows(chosen: dict[int, list[LengthPrompt]], config: PredictionConfig, ablations: dict, *, clean=None):
    """Per (condition, factor, prompt) whether the answer is right: the clean model (k = 0, group 'none')
    and every named group of `causal_groups` with the first causal_draws random sets of its pool, for each
    k and mode, read from the stage's real ablations (`estimates.causal_estimates`, which ablates these sets
    once for the rows here and for its calibration: `attribution.ablation_effects`, the heads replaced at
    every position by their mean at that position over the same length's prompts, or by zero; right when
    the ablated model's greedy next token is the answer).

    chosen: {factor: that length's causal prompts}; ablations: causal_estimates' {"groups": {k:
    `causal_groups` with at least causal_draws draws}, "where": {(k, ranking, group, draw or -1): set},
    "real": {mode: {factor: ablation_effects output}}}; clean: the clean model's rows (factor, length,
    prompt, correct) when already measured on these prompts (the lengths stage's 'between' accuracy), else
    the real ablations' clean answers.

    >>> import numpy as np
    >>> from types import SimpleNamespace
    >>> p = lambda i: SimpleNamespace(index=i, length=2)  # the rows read a prompt's index and length
    >>> groups = {1: {("sink-free", "symbolic"): [(0, 1)], ("sink-free", "positional"): [(0, 0)],
    ...               ("sink-free", "random:symbolic:0"): [(0, 2)], ("sink-free", "random:positional:0"): [(0, 2)]}}
    >>> where = {(1, "sink-free", "symbolic", -1): 0, (1, "sink-free", "symbolic", 0): 2,
    ...          (1, "sink-free", "positional", -1): 1, (1, "sink-free", "positional", 0): 2}
    >>> real = {"mean": {1: {"correct": np.array([[False, True, True]]), "clean_correct": np.array([True])}}}
    >>> ablations = {"groups": groups, "where": where, "real": real}
    >>> rows = causal_rows({1: [p(0)]}, PredictionConfig(causal_draws=1), ablations)
    >>> rows[["group", "draw", "correct"]].values.tolist()
    [['none', -1, True], ['symbolic', -1, False], ['positional', -1, True], ['random:symbolic', 0, True], ['random:positional', 0, True]]
    """
    import pandas as pd

    none = {"k": 0, "mode": "none", "ranking": "none", "group": "none", "draw": -1, "heads": ""}
    rows: list[dict] = []
    if clean is None:
        mode = next(iter(ablations["real"]))
        rows += [
            {**none, "factor": f, "length": p.length, "prompt": p.index, "correct": bool(ok)}
            for f, group in chosen.items()
            for p, ok in zip(group, ablations["real"][mode][f]["clean_correct"])
        ]
    else:
        # a clean row is of a causal prompt when its index, factor and length are: another format's rows
        # (another base length) never stand in for this one's
        wanted = {(p.index, f, p.length) for f, group in chosen.items() for p in group}
        found = [
            r
            for r in clean[["factor", "length", "prompt", "correct"]].to_dict("records")
            if (r["prompt"], r["factor"], r["length"]) in wanted
        ]
        if len(found) != len(wanted):
            raise PosymError(f"the clean rows cover {len(found)} of the {len(wanted)} causal prompts")
        rows.extend({**none, **r, "correct": bool(r["correct"])} for r in found)
    for k, groups in ablations["groups"].items():
        for mode in config.causal_modes:
            for (ranking, name), members in groups.items():
                pool, draw = (
                    (name.rsplit(":", 1)[0], int(name.rsplit(":", 1)[1])) if name.startswith(RANDOM) else (name, -1)
                )
                if draw >= config.causal_draws:
                    continue
                named = pool.split(":", 1)[1] if draw >= 0 else pool  # the pool's named group
                s = ablations["where"][(k, ranking, named, draw)]
                condition = {"k": k, "mode": mode, "ranking": ranking, "group": pool, "draw": draw}
                condition["heads"] = ",".join(f"{a}.{b}" for a, b in members)
                rows += [
                    {**condition, "factor": f, "length": p.length, "prompt": p.index, "correct": bool(correct[i, s])}
                    for f, group in chosen.items()
                    for correct in [ablations["real"][mode][f]["correct"]]
                    for i, p in enumerate(group)
                ]
    return pd.DataFrame(rows)


def causal_table(rows, *, n_boot: int = N_BOOT, seed: int = 0, effect: float = 0.1):
    """Drops and length effects per ablated group, against its own layer-matched random heads.

    rows: `causal_rows`. Per (k, mode, ranking, group, length): acc, drop = acc clean - acc ablated,
    effect = drop(L) - drop(base), each with a paired-bootstrap 95% interval over prompts (the random
    pools average their draws per prompt first); for the named groups also, against the random pool
    drawn for that ranking and group: drop_vs_random (the group's drop minus the pool's mean drop, with
    interval), p_drop (randomization p of the group's drop among the draws' drops), vs_random and p_effect
    (the same for the length effect, from the second length on), p_floor = 1 / (draws + 1), the smallest p
    the draws allow. Holm runs over every p of one (k, mode): p_drop_holm, p_effect_holm, family.
    drop_separated / separated: Holm-adjusted p < 0.05 and the bootstrap interval on the same side of 0.
    mde_drop / mde_effect: the difference detectable over prompts with 80% power at 0.05 / family (from
    the per-prompt spread of the difference, ddof 1); needed_drop / needed: prompts for `effect` at that
    level (the random side's draws averaged per prompt)."""
    import pandas as pd

    clean = rows[rows.group == "none"].pivot_table(index="prompt", columns="factor", values="correct", aggfunc="mean")
    prompts, factors = clean.index.tolist(), sorted(clean.columns.tolist())
    weights = bootstrap_weights(len(prompts), n_boot, seed)  # [B, P]
    n = len(prompts)

    def boot(matrix):  # [P, F] per-prompt values -> point [F], samples [B, F]
        return matrix.mean(0), weights @ matrix / n

    clean_matrix = clean[factors].to_numpy(dtype=float)  # [P, F]
    c_point, c_boot = boot(clean_matrix)
    length_of = rows.drop_duplicates("factor").set_index("factor")["length"].to_dict()
    ablations = rows[rows.group != "none"]
    stats: dict[tuple, tuple] = {}
    out = []
    for (k, mode, ranking, group), g in ablations.groupby(["k", "mode", "ranking", "group"], sort=False):
        per_prompt = g.pivot_table(index="prompt", columns="factor", values="correct", aggfunc="mean")
        matrix = per_prompt.reindex(index=prompts, columns=factors).to_numpy(dtype=float)  # [P, F]
        a_point, a_boot = boot(matrix)
        drop, drop_boot = c_point - a_point, c_boot - a_boot
        effect_, effect_boot = drop - drop[0], drop_boot - drop_boot[:, :1]
        per_draw = None
        if group.startswith(RANDOM):  # each draw's drop and length effect over all prompts: the null
            draws = g.pivot_table(index="draw", columns="factor", values="correct", aggfunc="mean")
            per_draw = c_point[None, :] - draws.reindex(columns=factors).to_numpy(dtype=float)  # [D, F]
        stats[(k, mode, ranking, group)] = (effect_, effect_boot, drop, drop_boot, clean_matrix - matrix, per_draw)
        dlo, dhi = percentile_interval(drop_boot)
        elo, ehi = percentile_interval(effect_boot)
        for j, factor in enumerate(factors):
            out.append(
                {
                    "k": k,
                    "mode": mode,
                    "ranking": ranking,
                    "group": group,
                    "factor": factor,
                    "length": length_of[factor],
                    "acc": float(a_point[j]),
                    "acc_clean": float(c_point[j]),
                    "drop": float(drop[j]),
                    "drop_lo": float(dlo[j]),
                    "drop_hi": float(dhi[j]),
                    "effect": float(effect_[j]),
                    "effect_lo": float(elo[j]),
                    "effect_hi": float(ehi[j]),
                    "draws": int(g.draw.nunique()) if group.startswith(RANDOM) else 1,
                    "prompts": n,
                }
            )
    table = pd.DataFrame(out)
    columns = (
        "drop_vs_random",
        "drop_vs_random_lo",
        "drop_vs_random_hi",
        "p_drop",
        "vs_random",
        "vs_random_lo",
        "vs_random_hi",
        "p_effect",
        "p_floor",
        "sd_drop",
        "sd_effect",
    )
    for column in columns:
        table[column] = np.nan
    for i, row in table.iterrows():
        pool = (row.k, row["mode"], row.ranking, f"{RANDOM}:{row.group}")
        if row.group.startswith(RANDOM) or pool not in stats:
            continue
        j = factors.index(row.factor)
        mine, theirs = stats[(row.k, row["mode"], row.ranking, row.group)], stats[pool]
        drop_diff, drop_boot = mine[2][j] - theirs[2][j], mine[3][:, j] - theirs[3][:, j]
        dlo, dhi = percentile_interval(drop_boot)
        diff, diff_boot = mine[0][j] - theirs[0][j], mine[1][:, j] - theirs[1][:, j]
        lo, hi = percentile_interval(diff_boot)
        null = theirs[5]  # [D, F] the draws' drops
        per_prompt_drop = mine[4][:, j] - theirs[4][:, j]  # [P]: group's drop minus the pool's mean drop
        per_prompt_effect = per_prompt_drop - (mine[4][:, 0] - theirs[4][:, 0])
        table.loc[i, list(columns)] = [
            float(drop_diff),
            float(dlo),
            float(dhi),
            randomization_p(float(mine[2][j]), null[:, j]),
            float(diff) if j > 0 else np.nan,
            float(lo) if j > 0 else np.nan,
            float(hi) if j > 0 else np.nan,
            randomization_p(float(mine[0][j]), null[:, j] - null[:, 0]) if j > 0 else np.nan,
            1.0 / (len(null) + 1),
            float(np.std(per_prompt_drop, ddof=1)),
            float(np.std(per_prompt_effect, ddof=1)) if j > 0 else np.nan,
        ]
    for column in ("p_drop_holm", "p_effect_holm", "mde_drop", "mde_effect"):
        table[column] = np.nan
    table["family"] = 0
    for column in ("drop_separated", "separated", "needed_drop", "needed"):
        table[column] = None
    for _, part in table.groupby(["k", "mode"], sort=False):
        both = np.concatenate([part.p_drop.to_numpy(), part.p_effect.to_numpy()])
        adjusted = holm(both)
        family = int(np.sum(~np.isnan(both)))
        level = ALPHA / max(family, 1)
        table.loc[part.index, "p_drop_holm"] = adjusted[: len(part)]
        table.loc[part.index, "p_effect_holm"] = adjusted[len(part) :]
        table.loc[part.index, "family"] = family
        for i in part.index:
            row = table.loc[i]
            if np.isnan(row.p_drop):
                continue
            table.at[i, "drop_separated"] = bool(
                row.p_drop_holm < ALPHA and (row.drop_vs_random_lo > 0 or row.drop_vs_random_hi < 0)
            )
            table.at[i, "mde_drop"] = detectable_effect(row.sd_drop, n, alpha=level)
            table.at[i, "needed_drop"] = prompts_for_effect(row.sd_drop, effect, alpha=level)
            if np.isnan(row.p_effect):
                continue
            table.at[i, "separated"] = bool(
                row.p_effect_holm < ALPHA and (row.vs_random_lo > 0 or row.vs_random_hi < 0)
            )
            table.at[i, "mde_effect"] = detectable_effect(row.sd_effect, n, alpha=level)
            table.at[i, "needed"] = prompts_for_effect(row.sd_effect, effect, alpha=level)
    return table


# ---- figures --------------------------------------------------------------------------------------


def plot_accuracy(summary, chosen: str):
    """Accuracy (Wilson 95% bands) against length per layout of the chosen format."""
    fig, ax = subplots(figsize=(6, 4))
    for k, (layout, rows) in enumerate(summary.groupby("layout", sort=False)):
        rows = rows.sort_values("length")
        ax.plot(rows.length, rows.acc, "o-", color=f"C{k}", label=f"{layout} (n = {int(rows.n.iloc[0])})")
        ax.fill_between(rows.length, rows.lo, rows.hi, color=f"C{k}", alpha=0.2)
    ax.set(
        xscale="log",
        xlabel="prompt length (tokens)",
        ylabel="accuracy (next token)",
        ylim=(-0.02, 1.02),
        title=f"{chosen}: accuracy by length",
    )
    ax.legend(fontsize=8)
    return fig


def plot_retention(groups, title: str):
    """Median head retention against length per group (margin and attention on the base key), 95% bands."""
    measures = list(dict.fromkeys(groups.measure))
    fig, axes = subplots(1, len(measures), figsize=(5.5 * len(measures), 4), squeeze=False)
    for ax, measure in zip(axes[0], measures):
        for k, (group, rows) in enumerate(groups[groups.measure == measure].groupby("group", sort=False)):
            rows = rows.sort_values("length")
            dashed = group.startswith(RANDOM)
            ax.plot(
                rows.length,
                rows.value,
                "--" if dashed else "o-",
                color=f"C{k}",
                label=f"{group} ({int(rows.heads.iloc[0])} heads{', %d draws' % rows.draws.iloc[0] if dashed else ''})",
            )
            ax.fill_between(rows.length, rows.lo, rows.hi, color=f"C{k}", alpha=0.15)
        ax.axhline(1, color="gray", lw=0.8, ls=":")
        ax.set(
            xscale="log",
            xlabel="prompt length (tokens)",
            ylabel=f"{measure} retention (median over heads)",
            title=measure,
        )
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_causal(table):
    """Length effect drop(L) - drop(base) per ablated group (sink-free ranking), 95% intervals."""
    panels = list(table[table.ranking != "plain"].groupby(["k", "mode"]))
    fig, axes = subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False, sharey=True)
    for ax, ((k, mode), rows) in zip(axes[0], panels):
        for c, (group, g) in enumerate(rows.groupby("group", sort=False)):
            g = g.sort_values("length")
            ax.errorbar(
                g.length * (1 + 0.04 * c),
                g.effect,
                yerr=[g.effect - g.effect_lo, g.effect_hi - g.effect],
                marker="o",
                capsize=3,
                ls="--" if group.startswith(RANDOM) else "-",
                color=f"C{c}",
                label=group,
            )
        ax.axhline(0, color="gray", lw=0.8)
        ax.set(xscale="log", xlabel="prompt length (tokens)", title=f"k = {k}, {mode}-ablation")
    axes[0, 0].set_ylabel("drop(L) - drop(base)")
    axes[0, -1].legend(fontsize=7)
    return fig


def label_moves(plain_heads, marked_heads, chosen: list[tuple[int, int]]):
    """The heads that matter (`chosen`), with their sink-free scores and labels without and with markers."""
    keep = ["layer", "head", "s_pos", "s_sym", "label"]
    a = plain_heads[plain_heads.variant == "sink-free"][keep]
    b = marked_heads[marked_heads.variant == "sink-free"][keep]
    both = a.merge(b, on=["layer", "head"], suffixes=("", "_marked"))
    wanted = set(chosen)
    return both[[(int(x), int(y)) in wanted for x, y in zip(both.layer, both["head"])]].reset_index(drop=True)
