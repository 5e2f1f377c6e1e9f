"""How heads become pure over training: per-prompt purity, labels per gamma, the first pure step, the
layer composition at the max-accuracy step (docs/method.md section 4; Fig. 2, 6 and 7 of 2605.31558).

Pure table arithmetic on the score tables `posym dynamics` collects (one row per checkpoint, prompt, layer
and head; `posym.core.scores.prompt_scores`): no model, no file.

>>> layer_ranges([5, 0, 1, 2, 3, 7, 8])
'L0-L3, L5, L7-L8'
"""

from __future__ import annotations

from posym.core.paper import GAMMAS
from posym.core.scores import head_labels, label_column
from posym.errors import PosymError

KINDS = ("positional", "symbolic")
"""The pure kinds a head is counted as in the purity tables (uniform and mixed heads are neither)."""


def query_roles(hops) -> dict[tuple[int, int], str]:
    """(prompt, query position) -> role ("last", "target", "inner") for per-prompt hop queries
    [query, p_1, ..., p_{H-1}] (`posym.commands.dynamics`' docstring defines the roles)."""
    roles = {}
    for prompt, queries in enumerate(hops):
        for k, position in enumerate(queries):
            roles[prompt, position] = "last" if k == 0 else "target" if k == len(queries) - 1 else "inner"
    return roles


def pure_column(kind: str, gamma: float) -> str:
    """The column of the fraction of prompts on which a head is pure of `kind` at `gamma`
    (pure_positional_gamma_0p1: a Python identifier, like `label_column`)."""
    return label_column(gamma).replace("label_", f"pure_{kind}_", 1)


def prompt_purity(per_prompt, gammas=GAMMAS):
    """Per (step, query_mode, layer, head): pure_column("positional", gamma) and pure_column("symbolic", gamma), the
    fractions of prompts whose own scores `posym.core.scores.head_labels` labels so."""
    frame = per_prompt[["step", "query_mode", "layer", "head"]].copy()
    for gamma in gammas:
        hi, lo = 1 - gamma, gamma
        frame[pure_column("positional", gamma)] = ((per_prompt.s_pos >= hi) & (per_prompt.s_sym <= lo)).astype(float)
        frame[pure_column("symbolic", gamma)] = ((per_prompt.s_sym >= hi) & (per_prompt.s_pos <= lo)).astype(float)
    return frame.groupby(["step", "query_mode", "layer", "head"], as_index=False).mean()


def normalised_entropy(table):
    """Entropy min-max normalised over the steps of each (query_mode, layer, head): a Series aligned
    with `table`, (e - min) / (max - min), 0 where the entropy never changes."""
    by_head = table.groupby(["query_mode", "layer", "head"]).entropy
    low, high = by_head.transform("min"), by_head.transform("max")
    span = (high - low).where(high > low)
    return ((table.entropy - low) / span).fillna(0.0)


def label(table, gammas=GAMMAS):
    """`table` plus a column `label_column(gamma)` per gamma: each row's `head_labels` label."""
    out = table.copy()
    for gamma in gammas:
        out[label_column(gamma)] = head_labels(out.s_pos, out.s_sym, gamma)
    return out


def purity(table, gammas=GAMMAS):
    """Per (gamma, query_mode, layer, head): kind (positional, symbolic, none), pure_from (step or
    NaN) and the final s_pos, s_sym; the exact rule is in the module docstring."""
    import pandas as pd

    rows = []
    for gamma in gammas:
        column = label_column(gamma)
        labelled = table if column in table.columns else label(table, [gamma])
        for (mode, layer, head), g in labelled.sort_values("step").groupby(["query_mode", "layer", "head"]):
            labels, steps = g[column].tolist(), g.step.tolist()
            kind = labels[-1] if labels[-1] in KINDS else "none"
            start = len(labels)
            while kind != "none" and start > 0 and labels[start - 1] == kind:
                start -= 1
            rows.append(
                {
                    "gamma": gamma,
                    "query_mode": mode,
                    "layer": layer,
                    "head": head,
                    "kind": kind,
                    "pure_from": steps[start] if kind != "none" else float("nan"),
                    "s_pos_end": g.s_pos.iloc[-1],
                    "s_sym_end": g.s_sym.iloc[-1],
                }
            )
    return pd.DataFrame(rows)


def purity_counts(table, pure):
    """Per (gamma, query_mode, step): heads, positional/symbolic (pure for good by then, Fig. 7) and
    positional_now/symbolic_now (labelled so at that step)."""
    import pandas as pd

    rows = []
    steps = sorted(table.step.unique())
    for (gamma, mode), heads in pure.groupby(["gamma", "query_mode"]):
        column = label_column(gamma)
        for step in steps:
            now = table[(table.step == step) & (table.query_mode == mode)]
            row = {"gamma": gamma, "query_mode": mode, "step": step, "heads": len(heads)}
            for kind in KINDS:
                row[kind] = int(((heads.kind == kind) & (heads.pure_from <= step)).sum())
                row[f"{kind}_now"] = int((now[column] == kind).sum()) if column in now.columns else 0
            rows.append(row)
    return pd.DataFrame(rows)


def max_accuracy_step(table) -> int:
    """The earliest step with the highest validation accuracy (column val_acc)."""
    acc = table.groupby("step").val_acc.first()
    if acc.isna().all():
        raise PosymError("no checkpoint has a validation accuracy")
    return int(acc[acc == acc.max()].index.min())


def layer_ranges(layers) -> str:
    """[0, 1, 2, 3, 5] -> "L0-L3, L5" (the paper's way of naming layer sets); "" for none."""
    layers, parts = sorted(set(int(x) for x in layers)), []
    for layer in layers:
        if parts and layer == parts[-1][1] + 1:
            parts[-1][1] = layer
        else:
            parts.append([layer, layer])
    return ", ".join(f"L{a}" if a == b else f"L{a}-L{b}" for a, b in parts)


def composition(table, max_step: int, gammas=GAMMAS):
    """(per-head labels, summary): labels at the max-accuracy step and at the last step per gamma
    and query mode; summary rows with the fraction of heads per label and the layer sets."""
    import pandas as pd

    stages = {"max_acc": max_step, "end": int(table.step.max())}
    heads, summary = [], []
    for gamma in gammas:
        column = label_column(gamma)
        for stage, step in stages.items():
            at = table[table.step == step]
            for mode, g in at.groupby("query_mode"):
                pure = [c for c in (pure_column("positional", gamma), pure_column("symbolic", gamma)) if c in g]
                heads.append(
                    g[["layer", "head", "s_pos", "s_sym", column, *pure]]
                    .rename(columns={column: "label", **{c: c.rsplit("_g", 1)[0] for c in pure}})
                    .assign(gamma=gamma, stage=stage, step=step, query_mode=mode)
                )
                row = {"gamma": gamma, "stage": stage, "step": step, "query_mode": mode, "heads": len(g)}
                for name in ("positional", "symbolic", "mixed", "uniform"):
                    chosen = g[g[column] == name]
                    row[f"frac_{name}"] = len(chosen) / len(g)
                    row[f"layers_{name}"] = layer_ranges(chosen.layer)
                summary.append(row)
    return pd.concat(heads, ignore_index=True), pd.DataFrame(summary)
