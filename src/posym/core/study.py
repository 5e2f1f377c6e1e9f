"""The real-model study's arithmetic on score tables (`posym llm-study`): pure DataFrames in and out.

- `find_sinks`: key positions that are the top key of most (prompt, head) rows: attention sinks.
- `sink_changes`: each head's label with and without the sink keys in the swaps, and whether it moved.
- `layer_profile` / `half_profile`: per-layer medians of s_pos and s_sym, and the early vs late halves
  (2511.11579 reports a median positional score of 0.83 in the early and 0.56 in the late half of
  Gemma-2-2b-it's layers).
- `label_counts`, `label_agreement`: labels at several purity thresholds gamma, and how often two
  prompt sets give a head the same label.
- `behaviour_frequency`: behaviour (s_pos - s_sym) against the frequency a head uses, with Pearson and
  Spearman correlation over heads (2511: positional heads on fast planes, symbolic heads on slow ones).
- `ablation_groups`: the top-k positional, top-k symbolic and k random heads.
"""

from __future__ import annotations

import random

from posym.core.paper import GAMMAS
from posym.core.scores import summarize_heads
from posym.core.stats import pearson, spearman

GROUPS = ("positional", "symbolic", "random")


def find_sinks(frame, share: float = 0.5) -> list[int]:
    """Key positions that hold the largest attention in at least `share` of the rows of a score
    table (columns top_key; one row per prompt, query, layer, head), most frequent first."""
    counts = frame["top_key"].value_counts()
    return [int(k) for k, c in counts.items() if c >= share * len(frame)]


def sink_changes(plain, excluded):
    """Per head: label and scores on the plain swaps and with the sink keys excluded, and `changed`.

    plain, excluded: `summarize_heads` tables of the same heads.
    """
    keep = ["layer", "head", "s_pos", "s_sym", "label"]
    out = plain[keep + [c for c in ("attn_first", "attn_top") if c in plain]].merge(
        excluded[keep], on=["layer", "head"], suffixes=("", "_excluded")
    )
    out["changed"] = out["label"] != out["label_excluded"]
    return out


def layer_profile(heads):
    """Per layer: median s_pos and s_sym over its heads, and its head count."""
    return heads.groupby("layer", as_index=False).agg(
        median_s_pos=("s_pos", "median"), median_s_sym=("s_sym", "median"), heads=("head", "count")
    )


def half_profile(heads, n_layers: int) -> dict:
    """Median s_pos and s_sym over the heads of the early half of the layers (layer < n_layers / 2)
    and of the late half."""
    early = heads[heads.layer < n_layers / 2]
    late = heads[heads.layer >= n_layers / 2]
    return {
        "early_s_pos": float(early.s_pos.median()),
        "late_s_pos": float(late.s_pos.median()),
        "early_s_sym": float(early.s_sym.median()),
        "late_s_sym": float(late.s_sym.median()),
    }


def label_counts(frame, gammas=GAMMAS):
    """Heads per label at each purity threshold gamma: columns gamma, label, heads."""
    import pandas as pd

    rows = []
    for gamma in gammas:
        counts = summarize_heads(frame, gamma=gamma)["label"].value_counts()
        rows += [
            {"gamma": gamma, "label": label, "heads": int(counts.get(label, 0))}
            for label in ("positional", "symbolic", "mixed", "uniform")
        ]
    return pd.DataFrame(rows)


def label_agreement(heads_by_set: dict):
    """For every pair of prompt sets: the share of heads with the same label (columns a, b, agreement)."""
    import pandas as pd

    names = list(heads_by_set)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            both = heads_by_set[a].merge(heads_by_set[b], on=["layer", "head"], suffixes=("_a", "_b"))
            rows.append({"a": a, "b": b, "heads": len(both), "agreement": float((both.label_a == both.label_b).mean())})
    return pd.DataFrame(rows, columns=["a", "b", "heads", "agreement"])


def behaviour_frequency(heads, frequency):
    """Heads' behaviour (s_pos - s_sym) beside their frequency use, and the correlations over heads.

    heads: `summarize_heads` rows; frequency: `posym.core.geometry.frequency_use` rows.
    Returns (merged table, {"pearson": r, "spearman": rho, "heads": n}) with correlations of behaviour
    against weighted_id (a high ID is a slow plane): 2511 predicts them negative.
    """
    both = heads.merge(frequency, on=["layer", "head"]).dropna(subset=["weighted_id"])
    both["behaviour"] = both.s_pos - both.s_sym
    return both, {
        "pearson": pearson(both.behaviour, both.weighted_id),
        "spearman": spearman(both.behaviour, both.weighted_id),
        "heads": len(both),
    }


def ablation_groups(heads, k: int, seed: int = 0) -> dict[str, list[tuple[int, int]]]:
    """The k most positional heads (largest s_pos - s_sym), the k most symbolic (largest s_sym - s_pos)
    and k heads drawn at random (seeded), each sorted."""
    order = heads.assign(behaviour=heads.s_pos - heads.s_sym).sort_values(["behaviour", "layer", "head"])
    pairs = [(int(layer), int(head)) for layer, head in zip(order.layer, order["head"])]
    drawn = random.Random(seed).sample(pairs, k)
    return {"positional": sorted(pairs[::-1][:k]), "symbolic": sorted(pairs[:k]), "random": sorted(drawn)}
