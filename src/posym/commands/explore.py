"""`posym explore`: one self-contained, offline HTML page to browse every head's scores and why.

Inputs are the score tables other commands wrote, recognised by their files:
- an `llm-scores` output (summary.json, heads.parquet, scores.parquet, prompts.parquet; with
  `--exclude-keys` also scores_excluded.parquet, with `--heads` planes.parquet);
- a `posym run` output (pipeline.yaml and one run directory per task) or one run directory
  (config.yaml) with analysis/ (`posym dynamics`, `posym geometry`) and lengthgen/;
- an `llm-study` output (study.yaml, scores/, frequency/, lengths/).

Each input gives one or more head sets (a task and query mode of a run, a prompt set of a study)
with the layer x head maps (s_pos, s_sym, their sink-free values where the tables hold them, label,
entropy, sink mass = attention on token 0, frequency ID), per-prompt scores, per-plane scores and
margin vs length where present. The tables hold no attention rows and no swaps: with the model at
hand (`details=True`: the model the tables name, or `model`), `posym.core.scores.head_details` recomputes them for
the first `detail_prompts` prompts (the last token's row, the `top` heaviest swaps); without it the
head page says so. Numbers are quantised to 1e-4 (scores, attention) or 1e-3 (entropy, frequency ID)
and embedded base64 (int16), one JSON blob read by the page's own script (posym/templates/
explore.html: no external script, style, font or request).
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from posym import io, models
from posym.configs import from_dict
from posym.core.paper import TAU
from posym.core.scores import LABELS, head_details, head_scores, prompt_scores, task_prompts
from posym.core.tasks import token_names
from posym.core.train import TrainConfig
from posym.errors import PosymError
from posym.models import RunDir

STEPS = {"s_pos": 1e-4, "s_sym": 1e-4, "s_pos_sf": 1e-4, "s_sym_sf": 1e-4, "entropy": 1e-3, "sink": 1e-4, "freq": 1e-3}
"""Quantisation step of each map metric (the page shows 3 decimals: nothing visible is lost)."""
FINE = 1e-4
"""Quantisation step of attention rows, swap weights, attention pairs and cosines (all in [-1, 1])."""
MISSING = -32768
"""The int16 code of a missing value (NaN)."""
EXPLORER = "explorer.html"
"""The file name of the explorer that `posym report` and `posym llm-study` write beside report.html."""
TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "explore.html"


@dataclass
class HeadSet:
    """One view of a model's heads: the maps, the prompts and what the head page shows."""

    name: str
    """What the set is (task, step and query mode; prompt set and variant)."""
    layers: int
    heads: int
    maps: dict
    """metric -> {(layer, head): value} (STEPS' metrics that the tables hold) and 'label' -> {(l, h): str}."""
    query: str = "last token"
    """Which queries the scores average over."""
    prompts: list = field(default_factory=list)
    """[{"text", "ids", "query", "tokens" (list or None), "scores": {(l, h): (s_pos, s_sym)}}]."""
    planes: dict = field(default_factory=dict)
    """(layer, head) -> [[frequency_id, s_pos, s_sym, use], ...]."""
    margins: dict = field(default_factory=dict)
    """(layer, head) -> {series: [[length, margin], ...]}."""
    model: dict | None = None
    """How to recompute attention rows and swaps: {"spec", "step"} (posym.models.load) or None."""
    details: dict = field(default_factory=dict)
    """prompt index -> head_details rows (filled by `add_details`)."""
    note: str = ""
    """Why the head page lacks attention rows and swaps, when it does."""


# ---- encoding -----------------------------------------------------------------------------------


def pack(values, step: float) -> str:
    """Base64 of little-endian int16 codes round(value / step) (NaN -> MISSING); the page's `unpack`
    multiplies back. |value| must stay below 32767 * step.

    >>> pack([0.5, float("nan")], 1e-4)
    'iBMAgA=='
    """
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    codes = np.round(x / step)
    bad = np.isfinite(codes) & (np.abs(codes) > 32767)
    if bad.any():
        raise PosymError(f"value {x[bad][0]} does not fit the explorer's int16 encoding at step {step}")
    codes = np.where(np.isfinite(codes), codes, MISSING).astype("<i2")
    return base64.b64encode(codes.tobytes()).decode("ascii")


def _grid(values: dict, layers: int, heads: int) -> list[float]:
    return [values.get((l, h), math.nan) for l in range(layers) for h in range(heads)]


def _key(layer, head) -> str:
    return f"{int(layer)}.{int(head)}"


def encode(sets: list[HeadSet], *, title: str, sources: list[str]) -> dict:
    """The page's data: plain JSON with int16 base64 arrays (`pack`)."""
    out = []
    for s in sets:
        n = s.layers * s.heads
        maps = {m: pack(_grid(v, s.layers, s.heads), STEPS[m]) for m, v in s.maps.items() if m in STEPS}
        labels = [s.maps.get("label", {}).get((l, h), "") for l in range(s.layers) for h in range(s.heads)]
        prompts = []
        for k, p in enumerate(s.prompts):
            entry = {
                "text": p["text"],
                "query": int(p["query"]),
                "tokens": p.get("tokens"),
                "ids": [int(i) for i in p["ids"]][: int(p["query"]) + 1],
            }
            if p.get("scores"):
                entry["s_pos"] = pack(
                    [p["scores"].get((l, h), (math.nan,) * 2)[0] for l in range(s.layers) for h in range(s.heads)], FINE
                )
                entry["s_sym"] = pack(
                    [p["scores"].get((l, h), (math.nan,) * 2)[1] for l in range(s.layers) for h in range(s.heads)], FINE
                )
            rows = s.details.get(k)
            if rows is not None:
                rows = rows.sort_values(["layer", "head"])
                if len(rows) != n:
                    raise PosymError(f"details of prompt {k} cover {len(rows)} heads, not {n}")
                entry["first"] = [int(f) for f in rows["first"]]
                entry["attention"] = pack([x for row in rows.attention for x in row], FINE)
                top = entry["top"] = max(len(a) for a in rows.a)  # a row with fewer swaps is padded (-1, NaN)
                entry["keys"] = [
                    int(x)
                    for a, b in zip(rows.a, rows.b)
                    for pair in [*zip(a, b), *[(-1, -1)] * (top - len(a))]
                    for x in pair
                ]
                entry["swaps"] = pack(
                    [
                        x
                        for row in rows.itertuples()
                        for i in range(top)
                        for x in (
                            (
                                row.weight[i],
                                row.before_a[i],
                                row.before_b[i],
                                row.after_a[i],
                                row.after_b[i],
                                row.cos_pos[i],
                                row.cos_sym[i],
                            )
                            if i < len(row.a)
                            else (math.nan,) * 7
                        )
                    ],
                    FINE,
                )
                entry["dense"] = pack(list(rows.s_pos) + list(rows.s_sym), FINE)
            prompts.append(entry)
        out.append(
            {
                "name": s.name,
                "query": s.query,
                "layers": s.layers,
                "heads": s.heads,
                "maps": maps,
                "steps": {m: STEPS[m] for m in maps},
                "labels": labels,
                "prompts": prompts,
                "planes": {_key(*k): v for k, v in s.planes.items()},
                "margins": {_key(*k): v for k, v in s.margins.items()},
                "note": s.note,
            }
        )
    return {"title": title, "sources": sources, "fine": FINE, "missing": MISSING, "labels": list(LABELS), "sets": out}


def render(data: dict) -> str:
    """The HTML page: the template with the data as one inline JSON script (`</` escaped)."""
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    page = TEMPLATE.read_text(encoding="utf-8")
    return page.replace("__TITLE__", _escape(data["title"])).replace("__DATA__", blob)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


# ---- reading the tables -------------------------------------------------------------------------


def _values(frame, column) -> dict:
    return {
        (int(r.layer), int(r.head)): float(getattr(r, column))
        for r in frame.itertuples()
        if getattr(r, column) is not None
    }


def _prompt_scores(frame) -> dict[int, dict]:
    """prompt -> {(layer, head): (s_pos, s_sym)} by the prompt-mean rule's first step."""
    out: dict[int, dict] = {}
    for r in prompt_scores(frame).itertuples():
        out.setdefault(int(r.prompt), {})[(int(r.layer), int(r.head))] = (float(r.s_pos), float(r.s_sym))
    return out


def _shape(frame) -> tuple[int, int]:
    return int(frame.layer.max()) + 1, int(frame["head"].max()) + 1


def llm_scores_sets(path: Path) -> list[HeadSet]:
    """One set from an `llm-scores` output directory."""
    summary = io.read_json_object(path / "summary.json")
    heads, scores = io.read_parquet(path / "heads.parquet"), io.read_parquet(path / "scores.parquet")
    prompts = io.read_parquet(path / "prompts.parquet")
    layers, n_heads = _shape(heads)
    maps = {
        "s_pos": _values(heads, "s_pos"),
        "s_sym": _values(heads, "s_sym"),
        "entropy": _values(heads, "entropy"),
        "label": {(int(r.layer), int(r.head)): r.label for r in heads.itertuples()},
    }
    if "attn_first" in heads:
        maps["sink"] = _values(heads, "attn_first")
    if (path / "scores_excluded.parquet").is_file():
        free = head_scores(io.read_parquet(path / "scores_excluded.parquet"))
        maps["s_pos_sf"], maps["s_sym_sf"] = _values(free, "s_pos"), _values(free, "s_sym")
    per_prompt = _prompt_scores(scores)
    settings = summary.get("settings", {})
    rows = [
        {
            "text": r.text,
            "ids": list(r.input_ids),
            "query": int(r.query),
            "tokens": None,
            "scores": per_prompt.get(int(r.prompt), {}),
        }
        for r in prompts.sort_values("prompt").itertuples()
    ]
    out = HeadSet(
        f"{path.name}: {settings.get('prompts', 'prompts')}, {settings.get('query', 'last')} token",
        layers,
        n_heads,
        maps,
        query=f"{settings.get('query', 'last')} token",
        prompts=rows,
        model={"spec": settings.get("model_dir"), "step": None, "tau": settings.get("tau", TAU)},
    )
    if (path / "planes.parquet").is_file():
        out.planes = _planes(io.read_parquet(path / "planes.parquet"), "max_logit")
    return [out]


def _num(x) -> float | None:
    """A table value for the page's JSON: 4 decimals (as the page's 1e-4 codes), None for NaN."""
    return round(float(x), 4) if math.isfinite(float(x)) else None


def _planes(frame, use: str) -> dict:
    out: dict = {}
    for r in frame.sort_values("frequency_id").itertuples():
        out.setdefault((int(r.layer), int(r.head)), []).append(
            [int(r.frequency_id), _num(r.s_pos), _num(r.s_sym), _num(getattr(r, use))]
        )
    return out


def _margins(frame, series) -> dict:
    out: dict = {}
    for keys, rows in frame.groupby(["layer", "head", *series]):
        name = " / ".join(str(k) for k in keys[2:]) or "margin"
        out.setdefault((int(keys[0]), int(keys[1])), {})[name] = [
            [int(r.length), _num(r.margin)] for r in rows.sort_values("length").itertuples()
        ]
    return out


def run_sets(run_dir: Path, *, detail_prompts: int) -> list[HeadSet]:
    """One set per query mode of a training run's `posym dynamics` tables, at its last step."""
    analysis = RunDir(run_dir).output("analysis")
    if not (analysis / "dynamics.parquet").is_file():
        raise PosymError(f"{run_dir} has no analysis/dynamics.parquet: run posym dynamics {run_dir} first")
    config = io.read_yaml(RunDir(run_dir).config)
    table = io.read_parquet(analysis / "dynamics.parquet")
    step = int(table.step.max())
    table = table[table.step == step]
    per_prompt = io.read_parquet(analysis / "dynamics_prompts.parquet")
    per_prompt = per_prompt[per_prompt.step == step]
    settings = io.read_json_object(analysis / "dynamics.json").get("settings", {})
    layers, n_heads = _shape(table)
    freq = io.read_parquet(analysis / "frequency.parquet") if (analysis / "frequency.parquet").is_file() else None
    planes = (
        _planes(io.read_parquet(analysis / "channels.parquet"), "use")
        if (analysis / "channels.parquet").is_file()
        else {}
    )
    retention = RunDir(run_dir).output("lengthgen") / "head_retention.parquet"
    margins = _margins(io.read_parquet(retention), []) if retention.is_file() else {}
    prompts = _task_prompts(config, settings, min(detail_prompts, int(settings.get("n_prompts", 0))))
    task = config.get("task", {}).get("task", run_dir.name)
    out = []
    for mode, rows in table.groupby("query_mode", sort=False):
        maps = {
            "s_pos": _values(rows, "s_pos"),
            "s_sym": _values(rows, "s_sym"),
            "entropy": _values(rows, "entropy"),
            "label": {(int(r.layer), int(r.head)): r.label_gamma_0p1 for r in rows.itertuples()},
        }
        if freq is not None:
            maps["freq"] = _values(freq, "weighted_id")
        scores = _prompt_scores(per_prompt[per_prompt.query_mode == mode])
        mode_prompts = [{**p, "scores": scores.get(k, {})} for k, p in enumerate(prompts)]
        out.append(
            HeadSet(
                f"{task} ({run_dir.name}), step {step}, {mode} queries",
                layers,
                n_heads,
                maps,
                query=f"{mode} queries (head page: the last token's row)",
                prompts=mode_prompts,
                planes=planes,
                margins=margins,
                model={"spec": str(run_dir), "step": step, "tau": TAU},
            )
        )
    return out


def _task_prompts(config: dict, settings: dict, n: int) -> list[dict]:
    """The first n of the prompts `posym dynamics` scored (the same seed and split), with token names."""
    if n < 1:
        return []
    task_config = from_dict(TrainConfig, config).task
    ids, _ = task_prompts(task_config, n, int(settings.get("seed", 0)), queries="hops")
    names = token_names(task_config)
    return [
        {"text": " ".join(names[i] for i in p), "ids": p, "query": len(p) - 1, "tokens": [names[i] for i in p]}
        for p in ids
    ]


def study_sets(path: Path) -> list[HeadSet]:
    """One set per prompt set of an `llm-study` output (plain and sink-free scores side by side)."""
    study = io.read_yaml(path / "study.yaml") if (path / "study.yaml").is_file() else {}
    manifest = path / "manifest.json"
    spec = io.read_json_object(manifest).get("model") if manifest.is_file() else None
    heads = io.read_parquet(path / "scores" / "heads.parquet")
    prompts = io.read_parquet(path / "scores" / "prompts.parquet")
    layers, n_heads = _shape(heads)
    behaviour = path / "frequency" / "behaviour.parquet"
    freq = io.read_parquet(behaviour) if behaviour.is_file() else None
    retention = path / "lengths" / "head_retention.parquet"
    margins = _margins(io.read_parquet(retention), ["layout", "ranking"]) if retention.is_file() else {}
    out = []
    for name, rows in heads.groupby("set", sort=False):
        variants = dict(list(rows.groupby("variant", sort=False)))
        plain = variants.get("plain", rows)
        maps = {
            "s_pos": _values(plain, "s_pos"),
            "s_sym": _values(plain, "s_sym"),
            "entropy": _values(plain, "entropy"),
            "sink": _values(plain, "attn_first"),
            "label": {(int(r.layer), int(r.head)): r.label for r in plain.itertuples()},
        }
        free = [v for k, v in variants.items() if k != "plain"]
        if free:
            maps["s_pos_sf"], maps["s_sym_sf"] = _values(free[0], "s_pos"), _values(free[0], "s_sym")
        if freq is not None:
            maps["freq"] = _values(freq, "weighted_id")
        chosen = prompts[prompts.set == name].sort_values("prompt")
        rows_ = [
            {"text": r.text, "ids": list(r.input_ids), "query": int(r.query), "tokens": None, "scores": {}}
            for r in chosen.itertuples()
        ]
        out.append(
            HeadSet(
                f"{path.name}: {name}",
                layers,
                n_heads,
                maps,
                prompts=rows_,
                margins=margins,
                query="the set's query token (per-prompt scores are not stored by llm-study)",
                model={"spec": spec, "step": None, "tau": study.get("tau", TAU)},
            )
        )
    return out


def kind_of(path: Path) -> str:
    """'llm-scores', 'pipeline', 'run' or 'study' by the files a directory holds."""
    if (path / "summary.json").is_file() and (path / "heads.parquet").is_file() and (path / "scores.parquet").is_file():
        return "llm-scores"
    if (path / "pipeline.yaml").is_file():
        return "pipeline"
    if RunDir(path).config.is_file():
        return "run"
    if (path / "scores" / "heads.parquet").is_file():
        return "study"
    raise PosymError(
        f"{path} holds no score tables posym explore reads (an llm-scores, llm-study, posym run or "
        "training run directory)"
    )


def collect(paths, *, detail_prompts: int = 8) -> list[HeadSet]:
    """Every head set of the inputs, in order."""
    sets: list[HeadSet] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise PosymError(f"{path} is not a directory of score tables")
        kind = kind_of(path)
        if kind == "llm-scores":
            sets += llm_scores_sets(path)
        elif kind == "study":
            sets += study_sets(path)
        elif kind == "run":
            sets += run_sets(path, detail_prompts=detail_prompts)
        else:
            runs = sorted(
                p for p in path.iterdir() if RunDir(p).config.is_file() and RunDir(p).output("analysis").is_dir()
            )
            if not runs:
                raise PosymError(f"{path} is a posym run output without analysed tasks (no <task>/analysis/)")
            for run in runs:
                sets += run_sets(run, detail_prompts=detail_prompts)
    if not sets:
        raise PosymError("no head sets found in the inputs")
    return sets


# ---- attention rows and swaps from the model ----------------------------------------------------


def add_details(
    sets: list[HeadSet], *, detail_prompts: int = 8, top: int = 8, device: str = "cpu", model: str | None = None
) -> None:
    """Fill `details` of each set from its model (loaded once per spec and step; `model` replaces
    the spec the tables name) for its first `detail_prompts` prompts at their query token; a set
    whose model cannot be loaded gets `note`."""
    loaded: dict = {}
    for s in sets:
        chosen = s.prompts[:detail_prompts]
        if model is not None:
            s.model = {**(s.model or {}), "spec": model, "step": None}
        spec = (s.model or {}).get("spec")
        if not chosen or spec is None:
            s.note = "the tables name no model and no prompts, so attention rows and swaps are not shown"
            continue
        key = (spec, s.model.get("step"))
        if key not in loaded:
            try:
                loaded[key] = models.load(spec, step=s.model.get("step"), device=device, dtype="float32")
            except PosymError as exc:
                loaded[key] = exc
        found = loaded[key]
        if isinstance(found, PosymError):
            s.note = f"the model {spec} could not be loaded ({found}), so attention rows and swaps are not shown"
            continue
        if found.has_tokenizer:  # task runs name their tokens already
            for p in chosen:
                if p.get("tokens") is None:
                    p["tokens"] = [found.tokenizer.decode([int(i)]) for i in p["ids"][: p["query"] + 1]]
        frame = head_details(
            found.model,
            [p["ids"] for p in chosen],
            [[p["query"]] for p in chosen],
            tau=float(s.model.get("tau") or TAU),
            top=top,
        )
        s.details = {int(k): rows for k, rows in frame.groupby("prompt")}


def no_details(sets: list[HeadSet]) -> None:
    """Mark every set as explored from the tables alone."""
    for s in sets:
        s.note = (
            "explored from the tables alone (--no-details): posym explore with the model available "
            "(or --model SPEC) adds attention rows and swaps"
        )


def explore(
    paths,
    out,
    *,
    details: bool = True,
    model: str | None = None,
    detail_prompts: int = 8,
    top: int = 8,
    device: str = "cpu",
    title: str | None = None,
) -> dict:
    """`posym explore`: write one self-contained HTML file `out`; returns {"path", "bytes", "sets", "heads"}.

    details: recompute attention rows and swaps from the model the tables name (or `model`, a
    `posym.models.load` spec); False: the tables alone (every head page says so)."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise PosymError("posym explore needs at least one directory of score tables")
    if detail_prompts < 0 or top < 1:
        raise PosymError(f"--detail-prompts must be >= 0 and --top >= 1, got {detail_prompts} and {top}")
    sets = collect(paths, detail_prompts=detail_prompts)
    if details and detail_prompts:
        add_details(sets, detail_prompts=detail_prompts, top=top, device=device, model=model)
    else:
        no_details(sets)
    data = encode(
        sets, title=title or "posym explore: " + ", ".join(p.name for p in paths), sources=[str(p) for p in paths]
    )
    path = io.write_text(out, render(data))
    return {
        "path": str(path),
        "bytes": Path(path).stat().st_size,
        "sets": len(sets),
        "heads": sum(s.layers * s.heads for s in sets),
    }
