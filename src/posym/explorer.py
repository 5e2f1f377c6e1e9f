"""The head explorer: one self-contained, offline HTML page to browse every head's scores and why
(`posym explore` writes it; `posym report` and `posym llm-study` write a tables-only one beside their
report). `page` builds it; the readers below turn score tables into its head sets.

Inputs are the score tables other commands wrote, recognised by their files:
- an `llm-scores` output (summary.json, heads.parquet, scores.parquet, prompts.parquet; with
  `--exclude-keys` also scores_excluded.parquet, with `--heads` planes.parquet, with `--details N`
  (the default 8) details.parquet);
- a `posym score` output (OUT.parquet beside OUT.parquet.json): one row per prompt, query and head;
- a `posym run` output (pipeline.yaml and one run directory per task) or one run directory
  (config.yaml) with analysis/ (`posym dynamics`, `posym geometry`) and lengthgen/;
- an `llm-study` output (study.yaml, scores/, frequency/, lengths/).

Each input gives one or more head sets (a task and query mode of a run, a prompt set of a study)
with the layer x head maps (s_pos, s_sym, their sink-free values where the tables hold them, label,
entropy, sink mass = attention on token 0, frequency ID), per-prompt scores (and per-query scores
where the table has a row per query), per-plane scores and margin vs length where present. Attention
rows and heaviest swaps (`posym.core.scores.head_details`, at every query of the first
`detail_prompts` prompts) come from llm-scores' details.parquet, written while it had the model
loaded, or are recomputed here from the model the tables name (`details=True`, or `model`); without
either the head page says so. Numbers are quantised to 1e-4 (scores, attention) or 1e-3 (entropy,
frequency ID) and packed as int16 base64; the maps are one JSON blob, the prompts are pages of PAGE
(one zlib-compressed block each) and each prompt's rows a block of its own, which the page's own
script (posym/templates/explore.html: no external script, style, font or request) decodes only when
it shows them. The file stays within `max_mb` (MAX_MB): the rows of the prompts past it are left out.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from posym import io, models
from posym.configs import from_dict
from posym.core.paper import GAMMA, TAU
from posym.core.purity import query_roles
from posym.core.scores import (
    DETAIL_LISTS,
    LABELS,
    head_details,
    head_scores,
    prompt_scores,
    summarize_heads,
    task_prompts,
)
from posym.core.tasks import TaskConfig, token_names
from posym.core.train import TrainConfig
from posym.errors import PosymError
from posym.io import quote
from posym.prompts import jsonl_records
from posym.runs import RunDir, StudyDir, kind_of, output_file

STEPS = {
    "s_pos": 1e-4,
    "s_sym": 1e-4,
    "s_pos_sf": 1e-4,
    "s_sym_sf": 1e-4,
    "entropy": 1e-3,
    "sink": 1e-4,
    "freq": 1e-3,
    "low_mass": 1e-4,
}
"""Quantisation step of each map metric (the page shows 3 decimals: nothing visible is lost)."""
FINE = 1e-4
"""Quantisation step of attention rows, swap weights, attention pairs and cosines (all in [-1, 1])."""
MISSING = -32768
"""The int16 code of a missing value (NaN)."""
TEMPLATE = Path(__file__).resolve().parent / "templates" / "explore.html"
PAGE = 25
"""Prompts per page: the page's prompt list shows one page at a time and decodes one block per page."""
MAX_MB = 25.0
"""The default limit on the file's size (MB, 1e6 bytes): attention rows and swaps of the prompts past it are left out."""
MAX_BYTES = int(MAX_MB * 1e6)
MOST_MB = 10_000.0
"""The largest --max-mb: a 10 GB page is more than a browser opens."""


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
    """[{"text", "ids" (or None), "queries" (positions), "tokens" (list or None), "scores": {(l, h): (s_pos,
    s_sym)} (the prompt's mean), "query_scores": {(l, h): [(s_pos, s_sym) per query]} where the tables
    hold one row per query}]."""
    planes: dict = field(default_factory=dict)
    """(layer, head) -> [[frequency_id, s_pos, s_sym, use], ...]."""
    margins: dict = field(default_factory=dict)
    """(layer, head) -> {series: [[length, margin], ...]}."""
    model: dict | None = None
    """How to recompute attention rows and swaps: {"spec", "step"} (posym.models.load) or None."""
    details: dict = field(default_factory=dict)
    """prompt index -> head_details rows at its queries (stored by llm-scores, or filled by `add_details`)."""
    stored: dict = field(default_factory=dict)
    """What the tables' stored details cover ({"prompts", "top"}: llm-scores' summary.json), {} if none."""
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


def block(payload) -> str:
    """One embedded block: the payload's JSON, zlib-compressed (the page's DecompressionStream
    "deflate" reads it), in base64. `unblock` is the inverse.

    >>> unblock(block({"a": [1, 2]}))
    {'a': [1, 2]}
    """
    raw = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def unblock(text: str):
    """The payload of a `block` (what the page's own `block(n)` decodes), read as every JSON posym
    reads (`io.parse_json`: nesting bounded)."""
    return io.parse_json(zlib.decompress(base64.b64decode(text)), "an explorer block")


def _grid(values: dict, layers: int, heads: int) -> list[float]:
    return [values.get((l, h), math.nan) for l in range(layers) for h in range(heads)]


def _key(layer, head) -> str:
    return f"{int(layer)}.{int(head)}"


def _queries(p: dict) -> list[int]:
    """A prompt's query positions (none where a run's query mode has none on it, e.g. inner on 2 hops)."""
    return [int(q) for q in p["queries"]]


def _end(p: dict) -> int:
    """The tokens the page needs of a prompt: up to its last query (all of them without queries)."""
    queries = _queries(p)
    return max(queries) + 1 if queries else len(p.get("ids") or p.get("tokens") or [])


def _score_entry(s: HeadSet, k: int, p: dict) -> dict:
    """What the page's prompt list shows of prompt k: text, tokens, queries, per-prompt and per-query scores."""
    queries, end = _queries(p), _end(p)
    entry = {
        "index": k,
        "text": p["text"],
        "queries": queries,
        "tokens": None if p.get("tokens") is None else list(p["tokens"])[:end],
        "ids": None if p.get("ids") is None else [int(i) for i in p["ids"]][:end],
    }
    grid = [(l, h) for l in range(s.layers) for h in range(s.heads)]
    if p.get("scores"):
        for j, name in enumerate(("s_pos", "s_sym")):
            entry[name] = pack([p["scores"].get(key, (math.nan,) * 2)[j] for key in grid], FINE)
    if p.get("query_scores"):  # [query][head] per score, query-major
        nan = [(math.nan,) * 2] * len(queries)
        for j, name in enumerate(("q_s_pos", "q_s_sym")):
            entry[name] = pack(
                [p["query_scores"].get(key, nan)[q][j] for q in range(len(queries)) for key in grid], FINE
            )
    return entry


def _detail_entry(s: HeadSet, k: int, p: dict, rows) -> dict:
    """Prompt k's attention rows and heaviest swaps at each of its queries (None where not computed)."""
    n = s.layers * s.heads
    out = []
    for q in _queries(p):
        at = rows[rows["query"] == q].sort_values(["layer", "head"]) if rows is not None else None
        if at is None or not len(at):
            out.append(None)
            continue
        if len(at) != n:
            raise PosymError(f"details of prompt {k} at query {q} cover {len(at)} heads, not {n}")
        top = max(1, max(len(a) for a in at.a))  # a row with fewer swaps is padded (-1, NaN)
        swaps = [
            x
            for row in at.itertuples()
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
        ]
        out.append(
            {
                "query": int(q),
                "first": [int(f) for f in at["first"]],
                "attention": pack([x for row in at.attention for x in row], FINE),
                "top": top,
                "keys": [
                    int(x)
                    for a, b in zip(at.a, at.b)
                    for pair in [*zip(a, b), *[(-1, -1)] * (top - len(a))]
                    for x in pair
                ],
                "swaps": pack(swaps, FINE),
                "dense": pack(list(at.s_pos) + list(at.s_sym), FINE),
            }
        )
    return {"index": k, "queries": out}


def encode(
    sets: list[HeadSet], *, title: str, sources: list[str], max_bytes: int = MAX_BYTES
) -> tuple[dict, list[str]]:
    """The page's data: (plain JSON with int16 base64 maps (`pack`), the blocks (`block`)).

    Each set's prompts are in pages of PAGE prompts (one block each: texts, tokens, queries, scores)
    and each prompt with attention rows has a block of its own (every query's rows and swaps), so
    the page decodes only what it shows. Detail blocks are kept in order while the whole file stays
    within `max_bytes`; the prompts past that keep their scores and the page says why they have no
    rows (`dropped`). The maps and score pages alone over `max_bytes` are a PosymError."""
    blocks: list[str] = []
    out = []
    for s in sets:
        maps = {m: pack(_grid(v, s.layers, s.heads), STEPS[m]) for m, v in s.maps.items() if m in STEPS}
        labels = [s.maps.get("label", {}).get((l, h), "") for l in range(s.layers) for h in range(s.heads)]
        entries = [_score_entry(s, k, p) for k, p in enumerate(s.prompts)]
        pages = []
        for start in range(0, len(entries), PAGE):
            pages.append(len(blocks))
            blocks.append(block({"prompts": entries[start : start + PAGE]}))
        out.append(
            {
                "name": s.name,
                "query": s.query,
                "layers": s.layers,
                "heads": s.heads,
                "maps": maps,
                "steps": {m: STEPS[m] for m in maps},
                "labels": labels,
                "n_prompts": len(entries),
                "page": PAGE,
                "pages": pages,
                "details": {},
                "dropped": 0,
                "planes": {_key(*k): v for k, v in s.planes.items()},
                "margins": {_key(*k): v for k, v in s.margins.items()},
                "note": s.note,
            }
        )
    data = {
        "title": title,
        "sources": sources,
        "fine": FINE,
        "missing": MISSING,
        "labels": list(LABELS),
        "limit": max_bytes,
        "sets": out,
    }
    used = _size(data, blocks)
    if used > max_bytes:
        raise PosymError(
            f"the maps and per-prompt scores alone take {used / 1e6:.1f} MB, over the explorer's limit of "
            f"{max_bytes / 1e6:g} MB (--max-mb): explore fewer prompts or raise --max-mb"
        )
    for s, entry in zip(sets, out):
        for k in sorted(s.details):
            chunk = block(_detail_entry(s, k, s.prompts[k], s.details[k]))
            extra = len(chunk) + _BLOCK_TAG + len(f'"{k}":{len(blocks)},')
            if used + extra > max_bytes:
                entry["dropped"] += 1
                continue
            entry["details"][str(k)] = len(blocks)
            blocks.append(chunk)
            used += extra
    return data, blocks


_BLOCK_TAG = len('<script type="application/octet-stream" id="block-000000"></script>\n')
"""Bytes one block's script element adds beyond its text (an upper bound: ids up to 6 digits)."""


def _size(data: dict, blocks: list[str]) -> int:
    """The file's size in bytes (an upper bound before rendering: `render` writes exactly this)."""
    return len(render(data, blocks).encode("utf-8"))


def render(data: dict, blocks: list[str] = ()) -> str:
    """The HTML page: the template with the data as one inline JSON script (every `<`, `>` and `&`
    written as a JSON escape, so no name can close the script or open a comment) and each block in a
    script element of its own (id block-N, base64 text, never run).

    The placeholders are filled in one pass over the template, never in the values put in: a title or
    file name holding `__DATA__` stays text (here twice in the heading, once in the data).

    >>> page = render({"title": "__DATA__</script><script>alert(1)</script>"})
    >>> "<script>alert(1)" in page, page.count("__DATA__")
    (False, 3)
    """
    blob = html_json(data)
    chunks = "".join(
        f'<script type="application/octet-stream" id="block-{k}">{b}</script>\n' for k, b in enumerate(blocks)
    )
    values = {"__TITLE__": html.escape(data["title"], quote=True), "__BLOCKS__": chunks, "__DATA__": blob}
    return _PLACEHOLDER.sub(lambda m: values[m.group(0)], TEMPLATE.read_text(encoding="utf-8"))


_PLACEHOLDER = re.compile("|".join(("__TITLE__", "__BLOCKS__", "__DATA__")))
"""The explorer template's placeholders, filled by `render` in one `re.sub` pass."""


def html_json(value) -> str:
    """JSON safe inside an HTML `<script>` element: `<`, `>` and `&` as `\\u003c`, `\\u003e`, `\\u0026`
    (JSON decodes them back; the HTML parser never sees a tag, a comment or an entity).

    >>> html_json({"name": "</script><!--&"})
    '{"name":"\\\\u003c/script\\\\u003e\\\\u003c!--\\\\u0026"}'
    """
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


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


HEAD_COLUMNS = ("layer", "head", "s_pos", "s_sym", "entropy", "label")
"""The columns of a heads table (llm-scores' heads.parquet, llm-study's scores/heads.parquet) explore reads."""


def llm_scores_sets(path: Path) -> list[HeadSet]:
    """One set from an `llm-scores` output directory."""
    summary = io.read_json_object(output_file(path, "llm-scores", "summary"))
    heads = io.read_parquet(output_file(path, "llm-scores", "heads"), required=HEAD_COLUMNS)
    scores = io.read_parquet(
        output_file(path, "llm-scores", "scores"), required=("prompt", "layer", "head", "s_pos", "s_sym")
    )
    prompts = io.read_parquet(
        output_file(path, "llm-scores", "prompts"), required=("prompt", "text", "input_ids", "query")
    )
    layers, n_heads = _shape(heads)
    maps = {
        "s_pos": _values(heads, "s_pos"),
        "s_sym": _values(heads, "s_sym"),
        "entropy": _values(heads, "entropy"),
        "label": {(int(r.layer), int(r.head)): r.label for r in heads.itertuples()},
    }
    if "attn_first" in heads:
        maps["sink"] = _values(heads, "attn_first")
    if "low_mass" in heads:
        maps["low_mass"] = _values(heads, "low_mass")
    if (output_file(path, "llm-scores", "excluded")).is_file():
        free = head_scores(io.read_parquet(output_file(path, "llm-scores", "excluded")))
        maps["s_pos_sf"], maps["s_sym_sf"] = _values(free, "s_pos"), _values(free, "s_sym")
    per_prompt = _prompt_scores(scores)
    settings = summary.get("settings", {})
    rows = [
        {
            "text": r.text,
            "ids": list(r.input_ids),
            "queries": [int(r.query)],
            "tokens": list(r.tokens) if "tokens" in prompts else None,
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
    if (output_file(path, "llm-scores", "details")).is_file():  # written by llm-scores while it had the model loaded
        stored = io.read_parquet(output_file(path, "llm-scores", "details"))
        out.details = {int(k): frame for k, frame in stored.groupby("prompt")}
        out.stored = summary.get("details", {})
    if (output_file(path, "llm-scores", "planes")).is_file():
        out.planes = _planes(io.read_parquet(output_file(path, "llm-scores", "planes")), "max_logit")
    return [out]


def score_sets(path: Path) -> list[HeadSet]:
    """One set from a `posym score` output (OUT.parquet and its OUT.parquet.json sidecar): one row
    per (prompt, query, layer, head), so every prompt's queries with their own scores. The prompts'
    tokens are regenerated from the sidecar's task (a prompt file is read back where it holds ids)."""
    sidecar = io.read_json_object(Path(f"{path}.json"))
    settings = sidecar.get("settings", {})
    frame = io.read_parquet(path)
    layers, n_heads = _shape(frame)
    heads = summarize_heads(frame, GAMMA)
    maps = {
        "s_pos": _values(heads, "s_pos"),
        "s_sym": _values(heads, "s_sym"),
        "entropy": _values(heads, "entropy"),
        "label": {(int(r.layer), int(r.head)): str(r.label) for r in heads.itertuples()},
    }
    if "attn_first" in frame:
        maps["sink"] = _values(heads, "attn_first")
    if "low_mass" in heads:
        maps["low_mass"] = _values(heads, "low_mass")
    per_prompt = _prompt_scores(frame)
    ids, names = _score_ids(settings)
    rows = []
    for prompt, part in frame.sort_values(["prompt", "query", "layer", "head"]).groupby("prompt"):
        queries = sorted(int(q) for q in part["query"].unique())
        at = {
            q: {(int(r.layer), int(r.head)): (float(r.s_pos), float(r.s_sym)) for r in rows_.itertuples()}
            for q, rows_ in part.groupby("query")
        }
        keys = {k for q in at.values() for k in q}
        prompt_ids = ids[int(prompt)] if ids is not None and int(prompt) < len(ids) else None
        tokens = [names[i] for i in prompt_ids] if names is not None and prompt_ids is not None else None
        rows.append(
            {
                "text": " ".join(tokens) if tokens else f"prompt {int(prompt)} ({len(queries)} queries)",
                "ids": prompt_ids,
                "queries": queries,
                "tokens": tokens,
                "scores": per_prompt.get(int(prompt), {}),
                "query_scores": {k: [at[q].get(k, (math.nan,) * 2) for q in queries] for k in keys},
            }
        )
    return [
        HeadSet(
            f"{path.name}: {settings.get('n', len(rows))} prompts, {settings.get('queries', 'last')} queries",
            layers,
            n_heads,
            maps,
            query=f"{settings.get('queries', 'last')} queries (labels at gamma {GAMMA})",
            prompts=rows,
            model={"spec": settings.get("model"), "step": settings.get("step"), "tau": settings.get("tau", TAU)},
        )
    ]


def _score_ids(settings: dict):
    """(input ids per prompt, token names or None) of a `posym score` output, or (None, None) where the
    sidecar cannot give them back (a text prompt file: its ids came from the model's tokenizer)."""
    if settings.get("task"):
        task_config = from_dict(TaskConfig, settings["task"])
        ids, _ = task_prompts(task_config, int(settings.get("n", 0)), int(settings.get("seed") or 0))
        return ids, token_names(task_config)
    if settings.get("prompts") and Path(settings["prompts"]).is_file():
        records = [record for _, record in jsonl_records(settings["prompts"])]
        if all(isinstance(r, dict) and isinstance(r.get("input_ids"), list) for r in records):
            return [[int(i) for i in r["input_ids"]] for r in records], None
    return None, None


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


def run_sets(run_dir: Path) -> list[HeadSet]:
    """One set per query mode of a training run's `posym dynamics` tables, at its last step."""
    analysis = RunDir(run_dir).output("analysis")
    if not (output_file(analysis, "dynamics", "dynamics")).is_file():
        raise PosymError(f"{run_dir} has no analysis/dynamics.parquet: run posym dynamics {run_dir} first")
    config = io.read_yaml(RunDir(run_dir).config)
    table = io.read_parquet(output_file(analysis, "dynamics", "dynamics"))
    step = int(table.step.max())
    table = table[table.step == step]
    per_prompt = io.read_parquet(output_file(analysis, "dynamics", "dynamics_prompts"))
    per_prompt = per_prompt[per_prompt.step == step]
    settings = io.read_json_object(output_file(analysis, "dynamics", "record")).get("settings", {})
    layers, n_heads = _shape(table)
    freq = (
        io.read_parquet(output_file(analysis, "geometry", "frequency"))
        if (output_file(analysis, "geometry", "frequency")).is_file()
        else None
    )
    planes = (
        _planes(io.read_parquet(output_file(analysis, "geometry", "channels")), "use")
        if (output_file(analysis, "geometry", "channels")).is_file()
        else {}
    )
    retention = RunDir(run_dir).analysis_file("lengthgen", "head_retention")
    margins = _margins(io.read_parquet(retention), []) if retention.is_file() else {}
    prompts = _task_prompts(config, settings, int(settings.get("n_prompts", 0)))
    task = config.get("task", {}).get("task", run_dir.name)
    roles = query_roles([p["hops"] for p in prompts])
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
        mode_prompts = [
            {
                **p,
                "queries": sorted(q for q in p["hops"] if mode == "hops" or roles[k, q] == mode),
                "scores": scores.get(k, {}),
            }
            for k, p in enumerate(prompts)
        ]
        out.append(
            HeadSet(
                f"{task} ({run_dir.name}), step {step}, {mode} queries",
                layers,
                n_heads,
                maps,
                query=f"{mode} queries",
                prompts=mode_prompts,
                planes=planes,
                margins=margins,
                model={"spec": str(run_dir), "step": step, "tau": TAU},
            )
        )
    return out


def _task_prompts(config: dict, settings: dict, n: int) -> list[dict]:
    """The n prompts `posym dynamics` scored (the same seed and split), with token names and hop queries."""
    if n < 1:
        return []
    task_config = from_dict(TrainConfig, config).task
    ids, hops = task_prompts(task_config, n, int(settings.get("seed", 0)), queries="hops")
    names = token_names(task_config)
    return [
        {"text": " ".join(names[i] for i in p), "ids": p, "hops": q, "tokens": [names[i] for i in p]}
        for p, q in zip(ids, hops)
    ]


def study_sets(path: Path) -> list[HeadSet]:
    """One set per prompt set of an `llm-study` output (plain and sink-free scores side by side)."""
    layout = StudyDir(path)
    study = io.read_yaml(layout.marker) if layout.marker.is_file() else {}
    spec = io.read_json_object(layout.manifest).get("model") if layout.manifest.is_file() else None
    heads = io.read_parquet(layout.file("scores", "heads"), required=(*HEAD_COLUMNS, "set", "attn_first"))
    prompts = io.read_parquet(layout.file("scores", "prompts"))
    layers, n_heads = _shape(heads)
    behaviour = layout.file("frequency", "behaviour")
    freq = io.read_parquet(behaviour) if behaviour.is_file() else None
    retention = layout.file("lengths", "head_retention")
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
        if "low_mass" in plain:
            maps["low_mass"] = _values(plain, "low_mass")
        free = [v for k, v in variants.items() if k != "plain"]
        if free:
            maps["s_pos_sf"], maps["s_sym_sf"] = _values(free[0], "s_pos"), _values(free[0], "s_sym")
        if freq is not None:
            maps["freq"] = _values(freq, "weighted_id")
        chosen = prompts[prompts.set == name].sort_values("prompt")
        rows_ = [
            {"text": r.text, "ids": list(r.input_ids), "queries": [int(r.query)], "tokens": None, "scores": {}}
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


EXPLORED = ("score", "llm-scores", "pipeline", "run", "study")
"""The kinds of output (`posym.runs.kind_of`) whose score tables the explorer reads."""


def input_kind(path: Path) -> str:
    """'llm-scores', 'pipeline', 'run' or 'study' by the files a directory holds; 'score' for a
    `posym score` Parquet file beside its JSON sidecar (`posym.runs.kind_of`); else a PosymError."""
    kind = kind_of(path, EXPLORED)
    if kind is not None:
        return kind
    if path.is_file():
        raise PosymError(f"{path} is a file without its posym score sidecar {path}.json, not score tables")
    if not path.is_dir():
        raise PosymError(f"{path} is not a directory of score tables")
    raise PosymError(
        f"{path} holds no score tables posym explore reads (an llm-scores, llm-study, posym run or "
        "training run directory, or a posym score Parquet file)"
    )


def collect(paths) -> list[HeadSet]:
    """Every head set of the inputs, in order."""
    sets: list[HeadSet] = []
    for path in map(Path, paths):
        try:
            sets += _sets_of(path)
        except KeyError as exc:  # a table without a column posym writes (edited, or of another tool)
            raise PosymError(
                f"{path}: a table lacks the column {quote(exc.args[0] if exc.args else '?')} that posym explore "
                "reads; give the tables as posym wrote them"
            ) from None
    if not sets:
        raise PosymError("no head sets found in the inputs")
    return sets


def _sets_of(path: Path) -> list[HeadSet]:
    """The head sets of one input (`collect`)."""
    sets: list[HeadSet] = []
    kind = input_kind(path)
    if kind == "llm-scores":
        sets += llm_scores_sets(path)
    elif kind == "score":
        sets += score_sets(path)
    elif kind == "study":
        sets += study_sets(path)
    elif kind == "run":
        sets += run_sets(path)
    else:
        runs = sorted(p for p in path.iterdir() if RunDir(p).config.is_file() and RunDir(p).output("analysis").is_dir())
        if not runs:
            raise PosymError(f"{path} is a posym run output without analysed tasks (no <task>/analysis/)")
        for run in runs:
            sets += run_sets(run)
    return sets


# ---- attention rows and swaps -------------------------------------------------------------------


def use_stored(sets: list[HeadSet], *, detail_prompts: int, top: int, model: str | None, recompute: bool) -> None:
    """Keep the details the tables hold (llm-scores' details.parquet), trimmed to the first
    `detail_prompts` prompts and `top` swaps, unless another `model` is asked for, or `recompute`
    (the model will be loaded) and they do not cover those prompts with `top` swaps: then they are
    dropped and `add_details` recomputes them."""
    for s in sets:
        if not s.details:
            continue
        wanted = min(detail_prompts, len(s.prompts))
        covers = all(k in s.details for k in range(wanted)) and int(s.stored.get("top", 0)) >= top
        if model is not None or (recompute and not covers):
            s.details, s.stored = {}, {}
            continue
        s.details = {
            k: rows.assign(**{c: [list(v)[:top] for v in rows[c]] for c in DETAIL_LISTS})
            for k, rows in s.details.items()
            if k < wanted
        }


def add_details(
    sets: list[HeadSet], *, detail_prompts: int = 8, top: int = 8, device: str = "cpu", model: str | None = None
) -> None:
    """Fill `details` of each set that has none from its model (loaded once per spec and step; `model`
    replaces the spec the tables name) for its first `detail_prompts` prompts at every one of their
    queries (the sets of one run share one pass at every hop query); a set whose model cannot be
    loaded, or whose prompts' ids the tables do not give back, gets `note` (a `model` given by name
    that cannot be loaded is a PosymError: `--model /nope` used to write a page without rows, exit 0)."""
    loaded: dict = {}
    computed: dict = {}
    for s in sets:
        if s.details:
            continue
        chosen = s.prompts[:detail_prompts]
        if model is not None:
            s.model = {**(s.model or {}), "spec": model, "step": None}
        spec = (s.model or {}).get("spec")
        if not chosen or spec is None:
            s.note = "the tables name no model and no prompts, so attention rows and swaps are not shown"
            continue
        if any(p.get("ids") is None for p in chosen):
            s.note = "the tables do not give back the prompts' token ids, so attention rows and swaps are not shown"
            continue
        key = (spec, s.model.get("step"))
        if key not in loaded:
            try:
                loaded[key] = models.load(spec, step=s.model.get("step"), device=device, dtype="float32")
            except PosymError as exc:
                if model is not None:  # asked for by name: a model that cannot load is the user's error
                    raise PosymError(f"--model {model}: {exc}") from None
                loaded[key] = exc
        found = loaded[key]
        if isinstance(found, PosymError):
            s.note = f"the model {spec} could not be loaded ({found}), so attention rows and swaps are not shown"
            continue
        if found.has_tokenizer:  # task runs name their tokens already
            for p in chosen:
                if p.get("tokens") is None:
                    p["tokens"] = [found.tokenizer.decode([int(i)]) for i in p["ids"][: _end(p)]]
        ids = [[int(i) for i in p["ids"]] for p in chosen]
        wanted = [sorted(p.get("hops") or _queries(p)) for p in chosen]
        tau = float(s.model.get("tau") or TAU)
        job = (*key, tau, top, json.dumps(ids), json.dumps(wanted))
        if job not in computed:
            computed[job] = head_details(found.model, ids, wanted, tau=tau, top=top)
        s.details = {int(k): rows for k, rows in computed[job].groupby("prompt")}


def no_details(sets: list[HeadSet]) -> None:
    """Mark every set without stored details as explored from the tables alone."""
    for s in sets:
        if not s.details:
            s.note = (
                "explored from the tables alone (--no-details): posym explore with the model available "
                "(or --model SPEC) adds attention rows and swaps"
            )


def page(
    paths,
    *,
    details: bool = True,
    model: str | None = None,
    detail_prompts: int = 8,
    top: int = 8,
    device: str = "cpu",
    title: str | None = None,
    max_mb: float = MAX_MB,
) -> tuple[str, dict]:
    """The explorer of the score tables at `paths` as (the HTML text, its counts: {"limit", "sets",
    "heads", "prompts", "detail_prompts" (prompts with attention rows, all sets), "dropped" (prompts
    whose rows the size limit left out), "stored" (sets whose rows the tables held)}).

    details: attention rows and swaps of the first `detail_prompts` prompts, from the tables where
    they hold them all (llm-scores' details.parquet, unless `model` is given), else recomputed from
    the model the tables name (or `model`, a `posym.models.load` spec); False: no model is loaded
    (what the tables hold is shown; the pages without rows say so). The text stays within `max_mb`
    MB (`encode`)."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise PosymError("posym explore needs at least one directory of score tables")
    if detail_prompts < 0 or top < 1:
        raise PosymError(f"--detail-prompts must be >= 0 and --top >= 1, got {detail_prompts} and {top}")
    if not 0 < max_mb <= MOST_MB:  # also refuses nan and inf (int(inf) raised OverflowError)
        raise PosymError(f"--max-mb must be a number of MB in (0, {MOST_MB:,.0f}], got {max_mb}")
    sets = collect(paths)
    recompute = bool(details and detail_prompts)
    use_stored(sets, detail_prompts=detail_prompts, top=top, model=model, recompute=recompute)
    stored = sum(bool(s.details) for s in sets)
    if recompute:
        add_details(sets, detail_prompts=detail_prompts, top=top, device=device, model=model)
    else:
        no_details(sets)
    limit = int(max_mb * 1e6)
    data, blocks = encode(
        sets,
        title=title or "posym explore: " + ", ".join(p.name for p in paths),
        sources=[str(p) for p in paths],
        max_bytes=limit,
    )
    text = render(data, blocks)
    if len(text.encode("utf-8")) > limit:  # encode's accounting is an upper bound: this cannot happen
        raise PosymError(f"the explorer came out at {len(text.encode()) / 1e6:.2f} MB, over --max-mb {max_mb}")
    return text, {
        "limit": limit,
        "sets": len(sets),
        "heads": sum(s.layers * s.heads for s in sets),
        "prompts": sum(len(s.prompts) for s in sets),
        "detail_prompts": sum(len(e["details"]) for e in data["sets"]),
        "dropped": sum(e["dropped"] for e in data["sets"]),
        "stored": stored,
    }
