"""`posym llm-study`: the lens of 2511.11579 and 2605.31558 on one real model, in nine resumable stages.

Every stage reads the model and the tables of earlier stages and writes its own folder under OUT;
its done-file (`posym.stages`, job "study") is written last, so a killed study re-run with the same
OUT skips the finished stages. `posym.commands.llm_study.report` turns OUT into report.html.

1. scores     every head on the binding prompts of 2511 at the last token and at the name token, and
              on the 1-hop number and letter prompts of 2605 Appendix H at the puzzle's query token;
              each set plainly and with the attention sinks left out of the swaps; the model's own
              whole-answer accuracy on each prompt set.
2. profile    per-layer medians, early vs late halves, Pearson r of the maps, labels at each gamma,
              label agreement across prompt sets, heads whose label the sinks decide.
3. frequency  per-plane scores and weighted frequency ID of every head, behaviour vs frequency.
4. discrepancy  top-1 minus top-2 logit of the most positional and most symbolic heads by length,
              beside Theorem 3.2's bounds at each head's dominant frequency.
5. bench      the Appendix H benchmark (Table 3 analogue), whole-answer judge.
6. ablation   zero/mean ablation of the top-k positional, top-k symbolic and k random heads: accuracy
              on the binding prompts and the size-12 Appendix H prompts, per prompt. Off by default
              (`ablation_ks` empty): its one unmatched random set per k is below the layer-matched pools
              against which stage 9 ablates the labels' top heads; `ablation_ks: [1, 4, 16]` runs it.
7. screen     length-task formats at their base length, every one with its accuracy (`posym.commands.llm_study.prediction`).
8. lengths    the chosen task at 1x-16x its base length (distractors between fact and question, before
              everything, and with markers): accuracy, head scores, per-head retention of the margin and of
              the attention on the base-length key, per label and for layer-matched random heads.
9. causal     mean-ablation of the top-k symbolic / positional heads and of layer-matched random heads at
              several lengths: drop(L) - drop(base) with intervals, separated or not; and every head's
              attribution-patching effect per length, each group's ESTIMATED effect against thousands of
              estimated matched random sets, calibrated against real ablations (`llm_study.estimates`).
"""

from __future__ import annotations

import functools
import math
import shutil
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from posym import configs, io, resources
from posym import prompts as prompt_sets
from posym.commands import llm_bench
from posym.commands.llm_study import estimates, prediction
from posym.commands.llm_study.report import JOB, build_study_report
from posym.core.discrepancy import head_gaps
from posym.core.geometry import channel_means, frequency_use, plane_scores
from posym.core.interventions import ABLATION_MODES, ablated, head_means
from posym.core.paper import GAMMAS, TAU
from posym.core.qk import fixed_position_table, past_trained_positions
from posym.core.retention import group_retention, head_retention, holm_verdicts
from posym.core.scores import score_model, summarize_heads
from posym.core.stats import pearson, wilson_interval
from posym.core.study import (
    GROUPS,
    ablation_groups,
    behaviour_frequency,
    find_sinks,
    half_profile,
    label_agreement,
    label_counts,
    layer_profile,
    sink_changes,
)
from posym.core.theory import frequency_angle, index_bound
from posym.errors import PosymError
from posym.models import LoadedModel, identity, tokenize
from posym.parallel import cpu_workers, forked_map
from posym.prompts import Builder, Prompt, base_length, build
from posym.runs import PREDICTION_STAGES, STUDY_MARKER, STUDY_STAGES, StudyDir
from posym.stages import claim, is_done, kept_piece, resumable, run_stage

STAGES = STUDY_STAGES
SETS = ("binding-last", "binding-name", "number", "letter")
"""Prompt sets of stage 1: binding prompts queried at the last token and at the name token, and the
Appendix H puzzles queried at the puzzle's final token."""


@dataclass
class StudyConfig:
    """What `posym llm-study` computes (written to OUT/study.yaml)."""

    n_binding: int = 20
    """Binding prompts of 2511 (scores, accuracy, ablation)."""
    n_bench: int = 10
    """Number and letter prompts scored in stage 1 and asked in stage 6."""
    bench_size: int = 12
    """Target-window size of the stage-1 and stage-6 Appendix H prompts."""
    tau: float = TAU
    """Temperature of the swap weights (posym.core.scores.swap_scores)."""
    gammas: list[float] = field(default_factory=lambda: list(GAMMAS))
    """Purity thresholds of the head labels (footnote 3 of 2605 uses 0.1)."""
    exclude_keys: list[int] | None = None
    """Key positions left out of the swaps in the sink-free scores; None finds the sinks of each prompt
    set (key positions that are the top key of at least half of its rows)."""
    frequency_prompts: int = 5
    """Binding prompts of the per-plane analysis (stage 3)."""
    lengths: list[int] = field(default_factory=lambda: [64, 256, 1024, 4096])
    """Prompt lengths of the discrepancy curves (stage 4); longer than the model's positions is an error."""
    gap_prompts: int = 2
    """Prompts per length in stage 4."""
    gap_heads: int = 2
    """Most positional and most symbolic heads whose gaps stage 4 follows (this many of each)."""
    bench_sizes: list[int] = field(default_factory=lambda: [12, 32])
    """Target-window sizes of the Appendix H benchmark (Table 3's columns). Table 3's sizes 100 and 300 are
    options (`bench_sizes: [12, 32, 100, 300]`): their ~840- and ~2,150-token prompts cost 0.22 and 0.62 of
    the four-size stage (docs/benchmarks/bench_sizes.json), which the default study's ~20-minute budget
    (issue 50) cannot hold, and SmolLM2 answers 0.00 already at size 32 (docs/results/llm-study/bench)."""
    bench_runs: int = 5
    """Runs (seeds) per size of the benchmark, as in the paper."""
    bench_n: int = 4
    """Questions per run and size of the benchmark."""
    ablation_ks: list[int] = field(default_factory=list)
    """Sizes k of stage 6's ablated head groups; empty (the default) leaves stage 6 out (`study_stages`).
    Its random group is one unmatched draw per k, below the project's standard for a control, and stage 9
    ablates the same labels against layer-matched random pools; `[1, 4, 16]` is the committed studies'."""
    ablation_modes: list[str] = field(default_factory=lambda: ["mean"])
    """Ablation modes (posym.core.interventions.ablated): mean-ablation by default (the heads' mean output,
    the intervention the causal stage also uses); add "zero" for zero-ablation beside it (twice the stage's
    cost; the committed studies ran both)."""
    seed: int = 0
    """Seed of every prompt set and of the random head groups."""
    prediction: prediction.PredictionConfig = field(default_factory=prediction.PredictionConfig)
    """What the screen, lengths and causal stages measure (`posym.commands.llm_study.prediction.PredictionConfig`)."""

    def __post_init__(self) -> None:
        resources.check_bounds({f.name: getattr(self, f.name) for f in fields(self)})
        if self.frequency_prompts > self.n_binding:
            raise PosymError("frequency_prompts cannot exceed n_binding (stage 3 reuses the binding prompts)")
        if any(k < 1 for k in self.ablation_ks):
            raise PosymError(f"ablation_ks must be positive head counts, got {self.ablation_ks}")
        if any(m not in ABLATION_MODES for m in self.ablation_modes) or not self.ablation_modes:
            raise PosymError(f"ablation_modes must be zero and/or mean, got {self.ablation_modes}")
        if any(not 0 < g < 0.5 for g in self.gammas) or not self.gammas:
            raise PosymError(f"gammas must lie in (0, 0.5), got {self.gammas}")


# ---- prompts ------------------------------------------------------------------------------------


def puzzle_query(loaded: LoadedModel, prompt: Prompt) -> int:
    """Token index of an Appendix H puzzle's final token (the last character before '\\nAnswer:')."""
    return loaded.tokenizer(prompt.text).char_to_token(prompt.text.rindex("\nAnswer:") - 1)


def study_prompts(config: StudyConfig) -> dict[str, list[Prompt]]:
    """The stage-1 prompt sets by name (the two binding sets share their prompts)."""
    binding = prompt_sets.binding_prompts(config.n_binding, seed=config.seed)
    return {
        "binding-last": binding,
        "binding-name": binding,
        **{
            task: prompt_sets.bench_prompts(task, config.bench_size, config.n_bench, seed=config.seed)
            for task in ("number", "letter")
        },
    }


def query_positions(loaded: LoadedModel, name: str, prompts: list[Prompt]) -> list[int]:
    """Query token of each prompt of set `name`."""
    if name.startswith("binding"):
        return [prompt_sets.query_position(loaded, p, name.split("-")[1]) for p in prompts]
    return [puzzle_query(loaded, p) for p in prompts]


def accuracy_rows(loaded: LoadedModel, prompts: list[Prompt], workers: int = 1, **labels) -> list[dict]:
    """One row per prompt: index, predicted (first word of the greedy reply), correct (whole answer); the
    prompts split over `workers` forked CPU processes (hooks on the model, such as an ablation, apply in each)."""
    judged = forked_map(functools.partial(llm_bench.local_correct, loaded), prompts, workers=workers)
    return [
        {**labels, "index": index, "predicted": predicted, "correct": bool(correct)}
        for index, (correct, predicted) in enumerate(judged)
    ]


def _workers(loaded: LoadedModel, config: StudyConfig) -> int:
    """The forked processes every stage splits its prompts over (`PredictionConfig.workers`)."""
    return cpu_workers(config.prediction.workers, loaded.model)


# ---- stages -------------------------------------------------------------------------------------


def _read(out: Path, stage: str, table: str):
    """Table `table` written by an earlier `stage` (out is the current stage's folder)."""
    return io.read_parquet(StudyDir(out.parent).file(stage, table))


def _path(out: Path, name: str) -> Path:
    """Where the current stage (its folder `out`) writes its file `name` (posym.runs.STUDY_FILES)."""
    return StudyDir(out.parent).file(out.name, name)


def stage_scores(loaded: LoadedModel, config: StudyConfig, out: Path, progress) -> None:
    import pandas as pd

    frames, prompt_rows, sinks = [], [], {}
    workers = _workers(loaded, config)
    for name, prompts in study_prompts(config).items():
        ids = [tokenize(loaded, p.text)[0].tolist() for p in prompts]
        queries = query_positions(loaded, name, prompts)
        plain = score_model(loaded.model, ids, [[q] for q in queries], tau=config.tau)
        sinks[name] = find_sinks(plain) if config.exclude_keys is None else list(config.exclude_keys)
        variants = {"plain": plain}
        if sinks[name]:
            variants["sinks excluded"] = score_model(
                loaded.model, ids, [[q] for q in queries], tau=config.tau, exclude_keys=sinks[name]
            )
        frames += [frame.assign(set=name, variant=variant) for variant, frame in variants.items()]
        answers = accuracy_rows(loaded, prompts, workers, set=name) if name != "binding-name" else []
        for k, prompt in enumerate(prompts):
            judged = answers[k] if answers else {"predicted": None, "correct": None}
            prompt_rows.append(
                {
                    "set": name,
                    "prompt": k,
                    "text": prompt.text,
                    "answer": prompt.answer,
                    "input_ids": ids[k],
                    "query": queries[k],
                    "query_token": loaded.tokenizer.decode([ids[k][queries[k]]]),
                    "predicted": judged["predicted"],
                    "correct": judged["correct"],
                }
            )
        progress(1)
    scores = pd.concat(frames, ignore_index=True)
    heads = pd.concat(
        [
            summarize_heads(g, gamma=config.gammas[0]).assign(set=s, variant=v)
            for (s, v), g in scores.groupby(["set", "variant"], sort=False)
        ],
        ignore_index=True,
    )
    io.write_parquet(_path(out, "scores"), scores)
    io.write_parquet(_path(out, "heads"), heads)
    io.write_parquet(_path(out, "prompts"), pd.DataFrame(prompt_rows))
    io.write_json(_path(out, "sinks"), sinks)


def stage_profile(loaded: LoadedModel, config: StudyConfig, out: Path, progress) -> None:
    import pandas as pd

    scores = _read(out, "scores", "scores")
    heads = _read(out, "scores", "heads")
    prompts = _read(out, "scores", "prompts")
    n_layers = loaded.model.config.num_hidden_layers
    plain = {name: heads[(heads.set == name) & (heads.variant == "plain")] for name in SETS}
    layers = pd.concat([layer_profile(h).assign(set=name) for name, h in plain.items()], ignore_index=True)
    labels = pd.concat(
        [
            label_counts(g, config.gammas).assign(set=s, variant=v)
            for (s, v), g in scores.groupby(["set", "variant"], sort=False)
        ],
        ignore_index=True,
    )
    sinks = [
        sink_changes(plain[s], heads[(heads.set == s) & (heads.variant == v)]).assign(set=s)
        for s, v in heads[["set", "variant"]].drop_duplicates().itertuples(index=False)
        if v != "plain"
    ]
    accuracy = prompts.dropna(subset=["correct"]).groupby("set")["correct"].agg(["mean", "size"])
    summary = {
        name: {
            **half_profile(h, n_layers),
            "pearson_r": pearson(h.s_pos, h.s_sym),
            "sink_label_changes": int(sum(s.changed.sum() for s in sinks if s.set.iloc[0] == name)),
            "mean_attn_first": float(h.attn_first.mean()),
        }
        for name, h in plain.items()
    }
    for name, row in accuracy.iterrows():
        summary[name] |= {"accuracy": float(row["mean"]), "prompts": int(row["size"])}
    io.write_parquet(_path(out, "layers"), layers)
    io.write_parquet(_path(out, "labels"), labels)
    io.write_parquet(
        _path(out, "agreement"), label_agreement({s: plain[s] for s in ("binding-last", "number", "letter")})
    )
    io.write_parquet(
        _path(out, "sink_changes"),
        pd.concat(sinks, ignore_index=True)
        if sinks
        else sink_changes(plain["binding-last"], plain["binding-last"]).assign(set="binding-last").iloc[:0],
    )
    io.write_json(_path(out, "profile"), summary)
    progress(1)


def stage_frequency(loaded: LoadedModel, config: StudyConfig, out: Path, progress) -> None:
    prompts = _read(out, "scores", "prompts")
    heads = _read(out, "scores", "heads")
    chosen = prompts[prompts.set == "binding-last"].head(config.frequency_prompts)
    planes = channel_means(
        plane_scores(
            loaded.model, [list(i) for i in chosen.input_ids], [[int(q)] for q in chosen["query"]], tau=config.tau
        )
    )
    use = frequency_use(planes)
    plain = heads[(heads.set == "binding-last") & (heads.variant == "plain")]
    both, correlation = behaviour_frequency(plain, use)
    rotary = planes[planes.frequency_id > 0].frequency_id.max()
    io.write_parquet(_path(out, "planes"), planes)
    io.write_parquet(_path(out, "behaviour"), both)
    io.write_json(
        _path(out, "frequency"),
        {
            **correlation,
            "uniform_weighted_id": (1 + float(rotary)) / 2,
            "weighting": "use_k = mean over prompts of plane k's largest logit contribution, clipped at 0",
            "mean_weighted_id": float(both.weighted_id.mean()),
        },
    )
    progress(1)


def _long_prompts(loaded: LoadedModel, config: StudyConfig, length: int) -> list[list[int]]:
    """`gap_prompts` prompts of exactly `length` tokens: binding facts run on, seeded per prompt."""
    out = []
    for k in range(config.gap_prompts):
        ids: list[int] = []
        seed = config.seed + 1000 * k
        while len(ids) < length:
            ids += loaded.tokenizer(" ".join(p.text for p in prompt_sets.binding_prompts(20, seed=seed))).input_ids
            seed += 1
        out.append(ids[:length])
    return out


def rope_bases(model_config) -> tuple[dict, list[float]]:
    """The RoPE bases of a model's config: (the fields discrepancy.json reports, the base of every layer).
    One base (Llama, SmolLM2): {"rope_base": base}. One base per layer kind (Gemma 3's rope_parameters keyed
    by layer type: local "sliding_attention" 10,000, global "full_attention" 1,000,000): {"rope_bases":
    {kind: base}, "layers_by_kind": {kind: [layers]}}, so no single base stands for the model."""
    params = getattr(model_config, "rope_parameters", None) or {}
    per_kind = {kind: float(p["rope_theta"]) for kind, p in params.items() if isinstance(p, dict) and "rope_theta" in p}
    layer_types = list(getattr(model_config, "layer_types", None) or [])
    if per_kind and layer_types and set(layer_types) <= set(per_kind):
        kinds = [kind for kind in per_kind if kind in layer_types]
        return (
            {
                "rope_bases": {kind: per_kind[kind] for kind in kinds},
                "layers_by_kind": {kind: [k for k, t in enumerate(layer_types) if t == kind] for kind in kinds},
            },
            [per_kind[t] for t in layer_types],
        )
    base = float(getattr(model_config, "rope_theta", None) or params.get("rope_theta", 10_000.0))
    return {"rope_base": base}, [base] * int(model_config.num_hidden_layers)


def stage_discrepancy(loaded: LoadedModel, config: StudyConfig, out: Path, progress) -> None:
    import pandas as pd

    if max(config.lengths) > loaded.max_positions:
        raise PosymError(
            f"lengths reach {max(config.lengths)} tokens but the model has {loaded.max_positions} positions"
        )
    behaviour = _read(out, "frequency", "behaviour").sort_values("behaviour")
    chosen = pd.concat(
        [
            behaviour.tail(config.gap_heads).assign(group="positional"),
            behaviour.head(config.gap_heads).assign(group="symbolic"),
        ]
    )
    model_config = loaded.model.config
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    bases, layer_base = rope_bases(model_config)
    rows = []
    for length in config.lengths:
        gaps = head_gaps(
            loaded.model, _long_prompts(loaded, config, length), "last", layers=sorted(set(chosen.layer.astype(int)))
        )
        for head in chosen.itertuples():
            mine = gaps[(gaps.layer == head.layer) & (gaps["head"] == head.head)]
            # the dominant plane's angle off the head's own layer's tables (Gemma 3: local and global bases);
            # a frequency stage written before that column existed falls back to the config's base of its layer
            base = layer_base[int(head.layer)]
            theta = (
                float(head.dominant_frequency)
                if hasattr(head, "dominant_frequency")
                else frequency_angle(int(head.dominant_id), base=base, rotary_dim=head_dim)
            )
            rows += [
                {
                    "group": head.group,
                    "layer": head.layer,
                    "head": head.head,
                    "length": length,
                    "prompt": int(g.prompt),
                    "gap": float(g.gap),
                    "top_key": int(g.top_key),
                    "dominant_id": int(head.dominant_id),
                    "theta": theta,
                    "index_bound": index_bound(theta, length),
                    "rope_base": base,
                }
                for g in mine.itertuples()
            ]
        progress(1)
    io.write_parquet(_path(out, "gaps"), pd.DataFrame(rows))
    io.write_json(
        _path(out, "discrepancy"),
        {
            **bases,
            "head_dim": head_dim,
            "theta": "the dominant plane's angle read off the head's own layer's rotary tables (per-layer RoPE bases)",
            "bound": "Theorem 3.2 Index bound min(1 - cos theta, 2 pi^2 / n^2) for "
            "unit-norm q, k; the measured gaps carry the head's norms",
        },
    )


def stage_bench(loaded: LoadedModel, config: StudyConfig, out: Path, progress) -> None:
    settings = {
        "model": loaded.name,
        "sizes": config.bench_sizes,
        "runs": config.bench_runs,
        "n": config.bench_n,
        "judge": "local whole answer",
    }
    llm_bench.write_bench(
        lambda prompt: llm_bench.local_correct(loaded, prompt),
        out,
        label=loaded.name,
        tasks=("number", "letter"),
        sizes=config.bench_sizes,
        runs=config.bench_runs,
        n=config.bench_n,
        settings=settings,
        progress=lambda k: None,
        workers=_workers(loaded, config),
    )
    progress(1)


def stage_ablation(loaded: LoadedModel, config: StudyConfig, out: Path, progress) -> None:
    import pandas as pd

    heads = _read(out, "scores", "heads")
    plain = heads[(heads.set == "binding-last") & (heads.variant == "plain")]
    sets = {name: p for name, p in study_prompts(config).items() if name != "binding-name"}
    groups = {
        (k, g): heads_
        for k in config.ablation_ks
        if k <= len(plain)
        for g, heads_ in ablation_groups(plain, k, config.seed + k).items()
    }
    means = None
    if "mean" in config.ablation_modes:
        reference = [tokenize(loaded, p.text)[0].tolist() for prompts in sets.values() for p in prompts]
        means = head_means(loaded.model, reference, sorted({h for hs in groups.values() for h in hs}))
    workers = _workers(loaded, config)
    rows = [
        r
        for name, prompts in sets.items()
        for r in accuracy_rows(loaded, prompts, workers, k=0, group="none", mode="none", heads="", set=name)
    ]
    for (k, group), chosen in groups.items():
        for mode in config.ablation_modes:
            with ablated(loaded.model, chosen, mode, means):
                text = ",".join(f"{layer}.{head}" for layer, head in chosen)
                rows += [
                    r
                    for name, prompts in sets.items()
                    for r in accuracy_rows(loaded, prompts, workers, k=k, group=group, mode=mode, heads=text, set=name)
                ]
        progress(1)
    frame = pd.DataFrame(rows)
    io.write_parquet(_path(out, "ablation"), frame)
    io.write_parquet(_path(out, "ablation_summary"), ablation_summary(frame))


def ablation_summary(frame):
    """Accuracy per (k, group, mode, set) of the ablation stage's per-prompt rows: the mean, its Wilson 95%
    interval (lo, hi), the sample std over prompts (ddof 1) and the standard error std / sqrt(prompts).

    >>> import pandas as pd
    >>> rows = pd.DataFrame({"k": 1, "group": "random", "mode": "zero", "set": "binding", "correct": [1, 0, 1, 1]})
    >>> r = ablation_summary(rows).iloc[0]
    >>> float(r.acc), int(r.prompts), round(float(r["std"]), 3), round(float(r.lo), 2), round(float(r.hi), 2)
    (0.75, 4, 0.5, 0.3, 0.95)
    """
    summary = frame.groupby(["k", "group", "mode", "set"], as_index=False)["correct"].agg(
        acc="mean", std=lambda c: float(c.std(ddof=1)), prompts="size", right="sum"
    )
    summary["sem"] = summary["std"] / summary["prompts"].map(math.sqrt)
    bounds = [wilson_interval(int(r), int(n)) for r, n in zip(summary.right, summary.prompts)]
    summary["lo"], summary["hi"] = [b[0] for b in bounds], [b[1] for b in bounds]
    return summary.drop(columns="right")


def stage_screen(loaded: LoadedModel, config: StudyConfig, out: Path, progress) -> None:
    settings = config.prediction
    rows = prediction.screen(
        loaded.model,
        Builder(loaded.tokenizer),
        settings,
        seed=config.seed,
        max_positions=loaded.max_positions,
        progress=progress,
    )
    summary = prediction.accuracy_by(rows, ["format"]).merge(rows.drop_duplicates("format")[["format", "base_length"]])
    io.write_parquet(_path(out, "screen"), rows)
    io.write_parquet(_path(out, "summary"), summary)
    io.write_json(_path(out, "choice"), prediction.choose_format(summary, settings))


def _length_prompts(loaded: LoadedModel, config: StudyConfig, fmt: str) -> dict:
    """{layout: {factor: prompts}} of the chosen format, the same questions in every layout and at the same
    lengths (one base length for all: the longest layout's, so a marked prompt is as long as its unmarked one)."""
    builder, n = Builder(loaded.tokenizer), config.prediction.n_length
    layouts = prediction.families(fmt, config.prediction)
    base = max(base_length(family, builder, n, config.seed) for family in layouts.values())
    return {
        name: build(
            family,
            builder,
            n,
            seed=config.seed,
            base=base,
            max_positions=None if config.prediction.past_context else loaded.max_positions,
        )
        for name, family in layouts.items()
    }


def stage_lengths(loaded: LoadedModel, config: StudyConfig, out: Path, progress) -> None:
    past = past_trained_positions() if config.prediction.past_context else nullcontext()
    with prediction.attention_kernel(loaded.model, config.prediction.kernel), past:
        _measure_lengths(loaded, config, out, progress)
    shutil.rmtree(StudyDir(out.parent).pieces(out.name), ignore_errors=True)  # the tables are written: pieces spent


def _piece(out: Path, name: str, compute: Callable):
    """compute() (a DataFrame), or the piece `name` an interrupted run of this stage kept (`StudyDir.piece`,
    `posym.stages.kept_piece`): a killed lengths stage on a large model (hours on a CPU) resumes from its
    last finished piece (OUT refuses another config or model, `_prepare`). Its done-file's seconds count
    the last run only."""
    return kept_piece(StudyDir(out.parent).piece(out.name, name), compute)


def _measure_lengths(loaded: LoadedModel, config: StudyConfig, out: Path, progress) -> None:
    import pandas as pd

    settings = config.prediction
    chosen = io.read_json_object(StudyDir(out.parent).file("screen", "choice"))
    layouts = _length_prompts(loaded, config, chosen["format"])
    accuracy = []
    workers = _workers(loaded, config)
    for layout, by_factor in layouts.items():

        def answers(by_factor=by_factor, layout=layout):
            correct = prediction.correct_by_length(loaded.model, by_factor, workers=workers)  # one shared-prefix pass
            return pd.concat(
                [
                    pd.DataFrame(
                        {
                            "layout": layout,
                            "factor": factor,
                            "length": prompts[0].length,
                            "prompt": [p.index for p in prompts],
                            "correct": correct[factor],
                        }
                    )
                    for factor, prompts in by_factor.items()
                ],
                ignore_index=True,
            )

        accuracy.append(_piece(out, f"accuracy-{layout}", answers))
        progress(1)
    accuracy = pd.concat(accuracy, ignore_index=True)
    summary = prediction.accuracy_by(accuracy, ["layout", "factor", "length"])
    one = layouts["between"][1][0].length  # the base length, shared by every layout
    trained = [f for f in layouts["between"] if f * one <= loaded.max_positions]  # factors inside the context
    inside = max(trained) if settings.past_context and len(trained) < len(layouts["between"]) else None
    tests = prediction.accuracy_tests(accuracy, effect=settings.accuracy_effect, inside=inside)
    scored = {layout: layouts[layout][1][: settings.n_scores] for layout in ("between", "marked")}
    plain = {
        layout: _piece(out, f"plain-{layout}", lambda ps=ps: prediction.plain_scores(loaded.model, ps, tau=config.tau))
        for layout, ps in scored.items()
    }
    sinks = {layout: find_sinks(frame) for layout, frame in plain.items()}
    # the sink is the model's: a key found as the sink of either prompt set is left out of both
    used = sorted(set().union(*map(set, sinks.values())))
    scores = {}
    for layout, prompts in scored.items():
        scores[layout] = _piece(
            out,
            f"heads-{layout}",
            lambda prompts=prompts, layout=layout: prediction.score_heads(
                loaded.model, prompts, gamma=config.gammas[0], tau=config.tau, plain=plain[layout], sinks=used
            )[0],
        )
        progress(1)
    kinds = prediction.layer_kinds(loaded.model)
    retention, groups, measured, sink_sets = [], [], [], {}
    for layout in ("between", "before"):
        # the sinks found on the base prompts' scores (token 0 on both models) are the keys the free top key
        # never is; the same token sits at the same place in both layouts (the filler of 'before' follows it)
        measures = _piece(
            out,
            f"measures-{layout}",
            lambda layout=layout: prediction.measures_by_length(
                loaded.model, layouts[layout], settings.n_heads, sinks=used
            ),
        )
        measured.append(measures.assign(layout=layout))
        base = layouts[layout][1][0].length
        sink_sets[layout] = prediction.sink_heads(measures[measures.factor == 1], used)
        for variant in ("sink-free", "plain"):
            labels = scores["between"][scores["between"].variant == variant][
                ["layer", "head", "label", "s_pos", "s_sym"]
            ]
            retention.append(
                head_retention(measures, base_length=base)
                .merge(labels, on=["layer", "head"])
                .assign(layout=layout, ranking=variant)
            )
            named = prediction.label_groups(
                scores["between"], variant, settings.draws, config.seed, sinks=sink_sets[layout], kinds=kinds
            )
            table = group_retention(
                measures,
                named,
                base_length=base,
                n_boot=settings.n_boot,
                seed=config.seed,
                statistic=prediction.RETENTION_STATISTIC,
            ).assign(layout=layout, ranking=variant)
            # one Holm family per (layout, ranking, measure): the groups at every length
            groups += [
                holm_verdicts(part, effect=settings.effect) for _, part in table.groupby("measure", sort=False)
            ] or [holm_verdicts(table, effect=settings.effect)]  # no group at all: an empty table with its columns
        progress(1)
    heads = pd.concat([frame.assign(layout=layout) for layout, frame in scores.items()], ignore_index=True)
    io.write_parquet(_path(out, "accuracy"), accuracy)
    io.write_parquet(_path(out, "accuracy_summary"), summary)
    io.write_parquet(_path(out, "accuracy_tests"), tests)
    io.write_parquet(_path(out, "heads"), heads)
    io.write_parquet(_path(out, "measures"), pd.concat(measured, ignore_index=True))
    io.write_parquet(_path(out, "head_retention"), pd.concat(retention, ignore_index=True))
    io.write_parquet(_path(out, "group_retention"), pd.concat(groups, ignore_index=True))
    io.write_parquet(_path(out, "label_moves"), label_moves(heads, config))
    io.write_json(
        _path(out, "lengths"),
        {
            "format": chosen["format"],
            "sinks": sinks,
            "sinks_left_out": used,
            "sink_heads": {k: [list(h) for h in v] for k, v in sink_sets.items()},
            "layer_kinds": kinds,
            "base_lengths": {k: v[1][0].length for k, v in layouts.items()},
            # the positions the model was trained at (its max_position_embeddings); past_context: lengths beyond
            "trained_context": loaded.max_positions,
            "past_context": settings.past_context,
            "inside_factor": inside,  # past_context: the longest factor inside the trained context (tests against it)
            "kernel": loaded.model.config._attn_implementation,  # inside `attention_kernel`: the one that ran
            "prompts": {"accuracy": settings.n_length, "heads": settings.n_heads, "scores": settings.n_scores},
            "draws": settings.draws,
            "holm_family": "per (layout, ranking, measure): every group with a random pool at every length",
        },
    )


def label_moves(heads, config: StudyConfig):
    """The heads the causal stage ablates (top-k symbolic and positional by sink-free scores, k the first
    of causal_ks) with their sink-free scores and labels without and with markers (the brief's advice)."""
    import pandas as pd

    plain, marked = heads[heads.layout == "between"], heads[heads.layout == "marked"]
    k = config.prediction.causal_ks[0]
    groups = prediction.causal_groups(plain, k, 0, config.seed)
    return pd.concat(
        [
            prediction.label_moves(plain, marked, groups[("sink-free", g)]).assign(group=g, k=k)
            for g in prediction.CAUSAL_GROUPS
        ],
        ignore_index=True,
    )


def stage_causal(loaded: LoadedModel, config: StudyConfig, out: Path, progress, measured=None) -> None:
    settings = config.prediction
    # the format the lengths stage measured (its heads, labels and clean answers are of it), not the screen's
    # choice read again: a screen replaced after the lengths ran would pair one format's labels with another's
    measured_format = io.read_json_object(StudyDir(out.parent).file("lengths", "lengths"))["format"]
    prompts = _length_prompts(loaded, config, measured_format)["between"]
    heads = _read(out, "lengths", "heads")
    heads = heads[heads.layout == "between"]
    accuracy = _read(out, "lengths", "accuracy")  # the clean model on these prompts: measured once, there
    # the estimated null (issue 51): every head's AtP effect per length, estimate_draws matched sets summed;
    # the named groups and the first draws of each pool ablated for real once, for the calibration beside
    # the estimates and for the causal rows (one mean-ablation: the same-length prompts' mean per position)
    chosen = {f: prompts[f][: settings.n_causal] for f in sorted(settings.causal_factors)}
    table, calibration, points, ablations = estimates.causal_estimates(
        loaded.model,
        chosen,
        settings,
        heads,
        seed=config.seed,
        kinds=prediction.layer_kinds(loaded.model),
        progress=progress,
        measured=measured,
    )
    rows = prediction.causal_rows(chosen, settings, ablations, clean=accuracy[accuracy.layout == "between"])
    io.write_parquet(_path(out, "causal"), rows)
    io.write_parquet(
        _path(out, "causal_summary"),
        prediction.causal_table(rows, n_boot=settings.n_boot, seed=config.seed, effect=settings.accuracy_effect),
    )
    io.write_parquet(_path(out, "estimates"), table)
    io.write_parquet(_path(out, "calibration"), calibration)
    io.write_parquet(_path(out, "calibration_points"), points)


STAGE_WORK: dict[str, Callable] = {
    "scores": stage_scores,
    "profile": stage_profile,
    "frequency": stage_frequency,
    "discrepancy": stage_discrepancy,
    "bench": stage_bench,
    "ablation": stage_ablation,
    "screen": stage_screen,
    "lengths": stage_lengths,
    "causal": stage_causal,
}


def study_stages(config: StudyConfig) -> list[str]:
    """The stages a study of `config` runs, in study order: every stage but the ablation when `ablation_ks`
    is empty (its default).

    >>> study_stages(StudyConfig())[4:]
    ['bench', 'screen', 'lengths', 'causal']
    >>> len(study_stages(StudyConfig(ablation_ks=[1, 4, 16])))
    9
    """
    return [s for s in STAGES if s != "ablation" or config.ablation_ks]


def stage_steps(config: StudyConfig) -> dict[str, int]:
    """Progress steps of each stage (for one progress bar over the study)."""
    p = config.prediction
    return {
        "scores": len(SETS),
        "profile": 1,
        "frequency": 1,
        "discrepancy": len(config.lengths),
        "bench": 1,
        "ablation": len(config.ablation_ks) * len(GROUPS),
        "screen": len(p.formats),
        "lengths": 3 + 2 + 2,
        # per mode and length an attribution step and a real-ablation step (`estimates.causal_estimates`)
        "causal": 2 * len(p.causal_modes) * len(p.causal_factors),
    }


def run_study(
    loaded: LoadedModel,
    out,
    config: StudyConfig,
    *,
    settings: dict,
    progress=None,
    only: list[str] | None = None,
    reuse_ablations=None,
) -> dict:
    """Run the stages not yet done (all, or `only`), then the report; returns {stage: seconds or "done"}.
    One process per OUT (`posym.io.locked`); Ctrl-C keeps the finished stages. reuse_ablations: an earlier
    study's causal/calibration_points.parquet whose real ablations the causal stage takes again where they
    are of the same sets, prompts and weights (`estimates.reused_ablations`)."""
    out = Path(out)
    check_sizes(loaded, config, only or study_stages(config))
    measured = None
    if reuse_ablations is not None:
        measured = io.read_parquet(reuse_ablations)
        missing = set(estimates.REUSED_COLUMNS) - set(measured.columns)
        if missing:
            raise PosymError(
                f"{io.quote(reuse_ablations)} has no {', '.join(sorted(missing))} column: not a causal stage's "
                "calibration_points.parquet"
            )
    work = {**STAGE_WORK, "causal": functools.partial(stage_causal, measured=measured)}
    with resumable(out, lambda: _kept(out, study_stages(config))):
        _prepare(out, config, loaded, settings)
        progress = progress or (lambda k=1: None)
        timings: dict[str, float | str] = {}
        for stage in only or study_stages(config):
            seconds = run_stage(out, JOB, stage, lambda: work[stage](loaded, config, out / stage, progress))
            if seconds is None:
                progress(stage_steps(config)[stage])
            timings[stage] = "done" if seconds is None else round(seconds, 2)
        build_study_report(out)
    return timings


def check_sizes(loaded: LoadedModel, config: StudyConfig, stages: list[str]) -> None:
    """Refuse, before any stage runs, a study whose prompts would not fit the model's positions (the
    discrepancy lengths, the longest Appendix H prompt of the bench and the longest length family),
    an ablation stage without ablation_ks or with ks past the model's heads, or exclude_keys that are not
    keys of every stage-1 prompt."""
    top = loaded.max_positions
    if "ablation" in stages and not config.ablation_ks:  # asked for by name (study_stages leaves it out)
        raise PosymError("stage ablation needs ablation_ks, the sizes of its head groups (e.g. [1, 4, 16])")
    if "ablation" in stages and max(config.ablation_ks) > (
        heads := loaded.model.config.num_hidden_layers * loaded.model.config.num_attention_heads
    ):  # was skipped, then blamed on OUT
        raise PosymError(f"ablation_ks reach {max(config.ablation_ks):,} heads, more than the model's {heads:,}")
    if "scores" in stages and config.exclude_keys:
        shortest = min(min(query_positions(loaded, name, p)) for name, p in study_prompts(config).items())
        outside = [k for k in config.exclude_keys if not 0 <= k < shortest]
        if outside:
            raise PosymError(
                f"exclude_keys {outside[0]} is not a key of every prompt: key positions lie in 0..{shortest - 1} "
                "(before the earliest query of the study's prompts)"
            )
    if "discrepancy" in stages and max(config.lengths) > top:
        raise PosymError(f"lengths reach {max(config.lengths)} tokens but the model has {top} positions")
    if "bench" in stages:
        for task in ("number", "letter"):
            prompt = prompt_sets.bench_prompts(task, max(config.bench_sizes), 1, seed=config.seed)[0]
            if len(loaded.text_ids(prompt.text)) > top:
                raise PosymError(
                    f"the Appendix H prompts of size {max(config.bench_sizes)} do not fit the model's "
                    f"{top} positions; choose smaller bench_sizes"
                )
    if set(PREDICTION_STAGES) & set(stages):
        builder, p = Builder(loaded.tokenizer), config.prediction
        # past the trained context (past_context) only the lengths stage goes; the causal stage's lengths stay inside
        inside = p.causal_factors if p.past_context else p.factors
        longest = 0
        for fmt in filter(builder.asks, p.formats):  # the screen skips chat forms without a chat template
            for family in prediction.families(fmt, p).values():
                base = base_length(family, builder, p.n_length, config.seed)
                longest = max(longest, max(p.factors) * base)
                if max(inside) * base > top:
                    what = "causal_factors" if p.past_context else "factors"
                    hint = "" if p.past_context else ", or set past_context: true to test past the trained context"
                    raise PosymError(
                        f"the {family.name} family reaches {max(inside) * base} tokens at "
                        f"{max(inside)}x but the model has {top} positions; choose smaller {what}{hint}"
                    )
        if "lengths" in stages and longest > top and (rows := fixed_position_table(loaded.model)) is not None:
            raise PosymError(
                f"past_context needs a rotary embedding that computes any position, but {loaded.name}'s table "
                f"holds {rows} positions and the lengths reach {longest}"
            )
        if "lengths" in stages and (p.kernel or loaded.model.config._attn_implementation) == "eager":
            # the eager kernel holds [heads, L, L] scores per forward, in each worker at once
            need = prediction.eager_attention_bytes(loaded.model, longest, cpu_workers(p.workers, loaded.model))
            if need > (have := resources.machine_memory(loaded.device)):
                raise PosymError(
                    f"the lengths stage's eager attention at {longest:,} tokens needs about {need / 2**30:.1f} GiB, "
                    f"more than this machine's {have / 2**30:.1f} GiB; set kernel: sdpa (or fewer workers)"
                )


def _prepare(out: Path, config: StudyConfig, loaded: LoadedModel, settings: dict) -> None:
    """OUT/study.yaml and manifest.json (with the model's `identity`); a study with another config or of
    another model, or a foreign directory, is refused."""
    model = identity(loaded)
    if not claim(out, STUDY_MARKER, configs.to_dict(config), what="a study"):
        manifest = StudyDir(out).manifest
        if not manifest.is_file() and any(is_done(out, JOB, stage) for stage in STAGES):
            raise PosymError(  # a finished stage of an unknown model: continuing could mix two models' results
                f"{out} holds finished stages but no manifest.json, so posym cannot tell which model they are "
                "of; restore manifest.json, or choose another --out"
            )
        before = io.read_json_object(manifest) if manifest.is_file() else {}
        held = before.get("identity")
        if isinstance(held, dict) and "digest" in held:  # the weights decide, not the spec that named them
            was, now = (f"{m.get('name')} (weights {m.get('digest')})" for m in (held, model))
            other = held["digest"] != model["digest"]
        else:  # a study written before identities were recorded: its spec is all there is to compare
            was, now = before.get("model"), settings.get("model", model["name"])
            other = was is not None and str(was) != str(now)
        if other:
            raise PosymError(
                f"{out} holds a study of {was}, not of {now}; re-run with that model to continue it, "
                "or choose another --out"
            )
    io.write_json(
        StudyDir(out).manifest, io.manifest(configs.to_dict(config), seed=config.seed, identity=model, **settings)
    )


def _kept(out: Path, stages: list[str]) -> str:
    """The Ctrl-C line of `posym llm-study` (`stages`: those its config runs)."""
    done = sum(is_done(out, JOB, stage) for stage in stages)
    return f"kept {done} of {len(stages)} finished stages in {out}; re-running the same command resumes"
