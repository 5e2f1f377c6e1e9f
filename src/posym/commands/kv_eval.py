"""`posym kv-eval`: how much a head-aware KV cache keeps of a model's accuracy, per policy at an equal budget
(issue 53's evaluation).

For one model, a head table (or the labels `posym atlas` computes for it), tasks, lengths and budgets (the
fraction of KV heads that keep only sink + recent keys), every policy of `posym.core.kvpolicy` is run as a
mask on the model's attention (`posym.core.kvcache.policy_attention`): one masked forward per prompt and
policy, the prompts of a length in equal-length batches, the answer teacher-forced. The policies at each
budget: 'posym' (positional KV heads streamed first, symbolic ones kept), 'retrieval' (the atlas's
retrieval score), 'duo' (DuoAttention's non-streaming proxy), `draws` layer-matched 'random' draws (as many
streaming KV heads per layer as the `reference` policy streams there; per layer type with `random_match:
type`, which a model with one KV head per layer needs); and 'streaming' (every KV head) and 'full' (none)
once.

Tasks (`TASKS`): 'length', llm-study's length task (`posym.prompts.LengthFamily`, format `length_format`,
'between' layout: the facts-to-question distance grows), and RULER's 'multikey' needles and 'vartrack'
variable tracking (`posym.prompts.RulerTask`), each at factor x its base length. A prompt is correct when
greedy decoding writes its answer: every answer token is the argmax after the tokens before it, and, for a
number judged whole, the argmax after it carries no digit on (`stops`); its log-probability is kept too.

Exactness and cost. At a length where a streaming KV head still sees every key (length <= recent), every
policy is the full cache: its answers are the full cache's, not recomputed. Two policies that choose the
same KV heads (a budget of 0; a random draw equal to a ranked policy) share one run. Every run goes
through the same kernel (`attend`), the full cache's too, so "relative to full" compares like with like.

OUT holds (resumable: a stage that finished is not run again; the same config is required to continue):
- kv_eval.yaml          the config (KVEvalConfig), written once; manifest.json: hash, versions, the model;
- heads.parquet         the head table the policies ranked (the one given, or the atlas's);
- prompts_TASK.parquet  per prompt, length, budget, policy and draw: correct, logprob, kept_fraction,
                        is_full (the run was the full cache's: budget 0, or length <= recent);
- pieces/TASK-Fx.parquet  while a task runs, its finished lengths (a killed run resumes at the first
                        missing one); removed once prompts_TASK.parquet is written;
- summary.parquet       per task, length, budget and policy: n, accuracy, Wilson 95% interval, the
                        kept-KV fraction at that length (`KVPolicy.kept_fraction`), accuracy relative to
                        the full cache; random: the mean over draws with their min, median, max and sd;
- tests.parquet         each ranked policy (and streaming) against the full cache and against the random
                        draws: exact McNemar p's (against full; against the median draw), the
                        randomization p over the draws, each Holm-adjusted over the table, and the
                        minimal detectable paired effect (80% power, 5% level) at the observed spread;
- primary.parquet       the run's primary tests (`primary_tests`): each ranked policy and budget against the
                        random draws on its answers pooled over every task and length, Holm over this
                        small family, with the smallest Holm p it can give and the draws that reach 0.05;
- accuracy.png/.svg     accuracy against kept-KV fraction per policy, one panel per task and length;
- summary.json          counts, base lengths, forwards, timings.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from posym import configs, io, resources
from posym.commands import atlas as atlas_command
from posym.core import kvcache, kvpolicy
from posym.core.stats import (
    detectable_effect,
    draws_for_holm,
    holm,
    holm_floor,
    mcnemar_p,
    prompts_for_effect,
    randomization_p,
    wilson_interval,
)
from posym.errors import PosymError
from posym.figures import save_figure, subplots
from posym.models import LoadedModel, identity
from posym.prompts import FACTORS, RULER_TASKS, Builder, LengthFamily, RulerTask, build, ruler_prompts
from posym.runs import KV_EVAL_MARKER, done_path, figure_file, kv_eval_piece, kv_eval_prompts, output_file
from posym.stages import claim, kept_piece, resumable, run_stage

TASKS = ("length", *RULER_TASKS)
"""The tasks kv-eval asks (see the module docstring)."""
RANKED = ("posym", "retrieval", "duo")
"""The policies that rank KV heads by a head-table score (tested against full and random)."""
JOB = "kv-eval"
"""The config file a resumable kv-eval directory keeps, and the job name of its done-files."""


@dataclass
class KVEvalConfig:
    """What `posym kv-eval` measures (written to OUT/kv_eval.yaml)."""

    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    """Tasks asked, among TASKS."""
    length_format: str = "kv-code"
    """The length task's format spec (`posym.prompts.parse_format`; a format llm-study's screen asks)."""
    factors: list[int] = field(default_factory=lambda: list(FACTORS))
    """Lengths as multiples of each task's base length."""
    base: int | None = None
    """Base length of every task in tokens (None: each task's own, its longest prompt without filler)."""
    n: int = 20
    """Prompts per task and length (the same questions at every length)."""
    budgets: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75])
    """Fractions of KV heads streaming (the budget) at which the ranked and random policies run."""
    policies: list[str] = field(default_factory=lambda: list(kvpolicy.POLICIES))
    """Policies run (`posym.core.kvpolicy.POLICIES`; 'full' always, the reference)."""
    draws: int = 100
    """Layer-matched random draws per budget (seeds seed .. seed + draws - 1). The randomization p against
    them is at least 1 / (draws + 1): 100 lets a policy that beats every draw reach 0.01; 10 cannot go below
    0.09. Holm multiplies that floor by the family's size: tests.parquet's per-cell family (27 rank tests on
    three tasks at three lengths) needs 539 draws to reach 0.05, primary.parquet's (one test per ranked policy
    and budget) 59 (`posym.core.stats.draws_for_holm`)."""
    reference: str = "posym"
    """The ranked policy whose streamed count per layer the random draws match."""
    random_match: str = "layer"
    """What the random draws keep of `reference` (`posym.core.kvpolicy.random_policy`): each layer's count of
    streaming KV heads ('layer'), or each layer type's ('type': windowed and global layers apart). A model
    with one KV head per layer (Gemma 3 270M) needs 'type': there every layer-matched draw is the reference
    itself, and the run is refused."""
    sink: int = kvpolicy.SINK
    """Keys at the start a streaming KV head keeps."""
    recent: int = kvpolicy.RECENT
    """Recent keys a streaming KV head keeps (a length up to this one is the full cache for every policy)."""
    needles: int = 4
    """multikey: key -> value needles per prompt."""
    chains: int = 2
    """vartrack: assignment chains per prompt."""
    hops: int = 4
    """vartrack: assignments after a chain's first."""
    digits: int = 0
    """Digits of the RULER tasks' values (0: RULER's, 7 for multikey, 5 for vartrack)."""
    seed: int = 0
    """Seed of every prompt set and of the random draws."""
    batch_tokens: int = 8192
    """Tokens per forward batch (prompts of a length batched up to this; one prompt at least)."""
    effect: float = 0.1
    """Accuracy difference whose needed prompt count the tests state (80% power, 5% level)."""
    atlas: dict = field(default_factory=dict)
    """Fields of `posym atlas`'s AtlasConfig for the labels when no head table is given (e.g.
    {n_binding: 20, needle_lengths: [256, 512]}); its seed is this config's seed unless given."""

    def __post_init__(self) -> None:
        resources.check_bounds({f.name: getattr(self, f.name) for f in fields(self) if f.name != "atlas"})
        if not self.tasks or any(t not in TASKS for t in self.tasks) or len(set(self.tasks)) != len(self.tasks):
            raise PosymError(f"tasks must be distinct, among {', '.join(TASKS)}, got {self.tasks}")
        LengthFamily(self.length_format)  # a PosymError for an unknown format or option
        if not self.factors or min(self.factors) < 1 or len(set(self.factors)) != len(self.factors):
            raise PosymError(f"factors must be distinct positive multiples of the base length, got {self.factors}")
        if self.base is not None and self.base < 8:
            raise PosymError(f"base must be at least 8 tokens (or null: each task's own), got {self.base}")
        if not 1 <= self.n <= 100_000:
            raise PosymError(f"n must lie in 1..100000, got {self.n}")
        if (
            not self.budgets
            or any(not 0 <= b <= 1 for b in self.budgets)
            or len(set(self.budgets)) != len(self.budgets)
        ):
            raise PosymError(f"budgets must be distinct fractions in [0, 1], got {self.budgets}")
        if any(p not in kvpolicy.POLICIES for p in self.policies) or "full" not in self.policies:
            raise PosymError(
                f"policies must be among {', '.join(kvpolicy.POLICIES)} and include full, got {self.policies}"
            )
        if self.random_match not in kvpolicy.MATCHES:
            raise PosymError(f"random_match must be one of {', '.join(kvpolicy.MATCHES)}, got {self.random_match!r}")
        if self.reference not in RANKED:
            raise PosymError(f"reference must be one of {', '.join(RANKED)}, got {self.reference!r}")
        if "random" in self.policies and not 1 <= self.draws <= 10_000:
            raise PosymError(f"draws must lie in 1..10000, got {self.draws}")
        if self.sink < 0 or self.recent < 1:
            raise PosymError(f"sink must be >= 0 and recent >= 1, got {self.sink}, {self.recent}")
        if self.batch_tokens < 1 or not 0 < self.effect <= 1:
            raise PosymError(
                f"batch_tokens must be positive and effect in (0, 1], got {self.batch_tokens}, {self.effect}"
            )
        RulerTask("multikey", needles=self.needles, digits=self.digits)
        RulerTask("vartrack", chains=self.chains, hops=self.hops, digits=self.digits)


# ---- prompts ------------------------------------------------------------------------------------


def task_prompts(loaded: LoadedModel, config: KVEvalConfig, task: str) -> dict[int, list]:
    """{factor: config.n prompts} of a task: `LengthPrompt`s of the length task, `RulerPrompt`s of the others
    (both carry ids, answer_id, answer_ids, stops and answer_keys)."""
    builder = Builder(loaded.tokenizer)
    if task == "length":
        family = LengthFamily(config.length_format, factors=sorted(config.factors))
        if not builder.asks(family.spec):
            raise PosymError(
                f"length_format {config.length_format!r} is a chat form; the tokenizer has no chat template"
            )
        return build(family, builder, config.n, seed=config.seed, base=config.base)
    ruler = RulerTask(task, needles=config.needles, chains=config.chains, hops=config.hops, digits=config.digits)
    return ruler_prompts(ruler, builder, config.n, config.factors, seed=config.seed, base=config.base)


def answer_tokens(prompt) -> tuple[int, ...]:
    """The tokens a prompt is judged on: its whole answer, or its answer token alone."""
    return tuple(prompt.answer_ids) or (prompt.answer_id,)


def forward_length(prompt) -> int:
    """Tokens of a prompt's teacher-forced forward: its ids and its answer."""
    return len(prompt.ids) + len(answer_tokens(prompt))


def check_sizes(loaded: LoadedModel, config: KVEvalConfig, prompts: dict[str, dict[int, list]]) -> None:
    """Refuse, before any forward, a length past the model's positions or a batch whose activations and
    attention blocks would not fit the machine's memory (`estimate_bytes`)."""
    longest = max(forward_length(p) for by_factor in prompts.values() for group in by_factor.values() for p in group)
    if longest > loaded.max_positions:
        raise PosymError(
            f"the prompts reach {longest:,} tokens but {loaded.name} has {loaded.max_positions:,} positions; "
            "choose smaller factors or base"
        )
    need = estimate_bytes(loaded.model, longest, batch_size(config, longest))
    have = resources.machine_memory("cuda" if "cuda" in str(loaded.device) else "cpu")
    if need > have:
        raise PosymError(
            f"a masked forward of {longest:,} tokens needs about {need / 2**30:.1f} GiB, more than this "
            f"machine's {have / 2**30:.1f} GiB; lower batch_tokens or the factors"
        )


def batch_size(config: KVEvalConfig, length: int) -> int:
    return max(1, config.batch_tokens // length)


def estimate_bytes(model, length: int, batch: int) -> int:
    """Peak bytes of one masked forward (an upper estimate): the kernel's query blocks (logits, their mask
    and softmax, each at most `kvcache.ATTEND_BYTES`) and per token the float32 activations a decoder layer
    keeps alive (hidden states, q/k/v and their repeats, the MLP's three intermediate tensors), and the
    weights.

    >>> smollm2 = type("M", (), {"config": type("C", (), {"hidden_size": 576, "intermediate_size": 1536,
    ...     "num_attention_heads": 9, "head_dim": 64}), "parameters": lambda self: []})()
    >>> round(estimate_bytes(smollm2, 4096, 2) / 2**30, 2)  # GiB: 0.75 of query blocks, 0.35 of activations
    1.1
    """
    config = getattr(model.config, "text_config", None) or model.config
    hidden = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or 4 * hidden
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    per_token = 4 * (6 * hidden + 3 * inner + 6 * config.num_attention_heads * head_dim)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return 3 * kvcache.ATTEND_BYTES + batch * length * per_token + weights


# ---- the model's answers under a policy -------------------------------------------------------------


def answer_outcomes(model, prompts: list, *, batch_tokens: int) -> tuple[list[bool], list[float]]:
    """(correct, log-probability of the answer) per prompt: one teacher-forced forward per prompt, prompts
    of an equal forward length batched (up to batch_tokens tokens), logits at the answer only. Correct:
    every answer token is the argmax after the tokens before it and the argmax after the answer is none
    of the prompt's `stops` (as greedy decoding would write it and stop)."""
    correct: dict[int, bool] = {}
    logprob: dict[int, float] = {}
    groups: dict[tuple[int, int], list[int]] = {}
    for k, p in enumerate(prompts):
        groups.setdefault((forward_length(p), len(answer_tokens(p))), []).append(k)
    device = next(model.parameters()).device
    with torch.no_grad():
        for (length, extra), members in groups.items():
            step = max(1, batch_tokens // length)
            for lo in range(0, len(members), step):
                chunk = members[lo : lo + step]
                answers = torch.tensor([answer_tokens(prompts[k]) for k in chunk], device=device)  # [b, extra]
                ids = torch.cat([torch.tensor([prompts[k].ids for k in chunk], device=device), answers], 1)  # [b, T]
                logits = model(
                    input_ids=ids, use_cache=False, logits_to_keep=extra + 1
                ).logits.float()  # [b, extra+1, V]
                greedy = logits.argmax(-1)  # [b, extra + 1]
                scores = torch.log_softmax(logits[:, :extra], -1).gather(-1, answers[..., None])[..., 0]  # [b, extra]
                for row, k in enumerate(chunk):
                    stops = prompts[k].stops
                    right = bool((greedy[row, :extra] == answers[row]).all())
                    correct[k] = right and int(greedy[row, extra]) not in stops
                    logprob[k] = float(scores[row].sum())
    return [correct[k] for k in range(len(prompts))], [logprob[k] for k in range(len(prompts))]


def policy_outcomes(model, policy: kvpolicy.KVPolicy, prompts: list, *, batch_tokens: int):
    """`answer_outcomes` with the model's attention masked by `policy` (`kvcache.policy_attention`)."""
    with kvcache.policy_attention(model, policy):
        return answer_outcomes(model, prompts, batch_tokens=batch_tokens)


# ---- policies at equal budget -----------------------------------------------------------------------


def check_table(table, config: KVEvalConfig) -> None:
    """A PosymError unless the head table holds the columns every ranked policy of the config ranks by."""
    for name in RANKED:
        if name in config.policies or (name == config.reference and "random" in config.policies):
            kvpolicy.keep_column(table, name)


def policy_grid(model_config, table, config: KVEvalConfig) -> list[dict]:
    """Every (budget, policy, draw) run: dicts with budget, policy, draw (-1 but for random) and the
    KVPolicy. 'full' and 'streaming' once (budget 0 and 1); ranked and random at every budget."""
    kw = {"sink": config.sink, "recent": config.recent}
    runs = []
    for name in ("full", "streaming"):
        if name in config.policies:
            runs.append(
                {
                    "budget": float(name == "streaming"),
                    "policy": name,
                    "draw": -1,
                    "kv": kvpolicy.policy_from_table(name, model_config, 0.0, **kw),
                }
            )
    for budget in config.budgets:
        for name in RANKED:
            if name in config.policies:
                kv = kvpolicy.policy_from_table(name, model_config, budget, table=table, **kw)
                runs.append({"budget": budget, "policy": name, "draw": -1, "kv": kv})
        if "random" in config.policies:
            base = kvpolicy.policy_from_table(config.reference, model_config, budget, table=table, **kw)
            for d in range(config.draws):
                kv = kvpolicy.random_policy(base, config.seed + d, config.random_match)
                runs.append({"budget": budget, "policy": "random", "draw": d, "kv": kv})
    return runs


def check_random(model_config, config: KVEvalConfig) -> None:
    """Refuse, before anything is written, random draws that could not differ from their reference whatever
    the ranking: with one KV head per layer, a layer-matched draw streams exactly the layers the reference
    streams (checked on a reference streaming one KV head per layer). A ranking that streams whole layers
    at some budget leaves that budget's draws no choice too; its randomization p is then 1, no verdict."""
    layer = config.random_match == "layer"
    if layer and "random" in config.policies and any(b > 0 for b in config.budgets):
        one = kvpolicy.uniform(True, model_config)
        grid = one.full.copy()
        grid[:, 0] = False  # [layers, kv]: one streaming KV head per layer
        probe = kvpolicy.KVPolicy(grid, one.sink, one.recent, one.windows, one.n_heads, config.reference)
        kvpolicy.check_draws(probe, config.random_match)


def distinct_runs(runs: list[dict], length: int, recent: int) -> dict[bytes, kvpolicy.KVPolicy]:
    """The policies a length needs run, by their KV-head choice: one run for policies that choose the same
    heads, and only the full cache at a length where streaming keeps every key (length <= recent)."""
    out: dict[bytes, kvpolicy.KVPolicy] = {}
    for run in runs:
        out.setdefault(run_key(run["kv"], length, recent), run["kv"])
    return out


def run_key(policy: kvpolicy.KVPolicy, length: int, recent: int) -> bytes:
    """What decides a policy's answers at a forward length: its full/streaming grid, or nothing (the full
    cache) where a streaming head sees every key."""
    if length <= recent:
        return b"full"
    return policy.full.tobytes()


def forward_count(runs: list[dict], prompts: dict[str, dict[int, list]], recent: int) -> int:
    """Distinct policy runs over every (task, length): the progress steps."""
    return sum(
        len(distinct_runs(runs, forward_length(group[0]), recent))
        for by_factor in prompts.values()
        for group in by_factor.values()
    )


def evaluate_task(
    model, task: str, prompts: dict[int, list], runs: list[dict], config: KVEvalConfig, progress=None, *, out=None
):
    """Per prompt, length and run: correct, logprob and the kept-KV fraction (a DataFrame). With `out` (the
    kv-eval directory), each finished length is kept (`posym.runs.kv_eval_piece`) until the task's table is
    written, so a killed run resumes at its first missing length."""
    import pandas as pd

    progress = progress or (lambda k=1: None)
    frames = []
    for factor, group in sorted(prompts.items()):
        length = forward_length(group[0])
        if any(forward_length(p) != length for p in group):
            raise PosymError(f"the {task} prompts at {factor}x differ in length")  # built equal: a builder bug
        if out is None:
            frames.append(length_rows(model, task, factor, group, runs, config, progress))
            continue
        path = kv_eval_piece(out, task, factor)
        if path.is_file():  # kept by a run that was killed later: its forwards are skipped
            progress(len(distinct_runs(runs, length, config.recent)))
        path.parent.mkdir(parents=True, exist_ok=True)
        frames.append(kept_piece(path, lambda: length_rows(model, task, factor, group, runs, config, progress)))
    return pd.concat(frames, ignore_index=True)


def length_rows(model, task: str, factor: int, group: list, runs: list[dict], config: KVEvalConfig, progress):
    """`evaluate_task`'s rows at one length: one masked forward per distinct policy over the group's prompts."""
    import pandas as pd

    length = forward_length(group[0])
    done: dict[bytes, tuple] = {}
    for key, policy in distinct_runs(runs, length, config.recent).items():
        done[key] = policy_outcomes(model, policy, group, batch_tokens=config.batch_tokens)
        progress(1)
    rows = []
    for run in runs:
        key = run_key(run["kv"], length, config.recent)
        right, logp = done[key]
        same = key == (b"full" if length <= config.recent else np.ones_like(run["kv"].full).tobytes())
        kept = run["kv"].kept_fraction(len(group[0].ids))
        for p, c, lp in zip(group, right, logp):
            rows.append(
                {
                    "task": task,
                    "factor": factor,
                    "length": length,
                    "index": p.index,
                    "budget": run["budget"],
                    "policy": run["policy"],
                    "draw": run["draw"],
                    "streaming_fraction": run["kv"].streaming_fraction,
                    "kept_fraction": kept,
                    "is_full": same,
                    "correct": c,
                    "logprob": lp,
                }
            )
    return pd.DataFrame(rows)


# ---- tables: summary and paired tests ------------------------------------------------------------------

CELL = ["task", "factor", "length", "budget"]


def summarize(frame):
    """Per task, length, budget and policy: n, accuracy, Wilson interval, kept fraction, relative to full;
    random: the draws' mean accuracy (its Wilson interval at n prompts) and their min/median/max/sd."""
    import pandas as pd

    full = frame[frame.policy == "full"].groupby(["task", "factor"]).correct.mean().rename("full_accuracy")
    rows = []
    for (task, factor, length, budget, policy), g in frame.groupby([*CELL, "policy"], sort=True):
        n = int(g["index"].nunique())
        by_draw = g.groupby("draw").correct.mean()
        accuracy = float(by_draw.mean())
        lo, hi = wilson_interval(round(accuracy * n), n)
        rows.append(
            {
                "task": task,
                "factor": factor,
                "length": length,
                "budget": budget,
                "policy": policy,
                "n": n,
                "draws": len(by_draw) if policy == "random" else 0,
                "accuracy": accuracy,
                "lo": lo,
                "hi": hi,
                "draw_min": float(by_draw.min()) if policy == "random" else math.nan,
                "draw_median": float(by_draw.median()) if policy == "random" else math.nan,
                "draw_max": float(by_draw.max()) if policy == "random" else math.nan,
                "draw_sd": float(by_draw.std(ddof=1)) if policy == "random" and len(by_draw) > 1 else math.nan,
                "streaming_fraction": float(g.streaming_fraction.mean()),
                "kept_fraction": float(g.kept_fraction.mean()),
                "logprob": float(g.logprob.mean()),
            }
        )
    out = pd.DataFrame(rows).merge(full.reset_index(), on=["task", "factor"], how="left")
    out["relative"] = np.where(
        out.full_accuracy > 0, out.accuracy / out.full_accuracy.where(out.full_accuracy > 0), np.nan
    )
    return out


def paired(a: np.ndarray, b: np.ndarray) -> dict:
    """Paired binary outcomes a against b (same prompts): discordant counts, exact McNemar p, the
    difference of accuracies and the detectable effect at the spread of the per-prompt differences (at
    least the spread one discordant prompt gives, 1 / sqrt(n): where no prompt differs, 0 is no bound)."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    d = a.astype(float) - b.astype(float)
    sd = max(float(d.std(ddof=1)), d.size**-0.5) if d.size > 1 else math.nan
    return {
        "b": int((a & ~b).sum()),
        "c": int((~a & b).sum()),
        "difference": float(d.mean()),
        "p": mcnemar_p(int((a & ~b).sum()), int((~a & b).sum())),
        "sd": sd,
        "mde": detectable_effect(sd, d.size),
    }


def paired_columns(a: np.ndarray, b: np.ndarray, name: str, effect: float | None = None) -> dict:
    """`paired` (a against b) as table columns suffixed `name`: diff, b, c, p, mde, and with `effect` the
    prompts `needed` to detect it (`prompts_for_effect` at the observed spread)."""
    test = paired(a, b)
    out = {f"diff_{name}": test["difference"], f"b_{name}": test["b"], f"c_{name}": test["c"]}
    out |= {f"p_{name}": test["p"], f"mde_{name}": test["mde"]}
    if effect is not None:
        out[f"needed_{name}"] = prompts_for_effect(test["sd"], effect)
    return out


def median_draw(accuracy: dict[int, float]) -> int:
    """The draw at the (lower) median of the draws' accuracies (ties: the lower draw)."""
    order = sorted(accuracy, key=lambda d: (accuracy[d], d))
    return order[(len(order) - 1) // 2]


def accuracy_tests(frame, effect: float):
    """Each ranked policy (and streaming) at each task, length and budget against the full cache (exact
    McNemar) and against the random draws of that budget (McNemar against the median draw, randomization
    p of the accuracy over the draws); each p Holm-adjusted over the table's rows (a NaN p is no test).
    A policy that ran as the full cache (`is_full`: budget 0, a length streaming keeps whole) is no test."""
    import pandas as pd

    rows = []
    for (task, factor), g in frame.groupby(["task", "factor"], sort=True):
        full = g[g.policy == "full"].sort_values("index")
        if full.empty:
            continue
        right_full = full.correct.to_numpy()
        for (budget, policy), h in g[g.policy.isin([*RANKED, "streaming"])].groupby(["budget", "policy"], sort=True):
            if "is_full" in h and h.is_full.all():
                continue  # the full cache's own run (budget 0, or a length streaming keeps whole): no test
            mine = h.sort_values("index").correct.to_numpy()
            row = {
                "task": task,
                "factor": factor,
                "length": int(h.length.iloc[0]),
                "budget": budget,
                "policy": policy,
                "n": len(mine),
                "accuracy": float(mine.mean()),
                "full_accuracy": float(right_full.mean()),
                **paired_columns(mine, right_full, "full", effect),
                "random_draws": 0,
                "diff_median": math.nan,
                "p_median": math.nan,
                "mde_median": math.nan,
                "p_random": math.nan,
            }
            draws = g[(g.policy == "random") & (g.budget == budget)]
            if policy in RANKED and not draws.empty:
                accuracy = draws.groupby("draw").correct.mean().to_dict()
                middle = draws[draws.draw == median_draw(accuracy)].sort_values("index").correct.to_numpy()
                row |= {
                    "random_draws": len(accuracy),
                    "random_mean": float(np.mean(list(accuracy.values()))),
                    "median_draw": median_draw(accuracy),
                    **paired_columns(mine, middle, "median"),
                    "p_random": randomization_p(float(mine.mean()), list(accuracy.values())),
                }
            rows.append(row)
    out = pd.DataFrame(rows)
    for column in ("p_full", "p_median", "p_random"):
        if column in out:
            out[f"{column}_holm"] = holm(out[column].to_numpy(dtype=float))
    return out


def primary_tests(frame, effect: float):
    """The run's primary tests, few enough for Holm to reach a verdict: each ranked policy at each budget
    against the random draws of that budget, on its answers pooled over every task and length of the run
    (the cells where it ran as the full cache left out: there every policy is the full cache). Per row: the
    pooled accuracy (Wilson interval), the paired tests against the full cache and the median draw, the
    draws' pooled accuracies (min, median, max; how many reach the policy's) and the randomization p among
    them, two-sided about the draws' median (`randomization_p`, as everywhere in posym) and one-sided
    (`p_above`: (1 + draws at least as accurate) / (draws + 1), the direction a KV policy is for: a skewed
    null, whose draws fall far below their median when they stream a head a task needs, leaves the
    two-sided p large even when no draw reaches the policy), each p Holm-adjusted over the table. `holm_floor` is the smallest Holm p the table can give
    (tests / (draws + 1)) and `draws_needed` the draws at which it reaches 0.05: tests.parquet's per-cell
    family is too large for that at 100 draws (27 rank tests: 0.267), this one is not (3 tests: 0.030).

    >>> import pandas as pd
    >>> rows = [dict(task="t", factor=1, index=i, budget=0.5, policy=p, draw=d, is_full=False, correct=c)
    ...         for i in range(4) for p, d, c in [("posym", -1, True), ("random", 0, i < 2), ("random", 1, i < 1),
    ...                                           ("random", 2, i < 3)]]
    >>> rows += [dict(task="t", factor=1, index=i, budget=0.0, policy="full", draw=-1, is_full=True, correct=True)
    ...          for i in range(4)]
    >>> t = primary_tests(pd.DataFrame(rows), 0.1)
    >>> shown = ["policy", "n", "accuracy", "random_median", "draws_reaching", "p_random", "p_above", "holm_floor"]
    >>> t[shown].values.tolist(), int(t.draws_needed.iloc[0])
    ([['posym', 4, 1.0, 0.5, 0, 0.25, 0.25, 0.25]], 19)
    """
    import pandas as pd

    keys = ["task", "factor", "index"]
    tested = frame[~frame.is_full.astype(bool)] if "is_full" in frame else frame
    full = frame[frame.policy == "full"].set_index(keys).correct
    rows = []
    for (budget, policy), h in tested[tested.policy.isin(RANKED)].groupby(["budget", "policy"], sort=True):
        draws = tested[(tested.policy == "random") & (tested.budget == budget)]
        if draws.empty:
            continue
        mine = h.set_index(keys).correct.sort_index()  # (prompts pooled over tasks and lengths,)
        by_draw = {d: g.set_index(keys).correct.reindex(mine.index) for d, g in draws.groupby("draw")}
        if any(v.isna().any() for v in by_draw.values()):
            raise ValueError(f"the random draws at budget {budget} do not cover {policy}'s prompts")
        accuracy = {d: float(v.mean()) for d, v in by_draw.items()}
        middle = median_draw(accuracy)
        n, right = len(mine), int(mine.sum())
        lo, hi = wilson_interval(right, n)
        values = np.array(list(accuracy.values()))
        reaching = int((values >= right / n - 1e-12).sum())  # draws at least as accurate
        rows.append(
            {
                "budget": budget,
                "policy": policy,
                "tasks": ",".join(dict.fromkeys(h.task)),
                "cells": int(h.groupby(["task", "factor"]).ngroups),
                "n": n,
                "accuracy": right / n,
                "lo": lo,
                "hi": hi,
                "full_accuracy": float(full.reindex(mine.index).mean()),
                **paired_columns(mine.to_numpy(), full.reindex(mine.index).to_numpy(), "full", effect),
                "random_draws": len(accuracy),
                "random_min": float(values.min()),
                "random_median": float(np.median(values)),
                "random_max": float(values.max()),
                "draws_reaching": reaching,
                "p_random": randomization_p(right / n, values),
                # one-sided, the direction a KV policy is for: (1 + #draws at least as accurate) / (draws + 1)
                "p_above": (1 + reaching) / (len(values) + 1),
                "median_draw": middle,
                **paired_columns(mine.to_numpy(), by_draw[middle].to_numpy(dtype=bool), "median"),
            }
        )
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    for column in ("p_full", "p_median", "p_random", "p_above"):
        out[f"{column}_holm"] = holm(out[column].to_numpy(dtype=float))
    tests = int(out.p_random.notna().sum())
    out["holm_floor"] = holm_floor(tests, int(out.random_draws.min()))
    out["draws_needed"] = draws_for_holm(tests)
    return out


# ---- the figure ------------------------------------------------------------------------------------

COLOURS = {"posym": "C0", "retrieval": "C1", "duo": "C2", "random": "C7", "streaming": "C3", "full": "k"}


def plot_accuracy(summary):
    """Accuracy (Wilson 95% interval; random: the draws' range as a grey bar behind) against the kept-KV
    fraction, per policy (each shifted a little sideways, as equal budgets keep equal memory), one panel
    per task (rows) and length (columns)."""
    tasks = list(dict.fromkeys(summary.task))
    factors = sorted(summary.factor.unique())
    order = [p for p in COLOURS if p in set(summary.policy)]
    fig, axes = subplots(
        len(tasks), len(factors), figsize=(2.8 * len(factors) + 1, 2.3 * len(tasks) + 0.6), squeeze=False, sharey=True
    )
    for i, task in enumerate(tasks):
        for j, factor in enumerate(factors):
            ax = axes[i][j]
            cell = summary[(summary.task == task) & (summary.factor == factor)]
            span = max(1e-3, 1 - float(cell.kept_fraction.min())) if not cell.empty else 1.0
            for k, policy in enumerate(order):
                g = cell[cell.policy == policy].sort_values("kept_fraction")
                if g.empty:
                    continue
                x = g.kept_fraction.to_numpy() + (k - (len(order) - 1) / 2) * 0.012 * span
                y = g.accuracy.to_numpy()
                err = np.vstack([y - g.lo.to_numpy(), g.hi.to_numpy() - y])
                colour = COLOURS[policy]
                if policy == "random":
                    ax.vlines(x, g.draw_min, g.draw_max, color=colour, alpha=0.35, lw=6)
                ax.errorbar(x, y, yerr=err, marker="o", ms=3, lw=1, capsize=2, color=colour, label=policy)
            if not cell.empty:
                ax.set_title(f"{task}, {factor}x ({int(cell.length.iloc[0]):,} tokens)", fontsize=8)
            ax.set_ylim(-0.05, 1.05)
            ax.tick_params(labelsize=7)
            if i == len(tasks) - 1:
                ax.set_xlabel("kept KV fraction", fontsize=8)
            if j == 0:
                ax.set_ylabel("accuracy", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=7, frameon=False)
    fig.subplots_adjust(top=1 - 0.45 / (2.3 * len(tasks) + 0.6), hspace=0.45)
    return fig


# ---- the stages -------------------------------------------------------------------------------------


def atlas_config(config: KVEvalConfig):
    """The AtlasConfig of the labels stage: config.atlas's fields, the seed this config's unless given."""
    return configs.from_dict(atlas_command.AtlasConfig, {"seed": config.seed, **config.atlas}, where="atlas")


def read_head_table(path):
    """A head table (Parquet) with layer and head columns."""
    table = io.read_parquet(path)
    missing = {"layer", "head"} - set(table.columns)
    if missing:
        raise PosymError(f"{io.quote(path)} has no {', '.join(sorted(missing))} column: not a head table")
    return table


def labels(loaded: LoadedModel, config: KVEvalConfig, table_path, progress=None):
    """The head table the policies rank: the one given, or `posym atlas`'s table of the model (s_pos/s_sym
    sink-free, retrieval, non-streaming)."""
    if table_path is not None:
        return read_head_table(table_path)
    return atlas_command.build_atlas(loaded, atlas_config(config), progress)["atlas"]


def run_kv_eval(
    loaded: LoadedModel, out, config: KVEvalConfig, *, table=None, settings: dict | None = None, progress=None
) -> dict:
    """Run the stages not yet done (labels, one per task, summary) into OUT (see the module docstring);
    returns summary.json's dict. `table`: a head table path (None: the atlas's labels). `progress(k)`
    advances by distinct policy runs (`plan` counts them)."""
    out = Path(out)
    progress = progress or (lambda k=1: None)
    model = loaded.model.eval()
    given = read_head_table(table) if table is not None else None
    if given is not None:
        check_table(given, config)
    else:
        atlas_config(config)  # a bad atlas field fails before any work
    prompts = {task: task_prompts(loaded, config, task) for task in config.tasks}
    check_sizes(loaded, config, prompts)
    check_random(model.config, config)
    timings: dict[str, float | str] = {}
    with resumable(out, lambda: f"kept the finished stages of {out}; run the same command again to continue"):
        prepare(out, config, loaded, settings or {})
        heads = output_file(out, "kv-eval", "heads")
        seconds = run_stage(out, JOB, "labels", lambda: io.write_parquet(heads, labels(loaded, config, table)))
        timings["labels"] = "done" if seconds is None else round(seconds, 2)
        head_table = io.read_parquet(heads)
        if given is not None and not given.reset_index(drop=True).equals(head_table):
            raise PosymError(
                f"{out} was ranked by another head table ({heads}); give that table to continue it, or choose "
                "another --out"
            )
        check_table(head_table, config)
        runs = policy_grid(model.config, head_table, config)
        for task in config.tasks:
            path = kv_eval_prompts(out, task)

            def work(task=task, path=path):
                io.write_parquet(path, evaluate_task(model, task, prompts[task], runs, config, progress, out=out))
                for factor in prompts[task]:  # the task's table holds them now
                    kv_eval_piece(out, task, factor).unlink(missing_ok=True)
                with contextlib.suppress(OSError):  # another task's pieces may still be there
                    kv_eval_piece(out, task, 1).parent.rmdir()

            seconds = run_stage(out, JOB, task, work)
            if seconds is None:
                progress(forward_count(runs, {task: prompts[task]}, config.recent))
            timings[task] = "done" if seconds is None else round(seconds, 2)
        import pandas as pd

        frame = pd.concat([io.read_parquet(kv_eval_prompts(out, t)) for t in config.tasks], ignore_index=True)
        summary, tests, primary = (
            summarize(frame),
            accuracy_tests(frame, config.effect),
            primary_tests(frame, config.effect),
        )
        record = {
            **io.manifest(configs.to_dict(config), seed=config.seed, **(settings or {})),
            "model": loaded.name,
            "base_lengths": {t: int(min(by[f][0].length for f in by) // min(by)) for t, by in prompts.items()},
            "lengths": {t: sorted({forward_length(g[0]) for g in by.values()}) for t, by in prompts.items()},
            "runs": len(runs),
            "forwards": forward_count(runs, prompts, config.recent),
            "prompts": len(frame),
            "timings": timings,
        }
        io.write_parquet(output_file(out, "kv-eval", "summary"), summary)
        io.write_parquet(output_file(out, "kv-eval", "tests"), tests)
        io.write_parquet(output_file(out, "kv-eval", "primary"), primary)
        save_figure(plot_accuracy(summary), figure_file(out, "kv-eval", "accuracy"))
        io.write_json(output_file(out, "kv-eval", "record"), record)
    return record


def plan(loaded: LoadedModel, config: KVEvalConfig, table=None) -> int:
    """Distinct policy runs the evaluation makes (the progress bar's steps); with no table the head count
    is known but not the ranking, so every budget's ranked and random runs are counted as distinct."""
    prompts = {task: task_prompts(loaded, config, task) for task in config.tasks}
    if table is None:  # no ranking yet: count every run that could be distinct
        per_budget = sum(p in config.policies for p in RANKED) + (config.draws if "random" in config.policies else 0)
        total = 0
        for by_factor in prompts.values():
            for group in by_factor.values():
                short = forward_length(group[0]) <= config.recent
                total += 1 if short else 1 + ("streaming" in config.policies) + per_budget * len(config.budgets)
        return total
    runs = policy_grid(loaded.model.config, read_head_table(table), config)
    return forward_count(runs, prompts, config.recent)


def prepare(out: Path, config: KVEvalConfig, loaded: LoadedModel, settings: dict) -> None:
    """OUT/kv_eval.yaml and manifest.json (the model's `identity`); a directory of another config or of
    another model's weights is refused."""
    model = identity(loaded)
    manifest = output_file(out, "kv-eval", "manifest")
    if not claim(out, KV_EVAL_MARKER, configs.to_dict(config), what="a kv-eval"):
        before = io.read_json_object(manifest) if manifest.is_file() else {}
        held = before.get("identity")
        if isinstance(held, dict) and held.get("digest") != model["digest"]:
            raise PosymError(
                f"{out} holds a kv-eval of {held.get('name')}, not of {model['name']}; re-run with that model "
                "to continue it, or choose another --out"
            )
        if not before and done_path(out, JOB, "labels").is_file():
            raise PosymError(f"{out} holds finished stages but no manifest.json; choose another --out")
    io.write_json(manifest, io.manifest(configs.to_dict(config), seed=config.seed, identity=model, **settings))
