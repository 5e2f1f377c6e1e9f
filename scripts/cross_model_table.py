"""The cross-model table (issues 50 and 52): one row per real model studied by `posym llm-study`.

Per model (docs/results/llm-study*/ with a lengths/ stage): its task and accuracy at 1x and 16x ('between'
layout, Wilson 95%); whether a head's sink-free label predicts that it keeps its answer key at 16x — among the
heads that look at the answer key at the base length, the AUROC of s_sym - s_pos for "keeps at least half of its
base attention on it" (`posym.core.retention.label_prediction`, 95% head-bootstrap interval, and the
layer-matched AUROC); and the symbolic and positional groups' retention on the answer key against their matched
random heads (Holm p and verdict, from lengths/group_retention.parquet); and, where the causal stage is committed,
each group's estimated accuracy drop under mean-ablation at the longest causal length against its matched random
sets (causal/estimates.parquet, the real ablation beside it, whether the calibration trusts the estimate there).
Nothing is averaged over models.

The block of docs/results.md between `<!-- cross-model:begin -->` and `<!-- cross-model:end -->` is this
script's output (`--write FILE` rewrites it); tests/test_cross_model_table.py checks it against the tables.

    python scripts/cross_model_table.py [--write docs/results.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
from llm_verdicts import ROOT, _p, write

from posym.core.retention import label_prediction
from posym.runs import StudyDir

BEGIN, END = "<!-- cross-model:begin -->", "<!-- cross-model:end -->"
STUDIES = ROOT / "docs" / "results"
NAMES = {
    "llm-study": "SmolLM2-135M-Instruct",
    "llm-study-gemma3": "Gemma 3 270M",
    "llm-study-qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct",
    "llm-study-qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B-Instruct",
}
"""Study directory -> the model's name in the table (in this order; a directory without lengths/ is skipped)."""
LAYOUT, RANKING = "between", "sink-free"


def studied() -> list[Path]:
    return [STUDIES / name for name in NAMES if (StudyDir(STUDIES / name).file("lengths", "group_retention")).is_file()]


def prediction(study: Path) -> dict:
    heads = pd.read_parquet(StudyDir(study).file("lengths", "head_retention"))
    heads = heads[(heads.layout == LAYOUT) & (heads.ranking == RANKING)]
    return label_prediction(heads, base_length=int(heads.length.min()), length=int(heads.length.max()))


def _group(groups, name: str) -> str:
    row = groups[groups.group == name]
    if not len(row):
        return "no head"
    r = row.iloc[0]
    kept = f"{r.value:.2f} [{r.lo:.2f}, {r.hi:.2f}] ({r.heads} heads)"
    if pd.isna(r.p_holm):
        return f"{kept}; untested (no disjoint random set)"
    return f"{kept} vs random {r.null_median:.2f}; Holm p {_p(r.p_holm)}: {r.verdict}"


def causal(study: Path) -> str:
    """The causal cell: each sink-free group's ESTIMATED accuracy drop at the longest causal length against its
    matched pool's estimated draws (Holm p, verdict), the real ablation's drop beside it, and whether the
    estimate was trusted at that length (causal/calibration.parquet); '-' without a causal stage."""
    path = StudyDir(study).file("causal", "estimates")
    if not path.is_file():
        return "- (no causal stage committed)"
    table = pd.read_parquet(path)
    est = table[(table.source == "estimate") & (table.ranking == RANKING) & (table.measure == "acc_drop")]
    est = est[est.factor == est.factor.max()]
    calibration = pd.read_parquet(StudyDir(study).file("causal", "calibration"))
    trusted = calibration[calibration.factor == est.factor.max()].trusted.all()
    parts = [
        f"{r.group} {r.value:+.2f} (real {r.real_value:+.2f}) vs random {r.null_median:+.2f} "
        f"[{r.null_lo:+.2f}, {r.null_hi:+.2f}]; Holm p {_p(r.p_holm)}: {r.verdict}"
        for r in est.sort_values("group", ascending=False).itertuples()
    ]
    first = est.iloc[0]
    return (
        f"at {int(first.factor)}x, k = {int(first.k)}, n = {int(first.prompts)}, {int(first.draws):,} draws: "
        + "; ".join(parts)
        + f" (estimate {'trusted' if trusted else 'NOT trusted'} there)"
    )


def row(study: Path) -> str:
    info = json.loads((StudyDir(study).file("lengths", "lengths")).read_text())
    accuracy = pd.read_parquet(StudyDir(study).file("lengths", "accuracy_summary"))
    accuracy = accuracy[accuracy.layout == LAYOUT].sort_values("factor")
    first, last = accuracy.iloc[0], accuracy.iloc[-1]
    groups = pd.read_parquet(StudyDir(study).file("lengths", "group_retention"))
    groups = groups[
        (groups.layout == LAYOUT)
        & (groups.ranking == RANKING)
        & (groups.measure == "attn_answer")
        & (groups.length == groups.length.max())
    ]
    p = prediction(study)
    auroc = (
        "- (no head keeps it)"
        if pd.isna(p["auroc"])
        else f"{p['auroc']:.2f} [{p['auroc_lo']:.2f}, {p['auroc_hi']:.2f}] (layer-matched {p['auroc_layer']:.2f} "
        f"[{p['auroc_layer_lo']:.2f}, {p['auroc_layer_hi']:.2f}])"
    )
    return (
        f"| {NAMES[study.name]} | `{info['format']}`: {first.acc:.2f} [{first.lo:.2f}, {first.hi:.2f}] at "
        f"{first.length} -> {last.acc:.2f} [{last.lo:.2f}, {last.hi:.2f}] at {last.length:,} (n = {last.n}) | "
        f"{p['looking']} of {p['heads']} / {p['kept']} | {auroc} | {_group(groups, 'symbolic')} | "
        f"{_group(groups, 'positional')} | {causal(study)} |"
    )


def block() -> str:
    return "\n".join(
        [
            BEGIN,
            "",
            (
                "| model | task: accuracy 1x -> 16x [Wilson 95%] | heads looking at the answer key at 1x / keeping "
                ">= half of it at 16x | AUROC of s_sym - s_pos for keeping it [95%] | symbolic heads: answer key "
                "kept at 16x [95%] | positional heads: answer key kept at 16x [95%] | causal: estimated accuracy "
                "drop when the group is mean-ablated, against matched random sets |"
            ),
            "|---|---|---|---|---|---|---|",
            *[row(study) for study in studied()],
            "",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="rewrite the cross-model block of this Markdown file")
    args = parser.parse_args()
    if args.write:
        write(args.write, BEGIN, END, block)
    else:
        print(block())


if __name__ == "__main__":
    main()
