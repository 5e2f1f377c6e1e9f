"""`posym report`: one self-contained HTML page of a study, beside every figure as PNG + SVG.

Inputs are directories other commands wrote, recognised by their files:
- a training run (config.yaml; posym train) with its analysis/ (posym dynamics, posym geometry) and
  lengthgen/ (posym lengthgen) outputs;
- a theory directory (theory.json; posym theory);
- an llm-bench directory (table.md and summary.parquet; posym llm-bench) for Table 3.
Nothing is recomputed: the page shows what the Parquet/JSON/figure files hold, and names the command
that would fill any gap. Figures are embedded as base64 PNG (no external CSS, JS, fonts or images),
so the page opens offline; the PNG and SVG files are copied next to it under figures/.
"""

from __future__ import annotations

import base64
import html
import json
import shutil
from pathlib import Path

from posym import io
from posym.core.geometry import PAPER_TABLE1
from posym.errors import PosymError


SEED_LAYERS = "seed summary: ~40% positional / 60% symbolic (number), > 90% symbolic (letter)"
# Pure heads at gamma = 0.1 of the paper's 12-layer models (SPEC 4).
PAPER_PURE = {"number": ("L0-L3", "L4-L11"), "letter": ("none", "L1-L11")}
PAPER_LENGTHGEN = {"number": "barely generalizes (collapses beyond the training length)",
                   "letter": ">= 90% accuracy up to 850 tokens (53x)"}
SEED_RETENTION = {"number": "~0.3 at 4x (positional)", "letter": ">= 0.8 at 2x-4x (symbolic)"}

# (subdirectory, file stem, figure name, what it shows); paper references are added per task.
RUN_FIGURES = [
    ("analysis", "fig2a_accuracy", "Fig. 2A", "Test accuracy overall and per hop count over training steps."),
    ("analysis", "fig2b_scores", "Fig. 2B", "Positional (s_pos) and symbolic (s_sym) score per layer over training, "
     "at hop queries, with normalised attention entropy."),
    ("analysis", "fig6_entropy", "Fig. 6", "The same scores and min-max normalised entropy at the last token."),
    ("analysis", "fig7_purity", "Fig. 7", "Cumulative number of heads that became pure for good, per gamma."),
    ("analysis", "fig4b_qk_plane", "Fig. 4B",
     "Queries and keys of layer 1 on its dominant RoPE plane, before rotation."),
    ("analysis", "fig8_frequency", "Fig. 8 / Table 1",
     "Use of every RoPE plane per layer and the weighted frequency ID."),
    ("lengthgen", "fig5b", "Fig. 5B", "Accuracy against sequence length per hop count (extra target-window tokens)."),
    ("discrepancy", "fig_discrepancy", "Theorem 3.2 on trained heads",
     "Top-1 minus top-2 attention logit at the last token against sequence length, per layer: median "
     "(solid) and minimum (dotted)."),
]
MISSING = {"analysis": "posym dynamics RUN_DIR and posym geometry RUN_DIR", "lengthgen": "posym lengthgen RUN_DIR"}
"""What to run for a missing figure; figures of other subdirectories (discrepancy) are optional extras."""

STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}
th{background:#eee}figure{margin:1.5em 0}img{max-width:100%;border:1px solid #ddd}
figcaption{font-size:.92em;margin-top:.3em}.ref{color:#555}.absent{color:#a33}pre{background:#f6f6f6;padding:.6em}"""


def kind_of(path: Path) -> str:
    """'run', 'theory' or 'bench' by the files a directory holds; anything else is a PosymError."""
    if (path / "config.yaml").is_file():
        return "run"
    if (path / "theory.json").is_file():
        return "theory"
    if (path / "table.md").is_file() and (path / "summary.parquet").is_file():
        return "bench"
    raise PosymError(f"{path} is not a posym run, theory or llm-bench directory (no config.yaml, theory.json or "
                     "table.md)")


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


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
    config = io.read_yaml(run_dir / "config.yaml")
    if not (run_dir / "metrics.parquet").is_file():
        raise PosymError(f"{run_dir} has no metrics.parquet: has training started?")
    metrics = io.read_parquet(run_dir / "metrics.parquet").sort_values("step")
    last = metrics.iloc[-1]
    out = {"run_dir": str(run_dir), "task": config["task"]["task"], "preset": config["preset"],
           "layers": config["model"]["n_layer"], "step": int(last.step), "max_steps": config["max_steps"],
           "acc": float(last.acc), "acc_hops": {int(c[7:]): float(last[c]) for c in metrics if c.startswith("acc_hop")},
           "first_step_ge_0.95": first_pure_steps(metrics), "positional": None, "symbolic": None,
           "weighted_id": None, "lengthgen": None}
    comp = run_dir / "analysis" / "composition_summary.parquet"
    if comp.is_file():
        c = io.read_parquet(comp)
        row = c[(c.gamma == 0.1) & (c.stage == "end") & (c.query_mode == "hops")].iloc[0]
        out["positional"] = row.layers_positional or "none"
        out["symbolic"] = row.layers_symbolic or "none"
        out["frac_positional"], out["frac_symbolic"] = float(row.frac_positional), float(row.frac_symbolic)
    freq = run_dir / "analysis" / "frequency.parquet"
    if freq.is_file():
        out["weighted_id"] = io.read_parquet(freq).groupby("layer").weighted_id.mean().round(1).tolist()
    lengthgen = _read_json(run_dir / "lengthgen" / "lengthgen.json")
    if lengthgen is not None:
        out["lengthgen"] = lengthgen["summary"]
    return out


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


# ---- HTML pieces ------------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _figure(src_stem: Path, out_dir: Path, name: str, title: str, caption: str, reference: str) -> str:
    """Copy stem.png/.svg into out_dir/figures/name.*; an <img> with the PNG inline and its caption."""
    png, svg = src_stem.with_suffix(".png"), src_stem.with_suffix(".svg")
    if not png.is_file():
        return ""
    for source in (png, svg):
        if source.is_file():
            with io.atomic_path(out_dir / "figures" / f"{name}{source.suffix}") as tmp:
                shutil.copyfile(source, tmp)
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    ref = f' <span class="ref">Paper: {html.escape(reference)}</span>' if reference else ""
    return (f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{data}"><figcaption><b>'
            f"{html.escape(title)}.</b> {html.escape(caption)}{ref} (files: figures/{name}.png, .svg)</figcaption>"
            "</figure>")


def _fmt(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _run_section(run_dir: Path, out_dir: Path) -> tuple[str, dict]:
    s = run_summary(run_dir)
    task, name = s["task"], f"{s['task']}-{run_dir.name}" if run_dir.name != s["task"] else s["task"]
    pos, sym = PAPER_PURE[task]
    references = {
        "Fig. 2A": "the number task is learned hop by hop (1 hop first), the letter task all hops at once; "
                   "accuracy peaks only once the heads are pure.",
        "Fig. 2B": "both scores ~1 at initialisation (uniform attention); then heads become pure: "
                   f"positional {pos}, symbolic {sym} (12 layers).",
        "Fig. 6": "entropy falls as heads become pure.",
        "Fig. 7": f"pure heads at gamma 0.1: positional {pos}, symbolic {sym}; {SEED_LAYERS}.",
        "Fig. 4B": "number model, layer 1: keys cluster in one direction, queries fan out by the offset they encode.",
        "Fig. 8 / Table 1": "weighted frequency ID per layer " + ", ".join(
            str(v) for v in _paper_table1(task)) + " (12 layers, 64 planes).",
        "Fig. 5B": f"{PAPER_LENGTHGEN[task]}; {SEED_RETENTION[task]}.",
        "Theorem 3.2 on trained heads": "a positional (Index) head's best gap can only shrink like 2 pi^2 / n^2, "
                                        "a symbolic (Retrieval) head's need not; the letter model generalizes, "
                                        "the number model does not.",
    }
    ours = {
        "Fig. 2A": "Ours: first step with >= 95% per hop: " + ", ".join(
            f"{h} hop{'s' * (h > 1)} {v}" for h, v in s["first_step_ge_0.95"].items()) + ".",
        "Fig. 7": f"Ours (end, hop queries): positional {s['positional']}, symbolic {s['symbolic']}.",
        "Fig. 8 / Table 1": f"Ours: {', '.join(str(v) for v in s['weighted_id'] or [])} "
                            f"({s['layers']} layers).",
        "Fig. 5B": f"Ours: {lengthgen_headline(s['lengthgen'])}.",
    }
    parts = [f"<h2>{html.escape(task)} task ({html.escape(str(run_dir))})</h2>"]
    for sub, stem, title, caption in RUN_FIGURES:
        figure = _figure(run_dir / sub / stem, out_dir, f"{name}-{stem}", f"{title}, {task} task",
                         f"{caption} {ours.get(title, '')}".strip(), references[title])
        if figure or sub in MISSING:
            parts.append(figure or f'<p class="absent">{title} ({task}): absent; run {MISSING[sub]} first.</p>')
    return "\n".join(parts), s


def _paper_table1(task: str) -> list[int]:
    return PAPER_TABLE1[task]


def _summary_tables(summaries: list[dict]) -> str:
    rows = []
    for s in summaries:
        hops = " / ".join(f"{v:.3f}" for v in s["acc_hops"].values())
        rows.append([s["task"], s["preset"], f"{s['step']}/{s['max_steps']}", _fmt(s["acc"]), hops,
                     _fmt(s["positional"]), _fmt(s["symbolic"]), " / ".join(PAPER_PURE[s["task"]]),
                     lengthgen_headline(s["lengthgen"]) or "n/a", PAPER_LENGTHGEN[s["task"]]])
    out = "<h2>Summary</h2>" + _table(
        ["task", "preset", "step", "test acc", "acc per hop (1 / 2 / ...)", "positional layers", "symbolic layers",
         "paper pos / sym", "length generalization", "paper"], rows)
    table1 = [s for s in summaries if s["weighted_id"]]
    if table1:
        depth = max(max(len(s["weighted_id"]) for s in table1), 12)
        rows = [[f"{s['task']} (ours)", *s["weighted_id"], *[""] * (depth - len(s["weighted_id"]))] for s in table1]
        rows += [[f"{t} (paper)", *_paper_table1(t)] for t in dict.fromkeys(s["task"] for s in table1)]
        out += ("<h2>Table 1: weighted frequency ID per layer</h2><p>Sum of k w_k / sum of w_k over RoPE planes k, "
                "w_k = max(largest logit the plane alone contributes, 0), averaged over prompts (posym.core.geometry). "
                "The paper's models have 12 layers and 64 planes; a quick model has fewer of both.</p>"
                + _table(["model", *[f"L{k}" for k in range(depth)]], rows))
    return out


def _theory_section(theory_dir: Path, out_dir: Path) -> str:
    result = _read_json(theory_dir / "theory.json")
    rows = [[r["head"], r["n0"], f"{r['theta']:.4g}", r["exact"], r["softmax_exact"], f"{r['delta_n0']:.3g}",
             f"{r['bound_n0']:.3g}", f"{r['beta_needed']:.4g}", f"{r['beta_lemma']:.4g}"] for r in result["summary"]]
    tasks = "; ".join(f"T_{k.capitalize()} on the {t['task']} task: s_pos {t['s_pos']:.3f}, s_sym {t['s_sym']:.3f}, "
                      f"answer after h hops {t['softmax']['after_h']:.3f} (softmax)"
                      for k, t in result["tasks"].items())
    figure = _figure(theory_dir / "fig5a", out_dir, "theory-fig5a", "Fig. 5A",
                     "Discrepancy Delta(n) of T_Index and T_Retrieval (measured) against Theorem 3.2's bounds.",
                     "Delta_Index(n) <= min(1 - cos theta, 2 pi^2 / n^2); "
                     "Delta_Retrieval(n) <= 1 - cos(omega - n theta), "
                     "theta = 0.866 (ID 2) and 0.0027 (ID 42).")
    return ("<h2>Theory: constructions and discrepancy (Theorems 3.1, 3.2)</h2>" + _table(
        ["head", "n0", "theta", "exact (hard)", "exact (softmax)", "Delta(n0)", "bound", "beta needed",
         "beta Lemma F.1"], rows) + f"<p>{html.escape(tasks)}.</p>" + figure)


def _bench_section(bench_dir: Path, out_dir: Path) -> str:
    table = (bench_dir / "table.md").read_text(encoding="utf-8")
    figure = _figure(bench_dir / "bench", out_dir, "table3-bench", "Table 3 (figure)",
                     "Accuracy of a real model on the 1-hop Appendix H prompts per target-window size, ours with std.",
                     "GPT-5.4, GPT-5.5, Claude Sonnet 3.7 (dashed).")
    return (f"<h2>Table 3: real models on 1-hop prompts ({html.escape(str(bench_dir))})</h2>"
            f"<pre>{html.escape(table)}</pre>{figure}")


def build_report(paths: list[str | Path], out_dir: str | Path, *, title: str = "posym report") -> Path:
    """Write out_dir/report.html (self-contained) and out_dir/figures/*.png|svg; return the HTML path."""
    if not paths:
        raise PosymError("give at least one run, theory or llm-bench directory")
    out_dir, dirs = Path(out_dir), [Path(p) for p in paths]
    for path in dirs:
        if not path.is_dir():
            raise PosymError(f"{path} is not a directory")
    kinds = [(kind_of(p), p) for p in dirs]
    sections, summaries = [], []
    for kind, path in kinds:
        if kind == "run":
            section, summary = _run_section(path, out_dir)
            sections.append(section)
            summaries.append(summary)
    theory = [p for k, p in kinds if k == "theory"]
    sections += [_theory_section(p, out_dir) for p in theory] or [
        '<p class="absent">Fig. 5A and the constructions: absent; run posym theory and pass its directory.</p>']
    bench = [p for k, p in kinds if k == "bench"]
    sections += [_bench_section(p, out_dir) for p in bench] or [
        '<p class="absent">Table 3 (real models): absent; no llm-bench result was given (run posym llm-bench '
        "and pass its directory).</p>"]
    intro = ('<p>Positional versus symbolic attention heads in RoPE transformers: our reproduction of '
             '<a href="https://arxiv.org/abs/2605.31558">arXiv 2605.31558</a>. Paper reference values are '
             "quoted beside ours in every caption.</p>")
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{intro}"
            + (_summary_tables(summaries) if summaries else "") + "\n".join(sections) + "</body></html>\n")
    return io.write_text(out_dir / "report.html", page)
