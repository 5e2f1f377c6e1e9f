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
from pathlib import Path
from typing import Callable

from posym.configs import to_dict
from posym.core.interventions import label_heads
from posym.core.retention import MEASURES, RANDOM, group_retention, head_measures, head_retention, matched_random
from posym.core.scores import label_column, prompt_inputs
from posym.core.tasks import TaskConfig, generate
from posym.core.theory import frequency_angle, index_bound, retrieval_bound
from posym.core.train import evaluate
from posym.errors import PosymError
from posym.figures import colormap, save_figure, spaced_tick_labels, subplots
from posym.io import manifest, write_json, write_parquet
from posym.loading import load_checkpoint
from posym.resources import check_count, sequence_bytes


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


# ---- pure planning ----------------------------------------------------------------------------------


def extension(task: TaskConfig, length: int) -> TaskConfig:
    """`task` lengthened to `length` tokens by extra target-window tokens before the effective window."""
    extra = length - task.seq_len
    if extra < 0:
        raise PosymError(f"length {length} is shorter than the run's training length {task.seq_len}; "
                         f"lengthgen only adds tokens")
    return dataclasses.replace(task, extra_target=task.extra_target + extra)


def plan(task: TaskConfig, config: LengthGenConfig, n_positions: int) -> list[tuple[str, int, float]]:
    """(protocol, length, factor = length / training length) to evaluate, each protocol by length.

    A length beyond the model's position table (`n_positions`), or more test sequences (`n`,
    `head_prompts`) than memory holds at the longest length, is a PosymError.
    """
    base = task.seq_len
    points = []
    for protocol in config.protocols:
        lengths = sorted(set(config.lengths)) if protocol == "paper" else sorted({k * base for k in config.factors})
        points += [(protocol, length, length / base) for length in lengths]
    for _, length, _ in points:
        extension(task, length)  # rejects lengths below the training length
        if length > n_positions:
            raise PosymError(f"length {length} exceeds the model's position table of {n_positions} tokens "
                             f"(n_positions); choose lengths <= {n_positions}")
    # each length's test sequences are generated at once: the longest bounds the counts
    longest = max(length for _, length, _ in points)
    each = sequence_bytes(extension(task, longest))
    check_count("--n", config.n, each, what=f"{longest}-token test sequence")
    if config.heads:
        check_count("--head-prompts", config.head_prompts, each, what=f"{longest}-token test sequence")
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


def protocol_table(measured: dict[int, dict], task: TaskConfig, points: list[tuple[str, int, float]],
                   hop_counts: dict[int, int], config: LengthGenConfig):
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
            rows.append({
                "task": task.task, "protocol": protocol, "length": length, "factor": factor,
                "extra_target": length - task.seq_len, "hop": hop, "n": hop_counts[hop], "acc": acc,
                "retention": retention, "loss": m["loss"] if hop == ALL_HOPS else float("nan"),
                "bound": discrepancy_bound(task, length, config),
            })
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
        out["seed"] = {"acc": dict(zip(seed["factor"].tolist(), seed["acc"].tolist())),
                       "retention": dict(zip(seed["factor"].tolist(), seed["retention"].tolist()))}
    return out


# ---- evaluation and outputs -------------------------------------------------------------------------


def measure(model, task: TaskConfig, lengths: list[int], config: LengthGenConfig,
            progress: Callable[[int], None] | None = None) -> dict[int, dict]:
    """`posym.core.train.evaluate` at every length (ascending), batches bounded by tokens.

    `progress(tokens)` is called after each length with the n * length tokens it read.
    """
    measured = {}
    for length in sorted(set(lengths)):
        cfg = extension(task, length)
        measured[length] = evaluate(model, cfg, config.n, config.seed, config.split,
                                    batch_size(length, config.max_tokens))
        if progress:
            progress(config.n * length)
    return measured


def plot(table, task: TaskConfig, *, title: str = ""):
    """Fig. 5B: accuracy vs length per hop (log x, the discrepancy bound on the right axis) and, for
    the seed protocol, retention vs length factor per hop. PNG + SVG; returns the paths."""
    protocols = [p for p in ("paper", "seed") if (table["protocol"] == p).any()]
    fig, axes = subplots(1, len(protocols), figsize=(5.5 * len(protocols), 4), squeeze=False)
    hops = [ALL_HOPS, *range(1, task.max_hops + 1)]
    colors = colormap("viridis")(
        [0.15 + 0.7 * i / max(1, task.max_hops - 1) for i in range(task.max_hops)])
    for ax, protocol in zip(axes[0], protocols):
        twin_lines = []  # the bound's line on the right axis joins the left axis' legend
        sub = table[table["protocol"] == protocol]
        x_col, y_col = ("length", "acc") if protocol == "paper" else ("factor", "retention")
        for hop in hops:
            rows = sub[sub["hop"] == hop].sort_values(x_col)
            style = dict(color="black", lw=2.2, label="all hops") if hop == ALL_HOPS else dict(
                color=colors[hop - 1], lw=1.2, label=f"{hop} hop{'s' if hop > 1 else ''}")
            ax.plot(rows[x_col], rows[y_col], marker="o", ms=3, **style)
        ax.set_ylim(-0.02, 1.05 if protocol == "paper" else max(1.1, float(sub["retention"].max()) + 0.05))
        if protocol == "paper":
            ax.set_xscale("log")
            ax.axvline(task.seq_len, color="gray", ls=":", lw=1, label=f"training length {task.seq_len}")
            ax.set(xlabel="sequence length (tokens)", ylabel="accuracy",
                   title="paper protocol: extra target-window tokens")
            bound = sub[sub["hop"] == ALL_HOPS].sort_values("length")
            if bound["bound"].notna().any():
                twin = ax.twinx()
                head = "T_Index" if task.task == "number" else "T_Retrieval"
                twin.plot(bound["length"], bound["bound"], color="tab:red", ls="--", lw=1,
                          label=f"{head} discrepancy bound (Thm 3.2)")
                twin.set(yscale="log", ylabel="discrepancy bound")
                twin_lines = twin.get_lines()
        else:
            factors = sorted(sub["factor"].unique())
            ax.set_xlim(min(factors) - 0.3, max(factors) + 0.3)
            for level, text in [(0.8, "expected: symbolic >= 0.8"), (0.3, "expected: positional ~0.3")]:
                ax.axhline(level, color="gray", ls=":", lw=1)
                ax.text(min(factors) - 0.25, level + 0.01, text, fontsize=7, color="gray")
            ax.set(xlabel=f"length / training length ({task.seq_len} tokens)",
                   ylabel="retention: acc / acc at training length", title="multiples of the training length (protocol seed)")
            ax.set_xticks(factors, [f"{f:g}x" for f in factors])
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles + twin_lines, labels + [line.get_label() for line in twin_lines], loc="best", fontsize=7)
    fig.suptitle(title or f"{task.task} task: length generalization", fontsize=10)
    fig.tight_layout()
    return fig


# ---- head-level retention (issue 33) ----------------------------------------------------------------


def head_lengths(task: TaskConfig, lengths: list[int]) -> list[int]:
    """The lengths of the head-level retention: the evaluated ones and the training length (its base)."""
    return sorted({*lengths, task.seq_len})


def chain_keys(chain) -> dict[int, int]:
    """{pointer position: the chain key it points at} of one chain (query -> ... -> answer, -1 padded)."""
    positions = [int(p) for p in chain if int(p) >= 0]
    return dict(zip(positions[:-1], positions[1:]))


def measure_heads(model, task: TaskConfig, lengths: list[int], config: LengthGenConfig,
                  progress: Callable[[int], None] | None = None):
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
        frame = head_measures(model, ids, queries, tracked=lambda prompt, query: keys[prompt].get(query),
                              batch_size=batch_size(length, config.max_tokens))
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
            notes[label] = {"heads": len(members), "draws": 0,
                            "random": f"none: {outside} heads outside the group of {len(members)}"}
            continue
        draws = matched_random(heads, members, RANDOM_DRAWS, seed=seed + k)
        exact = sum(sorted(l for l, _ in d) == sorted(l for l, _ in members) for d in draws)
        for i, draw in enumerate(draws):
            groups[f"{RANDOM}:{label}:{i}"] = draw
        match = ("same layers" if exact == len(draws) else
                 "nearest layers where a layer has no head outside the group"
                 + (" (one head per layer: every random head comes from another layer)"
                    if int(per_layer.max()) == 1 else ""))
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
        grouped = pd.DataFrame({"group": pd.Series(dtype=str), "measure": pd.Series(dtype=str),
                                **{c: pd.Series(dtype="int64") for c in ("length",)},
                                **{c: pd.Series(dtype="float64") for c in ("value", "lo", "hi")},
                                **{c: pd.Series(dtype="int64") for c in ("heads", "draws", "prompts")}})
    grouped.insert(1, "factor", grouped["length"] / task.seq_len)
    return per_head, grouped, notes


MEASURE_TITLES = {"margin": "margin (top-1 minus top-2 logit)", "attn_tracked": "attention on the chain key"}


def plot_head_retention(groups, task: TaskConfig, *, title: str = ""):
    """Retention vs length per group of heads (margin and attention panels, log x): each label a solid
    line with its 95% bootstrap band, its layer-matched random draws dashed with theirs. Returns the Figure."""
    fig, axes = subplots(1, len(MEASURES), figsize=(5.5 * len(MEASURES), 4), squeeze=False)
    colors = {"positional": "tab:red", "symbolic": "tab:blue", "mixed": "tab:purple"}
    for ax, measure in zip(axes[0], MEASURES):
        sub = groups[groups["measure"] == measure]
        for name in dict.fromkeys(sub["group"]):
            rows = sub[sub["group"] == name].sort_values("length")
            random = name.startswith(f"{RANDOM}:")
            label = name.split(":", 1)[1] if random else name
            color = colors.get(label, "gray")
            text = (f"random, matched to {label} ({int(rows['draws'].iloc[0])} draws)" if random
                    else f"{name} ({int(rows['heads'].iloc[0])} head{'s' * (int(rows['heads'].iloc[0]) != 1)})")
            ax.plot(rows["length"], rows["value"], color=color, ls="--" if random else "-", lw=1 if random else 1.8,
                    marker="" if random else "o", ms=3, label=text)
            ax.fill_between(rows["length"], rows["lo"], rows["hi"], color=color, alpha=0.08 if random else 0.2, lw=0)
        ax.axhline(1.0, color="gray", ls=":", lw=1)
        ax.axvline(task.seq_len, color="gray", ls=":", lw=1)
        ax.set_xscale("log")
        lengths = sorted(sub["length"].unique()) if len(sub) else [task.seq_len]
        ax.set_xticks(lengths, spaced_tick_labels(lengths), minor=False)
        ax.minorticks_off()
        ax.set(xlabel="sequence length (tokens)", ylabel=f"retention: value / value at {task.seq_len} tokens",
               title=MEASURE_TITLES[measure])
        if len(sub):
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "no positional, symbolic or mixed head", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8, color="gray")
    fig.suptitle(title or f"{task.task} task: head-level retention (median over heads, 95% bootstrap over prompts)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def summarize_head_retention(per_head, groups, notes, task: TaskConfig, config: LengthGenConfig) -> dict:
    """What lengthgen.json records of the head-level retention: settings, labels and per group, measure
    and length the retention with its interval."""
    labels = per_head.drop_duplicates(["layer", "head"])
    retention: dict = {}
    for r in groups.itertuples():
        retention.setdefault(r.group, {}).setdefault(r.measure, {})[str(int(r.length))] = {
            "value": r.value, "lo": r.lo, "hi": r.hi}
    return {
        "base_length": task.seq_len, "lengths": sorted(int(v) for v in per_head["length"].unique()),
        "prompts": config.head_prompts, "queries": "hops (every pointer of the chain)",
        "tracked_key": "the pointer's chain key (the next position on the chain, moved by the extra tokens)",
        "labels_from": f"label_heads: {LABEL_PROMPTS} test prompts at the training length, hop queries, "
                       f"gamma {HEAD_GAMMA} ({label_column(HEAD_GAMMA)})",
        "labels": {label: [f"L{int(r.layer)}H{int(r.head)}" for r in labels.itertuples() if r.label == label]
                   for label in dict.fromkeys(sorted(labels["label"]))},
        "groups": notes, "interval": "95% paired prompt bootstrap (1,000 draws) of the median head retention",
        "retention": retention,
    }


def run_lengthgen(run_dir, config: LengthGenConfig, out_dir, *, step: int | None = None,
                  progress: Callable[[int, int], None] | None = None) -> dict:
    """Evaluate a run's checkpoint at every planned length; write lengthgen.parquet, lengthgen.json
    and fig5b.png/svg into `out_dir`, and with `config.heads` the head-level retention:
    head_retention.parquet, head_groups.parquet and head_retention.png/svg. `progress(done_tokens,
    total_tokens)` follows the work. Returns what lengthgen.json holds plus the table (a DataFrame) under
    "table" (and with `config.heads` "head_table", "group_table")."""
    import numpy as np

    model, info = load_checkpoint(run_dir, step=step, device=config.device, attn_implementation="sdpa")
    task = info["task_config"]
    if task is None:
        raise PosymError(f"{info['path']} has no posym.json with its task config; lengthgen needs a posym run")
    points = plan(task, config, model.config.n_positions)
    lengths = sorted({length for _, length, _ in points})
    heads_at = head_lengths(task, lengths) if config.heads else []
    total, done = config.n * sum(lengths) + config.head_prompts * sum(heads_at), 0

    def advance(tokens: int) -> None:
        nonlocal done
        done += tokens
        if progress:
            progress(done, total)

    measured = measure(model, task, lengths, config, advance)
    hops = generate(task, config.n, config.seed, config.split).hops  # the same at every length
    counts = {ALL_HOPS: config.n, **{h: int(c) for h, c in enumerate(np.bincount(hops, minlength=task.max_hops + 1)) if h}}
    table = protocol_table(measured, task, points, counts, config)
    table.insert(0, "step", info["step"])
    out_dir = Path(out_dir)
    write_parquet(out_dir / "lengthgen.parquet", table)
    figure = plot(table, task, title=f"{task.task} task, step {info['step']}")
    figures = [str(path) for path in save_figure(figure, out_dir / "fig5b", dpi=150)]
    extra = {}
    if config.heads:
        labels = label_heads(model, task, n_prompts=LABEL_PROMPTS, seed=config.seed, gamma=HEAD_GAMMA)
        measures = measure_heads(model, task, heads_at, config, advance)
        per_head, groups, notes = head_tables(measures, labels, task, seed=config.seed)
        per_head.insert(0, "step", info["step"])
        write_parquet(out_dir / "head_retention.parquet", per_head)
        write_parquet(out_dir / "head_groups.parquet", groups)
        figures += [str(path) for path in save_figure(plot_head_retention(
            groups, task, title=f"{task.task} task, step {info['step']}: head-level retention (median over heads, "
                                f"95% bootstrap over {config.head_prompts} prompts)"), out_dir / "head_retention", dpi=150)]
        extra = {"head_table": per_head, "group_table": groups}
    result = {"summary": summarize_protocols(table, task), "checkpoint": str(info["path"]), "step": info["step"],
              "queries": "last (the answer token)" + ("; head retention: hops (every pointer of the chain)"
                                                      if config.heads else ""),
              "figures": figures, "config": to_dict(config),
              "manifest": manifest(to_dict(config), seed=config.seed, task=to_dict(task))}
    if config.heads:
        result["head_retention"] = summarize_head_retention(per_head, groups, notes, task, config)
    write_json(out_dir / "lengthgen.json", result)
    return {**result, "table": table, **extra}
