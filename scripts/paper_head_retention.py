"""Head-level length generalization of the paper-preset models from the committed tables (issue 33, item 5).

Reads docs/results/paper/discrepancy.parquet (per preset, seed, task, layer, head and length the top-1
minus top-2 logit gap of the last token over 64 test questions: its median gap_q50 and mean gap_mean;
the last checkpoint, lengths 17 ... 2,048 made with lengthgen's extra target-window tokens) and
dynamics.parquet (every head's label per checkpoint: the last step, query_mode 'hops', label_gamma_0p1).
A head's retention at length L = its gap at L / its gap at the training length 17, of the median gap and
of the mean gap. No per-prompt gaps are committed, so there are no bootstrap intervals over prompts
here: the intervals are over the three seeds (t distribution, seeds - 1 degrees of freedom) beside the
seeds' minimum and maximum. The labels come from hop queries (every pointer), the gaps from the last
token (the first pointer): what the committed tables hold.

Writes, into --out (default docs/results/paper/):

    head_retention.parquet         per preset, seed, task, layer, head and length: label, gaps, the base
                                   gaps at 17 tokens and both retentions
    head_retention_labels.parquet  per preset, seed, task, label, length and measure: the median over the
                                   label's heads of the head retentions (and the head count)
    head_retention_seeds.parquet   the same over seeds: mean, sd, min, max and a 95% t interval
    head_retention_layers.parquet  number model at 68 and 128 tokens, per seed and measure: every layer's
                                   retention, its rank (1 = the smallest retention: loses its margin
                                   first) and its block (L1-L4, L7-L11, other)
    head_retention_first.parquet   per seed, length and measure: median retention and mean rank of L1-L4
                                   and of L7-L11, the layers ranked lowest, whether L1-L4 all rank below
                                   L7-L11

    head_retention_within.parquet  (into --within, default docs/results/seed-preset-s1/: the seed preset's 6 x 8
                                   run) per task, length, layer and label of the layers holding heads of two
                                   labels: the heads and their median retentions (the within-layer comparison)

tests/test_head_retention_tables.py recomputes values of these tables from discrepancy.parquet and dynamics.parquet.

    python scripts/paper_head_retention.py [--out docs/results/paper]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from posym.core.stats import seed_interval  # noqa: E402
from posym.io import write_parquet  # noqa: E402

PAPER = ROOT / "docs" / "results" / "paper"
BASE = 17
"""The training length: 8 target + 8 pre-target tokens + the query."""
LABEL = "label_gamma_0p1"
MEASURES = {"gap_q50": "median gap", "gap_mean": "mean gap"}
RANK_LENGTHS = (68, 128)
BLOCKS = {"L1-L4": range(1, 5), "L7-L11": range(7, 12)}
"""The number model's layer blocks of the issue: positional L1-L4 and symbolic L7-L11 (12 layers)."""


def labels(dynamics: pd.DataFrame) -> pd.DataFrame:
    """Per (preset, seed, task, layer, head): the label at gamma 0.1 at the run's last step, hop queries."""
    hops = dynamics[dynamics["query_mode"] == "hops"]
    last = hops[hops["step"] == hops.groupby(["preset", "seed", "task"])["step"].transform("max")]
    return last[["preset", "seed", "task", "layer", "head", "step", "s_pos", "s_sym", LABEL]].rename(
        columns={LABEL: "label", "step": "label_step"}
    )


def head_table(discrepancy: pd.DataFrame, dynamics: pd.DataFrame) -> pd.DataFrame:
    """Per (preset, seed, task, layer, head, length): the gaps, their values at 17 tokens, the retentions
    (gap at L / gap at 17) and the head's label."""
    keys = ["preset", "seed", "task", "layer", "head"]
    base = discrepancy[discrepancy["length"] == BASE][keys + list(MEASURES)].rename(
        columns={m: f"{m}_base" for m in MEASURES}
    )
    out = discrepancy[keys + ["length", "inputs", *MEASURES]].merge(base, on=keys, how="inner")
    for m in MEASURES:
        out[f"retention_{m[4:]}"] = out[m] / out[f"{m}_base"]
    out.insert(out.columns.get_loc("length") + 1, "factor", out["length"] / BASE)
    out = out.merge(labels(dynamics), on=keys, how="left")
    if out["label"].isna().any():
        missing = out[out["label"].isna()][keys].drop_duplicates().head(1).to_dict("records")
        raise SystemExit(f"no label for {missing}: dynamics.parquet lacks that run")
    return out.sort_values(keys + ["length"], ignore_index=True)


def label_table(heads: pd.DataFrame) -> pd.DataFrame:
    """Per (preset, seed, task, label, length, measure): the median head retention and the head count."""
    long = heads.melt(
        id_vars=["preset", "seed", "task", "label", "length", "factor", "layer", "head"],
        value_vars=[f"retention_{m[4:]}" for m in MEASURES],
        var_name="measure",
        value_name="retention",
    )
    long["measure"] = long["measure"].str.replace("retention_", "gap_", regex=False)
    return long.groupby(["preset", "seed", "task", "label", "length", "factor", "measure"], as_index=False).agg(
        median_retention=("retention", "median"), heads=("retention", "size")
    )


def seed_table(by_label: pd.DataFrame) -> pd.DataFrame:
    """Per (preset, task, label, length, measure) over seeds: mean, sd, min, max of the per-seed median
    retention and the 95% t interval mean +- t(seeds - 1) sd / sqrt(seeds) (NaN with one seed)."""
    rows = []
    for key, sub in by_label.groupby(["preset", "task", "label", "length", "factor", "measure"]):
        values = sub["median_retention"].to_numpy(dtype=float)
        n = len(values)
        mean, sd, lo, hi = seed_interval(values)
        rows.append(
            {
                **dict(zip(["preset", "task", "label", "length", "factor", "measure"], key)),
                "seeds": n,
                "seed_list": ",".join(str(s) for s in sorted(sub["seed"])),
                "mean": mean,
                "sd": sd,
                "min": float(values.min()),
                "max": float(values.max()),
                "lo": lo,
                "hi": hi,
                "heads_min": int(sub["heads"].min()),
                "heads_max": int(sub["heads"].max()),
            }
        )
    return pd.DataFrame(rows)


def block_of(layer: int) -> str:
    return next((name for name, layers in BLOCKS.items() if layer in layers), "other")


def layer_table(heads: pd.DataFrame) -> pd.DataFrame:
    """Number model (paper preset) at RANK_LENGTHS, per seed and measure: each layer's retention (its one
    head's; the mean over heads with several) and its rank (1 = smallest retention), with its block."""
    sub = heads[(heads["task"] == "number") & heads["length"].isin(RANK_LENGTHS)]
    rows = []
    for m in MEASURES:
        col = f"retention_{m[4:]}"
        per_layer = sub.groupby(["preset", "seed", "length", "layer"], as_index=False).agg(
            retention=(col, "mean"), label=("label", lambda s: "/".join(sorted(set(s))))
        )
        per_layer["rank"] = per_layer.groupby(["preset", "seed", "length"])["retention"].rank(method="min").astype(int)
        rows.append(per_layer.assign(measure=m))
    out = pd.concat(rows, ignore_index=True)
    out["block"] = out["layer"].map(block_of)
    return out.sort_values(["preset", "seed", "length", "measure", "rank", "layer"], ignore_index=True)


def first_table(layers: pd.DataFrame) -> pd.DataFrame:
    """Per (preset, seed, length, measure): which block loses its margin first."""
    rows = []
    for (preset, seed, length, measure), sub in layers.groupby(["preset", "seed", "length", "measure"]):
        a, b = sub[sub["block"] == "L1-L4"], sub[sub["block"] == "L7-L11"]
        lowest = sub.sort_values(["rank", "layer"]).head(len(BLOCKS["L1-L4"]))
        rows.append(
            {
                "preset": preset,
                "seed": seed,
                "length": length,
                "measure": measure,
                "median_L1_L4": float(a["retention"].median()),
                "median_L7_L11": float(b["retention"].median()),
                "mean_rank_L1_L4": float(a["rank"].mean()),
                "mean_rank_L7_L11": float(b["rank"].mean()),
                "lowest_layers": ",".join(f"L{int(v)}" for v in lowest["layer"]),
                "L1_L4_all_below_L7_L11": bool(a["retention"].max() < b["retention"].min()),
                "layers": len(sub),
            }
        )
    return pd.DataFrame(rows)


def build(paper: Path = PAPER) -> dict[str, pd.DataFrame]:
    """Every table of this script from the committed discrepancy and dynamics tables."""
    discrepancy = pd.read_parquet(paper / "discrepancy.parquet")
    dynamics = pd.read_parquet(paper / "dynamics.parquet")
    heads = head_table(discrepancy[discrepancy["preset"] == "paper"], dynamics[dynamics["preset"] == "paper"])
    by_label = label_table(heads)
    layers = layer_table(heads)
    return {
        "head_retention": heads,
        "head_retention_labels": by_label,
        "head_retention_seeds": seed_table(by_label),
        "head_retention_layers": layers,
        "head_retention_first": first_table(layers),
    }


SEED_PRESET = PAPER.parent / "seed-preset-s1"
"""The seed preset's run of several heads per layer (6 x 8, seed 1, issue 56): the within-layer comparison."""


def within_layer_table(heads: pd.DataFrame) -> pd.DataFrame:
    """Per (task, seed, length, layer, label) of the layers whose heads carry two labels or more: the heads and the
    median of their retentions (both measures). With one head per layer (the paper preset) a label is its
    layer; with several, heads of different labels in ONE layer compare at the same depth."""
    mixed_layers = heads[heads.length == BASE].groupby(["task", "seed", "layer"]).label.nunique()
    keep = mixed_layers[mixed_layers > 1].reset_index()[["task", "seed", "layer"]]
    sub = heads.merge(keep, on=["task", "seed", "layer"])
    return sub.groupby(["task", "seed", "length", "layer", "label"], as_index=False).agg(
        heads=("head", "size"), retention_q50=("retention_q50", "median"), retention_mean=("retention_mean", "median")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PAPER)
    parser.add_argument(
        "--within", type=Path, default=SEED_PRESET, help="a collected seed-preset directory: head_retention_within"
    )
    args = parser.parse_args()
    if (args.within / "discrepancy.parquet").is_file():
        heads = head_table(
            pd.read_parquet(args.within / "discrepancy.parquet"), pd.read_parquet(args.within / "dynamics.parquet")
        )
        within = within_layer_table(heads)
        write_parquet(args.within / "head_retention_within.parquet", within)
        print(within[within.length.isin([68, 128])].to_string(index=False))
    tables = build()
    for name, table in tables.items():
        write_parquet(args.out / f"{name}.parquet", table)
    pd.set_option("display.width", 200)
    seeds = tables["head_retention_seeds"]
    view = seeds[(seeds["measure"] == "gap_q50") & seeds["length"].isin([34, 51, 68, 128, 256, 2048])]
    print("median retention of the median gap, per label, over seeds (mean [95% t interval], min-max):")
    for r in view.itertuples():
        print(
            f"  {r.task:6s} {r.label:10s} {r.length:5d} ({r.factor:.1f}x): {r.mean:.2f} [{r.lo:.2f}, {r.hi:.2f}], "
            f"seeds {r.min:.2f}-{r.max:.2f}, heads {r.heads_min}-{r.heads_max}"
        )
    print("number model, which layers lose their margin first:")
    print(tables["head_retention_first"].to_string(index=False))
    print(f"wrote {', '.join(f'{name}.parquet' for name in tables)} to {args.out}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
