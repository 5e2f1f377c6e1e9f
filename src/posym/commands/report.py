"""`posym report`: one self-contained HTML page of a study, beside every figure as PNG + SVG.

Inputs are directories other commands wrote, recognised by their files:
- a training run (config.yaml; posym train) with its analysis/ (posym dynamics, posym geometry) and
  lengthgen/ (posym lengthgen) outputs;
- a theory directory (theory.json; posym theory);
- an llm-bench directory (table.md and summary.parquet; posym llm-bench) for Table 3.
Nothing is recomputed: the page shows what the Parquet/JSON/figure files hold, and names the command
that would fill any gap. Figures are embedded as base64 PNG (no external CSS, JS, fonts or images),
so the page opens offline; the PNG and SVG files are copied next to it under figures/. This module
gathers plain data (sections, tables, figures, provenance); the Jinja2 template
posym/templates/report.html.j2 lays it out (autoescaped).
"""

from __future__ import annotations

import base64
import datetime
import os
import platform
import shutil
from pathlib import Path

import posym
from posym import explorer, io
from posym.core.paper import FIG5B, FIG7_LABELS, GAMMA, RETENTION, SEED_SUMMARY_SHARES, TABLE1 as PAPER_TABLE1
from posym.errors import PosymError
from posym.runs import EXPLORER, REPORT, REPORT_FIGURES, RunDir, figure_file, kind_of, output_file


def _layer_span(layers: range) -> str:
    """Layers as the report writes them: `range(4, 12)` -> 'L4-L11', `range(0)` -> 'none'."""
    if not layers:
        return "none"
    return f"L{layers[0]}" if len(layers) == 1 else f"L{layers[0]}-L{layers[-1]}"


# The paper's values in the report's words, read from posym.core.paper (its one source).
PAPER_PURE = {
    task: (_layer_span(labels["positional"]), _layer_span(labels["symbolic"]))
    for task, labels in FIG7_LABELS[GAMMA].items()
}
"""Pure heads at the default gamma of the paper's 12-layer models (Fig. 2B / 7): (positional, symbolic)."""
SMALL_MODEL_PURE = (
    f"a 6-layer, 8-head model (preset seed) is expected at ~{SEED_SUMMARY_SHARES['number']['positional']:.0%} "
    f"positional / {SEED_SUMMARY_SHARES['number']['symbolic']:.0%} symbolic heads (number) and "
    f"> {SEED_SUMMARY_SHARES['letter']['symbolic']:.0%} symbolic (letter)"
)
PAPER_LENGTHGEN = {
    task: f"accuracy {curve[850]:.2f} at 850 tokens, {curve[2048]:.2f} at 2,048 (Fig. 5B)"
    for task, curve in FIG5B.items()
}
EXPECTED_RETENTION = {
    "number": f"retention ~{RETENTION['number']:.1f} at 4x the training length (positional)",
    "letter": f"retention >= {RETENTION['letter']:.1f} at 2x-4x (symbolic)",
}
PAPER_PLANES = 64
"""RoPE planes of the paper's models (head dimension 128): the scale of its Table 1."""

# (analysis, figure (`posym.runs.FIGURES`), figure name, what it shows); paper references are added per task.
RUN_FIGURES = [
    ("dynamics", "accuracy", "Fig. 2A", "Test accuracy overall and per hop count over training steps."),
    (
        "dynamics",
        "scores",
        "Fig. 2B",
        "Positional (s_pos) and symbolic (s_sym) score per layer over training, "
        "at hop queries, with normalised attention entropy.",
    ),
    ("dynamics", "entropy", "Fig. 6", "The same scores and min-max normalised entropy at the last token."),
    ("dynamics", "purity", "Fig. 7", "Cumulative number of heads that became pure for good, per gamma."),
    (
        "dynamics",
        "roles",
        "Fig. 7 by query role",
        "Scores per layer at the max-accuracy step (chosen on validation) for the all-hops mean and each pointer "
        "role (last token, pointer into the target window, inner pointers), and the fraction of prompts on which "
        "the head is pure (gamma 0.1).",
    ),
    (
        "geometry",
        "qk_plane",
        "Fig. 4B",
        "Queries and keys of one prompt on the dominant RoPE plane of one head, before rotation (what the q/k "
        "projections write) and after RoPE rotated each by its position.",
    ),
    (
        "geometry",
        "frequency",
        "Fig. 8 / Table 1",
        "Use of every RoPE plane per layer, and the weighted frequency ID per layer divided by the number of planes, "
        "with the uniform baseline.",
    ),
    (
        "lengthgen",
        "lengthgen",
        "Fig. 5B",
        "Accuracy against sequence length per hop count (extra target-window tokens).",
    ),
    (
        "lengthgen",
        "head_retention",
        "Head-level retention",
        "Retention (value at L / value at the training length) of every head's margin (top-1 minus top-2 logit) and "
        "attention on the chain key at each pointer of the chain: median over the heads of each label (solid, 95% "
        "paired bootstrap over prompts as a band) and over layer-matched random heads (dashed).",
    ),
    (
        "discrepancy",
        "gaps",
        "Theorem 3.2 on trained heads",
        "Top-1 minus top-2 attention logit at the last token against sequence length, per layer: median "
        "(solid) and minimum (dotted).",
    ),
]
_ANALYSIS = "posym dynamics RUN_DIR and posym geometry RUN_DIR"
MISSING = {"dynamics": _ANALYSIS, "geometry": _ANALYSIS, "lengthgen": "posym lengthgen RUN_DIR"}
"""What to run for a missing figure; figures of other analyses (discrepancy) are optional extras."""
OPTIONAL = {("lengthgen", "head_retention")}
"""Figures of those analyses that are optional extras too (runs analysed before them, or without them)."""


REPORTED = ("run", "theory", "bench")
"""The kinds of output (`posym.runs.kind_of`) a report has sections for."""


def input_kind(path: Path) -> str:
    """'run', 'theory' or 'bench' by the files a directory holds (`posym.runs.kind_of`); anything else is a
    PosymError."""
    kind = kind_of(path, REPORTED)
    if kind is None:
        raise PosymError(
            f"{path} is not a posym run, theory or llm-bench directory (no config.yaml, theory.json or table.md)"
        )
    return kind


def _read_json(path: Path) -> dict | None:
    """A posym output's JSON object, or None if absent; not JSON, not an object or nested too deep is one line."""
    return io.read_json_object(path) if path.is_file() else None


def _guarded(build, path: Path, *args):
    """`build(path, *args)`, a section of the page; an output whose JSON or tables lack what posym writes
    there (a hand-edited `{}`, a list, another program's file) is one PosymError line naming `path`."""
    try:
        return build(path, *args)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise PosymError(
            f"{path} does not hold what posym writes there ({type(exc).__name__}: "
            f"{io.quote(str(exc))}); re-run the command that wrote it"
        ) from None


def first_pure_steps(metrics, threshold: float = 0.95) -> dict[int, int | None]:
    """Per hop count, the first checkpoint step whose accuracy on that hop is >= threshold."""
    out = {}
    for column in sorted(c for c in metrics.columns if c.startswith("acc_hop")):
        hit = metrics[metrics[column] >= threshold]
        out[int(column[7:])] = int(hit.step.min()) if len(hit) else None
    return out


def run_summary(run_dir: str | Path) -> dict:
    """Headline numbers of one training run from its files: task, preset, final step and accuracy per
    hop, pure layers at the end (gamma 0.1, hop queries; None before posym dynamics), weighted
    frequency ID per layer (None before posym geometry) and the length-generalization summary."""
    run_dir = Path(run_dir)
    config = io.read_yaml(RunDir(run_dir).config)
    if not RunDir(run_dir).metrics.is_file():
        raise PosymError(f"{run_dir} has no metrics.parquet: has training started?")
    metrics = io.read_parquet(RunDir(run_dir).metrics).sort_values("step")
    last = metrics.iloc[-1]
    out = {
        "run_dir": str(run_dir),
        "task": config["task"]["task"],
        "preset": config["preset"],
        "layers": config["model"]["n_layer"],
        "step": int(last.step),
        "max_steps": config["max_steps"],
        "acc": float(last.acc),
        "acc_hops": {int(c[7:]): float(last[c]) for c in metrics if c.startswith("acc_hop")},
        "first_step_ge_0.95": first_pure_steps(metrics),
        "positional": None,
        "symbolic": None,
        "weighted_id": None,
        "lengthgen": None,
    }
    comp = RunDir(run_dir).analysis_file("dynamics", "composition_summary")
    if comp.is_file():
        c = io.read_parquet(comp)
        row = c[(c.gamma == GAMMA) & (c.stage == "end") & (c.query_mode == "hops")].iloc[0]
        out["positional"] = row.layers_positional or "none"
        out["symbolic"] = row.layers_symbolic or "none"
        out["frac_positional"], out["frac_symbolic"] = float(row.frac_positional), float(row.frac_symbolic)
    freq = RunDir(run_dir).analysis_file("geometry", "frequency")
    if freq.is_file():
        per_layer = io.read_parquet(freq).groupby("layer").mean(numeric_only=True)
        out["weighted_id"] = per_layer.weighted_id.round(1).tolist()
        out["weightings"] = {
            c[len("weighted_id_") :]: per_layer[c].round(1).tolist() for c in per_layer if c.startswith("weighted_id_")
        }  # runs analysed before: none
    geometry = _read_json(RunDir(run_dir).analysis_file("geometry", "record")) or {}
    out["index_alignment"] = geometry.get("plane_figure", {}).get("index_alignment")  # number runs only
    out["planes"] = _rope_planes(config["model"])
    out["manifest"] = _read_json(RunDir(run_dir).manifest)
    lengthgen = _read_json(RunDir(run_dir).analysis_file("lengthgen", "record"))
    if lengthgen is not None:
        out["lengthgen"] = lengthgen["summary"]
    return out


def _rope_planes(model: dict) -> int | None:
    """RoPE planes per head of a run's model config (rotary_dim / 2; None when the config lacks widths)."""
    if "n_embd" not in model or "n_head" not in model:
        return None
    return (model.get("rotary_dim") or model["n_embd"] // model["n_head"]) // 2


def lengthgen_headline(summary: dict | None) -> str:
    """'acc >= 0.9 up to N tokens; retention 0.xx at Kx' from a lengthgen summary ('' if absent)."""
    if not summary:
        return ""
    parts = []
    if "paper" in summary:
        held = summary["paper"]["longest_length_acc_ge_0.9"]
        parts.append(f"acc >= 0.9 up to {held} tokens" if held else "acc < 0.9 at every length")
    if "seed" in summary:
        factor = max(summary["seed"]["retention"], key=float)
        parts.append(f"{float(factor):g}x retention {summary['seed']['retention'][factor]:.2f}")
    return "; ".join(parts)


# ---- page parts (plain data; templates/report.html.j2 lays them out) --------------------------------


def _figure(src_stem: Path, out_dir: Path, name: str, title: str, caption: str, reference: str) -> dict | None:
    """Copy stem.png/.svg into out_dir/figures/name.*; the figure's entry (PNG inline), None if absent."""
    png, svg = src_stem.with_suffix(".png"), src_stem.with_suffix(".svg")
    if not png.is_file():
        return None
    for source in (png, svg):
        if source.is_file():
            with io.atomic_path(out_dir / REPORT_FIGURES / f"{name}{source.suffix}") as tmp:
                shutil.copyfile(source, tmp)
    return {
        "id": name,
        "title": title,
        "caption": caption,
        "reference": reference,
        "data": base64.b64encode(png.read_bytes()).decode("ascii"),
        "files": f"{REPORT_FIGURES}/{name}.png, .svg",
    }


def _section(id: str, title: str, *, source=None, table=None, text=None, pre=None, items=(), link=None) -> dict:
    """One <h2> part of the page: optional source path, table, paragraph, preformatted text, figures, and a
    link {"href", "text"} to a file beside the page."""
    return {
        "id": id,
        "title": title,
        "source": source and str(source),
        "table": table,
        "text": text,
        "pre": pre,
        "items": list(items),
        "link": link,
    }


def _explorer_section(runs: list[Path], out_dir: Path) -> dict:
    """out_dir/explorer.html from the runs' score tables (`posym explore --no-details`: the report recomputes
    nothing) and the section that links it."""
    names = ", ".join(r.name for r in runs)
    text, counts = explorer.page(runs, details=False, title=f"posym explore: {names}")
    path = io.write_text(out_dir / EXPLORER, text)
    size = f"{EXPLORER} ({path.stat().st_size / 1e6:.2f} MB)"
    return _section(
        "explorer",
        "Head explorer",
        link={"href": EXPLORER, "text": size},
        text=f"Every head of {names} ({counts['heads']} heads in {counts['sets']} sets: task and query "
        "mode, last step) on one offline page: layer x head maps of s_pos, s_sym, label, entropy and "
        "frequency ID, filters, and per head its per-prompt scores, per-plane scores and margin vs "
        "length. Attention rows and swaps need the model: posym explore RUN --out explorer.html.",
    )


def _fmt(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _discrepancy_numbers(run_dir: Path) -> str:
    """'median gap at N1 -> N2 tokens: x-y times smaller (1 / n^2: z)' from discrepancy.json ('' if absent)."""
    result = _read_json(RunDir(run_dir).analysis_file("discrepancy", "record"))
    if not result or not result.get("median_gap"):
        return ""
    gaps: dict[str, dict[int, float]] = {}
    for key, value in result["median_gap"].items():  # "L{layer}H{head}@{length}"
        head, length = key.split("@")
        if head.endswith("H0"):
            gaps.setdefault(head[:-2], {})[int(length)] = value
    lengths = sorted({n for by_length in gaps.values() for n in by_length})
    if len(lengths) < 2:
        return ""
    short, long = lengths[0], lengths[-1]
    ratios = {layer: g[short] / g[long] for layer, g in gaps.items() if g.get(long, 0) > 0 and short in g}
    if not ratios:
        return ""
    low, high = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
    return (
        f"Ours: from {short} to {long} tokens the median gap shrinks {ratios[low]:.3g}x ({low}) to "
        f"{ratios[high]:.3g}x ({high}); a 1 / n^2 rate would shrink it {(long / short) ** 2:,.0f}x."
    )


def _run_section(run_dir: Path, out_dir: Path) -> tuple[dict, dict]:
    s = run_summary(run_dir)
    task, name = s["task"], f"{s['task']}-{run_dir.name}" if run_dir.name != s["task"] else s["task"]
    pos, sym = PAPER_PURE[task]
    references = {
        "Fig. 2A": "the number task is learned hop by hop (1 hop first), the letter task all hops at once; "
        "accuracy peaks only once the heads are pure.",
        "Fig. 2B": "both scores ~1 at initialisation (uniform attention); then heads become pure: "
        f"positional {pos}, symbolic {sym} (12 layers).",
        "Fig. 6": "entropy falls as heads become pure.",
        "Fig. 7": f"pure heads at gamma {GAMMA}: positional {pos}, symbolic {sym} (12 layers); {SMALL_MODEL_PURE}.",
        "Fig. 7 by query role": "which query positions the paper scored is not stated.",
        "Fig. 4B": (
            "number model, layer 1: keys cluster in one direction, queries fan out by the offset they "
            "encode (the Index construction)."
            if task == "number"
            else "the paper draws this figure for the number model only; a symbolic head is expected to "
            "match keys by content, not by one direction (the Retrieval construction)."
        ),
        "Fig. 8 / Table 1": "weighted frequency ID per layer "
        + ", ".join(str(v) for v in _paper_table1(task))
        + f" (12 layers, {PAPER_PLANES} planes).",
        "Fig. 5B": f"{PAPER_LENGTHGEN[task]}; {EXPECTED_RETENTION[task]}.",
        "Head-level retention": "a positional head's best margin can only shrink like 2 pi^2 / n^2 (Theorem 3.2), a "
        f"symbolic head's need not; seed summary: symbolic >= {RETENTION['letter']:.0%} of its accuracy at 2x-4x, "
        f"positional ~{RETENTION['number']:.0%}.",
        "Theorem 3.2 on trained heads": "a positional (Index) head's best gap can only shrink like 2 pi^2 / n^2, "
        "a symbolic (Retrieval) head's need not; the letter model generalizes, "
        "the number model does not.",
    }
    planes = s.get("planes")
    ours = {
        "Fig. 2A": "Ours: first step with >= 95% per hop: "
        + ", ".join(f"{h} hop{'s' * (h > 1)} {v}" for h, v in s["first_step_ge_0.95"].items())
        + ".",
        "Fig. 7": f"Ours (end, hop queries): positional {s['positional']}, symbolic {s['symbolic']}.",
        "Fig. 8 / Table 1": f"Ours: {', '.join(str(v) for v in s['weighted_id'] or [])} "
        f"({s['layers']} layers{f', {planes} planes' if planes else ''}).",
        "Fig. 4B": _alignment_text(s["index_alignment"]),
        "Fig. 5B": f"Ours: {lengthgen_headline(s['lengthgen'])}." if s["lengthgen"] else "",
        "Theorem 3.2 on trained heads": _discrepancy_numbers(run_dir),
    }
    head_table = _head_retention_table(run_dir)
    items = []
    for command, key, title, caption in RUN_FIGURES:
        stem = RunDir(run_dir).analysis_figure(command, key)
        figure = _figure(
            stem,
            out_dir,
            f"{name}-{stem.name}",
            f"{title}, {task} task",
            f"{caption} {ours.get(title, '')}".strip(),
            references[title],
        )
        if figure and (command, key) == ("lengthgen", "head_retention") and head_table:
            figure["table"] = head_table
        if figure or (command in MISSING and (command, key) not in OPTIONAL):
            items.append(figure or {"absent": f"{title} ({task}): absent; run {MISSING[command]} first."})
    section = _section(
        f"run-{name}", f"{task.capitalize()} task: step {s['step']} of {s['max_steps']}", source=run_dir, items=items
    )
    return section, s


def _head_retention_table(run_dir: Path) -> dict | None:
    """The head-level retention per group (lengthgen/head_groups.parquet) as a table: one row per group and
    measure, one column per length, each cell 'value [lo, hi]'; None without the file."""
    path = RunDir(run_dir).analysis_file("lengthgen", "head_groups")
    if not path.is_file():
        return None
    groups = io.read_parquet(path)
    if not len(groups):
        return None
    lengths = sorted(int(v) for v in groups["length"].unique())
    rows = []
    for (group, measure), sub in groups.groupby(["group", "measure"], sort=False):
        cells = {int(r.length): f"{r.value:.2f} [{r.lo:.2f}, {r.hi:.2f}]" for r in sub.itertuples()}
        rows.append(
            [group, measure, int(sub["heads"].iloc[0]), int(sub["draws"].iloc[0]), *(cells.get(n, "") for n in lengths)]
        )
    return {
        "header": ["group", "measure", "heads", "draws", *(f"{n} tokens" for n in lengths)],
        "rows": rows,
        "caption": f"Retention per group: median head retention [95% paired bootstrap over "
        f"{int(groups['prompts'].iloc[0])} prompts]; random groups: the mean over draws.",
    }


def _alignment_text(alignment: dict | None) -> str:
    """Fig. 4B's caption numbers (posym.core.geometry.index_alignment); empty without them."""
    if not alignment or not alignment["queries"]:
        return ""
    return (
        f"Ours, against T_Index: key concentration {alignment['key_concentration']:.3f} (1 = one direction), "
        f"integer queries {alignment['query_concentration']:.2f}; the query of an integer sigma at p points "
        f"at the key p - sigma within {alignment['phase_error_deg']:.1f} degrees (median), the nearest key in "
        f"angle for {alignment['target_nearest']:.0%} of {alignment['queries']} queries."
    )


def _paper_table1(task: str) -> list[int]:
    return PAPER_TABLE1[task]


def _summary(summaries: list[dict]) -> dict:
    hops = sorted({h for s in summaries for h in s["acc_hops"]})
    rows = [
        {
            "task": s["task"],
            "preset": s["preset"],
            "step": f"{s['step']}/{s['max_steps']}",
            "acc": _fmt(s["acc"]),
            "hops": [_fmt(s["acc_hops"].get(h)) for h in hops],
            "positional": _fmt(s["positional"]),
            "symbolic": _fmt(s["symbolic"]),
            "paper_pure": " / ".join(PAPER_PURE[s["task"]]),
            "lengthgen": lengthgen_headline(s["lengthgen"]) or "n/a",
            "paper_lengthgen": PAPER_LENGTHGEN[s["task"]],
        }
        for s in summaries
    ]
    return {"hops": hops, "rows": rows}


def _table1(summaries: list[dict]) -> dict | None:
    """Table 1 with one column per model and weighting of posym.core.geometry (ours) or per model (the
    paper's) and one row per layer, every cell
    'ID (ID / planes)', under rows for the planes and the uniform baseline (planes + 1) / 2."""
    measured = [s for s in summaries if s["weighted_id"]]
    if not measured:
        return None
    columns = [
        (f"{s['task']} (ours, {name})", ids, s.get("planes"))
        for s in measured
        for name, ids in (s.get("weightings") or {"linear": s["weighted_id"]}).items()
    ]
    columns += [(f"{t} (paper)", _paper_table1(t), PAPER_PLANES) for t in dict.fromkeys(s["task"] for s in measured)]
    depth = max(len(ids) for _, ids, _ in columns)

    def cell(value, planes) -> str:
        return f"{value:g} ({value / planes:.2f})" if planes else f"{value:g}"

    rows = [
        ["planes", *(planes or "n/a" for _, _, planes in columns)],
        [
            "uniform (planes + 1) / 2",
            *(cell((planes + 1) / 2, planes) if planes else "n/a" for _, _, planes in columns),
        ],
    ]
    rows += [
        [f"L{k}", *(cell(ids[k], planes) if k < len(ids) else "" for _, ids, planes in columns)] for k in range(depth)
    ]
    return {"models": [name for name, _, _ in columns], "rows": rows}


def _theory_section(theory_dir: Path, out_dir: Path) -> dict:
    result = _read_json(output_file(theory_dir, "theory", "record"))
    rows = [
        [
            r["head"],
            r["n0"],
            f"{r['theta']:.4g}",
            r["exact"],
            r["softmax_exact"],
            f"{r['delta_n0']:.3g}",
            f"{r['bound_n0']:.3g}",
            f"{r['beta_needed']:.4g}",
            f"{r['beta_lemma']:.4g}",
        ]
        for r in result["summary"]
    ]
    tasks = "; ".join(
        f"T_{k.capitalize()} on the {t['task']} task: s_pos {t['s_pos']:.3f}, s_sym {t['s_sym']:.3f}, "
        f"answer after h hops {t['softmax']['after_h']:.3f} (softmax)"
        for k, t in result["tasks"].items()
    )
    figure = _figure(
        figure_file(theory_dir, "theory", "discrepancy"),
        out_dir,
        "theory-fig5a",
        "Fig. 5A",
        "Discrepancy Delta(n) of T_Index and T_Retrieval (measured) against Theorem 3.2's bounds.",
        "Delta_Index(n) <= min(1 - cos theta, 2 pi^2 / n^2); "
        "Delta_Retrieval(n) <= 1 - cos(omega - n theta), "
        "theta = 0.866 (ID 2) and 0.0027 (ID 42).",
    )
    header = [
        "head",
        "n0",
        "theta",
        "exact (hard)",
        "exact (softmax)",
        "Delta(n0)",
        "bound",
        "beta needed",
        "beta Lemma F.1",
    ]
    return _section(
        "theory",
        "Theory: constructions and discrepancy (Theorems 3.1, 3.2)",
        source=theory_dir,
        table={"header": header, "rows": rows},
        text=f"{tasks}.",
        items=[figure] if figure else [],
    )


def _bench_section(bench_dir: Path, out_dir: Path, k: int) -> dict:
    figure = _figure(
        figure_file(bench_dir, "llm-bench", "bench"),
        out_dir,
        "table3-bench",
        "Table 3 (figure)",
        "Accuracy of a real model on the 1-hop Appendix H prompts per target-window size, ours with std.",
        "GPT-5.4, GPT-5.5, Claude Sonnet 3.7 (dashed).",
    )
    return _section(
        f"table3-{k}",
        "Table 3: real models on 1-hop prompts",
        source=bench_dir,
        pre=io.read_text(output_file(bench_dir, "llm-bench", "table")),
        items=[figure] if figure else [],
    )


def _provenance(summaries: list[dict]) -> dict[str, str]:
    """What a reader needs to trust or redo the page: versions, config hashes, seeds, date, machine."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")  # reproducible builds: a fixed date gives identical bytes
    now = (
        datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
        if epoch
        else datetime.datetime.now(datetime.timezone.utc)
    )
    out = {
        "posym": posym.__version__,
        "built": now.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()} ({platform.platform()}, {os.cpu_count()} CPUs)",
    }
    for s in summaries:
        m = s.get("manifest") or {}
        versions = m.get("versions", {})
        out[f"{s['task']} run"] = (
            f"config hash {m.get('config_hash', 'n/a')}, seed {m.get('seed', 'n/a')}, "
            f"posym {versions.get('posym', 'n/a')}, torch {versions.get('torch', 'n/a')}, "
            f"trained on {versions.get('platform', 'n/a')}"
        )
    return out


def build_report(paths: list[str | Path], out_dir: str | Path, *, title: str = "posym report") -> Path:
    """Write out_dir/report.html (self-contained) and out_dir/figures/*.png|svg; return the HTML path."""
    import jinja2

    if not paths:
        raise PosymError("give at least one run, theory or llm-bench directory")
    out_dir, dirs = Path(out_dir), [Path(p) for p in paths]
    for path in dirs:
        if not path.is_dir():
            raise PosymError(f"{path} is not a directory")
    kinds = [(input_kind(p), p) for p in dirs]
    sections, summaries = [], []
    for kind, path in kinds:
        if kind == "run":
            section, summary = _guarded(_run_section, path, out_dir)
            sections.append(section)
            summaries.append(summary)
    explorable = [p for k, p in kinds if k == "run" and RunDir(p).analysis_file("dynamics", "dynamics").is_file()]
    if explorable:
        sections.append(_guarded(_explorer_section, explorable, out_dir))
    theory = [p for k, p in kinds if k == "theory"]
    sections += [_guarded(_theory_section, p, out_dir) for p in theory] or [
        _section(
            "theory",
            "Theory (Theorems 3.1, 3.2)",
            items=[{"absent": "Fig. 5A and the constructions: absent; run posym theory and pass its directory."}],
        )
    ]
    bench = [p for k, p in kinds if k == "bench"]
    sections += [_guarded(_bench_section, p, out_dir, k) for k, p in enumerate(bench)] or [
        _section(
            "table3",
            "Table 3: real models",
            items=[
                {
                    "absent": "Table 3 (real models): absent; no llm-bench result was given (run posym llm-bench "
                    "and pass its directory)."
                }
            ],
        )
    ]
    table1 = _table1(summaries)
    contents = (
        [{"id": "provenance", "title": "Provenance", "figures": []}]
        + ([{"id": "summary", "title": "Summary", "figures": []}] if summaries else [])
        + ([{"id": "table1", "title": "Table 1: weighted frequency ID per layer", "figures": []}] if table1 else [])
        + [
            {
                "id": s["id"],
                "title": s["title"],
                "figures": [{"id": item["id"], "title": item["title"]} for item in s["items"] if "id" in item],
            }
            for s in sections
        ]
    )
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("posym", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    page = env.get_template("report.html.j2").render(
        title=title,
        contents=contents,
        provenance=_provenance(summaries),
        summary=_summary(summaries) if summaries else None,
        table1=table1,
        sections=sections,
    )
    return io.write_text(out_dir / REPORT, page)
