"""`posym attribute`: every head's estimated causal effect on a length task, from gradients (docs/attribution.md).

The prompts are `posym.prompts`' length families (the llm-study task: kv-code by default, 'between' layout)
at chosen multiples of the base length; the engine is `posym.core.attribution` (AtP, or AtP* with
GradDrop), the mean-ablation reference being the other prompts of the same length. Written: effects.parquet
(one row per prompt, factor and head: effect, magnitude, clean metric, and for the margin metric whether the
answer is right and whether it stays right at the estimated ablated margin), heads.parquet (per factor and
head: the prompt means with n and ddof-1 sd, and the rank by magnitude) and summary.json (manifest).

`validation_summary` is the comparison with real ablations that scripts/attribution_validation.py collects
into docs/results/attribution/ (tests/test_attribution_results.py reads it back).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from posym.core.attribution import head_effects
from posym.core.stats import pearson, spearman
from posym.errors import PosymError
from posym.io import manifest, write_json, write_parquet
from posym.models import LoadedModel
from posym.prompts import Builder, LengthFamily, LengthPrompt, build
from posym.runs import output_file

TOP_SHARE = 0.1
"""The share of heads whose recall is checked: the true top 10% by mean |real effect|."""


def length_prompts(loaded: LoadedModel, fmt: str, factors: list[int], n: int, *, seed: int = 0):
    """{factor: n prompts} of the length family `fmt` ('between' layout), as `posym llm-study` builds it."""
    family = LengthFamily(fmt, factors=sorted({1, *factors}))
    built = build(family, Builder(loaded.tokenizer), n, seed=seed, max_positions=loaded.max_positions)
    return {f: built[f] for f in sorted(factors)}


def write_attribution(
    loaded: LoadedModel,
    prompts: dict[int, list[LengthPrompt]],
    out: Path,
    *,
    mode: str,
    method: str,
    metric: str,
    batch_size: int = 4,
    settings: dict,
    progress=None,
) -> dict:
    """Effects of every head on every prompt (`posym.core.attribution.head_effects`) -> out/."""
    import pandas as pd

    frames = []
    for factor, group in prompts.items():
        if len(group) < 2 and mode == "mean":
            raise PosymError("mean-ablation needs at least 2 prompts per length (--n 2 or more)")
        frame = head_effects(
            loaded.model,
            [p.ids for p in group],
            [p.answer_id for p in group],
            mode=mode,
            method=method,
            metric=metric,
            batch_size=batch_size,
            progress=progress,
        )
        frame["prompt"] = np.array([p.index for p in group])[frame.prompt]
        frames.append(frame.assign(factor=factor))
    effects = pd.concat(frames, ignore_index=True)
    heads = head_table(effects)
    write_parquet(output_file(out, "attribute", "effects"), effects)
    write_parquet(output_file(out, "attribute", "heads"), heads)
    summary = {
        **manifest(settings, seed=settings.get("seed")),
        "model": loaded.name,
        "prompts": {str(f): len(g) for f, g in prompts.items()},
        "top_heads": {
            str(f): [f"{int(r.layer)}.{int(r['head'])}" for _, r in g.nsmallest(10, "rank").iterrows()]
            for f, g in heads.groupby("factor")
        },
    }
    write_json(output_file(out, "attribute", "summary"), summary)
    return summary


def head_table(effects):
    """Per factor and head: mean effect and magnitude over prompts, n, ddof-1 sd of the effect, and the
    rank by mean magnitude (1 = largest).

    >>> import pandas as pd
    >>> e = pd.DataFrame({"factor": 1, "prompt": [0, 0, 1, 1], "layer": 0, "head": [0, 1, 0, 1],
    ...                   "effect": [1.0, -3.0, 3.0, -1.0], "magnitude": [1.0, 3.0, 3.0, 1.0]})
    >>> head_table(e)[["head", "effect", "sd", "rank"]].values.tolist()
    [[0.0, 2.0, 1.4142135623730951, 1.0], [1.0, -2.0, 1.4142135623730951, 2.0]]
    """
    grouped = effects.groupby(["factor", "layer", "head"], sort=True)
    table = grouped.agg(
        effect=("effect", "mean"), sd=("effect", "std"), magnitude=("magnitude", "mean"), n=("effect", "size")
    ).reset_index()
    table["rank"] = table.groupby("factor").magnitude.rank(ascending=False, method="first").astype(int)
    return table


# ---- the validation against real ablations ------------------------------------------------------------


def _names(index) -> list[str]:
    return [f"{int(layer)}.{int(head)}" for layer, head in index]


def validation_summary(heads, groups):
    """AtP and AtP* against real single-head and group ablations.

    heads: one row per (prompt, layer, head) with exact (real effect), atp (AtP's signed estimate) and
    atp_star (AtP*'s GradDrop magnitude). groups: one row per (prompt, group) with group ("L.H,L.H,..."),
    kind and exact. Per method: Spearman over heads of the prompt-mean effect (signed, AtP only) and of the
    prompt-mean magnitude against the mean |real effect|; the median over prompts of the per-prompt
    Spearman of magnitudes; recall of the true top 10% heads (by mean |real effect|) among the method's top
    10% (by mean magnitude), the false negatives named, and the same recall per prompt (mean). Group rows
    (method 'sum of heads'): per kind, the AtP sum of the heads' effects against the real group ablation
    (Pearson and Spearman over prompt x group, means, the real / estimate slope through 0).
    """
    import pandas as pd

    frame = heads.assign(abs_exact=heads.exact.abs(), abs_atp=heads.atp.abs())
    means = frame.groupby(["layer", "head"]).mean(numeric_only=True)
    n_heads = len(means)
    k = max(1, math.ceil(TOP_SHARE * n_heads))
    truth = set(means.abs_exact.nlargest(k).index)
    rows = []
    for method, score, signed in (("atp", "abs_atp", "atp"), ("atp*", "atp_star", None)):
        chosen = set(means[score].nlargest(k).index)
        per_prompt, recall = [], []
        for _, g in frame.groupby("prompt"):
            per_prompt.append(spearman(g[score], g.abs_exact))
            top_true = set(g.abs_exact.nlargest(k).index)
            recall.append(len(top_true & set(g[score].nlargest(k).index)) / k)
        missed = sorted(truth - chosen, key=lambda h: -means.abs_exact[h])
        rows.append(
            {
                "method": method,
                "n_prompts": int(frame.prompt.nunique()),
                "n_heads": n_heads,
                "k": k,
                "spearman_signed": spearman(means[signed], means.exact) if signed else float("nan"),
                "spearman_abs": spearman(means[score], means.abs_exact),
                "spearman_prompt_median": float(np.nanmedian(per_prompt)),
                "recall_top": len(truth & chosen) / k,
                "recall_top_prompt": float(np.mean(recall)),
                "false_negatives": ",".join(_names(missed)),
            }
        )
    effect = {(p, layer, h): e for p, layer, h, e in zip(heads.prompt, heads.layer, heads["head"], heads.atp)}
    estimate = [
        sum(effect[(p, *map(int, member.split(".")))] for member in name.split(","))
        for p, name in zip(groups.prompt, groups.group)
    ]
    g = groups.assign(estimate=estimate)
    group_rows = []
    for kind, part in g.groupby("kind", sort=True):
        slope = float((part.exact * part.estimate).sum() / (part.estimate**2).sum())
        group_rows.append(
            {
                "method": "sum of heads",
                "kind": kind,
                "n": len(part),
                "n_groups": int(part.group.nunique()),
                "pearson": pearson(part.estimate, part.exact),
                "spearman": spearman(part.estimate, part.exact),
                "mean_exact": float(part.exact.mean()),
                "mean_estimate": float(part.estimate.mean()),
                "slope": slope,
            }
        )
    return pd.DataFrame(rows), pd.DataFrame(group_rows)


# ---- the tables docs/attribution.md shows (generated; tests/test_attribution_results.py compares) -------


def _cell(value, digits: int = 2) -> str:
    return "-" if isinstance(value, float) and math.isnan(value) else f"{value:.{digits}f}"


def disagreements(heads, n: int = 5):
    """The n heads whose prompt-mean AtP is farthest from their prompt-mean real effect: layer, head, exact,
    atp, atp_star (prompt means), gap = atp - exact.

    >>> import pandas as pd
    >>> h = pd.DataFrame({"prompt": 0, "layer": 0, "head": [0, 1], "exact": [1.0, -2.0], "atp": [1.0, 0.5],
    ...                   "atp_star": [1.0, 1.5]})
    >>> disagreements(h, 1)[["head", "gap"]].values.tolist()
    [[1.0, 2.5]]
    """
    means = heads.groupby(["layer", "head"])[["exact", "atp", "atp_star"]].mean().reset_index()
    means["gap"] = means.atp - means.exact
    return means.loc[means.gap.abs().sort_values(ascending=False).index[:n]].reset_index(drop=True)


def validation_markdown(summary, group_summary, worst=None) -> str:
    """The validation tables of docs/attribution.md from summary.parquet and groups_summary.parquet.

    >>> import pandas as pd
    >>> s = pd.DataFrame([{"model": "m", "factor": 1, "method": "atp", "n_prompts": 2, "n_heads": 20, "k": 2,
    ...     "spearman_signed": 0.5, "spearman_abs": 0.25, "spearman_prompt_median": 0.1, "recall_top": 0.5,
    ...     "recall_top_prompt": 0.5, "false_negatives": "1.0"}])
    >>> g = pd.DataFrame([{"model": "m", "factor": 1, "kind": "random", "n": 4, "n_groups": 2, "pearson": 0.9,
    ...     "spearman": 0.8, "mean_exact": -1.0, "mean_estimate": -0.5, "slope": 1.9}])
    >>> print(validation_markdown(s, g).splitlines()[2])
    | m | 1x | 2 | atp | 0.50 | 0.25 | 0.10 | 1/2 (0.50) | 0.50 | 1.0 |
    """
    lines = [
        "| model | length | prompts | method | Spearman, signed | Spearman, magnitude | per-prompt Spearman "
        "(median) | top-10% recall | per-prompt recall | false negatives (by real effect) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in summary.sort_values(["model", "factor", "method"]).itertuples():
        hits = round(r.recall_top * r.k)
        lines.append(
            f"| {r.model} | {r.factor}x | {r.n_prompts} | {r.method} | {_cell(r.spearman_signed)} | "
            f"{_cell(r.spearman_abs)} | {_cell(r.spearman_prompt_median)} | {hits}/{r.k} ({r.recall_top:.2f}) | "
            f"{r.recall_top_prompt:.2f} | {r.false_negatives or 'none'} |"
        )
    lines += [
        "",
        "| model | length | groups of 8 | prompt x group | Pearson | Spearman | mean real | mean sum of AtP | "
        "real / estimate (slope) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in group_summary.sort_values(["model", "factor", "kind"]).itertuples():
        lines.append(
            f"| {r.model} | {r.factor}x | {r.kind} ({r.n_groups}) | {r.n} | {_cell(r.pearson)} | {_cell(r.spearman)} | "
            f"{r.mean_exact:.3f} | {r.mean_estimate:.3f} | {_cell(r.slope)} |"
        )
    if worst is not None:
        lines += [
            "",
            "| model | length | head | mean real effect | mean AtP | mean AtP* magnitude | AtP - real |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in worst.sort_values(["model", "factor"], kind="stable").itertuples():
            lines.append(
                f"| {r.model} | {r.factor}x | {int(r.layer)}.{int(r.head)} | {r.exact:.3f} | {r.atp:.3f} | "
                f"{r.atp_star:.3f} | {r.gap:+.3f} |"
            )
    return "\n".join(lines)


def speed_markdown(record: dict) -> str:
    """The benchmark table of docs/attribution.md from docs/benchmarks/attribution_speed.json.

    >>> row = {"model": "m", "heads": 8, "tokens": 56, "forward_s": 0.1, "atp_s": 0.3, "atp_x_forward": 3.0,
    ...        "atp*_s": 1.0, "atp*_x_forward": 10.0}
    >>> print(speed_markdown({"machine": {"torch_threads": 1}, "rows": [row]}).splitlines()[2])
    | m | 56 | 8 | 0.100 | 0.30 (3.0x) | 1.00 (10.0x) | - |
    """
    lines = [
        f"| model | tokens | heads | forward (CPU s) | AtP (CPU s, x forward) | AtP* (CPU s, x forward) | every head "
        f"ablated (CPU s, x forward) |  <!-- torch threads: {record['machine']['torch_threads']} -->",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in record["rows"]:
        exhaustive = f"{r['exhaustive_s']:.1f} ({r['exhaustive_x_forward']:.0f}x)" if "exhaustive_s" in r else "-"
        lines.append(
            f"| {r['model']} | {r['tokens']} | {r['heads']} | {r['forward_s']:.3f} | {r['atp_s']:.2f} "
            f"({r['atp_x_forward']:.1f}x) | {r['atp*_s']:.2f} ({r['atp*_x_forward']:.1f}x) | {exhaustive} |"
        )
    return "\n".join(lines)
