"""Length generalization (docs/method.md section 6, Fig. 5B): accuracy of a trained run against sequence length.

Both protocols lengthen a sequence the same way, with the task's `extra_target` knob: E extra
target-window tokens go BEFORE the effective target window, and the rest of the sequence (target
window, hop instructions, query) is exactly the training-length sample with the same index, so the
answer and every offset are unchanged and each length is evaluated on the same questions. Length
always means the total number of tokens the model reads (query included): the paper's training
length is 8 + 8 + 1 = 17.

- paper protocol: absolute total lengths (default 17 ... 2048, the paper plots up to ~5,000);
  reported as accuracy per hop count. The paper: the letter model stays >= 90% up to 850 tokens,
  the number model collapses.
- seed protocol: lengths k x the run's training length for k in `factors` (default 1-4), reported as
  accuracy and as retention = acc(k L) / acc(L) per hop count. The seed summary: symbolic heads keep
  >= 80% of their accuracy at 2x-4x, positional ones fall to ~30% at the longest.
  Why the extra target window and not wider target / pre-target windows: a number-task window of
  16k tokens needs offsets up to 16k, integer tokens outside the trained vocabulary (and the ids of
  every symbol would move), so only the extra window lengthens both tasks with the tokens the model
  was trained on.

Each distinct length is evaluated once (with `posym.core.train.evaluate`) and shared by both protocols.
Batches are bounded by `max_tokens` tokens per forward pass, so memory stays bounded at any length.
Theorem 3.2's discrepancy bound of the task's head (number: T_Index, letter: T_Retrieval, from
`posym.core.theory`) at each length can be drawn next to the accuracies.

Head-level retention (issue 33, `posym.core.retention`; on unless `heads=False`): at every evaluated length
(and the training length), `head_prompts` of the same test questions, every pointer of the chain as a
query (queries="hops"), and per (prompt, query, layer, head) the margin (top-1 minus top-2 logit over the
keys the query sees) and the attention on the pointer's chain key (the next position on the chain: the
base position p sits at p + E at E extra tokens). Retention = mean at L / mean at the training length,
per head (head_retention.parquet, with the head's label: the run's own scores at the training length,
hop queries, gamma 0.1, `posym.core.interventions.label_heads`) and per group (head_groups.parquet:
positional / symbolic / mixed heads and 10 layer-matched random draws per group, median head retention
with paired prompt-bootstrap 95% intervals), and a figure (head_retention.png/svg).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

from posym.core.retention import (
    RANDOM,
    group_retention,
    head_measures,
    head_retention,
    matched_random,
)
from posym.core.scores import label_column, prompt_inputs
from posym.core.tasks import TaskConfig, generate
from posym.core.theory import frequency_angle, index_bound, retrieval_bound
from posym.core.train import evaluate
from posym.errors import PosymError

PROTOCOLS = ("paper", "seed", "both")


PAPER_LENGTHS = [17, 34, 51, 68, 128, 256, 512, 850, 1024, 2048]


SEED_FACTORS = [1, 2, 3, 4]


ALL_HOPS = 0
"""`hop` value of the rows that pool every hop count."""


HEAD_GAMMA = 0.1
"""Purity threshold of the head labels that group the head-level retention (the project's labels)."""


LABEL_PROMPTS = 100
"""Test prompts the head labels are scored on (`label_heads`' and `posym dynamics`' 100)."""


HEAD_GROUPS = ("positional", "symbolic", "mixed")
"""Labels that form groups of the head-level retention (uniform heads stay in the head table only)."""


RANDOM_DRAWS = 10
"""Layer-matched random head sets drawn per group."""


@dataclass
class LengthGenConfig:
    """What `posym lengthgen` evaluates."""

    lengths: list[int] = field(default_factory=lambda: list(PAPER_LENGTHS))
    """Paper protocol: total sequence lengths (tokens, query included); none may be shorter than
    the run's training length."""
    factors: list[int] = field(default_factory=lambda: list(SEED_FACTORS))
    """Seed protocol: multiples of the run's training length (1 is the reference of retention)."""
    protocol: str = "both"
    """Which protocol(s): paper, seed or both."""
    n: int = 128
    """Test sequences per length (the same questions at every length); 128 keeps a quick run under a
    minute on 2 CPU cores (the 2,048-token batches dominate)."""
    seed: int = 0
    """Seed of the test data."""
    split: str = "test"
    """Split whose random stream the test data comes from."""
    max_tokens: int = 16384
    """Tokens per forward pass: the batch at length L is max(1, max_tokens // L) sequences."""
    index_freq_id: int = 2
    """Bound overlay, number task: frequency ID (of the paper's 128-dim RoPE) of T_Index's plane
    (2: theta = 0.866, as Fig. 5A)."""
    retrieval_freq_id: int = 42
    """Bound overlay, letter task: frequency ID of T_Retrieval's plane (42: theta = 0.0027, as Fig. 5A)."""
    device: str = "cpu"
    """cpu or cuda."""
    heads: bool = True
    """Also measure head-level retention (margin and attention on the chain key per head and length)."""
    head_prompts: int = 64
    """Test sequences per length of the head-level retention (the first of the accuracy's questions)."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise PosymError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        if self.protocol != "seed" and (not self.lengths or min(self.lengths) < 2):
            raise PosymError("the paper protocol needs at least one length, each >= 2 tokens")
        if self.protocol != "paper" and (not self.factors or min(self.factors) < 1):
            raise PosymError("the seed protocol needs at least one factor, each a positive integer")
        if self.n < 1 or self.max_tokens < 1:
            raise PosymError(f"n and max_tokens must be positive, got n={self.n}, max_tokens={self.max_tokens}")
        if self.head_prompts < 2:
            raise PosymError(f"head_prompts must be at least 2 (a bootstrap over prompts), got {self.head_prompts}")

    @property
    def protocols(self) -> list[str]:
        """The protocols to run, in order."""
        return ["paper", "seed"] if self.protocol == "both" else [self.protocol]


def extension(task: TaskConfig, length: int) -> TaskConfig:
    """`task` lengthened to `length` tokens by extra target-window tokens before the effective window."""
    extra = length - task.seq_len
    if extra < 0:
        raise PosymError(
            f"length {length} is shorter than the run's training length {task.seq_len}; lengthgen only adds tokens"
        )
    return dataclasses.replace(task, extra_target=task.extra_target + extra)


def plan(task: TaskConfig, config: LengthGenConfig, n_positions: int) -> list[tuple[str, int, float]]:
    """(protocol, length, factor = length / training length) to evaluate, each protocol by length.

    A length beyond the model's position table (`n_positions`) is a PosymError; whether the test
    sequences fit in memory at the longest length is `posym.resources.check_lengths`'.
    """
    base = task.seq_len
    points = []
    for protocol in config.protocols:
        lengths = sorted(set(config.lengths)) if protocol == "paper" else sorted({k * base for k in config.factors})
        points += [(protocol, length, length / base) for length in lengths]
    for _, length, _ in points:
        extension(task, length)  # rejects lengths below the training length
        if length > n_positions:
            raise PosymError(
                f"length {length} exceeds the model's position table of {n_positions} tokens "
                f"(n_positions); choose lengths <= {n_positions}"
            )
    return points


def batch_size(length: int, max_tokens: int) -> int:
    """Sequences per forward pass at `length` so that a batch holds at most `max_tokens` tokens."""
    return max(1, max_tokens // length)


def discrepancy_bound(task: TaskConfig, length: int, config: LengthGenConfig) -> float:
    """Theorem 3.2's bound on the discrepancy of the task's head with its query at position
    length - 1 (number: T_Index, letter: T_Retrieval); NaN where the letter bound's condition
    n theta < omega / 2 fails."""
    n = length - 1
    if task.task == "number":
        return index_bound(frequency_angle(config.index_freq_id), n)
    theta = frequency_angle(config.retrieval_freq_id)
    if n * theta >= math.pi / task.alphabet_size:  # omega / 2
        return float("nan")
    return retrieval_bound(theta, task.alphabet_size, n)


def protocol_table(
    measured: dict[int, dict],
    task: TaskConfig,
    points: list[tuple[str, int, float]],
    hop_counts: dict[int, int],
    config: LengthGenConfig,
):
    """Long table, one row per (protocol, length, hop), hop 0 = all hops; `measured[length]` holds
    `posym.core.train.evaluate`'s metrics. Retention = acc / acc at the training length (same hop), NaN
    when the training length was not measured."""
    import pandas as pd

    rows = []
    for protocol, length, factor in points:
        m = measured[length]
        ref = measured.get(task.seq_len)
        for hop in [ALL_HOPS, *range(1, task.max_hops + 1)]:
            key = "acc" if hop == ALL_HOPS else f"acc_hop{hop}"
            acc = m[key]
            retention = acc / ref[key] if ref is not None and ref[key] > 0 else float("nan")
            rows.append(
                {
                    "task": task.task,
                    "protocol": protocol,
                    "length": length,
                    "factor": factor,
                    "extra_target": length - task.seq_len,
                    "hop": hop,
                    "n": hop_counts[hop],
                    "acc": acc,
                    "retention": retention,
                    "loss": m["loss"] if hop == ALL_HOPS else float("nan"),
                    "bound": discrepancy_bound(task, length, config),
                }
            )
    return pd.DataFrame(rows)


def summarize_protocols(table, task: TaskConfig) -> dict:
    """Headline numbers: paper protocol, the longest length whose all-hop accuracy stays >= 0.9 (and
    every accuracy); seed protocol, all-hop accuracy and retention per factor."""
    out = {"task": task.task, "train_length": task.seq_len}
    allhops = table[table["hop"] == ALL_HOPS]
    paper = allhops[allhops["protocol"] == "paper"]
    if len(paper):
        accs = dict(zip(paper["length"].tolist(), paper["acc"].tolist()))
        held = None  # the longest length up to which EVERY length is >= 0.9 (no later recovery counts)
        for length in sorted(accs):
            if accs[length] < 0.9:
                break
            held = length
        out["paper"] = {"acc": accs, "longest_length_acc_ge_0.9": held}
    seed = allhops[allhops["protocol"] == "seed"]
    if len(seed):
        out["seed"] = {
            "acc": dict(zip(seed["factor"].tolist(), seed["acc"].tolist())),
            "retention": dict(zip(seed["factor"].tolist(), seed["retention"].tolist())),
        }
    return out


def measure(
    model, task: TaskConfig, lengths: list[int], config: LengthGenConfig, progress: Callable[[int], None] | None = None
) -> dict[int, dict]:
    """`posym.core.train.evaluate` at every length (ascending), batches bounded by tokens.

    `progress(tokens)` is called after each length with the n * length tokens it read.
    """
    measured = {}
    for length in sorted(set(lengths)):
        cfg = extension(task, length)
        measured[length] = evaluate(
            model, cfg, config.n, config.seed, config.split, batch_size(length, config.max_tokens)
        )
        if progress:
            progress(config.n * length)
    return measured


def head_lengths(task: TaskConfig, lengths: list[int]) -> list[int]:
    """The lengths of the head-level retention: the evaluated ones and the training length (its base)."""
    return sorted({*lengths, task.seq_len})


def chain_keys(chain) -> dict[int, int]:
    """{pointer position: the chain key it points at} of one chain (query -> ... -> answer, -1 padded)."""
    positions = [int(p) for p in chain if int(p) >= 0]
    return dict(zip(positions[:-1], positions[1:]))


def measure_heads(
    model, task: TaskConfig, lengths: list[int], config: LengthGenConfig, progress: Callable[[int], None] | None = None
):
    """`posym.core.retention.head_measures` rows (with a `length` column) of `config.head_prompts` test
    questions at every length: queries at every pointer of the chain, the tracked key of a pointer its
    chain key. The samples at E extra tokens carry the chain already moved by E (`extension`), so the
    base pointer p and its key k are measured at p + E and k + E. `progress(tokens)` after each length."""
    import pandas as pd

    parts = []
    for length in lengths:
        samples = generate(extension(task, length), config.head_prompts, config.seed, config.split)
        ids, queries = prompt_inputs(samples, "hops")  # queries: per prompt its pointer positions
        keys = [chain_keys(chain) for chain in samples.chain]
        frame = head_measures(
            model,
            ids,
            queries,
            tracked=lambda prompt, query: keys[prompt].get(query),
            batch_size=batch_size(length, config.max_tokens),
        )
        parts.append(frame.assign(length=length))
        if progress:
            progress(config.head_prompts * length)
    return pd.concat(parts, ignore_index=True)


def head_groups(labels, *, seed: int = 0) -> tuple[dict[str, list[tuple[int, int]]], dict]:
    """Groups of heads for `group_retention`: each label of HEAD_GROUPS that some head carries, and
    RANDOM_DRAWS layer-matched random draws per group ('random:<label>:<i>'). Returns (groups, notes):
    notes per group say how the random draws were matched, or why there are none (too few heads
    outside the group)."""
    heads = sorted(zip(labels["layer"].astype(int), labels["head"].astype(int)))
    per_layer = labels.groupby("layer")["head"].nunique()
    groups: dict[str, list[tuple[int, int]]] = {}
    notes: dict[str, dict] = {}
    for k, label in enumerate(HEAD_GROUPS):
        chosen = labels[labels["label"] == label]
        members = sorted(zip(chosen["layer"].astype(int), chosen["head"].astype(int)))
        if not members:
            continue
        groups[label] = members
        outside = len(heads) - len(members)
        if outside < len(members):
            notes[label] = {
                "heads": len(members),
                "draws": 0,
                "random": f"none: {outside} heads outside the group of {len(members)}",
            }
            continue
        draws = matched_random(heads, members, RANDOM_DRAWS, seed=seed + k)
        exact = sum(sorted(l for l, _ in d) == sorted(l for l, _ in members) for d in draws)
        for i, draw in enumerate(draws):
            groups[f"{RANDOM}:{label}:{i}"] = draw
        match = (
            "same layers"
            if exact == len(draws)
            else "nearest layers where a layer has no head outside the group"
            + (" (one head per layer: every random head comes from another layer)" if int(per_layer.max()) == 1 else "")
        )
        notes[label] = {"heads": len(members), "draws": len(draws), "layer_matched_draws": exact, "random": match}
    return groups, notes


def head_tables(measures, labels, task: TaskConfig, *, seed: int = 0) -> tuple:
    """(head table, group table, notes): `head_retention` per head and length with the head's label,
    s_pos and s_sym, and `group_retention` of `head_groups` (empty when no head is positional,
    symbolic or mixed)."""
    import pandas as pd

    per_head = head_retention(measures, base_length=task.seq_len)
    per_head = per_head.merge(labels[["layer", "head", "s_pos", "s_sym", "label"]], on=["layer", "head"], how="left")
    groups, notes = head_groups(labels, seed=seed)
    if groups:
        grouped = group_retention(measures, groups, base_length=task.seq_len, seed=seed)
    else:
        grouped = pd.DataFrame(
            {
                "group": pd.Series(dtype=str),
                "measure": pd.Series(dtype=str),
                **{c: pd.Series(dtype="int64") for c in ("length",)},
                **{c: pd.Series(dtype="float64") for c in ("value", "lo", "hi")},
                **{c: pd.Series(dtype="int64") for c in ("heads", "draws", "prompts")},
            }
        )
    grouped.insert(1, "factor", grouped["length"] / task.seq_len)
    return per_head, grouped, notes


def summarize_head_retention(per_head, groups, notes, task: TaskConfig, config: LengthGenConfig) -> dict:
    """What lengthgen.json records of the head-level retention: settings, labels and per group, measure
    and length the retention with its interval."""
    labels = per_head.drop_duplicates(["layer", "head"])
    retention: dict = {}
    for r in groups.itertuples():
        retention.setdefault(r.group, {}).setdefault(r.measure, {})[str(int(r.length))] = {
            "value": r.value,
            "lo": r.lo,
            "hi": r.hi,
        }
    return {
        "base_length": task.seq_len,
        "lengths": sorted(int(v) for v in per_head["length"].unique()),
        "prompts": config.head_prompts,
        "queries": "hops (every pointer of the chain)",
        "tracked_key": "the pointer's chain key (the next position on the chain, moved by the extra tokens)",
        "labels_from": f"label_heads: {LABEL_PROMPTS} test prompts at the training length, hop queries, "
        f"gamma {HEAD_GAMMA} ({label_column(HEAD_GAMMA)})",
        "labels": {
            label: [f"L{int(r.layer)}H{int(r.head)}" for r in labels.itertuples() if r.label == label]
            for label in dict.fromkeys(sorted(labels["label"]))
        },
        "groups": notes,
        "interval": "95% paired prompt bootstrap (1,000 draws) of the median head retention",
        "retention": retention,
    }
