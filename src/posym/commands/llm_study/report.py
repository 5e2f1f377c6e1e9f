"""The report of `posym llm-study`: figures from OUT's stage tables and one self-contained report.html.

Sections follow the stages (`posym.commands.llm_study`); a stage not yet run shows as absent. Each
caption puts our number beside the paper's where the paper has one: 2511.11579's Gemma-2-2b-it
layer halves (median s_pos 0.83 early vs 0.56 late) and frequency finding (positional heads on fast
planes, symbolic on slow ones), 2605.31558's Table 3 (`posym.commands.llm_bench.PAPER_TABLE3`).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

from posym import io
from posym.commands.explore import explore
from posym.commands.llm_study import estimates
from posym.commands.llm_study.prediction import (
    plot_accuracy,
    plot_causal,
    plot_retention,
)
from posym.core.stats import wilson_interval
from posym.core.stats import pearson
from posym.errors import PosymError
from posym.figures import plot_heads, save_figure, subplots
from posym.runs import DONE, EXPLORER, STAGES, StudyDir, figure_file
from posym.stages import is_done

if TYPE_CHECKING:
    from matplotlib.figure import Figure

JOB = "study"
"""The job name of `posym llm-study`'s done-files (stages/study-<stage>.done.json)."""

GEMMA_HALVES = (0.83, 0.56)
"""2511.11579: median positional score of Gemma-2-2b-it's early and late halves of layers."""
SECTIONS = (
    "Settings",
    "Accuracy",
    "Scores and sinks",
    "Layer profile",
    "Frequency",
    "Discrepancy",
    "Table 3",
    "Ablation",
    "Length task",
    "Head retention",
    "Causal tests",
    "Head explorer",
)

TEMPLATE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}
th{background:#eee}img{max-width:100%;border:1px solid #ddd}figcaption{font-size:.92em}.absent{color:#a33}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto}</style></head><body><h1>{{ title }}</h1>
{% for section in sections %}<h2>{{ section.name }}</h2>
{% if section.absent %}<p class="absent">Absent: stage {{ section.absent }} has not run (re-run posym llm-study
with the same --out to resume).</p>{% endif %}
{% for text in section.texts %}<p>{{ text }}</p>{% endfor %}
{% for table in section.tables %}<table><tr>{% for h in table.header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in table.rows %}<tr>{% for v in row %}<td>{{ v }}</td>{% endfor %}</tr>{% endfor %}</table>{% endfor %}
{% for pre in section.pres %}<pre>{{ pre }}</pre>{% endfor %}
{% for link in section.links %}<p><a href="{{ link.href }}">{{ link.text }}</a></p>{% endfor %}
{% for fig in section.figures %}<figure><img alt="{{ fig.title }}" src="data:image/png;base64,{{ fig.data }}">
<figcaption><b>{{ fig.title }}.</b> {{ fig.caption }} (files: {{ fig.files }})</figcaption></figure>{% endfor %}
{% endfor %}</body></html>
"""


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _table(frame, columns) -> dict:
    return {
        "header": list(columns),
        "rows": [[_fmt(v) for v in row] for row in frame[list(columns)].itertuples(index=False)],
    }


def _figure(stem: Path, out: Path, title: str, caption: str) -> dict:
    return {
        "title": title,
        "caption": caption,
        "files": f"{stem.relative_to(out)}.png, .svg",
        "data": base64.b64encode(stem.with_suffix(".png").read_bytes()).decode("ascii"),
    }


# ---- figures ------------------------------------------------------------------------------------


def plot_profile(layers) -> Figure:
    """Median s_pos (solid) and s_sym (dashed) per layer, one colour per prompt set."""
    fig, ax = subplots(figsize=(8, 4))
    for k, (name, rows) in enumerate(layers.groupby("set", sort=False)):
        color = f"C{k}"
        ax.plot(rows.layer, rows.median_s_pos, "o-", color=color, ms=3, label=f"{name} s_pos")
        ax.plot(rows.layer, rows.median_s_sym, "s--", color=color, ms=3, label=f"{name} s_sym")
    ax.set(xlabel="layer", ylabel="median over heads", ylim=(-0.05, 1.05), title="layer profile")
    ax.legend(fontsize=7, ncol=2)
    return fig


def plot_behaviour(both, correlation: dict) -> Figure:
    """Behaviour (s_pos - s_sym) against weighted frequency ID, one dot per head, coloured by layer."""
    fig, ax = subplots(figsize=(6.5, 4.2))
    dots = ax.scatter(both.weighted_id, both.behaviour, c=both.layer, cmap="plasma", s=14)
    fig.colorbar(dots, ax=ax, label="layer")
    ax.set(
        xlabel="weighted frequency ID (1 = fastest plane)",
        ylabel="s_pos - s_sym",
        ylim=(-1.05, 1.05),
        title=f"Pearson r = {correlation['pearson']:.2f}, Spearman rho = {correlation['spearman']:.2f}",
    )
    return fig


def plot_gaps(gaps) -> Figure:
    """Median gap per head against length (log-log) with Theorem 3.2's Index bound at the head's
    dominant frequency (dotted, unit-norm q and k); one panel per group."""
    groups = list(gaps.groupby("group", sort=False))
    fig, axes = subplots(1, len(groups), figsize=(5.5 * len(groups), 4), squeeze=False)
    for ax, (group, rows) in zip(axes[0], groups):
        for k, ((layer, head), g) in enumerate(rows.groupby(["layer", "head"])):
            med = g.groupby("length", as_index=False).agg(gap=("gap", "median"), bound=("index_bound", "first"))
            ax.plot(med["length"], med.gap.clip(lower=1e-6), "o-", color=f"C{k}", label=f"L{layer}.H{head} gap")
            ax.plot(med["length"], med.bound, ":", color=f"C{k}", label=f"bound (id {g.dominant_id.iloc[0]})")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="prompt length (tokens)",
            ylabel="top-1 minus top-2 logit",
            title=f"most {group} heads",
        )
        ax.legend(fontsize=7)
    return fig


def plot_ablation(summary) -> Figure:
    """Accuracy against k per ablated group, one panel per (prompt set, mode), bars = Wilson 95% interval
    over prompts; k = 0 is the intact model."""
    import pandas as pd

    panels = list(summary[summary.k > 0].groupby(["set", "mode"]))
    fig, axes = subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, ((name, mode), rows) in zip(axes[0], panels):
        base = summary[(summary.k == 0) & (summary.set == name)]
        for k, (group, g) in enumerate(rows.groupby("group")):
            g = pd.concat([base, g.sort_values("k")])
            ax.errorbar(
                [0, *g.k.iloc[1:]],
                g.acc,
                yerr=[g.acc - g.lo, g.hi - g.acc],
                marker="o",
                capsize=3,
                color=f"C{k}",
                label=group,
            )
        ax.set(title=f"{name}, {mode}-ablation", xlabel="heads ablated (k)", ylim=(-0.05, 1.05))
    axes[0, 0].set_ylabel("accuracy (whole answer)")
    axes[0, -1].legend(fontsize=7)
    return fig


# ---- sections -----------------------------------------------------------------------------------


def _has(out: Path, stage: str) -> bool:
    return is_done(out, JOB, stage)


def _sections(out: Path) -> list[dict]:
    import pandas as pd

    study = StudyDir(out)

    def section(name, stage=None, **parts):
        absent = stage if stage and not _has(out, stage) else None
        return {
            "name": name,
            "absent": absent,
            "texts": [],
            "tables": [],
            "pres": [],
            "figures": [],
            "links": [],
            **parts,
        }

    settings = section("Settings", pres=[io.read_text(study.marker)] if study.marker.is_file() else [])
    written = io.read_yaml(study.marker) if study.marker.is_file() else {}  # the study's config, as run
    accuracy, scores, profile = (
        section("Accuracy", "profile"),
        section("Scores and sinks", "scores"),
        section("Layer profile", "profile"),
    )
    if _has(out, "scores"):
        heads = io.read_parquet(study.file("scores", "heads"))
        sinks = io.read_json_object(study.file("scores", "sinks"))
        scores["texts"].append(
            "Sink key positions left out of the swaps, per prompt set: "
            + "; ".join(f"{k}: {v or 'none'}" for k, v in sinks.items())
        )
        for variant, rows in heads[heads.set == "binding-last"].groupby("variant", sort=False):
            stem = study.figures / f"heads-{variant.replace(' ', '-')}"
            save_figure(plot_heads(rows, pearson(rows.s_pos, rows.s_sym)), stem)
            scores["figures"].append(
                _figure(
                    stem,
                    out,
                    f"Layer x head maps, binding prompts, last token ({variant})",
                    "s_pos and s_sym of every head, and the heads in the (s_pos, s_sym) plane.",
                )
            )
        counts = heads.groupby(["set", "variant", "label"]).size().unstack(fill_value=0).reset_index()
        scores["tables"].append(_table(counts, counts.columns))
    if _has(out, "profile"):
        summary = io.read_json_object(study.file("profile", "profile"))
        rows = pd.DataFrame([{"set": k, **v} for k, v in summary.items()])
        accuracy["tables"].append(
            _table(
                rows.dropna(subset=["accuracy"]) if "accuracy" in rows else rows.iloc[:0],
                ["set", "accuracy", "prompts"] if "accuracy" in rows else ["set"],
            )
        )
        profile["tables"].append(
            _table(
                rows,
                [
                    "set",
                    "early_s_pos",
                    "late_s_pos",
                    "early_s_sym",
                    "late_s_sym",
                    "pearson_r",
                    "mean_attn_first",
                    "sink_label_changes",
                ],
            )
        )
        profile["texts"].append(
            f"2511.11579 (Gemma-2-2b-it): median s_pos {GEMMA_HALVES[0]} in the early half of the "
            f"layers vs {GEMMA_HALVES[1]} in the late half."
        )
        save_figure(plot_profile(io.read_parquet(study.file("profile", "layers"))), study.figures / "profile")
        halves = "; ".join(
            f"{k}: {v['early_s_pos']:.2f} vs {v['late_s_pos']:.2f}"
            for k, v in summary.items()
            if v.get("early_s_pos") is not None
        )
        profile["figures"].append(
            _figure(
                study.figures / "profile",
                out,
                "Layer profile",
                "Median s_pos (solid) and s_sym (dashed) per layer and prompt set. Median "
                f"s_pos, early vs late half of the layers, ours: {halves}; 2511.11579 "
                f"(Gemma-2-2b-it): {GEMMA_HALVES[0]} vs {GEMMA_HALVES[1]}.",
            )
        )
        labels = io.read_parquet(study.file("profile", "labels"))
        profile["tables"].append(
            _table(
                labels.pivot_table(index=["set", "variant", "gamma"], columns="label", values="heads").reset_index(),
                ["set", "variant", "gamma", "positional", "symbolic", "mixed", "uniform"],
            )
        )
        profile["tables"].append(
            _table(io.read_parquet(study.file("profile", "agreement")), ["a", "b", "heads", "agreement"])
        )
        changes = io.read_parquet(study.file("profile", "sink_changes"))
        changed = changes[changes.changed]
        scores["texts"].append(
            f"{len(changed)} of {len(changes)} (set, head) labels change when the sinks are "
            "excluded from the swaps; the first 40:"
        )
        scores["tables"].append(
            _table(
                changed.head(40),
                [
                    "set",
                    "layer",
                    "head",
                    "attn_first",
                    "s_pos",
                    "s_sym",
                    "label",
                    "s_pos_excluded",
                    "s_sym_excluded",
                    "label_excluded",
                ],
            )
        )
    frequency = section("Frequency", "frequency")
    if _has(out, "frequency"):
        info = io.read_json_object(study.file("frequency", "frequency"))
        save_figure(
            plot_behaviour(io.read_parquet(study.file("frequency", "behaviour")), info),
            study.figures / "behaviour",
        )
        frequency["texts"].append(
            f"Weighting: {info['weighting']}. Mean weighted frequency ID {info['mean_weighted_id']:.2f} "
            f"(uniform weighting: {info['uniform_weighted_id']:.1f}); over {info['heads']} heads, "
            f"Pearson r = {info['pearson']:.3f}, Spearman rho = {info['spearman']:.3f}."
        )
        frequency["figures"].append(
            _figure(
                study.figures / "behaviour",
                out,
                "Behaviour against frequency",
                "One dot per head (binding prompts, last token). Ours: Pearson r = "
                f"{info['pearson']:.2f} between behaviour (s_pos - s_sym) and weighted "
                "frequency ID; 2511.11579: positional heads use fast planes, symbolic heads "
                "slow ones, i.e. a negative correlation (no coefficient given).",
            )
        )
    discrepancy = section("Discrepancy", "discrepancy")
    if _has(out, "discrepancy"):
        save_figure(plot_gaps(io.read_parquet(study.file("discrepancy", "gaps"))), study.figures / "gaps")
        info = io.read_json_object(study.file("discrepancy", "discrepancy"))
        discrepancy["figures"].append(
            _figure(
                study.figures / "gaps",
                out,
                "Discrepancy by length",
                f"Median gap over prompts; dotted: {info['bound']}.",
            )
        )
    table3 = section("Table 3", "bench")
    if _has(out, "bench"):
        table3["pres"].append(io.read_text(study.file("bench", "table")))
        note = _chance_note(io.read_parquet(study.file("bench", "summary")))
        if note:
            table3["texts"].append(note)
        table3["figures"].append(
            _figure(
                figure_file(study.folder("bench"), "llm-bench", "bench"),
                out,
                "Table 3 analogue",
                "Whole-answer accuracy per target-window size, std over runs; the paper's models dashed.",
            )
        )
    ablation = section("Ablation", "ablation")
    if not _has(out, "ablation") and study.marker.is_file() and not written.get("ablation_ks"):
        ablation["absent"] = None  # not pending: this study's config leaves the stage out
        ablation["texts"].append(
            "Stage 6 is off in this study (ablation_ks is empty, the default): its random group is one unmatched "
            "draw per k, and the causal stage below ablates the labels' top heads against layer-matched random "
            "pools. Set ablation_ks (e.g. [1, 4, 16]) in the study YAML to run it."
        )
    if _has(out, "ablation"):
        summary = io.read_parquet(study.file("ablation", "ablation_summary"))
        save_figure(plot_ablation(summary), study.figures / "ablation")
        ablation["figures"].append(
            _figure(
                study.figures / "ablation",
                out,
                "Ablation effects",
                "Top-k positional, top-k symbolic and k random heads (binding, last token).",
            )
        )
        ablation["tables"].append(_table(summary, ["k", "group", "mode", "set", "acc", "lo", "hi", "prompts"]))
        size = int(written.get("bench_size", 12))
        for row in summary[summary.k == 0].itertuples():
            chance = 0.25 if row.set.startswith("binding") else 1 / size  # 4 facts; one of `size` target tokens
            lo, hi = wilson_interval(round(row.acc * row.prompts), int(row.prompts))
            if lo <= chance:
                ablation["texts"].append(
                    f"The intact model is at chance on {row.set} ({row.acc:.2f}, Wilson 95% [{lo:.2f}, {hi:.2f}] over "
                    f"{row.prompts} prompts reaches chance {chance:.2f}), so its ablation rows say nothing about "
                    "which heads matter."
                )
    explorer = section("Head explorer", "scores")
    if _has(out, "scores"):
        # the tables alone (the report recomputes nothing); `posym explore OUT` adds attention rows and swaps
        result = explore([out], study.explorer, details=False, title=f"posym explore: {out.name}")
        explorer["texts"].append(
            f"Every head on one offline page ({result['heads']} heads in {result['sets']} prompt sets): "
            "layer x head maps of s_pos, s_sym (plain and sink-free), label, entropy, sink mass and "
            "frequency ID, filters, and per head its per-plane use, margin vs length and prompts. "
            "Attention rows and swaps need the model: posym explore OUT --model MODEL."
        )
        explorer["links"].append({"href": EXPLORER, "text": f"{EXPLORER} ({result['bytes'] / 1e6:.2f} MB)"})
    return [
        settings,
        accuracy,
        scores,
        profile,
        frequency,
        discrepancy,
        table3,
        ablation,
        *_prediction_sections(out, section),
        explorer,
    ]


def _chance_note(summary) -> str | None:
    """A sentence when every Appendix H accuracy's Wilson interval reaches down to chance (1 / size):
    the benchmark then cannot rank anything."""
    rows = [
        (r, wilson_interval(round(r.acc_mean * r.runs * r.per_run), int(r.runs * r.per_run)))
        for r in summary.itertuples()
    ]
    if rows and all(lo <= 1 / r.size for r, (lo, _) in rows):
        return (
            "The model is at chance on every size (each accuracy's 95% Wilson interval reaches 1 / size), so "
            "this table says nothing about how its heads behave."
        )
    return None


def _prediction_sections(out: Path, section) -> list[dict]:
    """Length task (screen), Head retention and Causal tests (`posym.commands.llm_study.prediction`)."""
    study = StudyDir(out)
    task, kept, causal = (
        section("Length task", "screen"),
        section("Head retention", "lengths"),
        section("Causal tests", "causal"),
    )
    if _has(out, "screen"):
        summary = io.read_parquet(study.file("screen", "summary"))
        chosen = io.read_json_object(study.file("screen", "choice"))
        task["texts"].append(
            f"Every format tried at its base length ('between' layout), with its n and 95% Wilson "
            f"interval: each is probed first, and a format that can still reach the threshold is then "
            f"asked the full count, in order, until one passes. "
            f"Rule: {chosen['rule']}. Chosen: {chosen['format']} ({chosen['accuracy']:.3f})"
            + (
                "."
                if chosen["passes"]
                else "; NO format reached the threshold, so the length and "
                "causal stages describe a task the model does not solve."
            )
        )
        task["tables"].append(_table(summary, ["format", "base_length", "acc", "lo", "hi", "n"]))
    if _has(out, "lengths"):
        acc = io.read_parquet(study.file("lengths", "accuracy_summary"))
        info = io.read_json_object(study.file("lengths", "lengths"))
        save_figure(plot_accuracy(acc, info["format"]), study.figures / "length-accuracy")
        task["figures"].append(
            _figure(
                study.figures / "length-accuracy",
                out,
                "Accuracy by length",
                "between: distractors between the facts and the question; before: distractors "
                "before everything; marked: between, each fact tagged with a marker the question "
                "repeats. Bands: Wilson 95%.",
            )
        )
        task["tables"].append(_table(acc, ["layout", "factor", "length", "acc", "lo", "hi", "n"]))
        groups = io.read_parquet(study.file("lengths", "group_retention"))
        for (layout, ranking), rows in groups.groupby(["layout", "ranking"], sort=False):
            stem = study.figures / f"retention-{layout}-{ranking}"
            save_figure(plot_retention(rows, f"{info['format']} / {layout}: heads labelled by {ranking} scores"), stem)
            kept["figures"].append(
                _figure(
                    stem,
                    out,
                    f"Head retention, {layout}, {ranking} labels",
                    "Per group of heads (sink-tracking heads apart), the attention it keeps on the "
                    "answer-bearing key and on each head's base-length top key with the sinks left out "
                    "(summed over the group at L / summed at the base length; a key outside a window "
                    "counts as lost), and the median head's top-1 minus top-2 logit retention; dashed: "
                    "random heads matched on layer and layer kind; bands: paired prompt bootstrap 95% "
                    f"over {int(rows.prompts.iloc[0])} prompts.",
                )
            )
        moves = study.file("lengths", "label_moves")
        if moves.is_file():
            moves = io.read_parquet(moves)
            kept["texts"].append(
                f"The heads the causal stage ablates, sink-free scores without and with markers: "
                f"{int((moves.label != moves.label_marked).sum())} of {len(moves)} change label."
            )
            kept["tables"].append(
                _table(
                    moves,
                    [
                        "group",
                        "layer",
                        "head",
                        "s_pos",
                        "s_sym",
                        "label",
                        "s_pos_marked",
                        "s_sym_marked",
                        "label_marked",
                    ],
                )
            )
        if len(groups):
            longest = groups[(groups.length == groups.length.max()) & ~groups.group.str.startswith("random")]
            kept["texts"].append(
                "At the longest length, every group against its own random heads: p_random is the "
                "randomization p over the draws, p_holm its Holm adjustment over the family of one "
                "(layout, ranking, measure); a verdict needs p_holm < 0.05 and the prompt-bootstrap "
                "interval of diff on the same side of 0; mde: the difference detectable over prompts "
                "with 80% power at the family's level."
            )
            columns = ["layout", "ranking", "measure", "group", "length", "value", "lo", "hi", "level", "heads"]
            columns += [
                c
                for c in ("null_median", "diff", "diff_lo", "diff_hi", "p_random", "p_holm", "verdict", "mde")
                if c in longest
            ]
            kept["tables"].append(
                _table(longest.assign(verdict=longest.get("verdict", "").astype(str)), columns + ["draws", "prompts"])
            )
        else:
            kept["texts"].append("No head has a positional, symbolic or mixed label here, so there are no groups.")
    if _has(out, "causal"):
        table = io.read_parquet(study.file("causal", "causal_summary"))
        save_figure(plot_causal(table), study.figures / "causal")
        causal["figures"].append(
            _figure(
                study.figures / "causal",
                out,
                "Length effect of ablations",
                "drop(L) - drop(base) of each ablated group (sink-free ranking) and of its "
                "layer-matched random heads; bars: paired prompt bootstrap 95%.",
            )
        )
        named = table[~table.group.str.startswith("random")]
        causal["texts"].append(
            "Each group against its own random heads (matched on layer and layer kind): p_drop is the "
            "randomization p of its drop among the draws' drops, p_effect that of the length effect "
            "drop(L) - drop(base); Holm over every p of one (k, mode). drop_separated / separated: the "
            "Holm-adjusted p below 0.05 and the prompt-bootstrap interval on the same side of 0. p_floor "
            "= 1 / (draws + 1) is the smallest p the draws allow: with p_floor * family above 0.05 "
            "nothing can be separated. mde_effect: the length-effect difference detectable with 80% "
            "power; needed: the prompts a 0.1 difference would need."
        )
        causal["tables"].append(
            _table(
                named.assign(
                    separated=named.separated.astype(str),
                    needed=named.needed.astype(str),
                    drop_separated=named.drop_separated.astype(str),
                ),
                [
                    "k",
                    "mode",
                    "ranking",
                    "group",
                    "length",
                    "acc",
                    "drop",
                    "drop_vs_random",
                    "p_drop_holm",
                    "drop_separated",
                    "effect",
                    "effect_lo",
                    "effect_hi",
                    "vs_random",
                    "vs_random_lo",
                    "vs_random_hi",
                    "p_effect",
                    "p_effect_holm",
                    "p_floor",
                    "separated",
                    "mde_effect",
                    "needed",
                    "prompts",
                ],
            )
        )
        _estimate_tables(out, causal)
    return [task, kept, causal]


def _estimate_tables(out: Path, causal: dict) -> None:
    """The causal section's ESTIMATED tests (`posym.commands.llm_study.estimates`) and their calibration."""
    study = StudyDir(out)
    path = study.file("causal", "estimates")
    if not path.is_file():
        return
    table = io.read_parquet(path)
    calibration = io.read_parquet(study.file("causal", "calibration"))
    est = table[table.source == "estimate"]
    causal["texts"].append(
        f"ESTIMATES, not ablations: each group's effect estimated as the sum of its heads' attribution-patching "
        f"(AtP) effects on the answer's logit margin, against {int(est.draws.max())} ESTIMATED random sets of its "
        "own pool (matched on layer and layer kind; like for like: estimate against estimates). value: the "
        "estimated accuracy drop (the answer counted right while clean margin + estimated change > 0; next "
        "token only), margin change or length effect drop(L) - drop(base); p: its randomization p among the "
        "estimated draws; Holm over every estimated p of one (k, mode). real_value: the same measure of the "
        "group ablated for real (same mode, same-length mean reference: the estimate's exact counterpart); "
        "real_verdict: the verdict the real value gets against the same estimated null; agrees: whether it "
        "is the estimate's. The real ablations' own tests against the calibrated real draws are the rows "
        "with source 'real' in causal/estimates.parquet."
    )
    columns = ["source", "k", "mode", "ranking", "group", "length", "measure", "value", "null_median", "null_lo"]
    columns += ["null_hi", "p", "p_holm", "family", "verdict", "mde", "real_value", "real_verdict", "agrees"]
    causal["tables"].append(
        _table(
            est.assign(agrees=est.agrees.astype(str), real_verdict=est.real_verdict.astype(str)),
            columns + ["draws", "prompts"],
        )
    )
    causal["texts"].append(
        "How far the estimate can be trusted, per length: the named groups and the first calibration sets of "
        "each random pool ablated for real beside their estimates, over prompt x set: Pearson and Spearman of "
        "the estimated against the real margin change, the real / estimate slope through 0, both means, the "
        "share of answers the estimate calls as the ablation does (acc_agreement), and how many named groups' "
        f"accuracy-drop verdicts agree. trusted: Pearson >= {estimates.TRUST_PEARSON} and the slope within "
        f"{estimates.TRUST_SLOPE[0]}-{estimates.TRUST_SLOPE[1]}; where it is False, read the estimated verdicts "
        "at that length as unvalidated."
    )
    causal["tables"].append(
        _table(
            calibration.assign(trusted=calibration.trusted.astype(str)),
            ["k", "mode", "length", "sets", "points", "pearson", "spearman", "slope", "mean_real", "mean_estimate"]
            + ["acc_agreement", "verdicts_agree", "verdicts", "trusted"],
        )
    )


def build_study_report(out) -> Path:
    """Write OUT/report.html (self-contained) and OUT/figures/*.png|svg from the finished stages."""
    from jinja2 import Environment

    out = Path(out)
    template = Environment(autoescape=True).from_string(TEMPLATE)
    try:
        sections = _sections(out)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:  # a stage output of another shape
        raise PosymError(
            f"{out} holds a stage output that is not what posym llm-study writes there "
            f"({type(exc).__name__}: {io.quote(str(exc))}); delete that stage's folder and its "
            f"{STAGES}/{JOB}-STAGE{DONE} to run it again"
        ) from None
    page = template.render(title=f"posym llm-study: {out.name}", sections=sections)
    return io.write_text(StudyDir(out).report, page)
