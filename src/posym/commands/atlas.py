"""`posym atlas`: every head of a real model under posym's lens and the long-context field's taxonomies.

One table per model with one row per head (OUT/atlas.parquet): s_pos / s_sym plainly and with the
attention sinks left out of the swaps, their labels (`posym.core.scores`, on the binding prompts of
2511 at the last token), weighted frequency ID and dominant plane (`posym.core.geometry`), and the
scores of `posym.core.atlas` (docs/atlas.md defines each with its paper):
- retrieval (Wu et al. 2024) on needle-in-a-haystack prompts built from the model's own tokenizer at
  several lengths and needle depths; the model's own needle recall beside it (Wilson intervals);
- streaming (DuoAttention's training-free proxy) for each recent-window size, attention entropy, sink
  mass and previous-token score over long natural English text (the Python reference documentation
  that every CPython installs, `pydoc_data.topics`);
- echo and induction (RazorAttention) on random tokens repeated several times.
The three prompt sets are `posym.prompts`' (`needle_prompts`, `natural_text`, `repeated_tokens`).
Then the per-KV-head tables (max and mean over the query heads sharing a KV head), the export in the
shape KV-cache tools read (full_attention_heads.tsv, layer x KV head, and a boolean mask at a
quantile), the agreement of every pair of scores, figures and report.md. `--kv-table FILE` reads such
a layer x KV-head table from elsewhere and cross-tabulates it with posym's labels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from posym import configs, io, resources
from posym.core import atlas, stats
from posym.core.geometry import channel_means, frequency_use, plane_scores
from posym.core.interventions import ablated_planes
from posym.core.paper import GAMMA, TAU
from posym.core.qk import as_batch, capture, check_layers, head_qk
from posym.core.scores import score_model, summarize_heads
from posym.core.stats import wilson_interval
from posym.core.study import find_sinks
from posym.errors import PosymError
from posym.figures import save_figure, subplots
from posym.io import format_grid, read_kv_table
from posym.models import LoadedModel, tokenize
from posym.prompts import (
    Builder,
    Needle,
    binding_prompts,
    natural_text,
    needle_prompts,
    query_position,
    repeated_tokens,
)
from posym.runs import figure_file, output_file

BUDGET = 1 << 23
"""Float64 elements of one chunk of attention rows [prompts, heads, queries, keys] (~64 MB)."""


# ---- inputs: layer x KV-head tables -----------------------------------------------------------


@dataclass
class AtlasConfig:
    """What `posym atlas` computes (written to OUT/atlas.yaml)."""

    n_binding: int = 20
    """Binding prompts of 2511 on which s_pos and s_sym are scored (last token)."""
    frequency_prompts: int = 5
    """Binding prompts of the per-plane analysis (weighted frequency ID, dominant plane)."""
    tau: float = TAU
    """Temperature of the swap weights (posym.core.scores.swap_scores)."""
    gamma: float = GAMMA
    """Purity threshold of the labels (footnote 3 of 2605)."""
    needle_lengths: list[int] = field(default_factory=lambda: [256, 512, 1024])
    """Token lengths of the needle-in-a-haystack prompts."""
    needle_depths: list[float] = field(default_factory=lambda: [0.1, 0.5, 0.9])
    """Where the needle sits in the haystack (0: its start, 1: its end)."""
    needle_prompts: int = 1
    """Needle prompts per (length, depth) on which the retrieval score is computed, each with its own
    needle words (the first ones of the recall set)."""
    recall_prompts: int = 4
    """Needle prompts per (length, depth) of the model's own needle recall (a superset of the
    retrieval-score prompts: one forward pass each)."""
    needle_words: int = 4
    """Words of a needle (single-token key words of the model's tokenizer, drawn per prompt)."""
    stream_length: int = 1024
    """Tokens of each natural-text prompt of the streaming, entropy, sink and previous-token scores."""
    stream_prompts: int = 2
    """Natural-text prompts (consecutive stretches of the text)."""
    sink: int = 4
    """Keys at the start that a streaming cache keeps (StreamingLLM keeps 4), and of the sink mass."""
    windows: list[int] = field(default_factory=lambda: [64, 256])
    """Recent-window sizes of the streaming score (one column each; the first defines the non-streaming heads)."""
    repeat_period: int = 50
    """Random tokens per repeat of the echo/induction prompts."""
    repeats: int = 4
    """How many times the random tokens are repeated."""
    repeat_prompts: int = 4
    """Echo/induction prompts (fresh random tokens each)."""
    top_share: float = 0.1
    """The top retrieval / non-streaming / induction heads whose ranking by s_sym the AUROC measures."""
    quantile: float = 0.5
    """Quantile of the non-streaming score above which a KV head is marked full attention in the mask."""
    draws: int = 1000
    """Bootstrap draws (heads resampled) of every AUROC interval."""
    seed: int = 0
    """Seed of every prompt set."""
    causal: bool = False
    """Run the causal check of the frequency story (`causal_*` below; one forward pass per prompt and
    condition, so it is off by default: docs/atlas.md gives its cost)."""
    causal_length: int = 256
    """Token length of the causal check's needle prompts."""
    causal_prompts: int = 12
    """Needle prompts per depth of the causal check (the first ones are the recall prompts of that length)."""
    causal_heads: int = 16
    """Heads per group (the top sink-free symbolic, sink-free positional and retrieval heads) whose planes are ablated."""
    causal_planes: int = 8
    """RoPE planes zeroed in each ablated head (the slowest ones, or as many random ones)."""
    causal_draws: int = 1
    """Draws of each random control (random planes of the same heads; layer-matched random heads)."""

    def __post_init__(self) -> None:
        resources.check_bounds({f.name: getattr(self, f.name) for f in fields(self)})
        if self.repeats < 2:
            raise PosymError(
                f"repeats must be at least 2 (echo and induction need an earlier copy), got {self.repeats}"
            )
        if self.recall_prompts < self.needle_prompts:
            raise PosymError(
                "recall_prompts cannot be fewer than needle_prompts (the recall set holds the scored prompts)"
            )
        if self.frequency_prompts > self.n_binding:
            raise PosymError(
                "frequency_prompts cannot exceed n_binding (the per-plane analysis reuses the binding prompts)"
            )
        if not self.needle_lengths or not self.needle_depths or not self.windows:
            raise PosymError("needle_lengths, needle_depths and windows each need at least one value")
        if any(not 0 <= d <= 1 for d in self.needle_depths):
            raise PosymError(f"needle_depths must lie in [0, 1], got {self.needle_depths}")
        if self.sink < 1 or any(w < 1 for w in self.windows):
            raise PosymError(f"sink and windows must be positive, got sink {self.sink}, windows {self.windows}")
        if self.sink + max(self.windows) >= self.stream_length:
            raise PosymError(
                f"stream_length {self.stream_length} leaves no query with keys outside the sink "
                f"({self.sink}) and the largest window ({max(self.windows)})"
            )
        if not 0 < self.top_share <= 1 or not 0 <= self.quantile <= 1 or not 0 < self.gamma < 0.5:
            raise PosymError("top_share must lie in (0, 1], quantile in [0, 1] and gamma in (0, 0.5)")


def streaming_columns(config: AtlasConfig) -> list[str]:
    return [f"streaming_w{w}" for w in config.windows]


def non_streaming(config: AtlasConfig) -> str:
    """The column of 1 - streaming at the first window: the attention mass a sink + window cache loses."""
    return f"non_streaming_w{config.windows[0]}"


def score_columns(config: AtlasConfig) -> list[str]:
    """Every per-head score of atlas.parquet, in the order of the agreement tables and figures."""
    return [
        "s_pos",
        "s_sym",
        "s_pos_sinkfree",
        "s_sym_sinkfree",
        "weighted_id",
        "dominant_id",
        "entropy",
        "sink_mass",
        "previous_token",
        *streaming_columns(config),
        non_streaming(config),
        "retrieval",
        "echo",
        "induction",
    ]


# ---- prompts (built by posym.prompts) -----------------------------------------------------------


def needles_of(loaded: LoadedModel, config: AtlasConfig, per_cell: int, lengths: list[int]) -> list[Needle]:
    """`posym.prompts.needle_prompts` at the config's depths, needle words and seed: `per_cell` prompts per
    (length, depth) for the `lengths` (the recall set: `recall_prompts` x `needle_lengths`; the causal
    check's: `causal_prompts` x [`causal_length`])."""
    return needle_prompts(
        loaded,
        lengths=lengths,
        depths=config.needle_depths,
        per_cell=per_cell,
        n_words=config.needle_words,
        seed=config.seed,
    )


def check_sizes(loaded: LoadedModel, config: AtlasConfig) -> None:
    """Refuse, before any prompt is built, what the model or the machine cannot hold: a prompt longer
    than the model's positions, more needle words than the tokenizer has single-token key words, or
    more prompt tokens at once than memory holds (`posym.resources`: `--lengths 10**9` used to build a
    24 GB haystack first)."""
    lengths = {"needle_lengths": config.needle_lengths, "stream_length": config.stream_length}
    lengths["repeat_period x repeats"] = len(loaded.tokenizer("").input_ids) + config.repeat_period * config.repeats
    if config.causal:
        lengths["causal_length"] = config.causal_length
    resources.check_positions(lengths, loaded.max_positions)
    keys = len(Builder(loaded.tokenizer).keys)
    if config.needle_words > keys:
        raise PosymError(
            f"needle_words {config.needle_words} is more than the {keys} single-token key words of the tokenizer"
        )
    cells = len(config.needle_depths)
    token = resources.SAMPLE_BYTES_PER_TOKEN
    held = {  # each set of prompts is held whole while it is scored
        "recall_prompts": (config.recall_prompts, token * cells * sum(config.needle_lengths), "needle prompt set"),
        "stream_prompts": (config.stream_prompts, token * config.stream_length, "natural-text prompt"),
        "repeat_prompts": (config.repeat_prompts, token * config.repeat_period * config.repeats, "repeat prompt"),
    }
    if config.causal:
        held["causal_prompts"] = (config.causal_prompts, token * cells * config.causal_length, "causal prompt set")
    for name, (count, each, what) in held.items():
        resources.check_count(name, count, each, what=what, device="cuda" if "cuda" in str(loaded.device) else "cpu")


# ---- attention scores over prompts --------------------------------------------------------------


def attention_scores(model, prompts: list[list[int]], queries: list[list[int]], row_scores):
    """Per (prompt, layer, head) the prompt means of the per-query scores `row_scores(probs, ids,
    queries, prompt) -> {name: [1, H, Q]}`; one capture pass per prompt, attention from q/k in chunks."""
    import pandas as pd

    layers = check_layers(model, None)
    rows = []
    for k, (ids, wanted) in enumerate(zip(prompts, queries)):
        batch = as_batch(model, [ids])  # [1, T]
        sums: dict = {}

        def on_layer(layer, qk):
            heads, T = qk.q.shape[1], qk.q.shape[2]
            step = atlas.query_chunk(1, heads, T, BUDGET)
            parts: dict[str, list] = {}
            for lo in range(0, len(wanted), step):
                chunk = torch.tensor(wanted[lo : lo + step])
                probs = atlas.attention(qk, chunk)  # [1, H, Q, T]
                for name, value in row_scores(probs, batch.cpu(), chunk, k).items():
                    parts.setdefault(name, []).append(value)
            sums[layer] = {name: atlas.row_mean(torch.cat(v, dim=-1))[0] for name, v in parts.items()}  # [H]

        capture(model, batch, layers, on_layer)
        for layer, scores in sums.items():
            for h in range(len(next(iter(scores.values())))):
                rows.append({"prompt": k, "layer": layer, "head": h, **{n: float(v[h]) for n, v in scores.items()}})
    return pd.DataFrame(rows)


def prompt_mean(frame, columns):
    """Per (layer, head): the mean over prompts of each column (NaN prompts skipped)."""
    return frame.groupby(["layer", "head"], as_index=False)[list(columns)].mean()


def needle_answers(model, needles: list[Needle]) -> list[dict]:
    """Per needle prompt (teacher-forced, one forward pass; logits only at the answer steps): recalled,
    whether the model's greedy token is the needle's word at every answer step; words, the share of
    answer steps where it is; logprob, the mean log-probability of the needle's words."""
    out = []
    with torch.inference_mode():
        for n in needles:
            ids = torch.tensor([n.ids], device=model.device)
            first = n.queries[0]
            kept = len(n.ids) - first  # the answer steps are the last positions but one
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=kept).logits[0]  # [kept, vocab]
            rows = logits[[q - first for q in n.queries]].double().log_softmax(-1)  # [answer steps, vocab]
            wanted = torch.tensor([n.ids[q + 1] for q in n.queries], device=rows.device)
            right = rows.argmax(-1) == wanted
            out.append(
                {
                    "recalled": bool(right.all()),
                    "words": float(right.double().mean()),
                    "logprob": float(rows.gather(-1, wanted[:, None]).mean()),
                }
            )
    return out


# ---- the table -----------------------------------------------------------------------------------


def swap_table(loaded: LoadedModel, config: AtlasConfig):
    """Per head: s_pos, s_sym and label, plain and with the binding prompts' sinks left out of the swaps,
    weighted frequency ID and dominant plane; and the sink keys."""
    prompts = binding_prompts(config.n_binding, seed=config.seed)
    ids = [tokenize(loaded, p.text)[0].tolist() for p in prompts]
    queries = [[query_position(loaded, p, "last")] for p in prompts]
    plain = score_model(loaded.model, ids, queries, tau=config.tau)
    sinks = find_sinks(plain)
    excluded = score_model(loaded.model, ids, queries, tau=config.tau, exclude_keys=sinks) if sinks else plain
    heads = summarize_heads(plain, config.gamma)[["layer", "head", "s_pos", "s_sym", "label"]]
    free = summarize_heads(excluded, config.gamma)[["layer", "head", "s_pos", "s_sym", "label"]]
    heads = heads.merge(free, on=["layer", "head"], suffixes=("", "_sinkfree"))
    geometry = frequency_use(
        channel_means(
            plane_scores(
                loaded.model, ids[: config.frequency_prompts], queries[: config.frequency_prompts], tau=config.tau
            )
        )
    )
    return heads.merge(geometry[["layer", "head", "weighted_id", "dominant_id"]], on=["layer", "head"]), sinks


def build_atlas(loaded: LoadedModel, config: AtlasConfig, progress=None) -> dict:
    """Every table of the atlas as DataFrames (no file written): atlas (per head), kv (per KV head),
    retrieval (per needle prompt and head), needles (per needle prompt), and the timings."""
    import pandas as pd

    progress = progress or (lambda k=1: None)
    model, timings = loaded.model, {}
    n_heads = model.config.num_attention_heads
    n_kv = getattr(model.config, "num_key_value_heads", None) or n_heads

    start = time.perf_counter()
    heads, sinks = swap_table(loaded, config)
    timings["swap_scores"] = time.perf_counter() - start
    progress(1)

    start = time.perf_counter()
    recall_set = needles_of(loaded, config, config.recall_prompts, config.needle_lengths)
    if max(n.length for n in recall_set) > loaded.max_positions:
        raise PosymError(
            f"needle_lengths reach {max(config.needle_lengths)} tokens but {loaded.name} has "
            f"{loaded.max_positions} positions"
        )
    scored = [k for k, n in enumerate(recall_set) if n.index < config.needle_prompts]
    needles = [recall_set[k] for k in scored]
    marks = []
    for n in needles:
        mark = torch.zeros(1, len(n.ids), dtype=torch.bool)
        mark[0, n.needle] = True
        marks.append(mark)
    retrieval = attention_scores(
        model,
        [n.ids for n in needles],
        [n.queries for n in needles],
        lambda probs, ids, q, k: {"retrieval": atlas.copy_events(probs, ids, q, marks[k])},
    )
    retrieval["prompt"] = retrieval.prompt.map(dict(enumerate(scored)))  # numbered as in the recall set
    needle_rows = pd.DataFrame(
        [
            {
                "prompt": k,
                "length": n.length,
                "depth": n.depth,
                "index": n.index,
                "needle": " ".join(n.words),
                "scored": n.index < config.needle_prompts,
                **answer,
            }
            for k, (n, answer) in enumerate(zip(recall_set, needle_answers(model, recall_set)))
        ]
    )
    retrieval = retrieval.merge(needle_rows[["prompt", "length", "depth"]], on="prompt")
    timings["retrieval"] = time.perf_counter() - start
    progress(1)

    start = time.perf_counter()
    text = natural_text(loaded, length=config.stream_length, n=config.stream_prompts)
    first = config.sink + max(config.windows)  # every streaming column is defined from here on
    windows = config.windows

    def stream_rows(probs, ids, q, k):
        out = {
            "entropy": atlas.entropy(probs),
            "sink_mass": atlas.sink_mass(probs, config.sink),
            "previous_token": atlas.previous_token(probs, q),
        }
        for w in windows:
            out[f"streaming_w{w}"] = atlas.streaming(probs, q, sink=config.sink, window=w)
        return out

    stream = attention_scores(model, text, [list(range(first, len(t))) for t in text], stream_rows)
    timings["streaming"] = time.perf_counter() - start
    progress(1)

    start = time.perf_counter()
    repeats = repeated_tokens(
        loaded, period=config.repeat_period, repeats=config.repeats, n=config.repeat_prompts, seed=config.seed
    )
    offset = len(repeats[0]) - config.repeat_period * config.repeats  # the BOS
    later = list(range(offset + config.repeat_period, len(repeats[0])))  # repeats 2..R
    echo = attention_scores(
        model,
        repeats,
        [later] * len(repeats),
        lambda probs, ids, q, k: {
            "echo": atlas.match_mass(probs, ids, q, 0),
            "induction": atlas.match_mass(probs, ids, q, 1),
        },
    )
    timings["echo_induction"] = time.perf_counter() - start
    progress(1)

    table = heads
    for part, columns in (
        (stream, ["entropy", "sink_mass", "previous_token", *streaming_columns(config)]),
        (retrieval, ["retrieval"]),
        (echo, ["echo", "induction"]),
    ):
        table = table.merge(prompt_mean(part, columns), on=["layer", "head"])
    table[non_streaming(config)] = 1 - table[f"streaming_w{windows[0]}"]
    table.insert(2, "kv_head", [atlas.kv_group(int(h), n_heads, n_kv) for h in table["head"]])
    kv = atlas.kv_pool(table.drop(columns="kv_head"), score_columns(config), n_heads, n_kv)
    return {
        "atlas": table,
        "kv": kv,
        "retrieval": retrieval,
        "needles": needle_rows,
        "sinks": sinks,
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "n_heads": n_heads,
        "n_kv_heads": n_kv,
        "n_layers": model.config.num_hidden_layers,
    }


# ---- the causal check of the frequency story --------------------------------------------------------


GROUP_COLUMNS = {"retrieval": "retrieval", "symbolic": "s_sym_sinkfree", "positional": "s_pos_sinkfree"}
"""The groups of the causal check and the atlas column whose top heads make each."""


def rope_planes(model) -> int:
    """RoPE planes of the model's heads (rotary dims / 2), read off layer 0's own tables."""
    qk = head_qk(model, [[0, 0]], [0])[0]
    return qk.cos.shape[-1] // 2


def causal_check(loaded: LoadedModel, config: AtlasConfig, table, progress=None, on_rows=None) -> dict:
    """Needle answers of the clean model and of every ablation of `posym.core.atlas.plane_ablations`
    (the top `causal_heads` of each of `GROUP_COLUMNS`, their slowest `causal_planes` planes, as many
    random planes, or the slowest planes of layer-matched random heads) on `causal_prompts` needle
    prompts per depth of `causal_length` tokens: rows (group, control, draw, prompt, measures),
    summary (`posym.core.atlas.causal_summary`), the ablated heads and planes. on_rows(frame), if given,
    receives the rows so far after every condition (a long run can keep what it has)."""
    import pandas as pd

    progress = progress or (lambda k=1: None)
    model = loaded.model
    if config.causal_length > loaded.max_positions:
        raise PosymError(
            f"causal_length {config.causal_length} exceeds the {loaded.max_positions} positions of {loaded.name}"
        )
    needles = needles_of(loaded, config, config.causal_prompts, [config.causal_length])
    n_planes = rope_planes(model)
    groups, ablations = causal_plan(table, config, n_planes)
    rows = []
    for a in ablations:
        with ablated_planes(model, a["planes"]):
            answers = needle_answers(model, needles)
        for k, (n, answer) in enumerate(zip(needles, answers)):
            rows.append(
                {
                    "group": a["group"],
                    "control": a["control"],
                    "draw": a["draw"],
                    "prompt": k,
                    "depth": n.depth,
                    **answer,
                }
            )
        progress(1 / len(ablations))  # one step of the caller's bar for the whole check
        if on_rows is not None:
            on_rows(pd.DataFrame(rows))
    return causal_result(pd.DataFrame(rows), groups, ablations, n_planes, config)


def causal_plan(table, config: AtlasConfig, n_planes: int) -> tuple[dict, list[dict]]:
    """The groups of the causal check (the top `causal_heads` of each `GROUP_COLUMNS` column of the atlas
    table) and its conditions in order: the clean model, then `posym.core.atlas.plane_ablations`."""
    every = [(int(a), int(b)) for a, b in zip(table.layer, table["head"])]
    groups = {
        g: atlas.top_k(table[c].to_numpy(dtype=float), every, config.causal_heads) for g, c in GROUP_COLUMNS.items()
    }
    ablations = [
        {"group": atlas.CLEAN[0], "control": atlas.CLEAN[1], "draw": 0, "heads": [], "planes": {}},
        *atlas.plane_ablations(groups, every, n_planes, config.causal_planes, config.causal_draws, config.seed),
    ]
    return groups, ablations


def causal_result(rows, groups: dict, ablations: list[dict], n_planes: int, config: AtlasConfig) -> dict:
    """The causal check's tables from its rows: rows, summary, the ablated heads and planes of every
    condition the rows hold, n_planes and the heads the groups share."""
    import pandas as pd

    ran = set(zip(rows.group, rows.control, rows.draw))
    heads = [
        {
            "group": a["group"],
            "control": a["control"],
            "draw": a["draw"],
            "layer": h[0],
            "head": h[1],
            "planes": list(p),
        }
        for a in ablations
        if (a["group"], a["control"], a["draw"]) in ran
        for h, p in a["planes"].items()
    ]
    return {
        "rows": rows,
        "summary": atlas.causal_summary(rows, config.draws, config.seed),
        "heads": pd.DataFrame(heads, columns=["group", "control", "draw", "layer", "head", "planes"]),
        "n_planes": n_planes,
        "overlap": {
            f"{a} & {b}": len(set(groups[a]) & set(groups[b]))
            for i, a in enumerate(groups)
            for b in list(groups)[i + 1 :]
        },
    }


def causal_entry(causal: dict, config: AtlasConfig) -> dict:
    """summary.json's account of the causal check: prompts, length, planes, heads per group, shared heads, conditions."""
    rows = causal["rows"]
    return {
        "prompts": int(rows.prompt.nunique()),
        "length": config.causal_length,
        "planes": f"{config.causal_planes} of {causal['n_planes']}",
        "heads_per_group": config.causal_heads,
        "group_overlap": causal["overlap"],
        "conditions": int(len(rows) // rows.prompt.nunique()),
    }


# ---- agreement -----------------------------------------------------------------------------------


SCORERS = (
    ("s_sym_sinkfree", False),
    ("s_sym_sinkfree", True),
    ("s_sym", False),
    ("s_pos_sinkfree", False),
    ("layer", False),
)
"""(score, layer-matched) pairs whose AUROC is reported: s_sym sink-free over all heads and only against
heads of the same layer, plain s_sym, sink-free s_pos, and the layer index (what depth alone gives)."""


def agreement(table, config: AtlasConfig) -> dict:
    """Spearman rho of every pair of scores; AUROC (with a head-bootstrap interval) of `SCORERS` for the
    top retrieval, non-streaming and induction heads; label confusion tables; where the sinks decide an agreement."""
    import pandas as pd

    columns = score_columns(config)
    rho = atlas.spearman_pairs(table, columns)
    targets = {"retrieval": "retrieval", "non-streaming": non_streaming(config), "induction": "induction"}
    rows = []
    for target, column in targets.items():
        positive = atlas.top_heads(table[column], config.top_share)
        for scorer, strata in SCORERS:
            layers = table.layer if strata else None
            name = f"{scorer} within layers" if strata else scorer
            lo, hi = stats.auroc_interval(table[scorer], positive, layers, draws=config.draws, seed=config.seed)
            rows.append(
                {
                    "target": target,
                    "column": column,
                    "scorer": name,
                    "auroc": stats.auroc(table[scorer], positive, layers),
                    "low": lo,
                    "high": hi,
                    "positives": int(positive.sum()),
                    "heads": len(table),
                }
            )
    auroc = pd.DataFrame(rows)
    flags = {name: atlas.top_heads(table[column], config.top_share) for name, column in targets.items()}
    confusion = pd.concat(
        [atlas.confusion(table.label, table.label_sinkfree, "a", "b").assign(table="label x label_sinkfree")]
        + [
            atlas.confusion(table[lab], flags[name], "a", "b").assign(table=f"{lab} x top {name}")
            for lab in ("label", "label_sinkfree")
            for name in targets
        ],
        ignore_index=True,
    )
    confusion["a"], confusion["b"] = confusion.a.astype(str), confusion.b.astype(str)
    by_pair = {(r.a, r.b): r.rho for r in rho.itertuples()} | {(r.b, r.a): r.rho for r in rho.itertuples()}
    decides = []  # Spearman rho: opposite signs; AUROC: opposite sides of chance (0.5)
    for score in ("s_pos", "s_sym"):
        for other in columns:
            if not other.startswith(("s_pos", "s_sym")):
                plain, free = by_pair[(score, other)], by_pair[(f"{score}_sinkfree", other)]
                decides.append(
                    {
                        "score": score,
                        "measure": f"spearman rho with {other}",
                        "plain": plain,
                        "sinkfree": free,
                        "sink_decides": bool(plain * free < 0),
                    }
                )
    for target in targets:
        plain, free = (
            auroc[(auroc.target == target) & (auroc.scorer == s)].auroc.iloc[0] for s in ("s_sym", "s_sym_sinkfree")
        )
        decides.append(
            {
                "score": "s_sym",
                "measure": f"AUROC for the top {target} heads",
                "plain": plain,
                "sinkfree": free,
                "sink_decides": bool((plain - 0.5) * (free - 0.5) < 0),
            }
        )
    return {"spearman": rho, "auroc": auroc, "confusion": confusion, "sink_decides": pd.DataFrame(decides)}


# ---- export and import ---------------------------------------------------------------------------


def check_grid(grid, n_layers: int, n_kv: int) -> None:
    """An imported table must have one line per layer and one value per KV head."""
    if grid.shape != (n_layers, n_kv):
        raise PosymError(
            f"the imported table is {grid.shape[0]} x {grid.shape[1]} but the model has {n_layers} layers "
            f"x {n_kv} KV heads"
        )


def compare_table(table, grid, quantile: float):
    """Per query head: the imported layer x KV-head value of its KV head, whether it is at or above
    the grid's `quantile` (imported_full), beside posym's labels; and the confusion of those."""
    import numpy as np
    import pandas as pd

    grid = np.asarray(grid, dtype=float)
    check_grid(grid, int(table.layer.max()) + 1, int(table.kv_head.max()) + 1)
    mask = atlas.full_attention_mask(grid, quantile)
    out = table[["layer", "head", "kv_head", "label", "label_sinkfree"]].copy()
    out["imported"] = grid[out.layer, out.kv_head]
    out["imported_full"] = mask[out.layer, out.kv_head]
    confusion = pd.concat(
        [
            atlas.confusion(out[lab], out.imported_full, "a", "b").assign(table=f"{lab} x imported_full")
            for lab in ("label", "label_sinkfree")
        ],
        ignore_index=True,
    )
    confusion["a"], confusion["b"] = confusion.a.astype(str), confusion.b.astype(str)
    return out, confusion


# ---- figures and report --------------------------------------------------------------------------


def plot_maps(table, columns):
    """A layer x head map per score (one panel each, its own colour scale)."""
    import numpy as np

    n_layers, n_heads = int(table.layer.max()) + 1, int(table["head"].max()) + 1
    cols = 4
    rows = -(-len(columns) // cols)
    fig, axes = subplots(rows, cols, figsize=(3.4 * cols, 3.2 * rows), squeeze=False)
    for ax, column in zip(axes.flat, columns):
        grid = np.full((n_layers, n_heads), np.nan)  # [layers, heads]
        grid[table.layer.to_numpy(), table["head"].to_numpy()] = table[column].to_numpy(dtype=float)
        image = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis")
        ax.set(title=column, xlabel="head", ylabel="layer")
        fig.colorbar(image, ax=ax)
    for ax in list(axes.flat)[len(columns) :]:
        ax.set_visible(False)
    fig.subplots_adjust(hspace=0.45, wspace=0.35)  # tight_layout measures every tick label: minutes on a busy CPU
    return fig


def plot_scatter(table, columns):
    """A scatter matrix of the scores over heads (histograms on the diagonal), coloured by layer."""
    k = len(columns)
    fig, axes = subplots(k, k, figsize=(1.9 * k, 1.9 * k), squeeze=False)
    for i, y in enumerate(columns):
        for j, x in enumerate(columns):
            ax = axes[i, j]
            if i == j:
                ax.hist(table[x].dropna(), bins=20, color="grey")
            else:
                ax.scatter(table[x], table[y], c=table.layer, cmap="plasma", s=4)
            ax.set_xticks([])  # ranks are what the agreement is about; 36 panels of tick labels cost minutes
            ax.set_yticks([])
            if i == k - 1:
                ax.set_xlabel(x, fontsize=7)
            if j == 0:
                ax.set_ylabel(y, fontsize=7)
    fig.subplots_adjust(wspace=0.05, hspace=0.05)
    return fig


SCATTER = ("s_pos_sinkfree", "s_sym_sinkfree", "weighted_id", "previous_token", "retrieval", "induction")


def markdown_table(frame, digits: int = 3) -> str:
    """A DataFrame as a GitHub markdown table (floats rounded)."""

    def cell(v):
        return f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "---|" * len(frame.columns)
    return "\n".join(
        [head, rule, *("| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False))]
    )


CAUSAL_REPORT = ("group", "control", "n", "draws", "recalled", "recalled_low", "recalled_high", "recalled_drop")
CAUSAL_REPORT += (
    "recalled_drop_low",
    "recalled_drop_high",
    "logprob",
    "logprob_drop",
    "logprob_drop_low",
    "logprob_drop_high",
)
"""The columns of causal_summary.parquet that report.md shows (the rest: words, and the vs-control differences)."""


def causal_section(causal: dict, config: AtlasConfig) -> str:
    """report.md's causal check: what was ablated, every condition's accuracy, the slowest-vs-control differences."""
    summary = causal["summary"]
    slow = summary[summary.control == "slowest"]
    versus = [
        c
        for m in ("recalled", "logprob")
        for tag in ("random_planes", "matched_heads")
        for c in (f"{m}_vs_{tag}", f"{m}_vs_{tag}_low", f"{m}_vs_{tag}_high")
    ]
    return (
        f"## Causal check: do the slow RoPE planes carry retrieval?\n\n"
        f"In the top {config.causal_heads} heads of each group (sink-free s_sym, sink-free s_pos, retrieval score), the "
        f"query components on the slowest {config.causal_planes} of {causal['n_planes']} RoPE planes are zeroed "
        f"(`posym.core.interventions.ablated_planes`); controls: {config.causal_planes} random planes of the same heads, "
        f"and the slowest planes of layer-matched random heads ({config.causal_draws} draw(s) each). "
        f"{summary.n.iloc[0]} needle prompts of {config.causal_length} tokens, teacher-forced; recalled = every answer "
        "word the greedy token (95% Wilson for one condition, prompt bootstrap for pooled draws), logprob = mean "
        "log-probability of the answer words; drops are clean - ablated with paired prompt-bootstrap intervals. "
        f"Heads shared by groups: {causal['overlap']}.\n\n"
        + markdown_table(summary[list(CAUSAL_REPORT)])
        + "\n\nSlowest planes against the controls (control - slowest: positive = the slow planes of these heads "
        "matter more than the control's):\n\n" + markdown_table(slow[["group", *versus]])
    )


def report(
    result: dict, agree: dict, summary: dict, config: AtlasConfig, figures: bool = True, causal: dict | None = None
) -> str:
    """report.md: what was measured, the needle recall, the AUROC table, the strongest rank correlations,
    where the sinks decide, label counts, and the causal check when it ran."""
    table = result["atlas"]
    spearman = agree["spearman"].assign(abs_rho=lambda f: f.rho.abs()).sort_values("abs_rho", ascending=False)
    recall = summary["needle_recall"]
    counts = table.groupby(["label", "label_sinkfree"], as_index=False).size().rename(columns={"size": "heads"})
    return (
        "\n\n".join(
            [
                f"# Head atlas of {summary['model']}",
                f"{len(table)} heads ({result['n_layers']} layers x {result['n_heads']} heads, {result['n_kv_heads']} KV heads "
                "per layer). Scores are defined in docs/atlas.md; every attention row is rebuilt from the captured queries "
                "and keys in float64.",
                f"Needle recall of the model (teacher-forced, every answer word its greedy token): {recall['recalled']}/"
                f"{recall['n']} = {recall['rate']:.2f} (95% Wilson {recall['low']:.2f}-{recall['high']:.2f}). Binding-prompt "
                f"sinks left out of the sink-free swaps: {result['sinks']}.",
                "Settings (atlas.yaml): " + ", ".join(f"{k} {v}" for k, v in configs.to_dict(config).items()) + ".",
                f"## AUROC: does s_sym rank the top {config.top_share:.0%} heads of each taxonomy first?\n\n"
                "0.5 is chance; `layer` is a depth-only baseline (the layer index as the score); `within layers` counts only "
                f"pairs of heads in the same layer (layer-matched); intervals resample heads ({config.draws:,} draws).\n\n"
                + markdown_table(agree["auroc"][["target", "scorer", "auroc", "low", "high", "positives", "heads"]]),
                "## Strongest rank correlations (Spearman rho over heads)\n\n"
                + markdown_table(spearman.head(15)[["a", "b", "rho", "heads"]]),
                "## Where the sinks decide an agreement (opposite signs, plain vs sink-free)\n\n"
                + markdown_table(agree["sink_decides"]),
                "## Labels (plain x sink-free)\n\n" + markdown_table(counts),
                f"## Labels of the top {config.top_share:.0%} heads of each taxonomy (a: label, b: in the top set)\n\n"
                + markdown_table(
                    agree["confusion"][agree["confusion"].table.str.contains("top")][["table", "a", "b", "heads"]]
                ),
                *([causal_section(causal, config)] if causal is not None else []),
                "\n\n".join(f"![{k}]({figure_file('', 'atlas', k)}.png)" for k in ("maps", "scatter"))
                if figures
                else "(figures not drawn: --no-figures)",
                f"Timings (s): {summary['timings']}",
            ]
        )
        + "\n"
    )


def write_atlas(
    loaded: LoadedModel,
    out,
    config: AtlasConfig,
    *,
    settings: dict,
    compare=None,
    figures: bool = True,
    progress=None,
    owns: tuple[str, ...] = (),
) -> dict:
    """Build the atlas and write every file of OUT (module docstring; maps and scatter PNG/SVG unless
    figures=False) as one set (`posym.io.output_set`; `owns`: the names an earlier set in OUT may hold):
    a kill or a failed write leaves OUT as it was. Returns summary.json's dict."""
    start = time.perf_counter()
    out = Path(out)
    grid_in = None
    if compare is not None:  # a bad file fails before any work
        grid_in = read_kv_table(compare)
        config_ = loaded.model.config
        check_grid(
            grid_in,
            config_.num_hidden_layers,
            getattr(config_, "num_key_value_heads", None) or config_.num_attention_heads,
        )
    check_sizes(loaded, config)
    result = build_atlas(loaded, config, progress)
    causal = None
    if config.causal:
        begun = time.perf_counter()
        causal = causal_check(loaded, config, result["atlas"], progress)
        result["timings"]["causal"] = round(time.perf_counter() - begun, 2)
    agree = agreement(result["atlas"], config)
    column = f"{non_streaming(config)}_max"
    grid = atlas.kv_grid(result["kv"], column, result["n_layers"], result["n_kv_heads"])
    mask = atlas.full_attention_mask(grid, config.quantile)
    recalled = result["needles"].recalled
    lo, hi = wilson_interval(int(recalled.sum()), len(recalled))
    summary = {
        "model": loaded.name,
        "config": configs.to_dict(config),
        "needle_recall": {
            "recalled": int(recalled.sum()),
            "n": len(recalled),
            "rate": float(recalled.mean()),
            "low": lo,
            "high": hi,
        },
        "sinks": result["sinks"],
        "timings": result["timings"],
        "export_column": column,
        "full_attention_kv_heads": int(mask.sum()),
        "kv_heads": int(mask.size),
    }
    if compare is not None:
        summary["kv_table"] = str(compare)
    if causal is not None:
        summary["causal"] = causal_entry(causal, config)
    tables = {
        "atlas": result["atlas"],
        "atlas_kv": result["kv"],
        "retrieval": result["retrieval"],
        "needles": result["needles"],
        **{f"agreement_{k}": v for k, v in agree.items()},
    }
    if causal is not None:
        tables |= {"causal": causal["rows"], "causal_summary": causal["summary"], "causal_heads": causal["heads"]}
    if grid_in is not None:
        compared, confusion = compare_table(result["atlas"], grid_in, config.quantile)
        tables |= {"compare": compared, "compare_confusion": confusion}
    with io.output_set(out, owns=owns) as final:
        for name, frame in tables.items():
            io.write_parquet(output_file(final, "atlas", name), frame)
        io.write_text(output_file(final, "atlas", "full_attention_heads"), format_grid(grid))
        io.write_text(output_file(final, "atlas", "full_attention_mask"), format_grid(mask, as_bool=True))
        if figures:
            save_figure(plot_maps(result["atlas"], score_columns(config)), figure_file(final, "atlas", "maps"))
            save_figure(plot_scatter(result["atlas"], list(SCATTER)), figure_file(final, "atlas", "scatter"))
        summary["timings"]["total"] = round(time.perf_counter() - start, 2)
        io.write_yaml(output_file(final, "atlas", "config"), configs.to_dict(config))
        io.write_json(
            output_file(final, "atlas", "summary"),
            {**io.manifest(configs.to_dict(config), seed=config.seed, **settings), **summary},
        )
        io.write_text(output_file(final, "atlas", "report"), report(result, agree, summary, config, figures, causal))
    return summary
