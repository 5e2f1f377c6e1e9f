"""Issue 50's real-model verdicts, printed from the committed lengths tables of `posym llm-study`.

For each real model (docs/results/llm-study*/lengths/), the block of docs/results.md between
`<!-- llm-verdicts:begin -->` and `<!-- llm-verdicts:end -->` (`--write FILE` rewrites it):

- head retention at the longest length (16x), 'between' layout (the fact-to-question distance grows),
  heads labelled by their sink-free scores: per group (its head count; the sink-tracking heads apart;
  Gemma's local and global layers apart) the share of its base-length attention it keeps on the
  answer-bearing key and on its own base top key with the sinks left out, with the paired prompt
  bootstrap 95% interval, the median of its 1,000 matched random draws, the Holm-adjusted randomization
  p, the verdict and the minimal detectable difference (80% power at the Holm family's level);
- the paired accuracy tests (exact McNemar on the same questions, Holm over the table).

Nothing is computed here that the tables do not hold: tests/test_llm_verdicts.py checks the block
against this script's output, tests/test_prediction.py the verdicts against their numbers.

    python scripts/llm_verdicts.py [--write docs/results.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from posym.runs import StudyDir

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- llm-verdicts:begin -->", "<!-- llm-verdicts:end -->"
MODELS = {
    "SmolLM2-135M-Instruct": ROOT / "docs" / "results" / "llm-study",
    "Gemma 3 270M": ROOT / "docs" / "results" / "llm-study-gemma3",
    "Qwen2.5-Coder-0.5B-Instruct": ROOT / "docs" / "results" / "llm-study-qwen2.5-coder-0.5b",
}
MEASURE_NAMES = {"attn_answer": "answer key", "attn_tracked": "own top key, sinks left out", "margin": "margin"}


def _p(value: float) -> str:
    return "-" if pd.isna(value) else (f"{value:.3f}" if value >= 0.001 else f"{value:.1e}")


def retention_rows(study: Path, *, layout: str = "between", ranking: str = "sink-free") -> list[str]:
    """Markdown rows: one per (measure, group) at the longest length."""
    groups = pd.read_parquet(StudyDir(study).file("lengths", "group_retention"))
    longest = groups.length.max()
    at = groups[
        (groups.layout == layout)
        & (groups.ranking == ranking)
        & (groups.length == longest)
        & ~groups.group.str.startswith("random:")
        & groups.measure.isin(["attn_answer", "attn_tracked"])
    ]
    rows = []
    for measure in ("attn_answer", "attn_tracked"):
        for r in at[at.measure == measure].itertuples():
            if pd.isna(r.p_holm):  # over half of the heads: no disjoint random set, no test
                rows.append(
                    f"| {MEASURE_NAMES[measure]} | {r.group} | {r.heads} | {r.level:.3f} | {r.value:.2f} "
                    f"[{r.lo:.2f}, {r.hi:.2f}] | - | - | untested (no disjoint random set) | - |"
                )
                continue
            rows.append(
                f"| {MEASURE_NAMES[measure]} | {r.group} | {r.heads} | {r.level:.3f} | {r.value:.2f} "
                f"[{r.lo:.2f}, {r.hi:.2f}] | {r.null_median:.2f} | {_p(r.p_holm)} (of {r.family}) | "
                f"{r.verdict} | {r.mde:.2f} |"
            )
    return rows


def accuracy_lines(study: Path) -> list[str]:
    tests = pd.read_parquet(StudyDir(study).file("lengths", "accuracy_tests"))
    return [
        f"| {r.comparison} | {r.n} | {r.acc_a:.2f} vs {r.acc_b:.2f} | {r.only_a} / {r.only_b} | {_p(r.p)} | "
        f"{_p(r.p_holm)} | {'yes' if r.separated else 'no'} | {r.mde:.2f} |"
        for r in tests.itertuples()
    ]


def block() -> str:
    lines = [BEGIN]
    for model, study in MODELS.items():
        groups = pd.read_parquet(StudyDir(study).file("lengths", "group_retention"))
        longest, base = groups.length.max(), groups.length.min()
        prompts = int(groups.prompts.iloc[0])
        draws = int(groups[groups.group.str.startswith("random:")].draws.max())
        lines += [
            "",
            f"**{model}**, head retention at {longest:,} tokens (16x the base {base}), distractors between the "
            f"facts and the question, sink-free labels, {prompts} prompts, {draws:,} matched random draws per group "
            f"(docs/results/{study.name}/lengths/group_retention.parquet):",
            "",
            "| measure | group | heads | attention at 16x | kept (pooled) [95%] | random median | Holm p "
            "(family) | verdict | MDE |",
            "|---|---|---|---|---|---|---|---|---|",
            *retention_rows(study),
            "",
            f"{model}, paired accuracy tests (exact McNemar on the same questions, Holm over the table; MDE: "
            "the accuracy difference detectable with 80% power at the family's level):",
            "",
            "| comparison | n | accuracy | right only in a / only in b | p | Holm p | separated | MDE |",
            "|---|---|---|---|---|---|---|---|",
            *accuracy_lines(study),
        ]
    return "\n".join([*lines, "", END])


PAST_BEGIN, PAST_END = "<!-- past-context:begin -->", "<!-- past-context:end -->"
PAST = {"SmolLM2-135M-Instruct": ROOT / "docs" / "results" / "llm-study-past-context"}
"""Studies run with past_context: true (prompts past the model's max_position_embeddings)."""


def past_context_block() -> str:
    """The past-context block: per model, accuracy at every length (inside or past the trained context), the
    paired tests of the lengths past it against the longest one inside (and against 1x), and the groups'
    retention at the lengths around the trained context."""
    lines = [PAST_BEGIN]
    for model, study in PAST.items():
        info = pd.read_json(StudyDir(study).file("lengths", "lengths"), typ="series")
        trained, inside = int(info["trained_context"]), int(info["inside_factor"])
        summary = pd.read_parquet(StudyDir(study).file("lengths", "accuracy_summary"))
        tests = pd.read_parquet(StudyDir(study).file("lengths", "accuracy_tests"))
        groups = pd.read_parquet(StudyDir(study).file("lengths", "group_retention"))
        base = int(info["base_lengths"]["between"])
        around = sorted(x for x in groups.length.unique() if x >= inside * base)
        prompts, draws = int(info["prompts"]["heads"]), int(info["draws"])
        lines += [
            "",
            f"**{model}** past its trained context ({trained:,} positions): prompts of {base} to "
            f"{int(summary.length.max()):,} tokens, `{info['format']}` task, attention kernel {info['kernel']} "
            f"(docs/results/{study.name}/lengths/):",
            "",
            "| layout | factor | tokens | where | accuracy [Wilson 95%] | n |",
            "|---|---|---|---|---|---|",
            *(
                f"| {r.layout} | {r.factor}x | {r.length:,} | {'past' if r.length > trained else 'inside'} | "
                f"{r.acc:.2f} [{r.lo:.2f}, {r.hi:.2f}] | {r.n} |"
                for r in summary.itertuples()
            ),
            "",
            f"Paired accuracy tests past the trained context (exact McNemar; Holm over all {len(tests)} tests of the "
            "run; MDE at 80% power):",
            "",
            "| comparison | n | accuracy | right only in a / only in b | p | Holm p | separated | MDE |",
            "|---|---|---|---|---|---|---|---|",
            *(
                f"| {r.comparison} | {r.n} | {r.acc_a:.2f} vs {r.acc_b:.2f} | {r.only_a} / {r.only_b} | {_p(r.p)} | "
                f"{_p(r.p_holm)} | {'yes' if r.separated else 'no'} | {r.mde:.2f} |"
                for r in tests.itertuples()
                if r.factor_a * base > trained and r.layout_a == r.layout_b
            ),
            "",
            f"Head retention (distractors between, sink-free labels, {prompts} prompts, {draws:,} matched random "
            "draws per group, Holm over each measure's groups at every length):",
            "",
            "| measure | group | heads | tokens | attention | kept (pooled) [95%] | random median | Holm p | verdict |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        at = groups[
            (groups.layout == "between")
            & (groups.ranking == "sink-free")
            & groups.length.isin(around)
            & groups.group.isin(["positional", "symbolic", "mixed", "sink"])
            & groups.measure.isin(["attn_answer", "attn_tracked"])
        ]
        for r in at.itertuples():
            tested = not pd.isna(r.p_holm)
            lines.append(
                f"| {MEASURE_NAMES[r.measure]} | {r.group} | {r.heads} | {r.length:,} | {r.level:.3f} | "
                f"{r.value:.2f} [{r.lo:.2f}, {r.hi:.2f}] | {f'{r.null_median:.2f}' if tested else '-'} | "
                f"{_p(r.p_holm)} | {r.verdict if tested else 'untested (no disjoint random set)'} |"
            )
    return "\n".join([*lines, "", PAST_END])


CAUSAL_BEGIN, CAUSAL_END = "<!-- causal-estimates:begin -->", "<!-- causal-estimates:end -->"
CAUSAL_SHOWN = ("acc_drop", "length_effect")
"""The measures the block shows (causal/estimates.parquet holds the margin change too)."""


def causal_block() -> str:
    """The causal block: per model with a causal/estimates.parquet, the calibration of the AtP estimates
    against real ablation at every causal length, then each named group's estimated accuracy drop at the
    base and the longest length and its length effect at the longest, against its pool's estimated draws
    (Holm over the (source, k, mode) family), with the real ablation's value and the verdict it gets
    against the same null beside it."""
    lines = [CAUSAL_BEGIN]
    for model, study in MODELS.items():
        if not (StudyDir(study).file("causal", "estimates")).is_file():
            continue
        table = pd.read_parquet(StudyDir(study).file("causal", "estimates"))
        calibration = pd.read_parquet(StudyDir(study).file("causal", "calibration"))
        est = table[table.source == "estimate"]
        real = table[table.source == "real"]
        low, top = int(est.factor.min()), int(est.factor.max())
        lines += [
            "",
            f"**{model}** (docs/results/{study.name}/causal/): {int(est.prompts.max())} prompts a length, "
            f"k = {', '.join(str(k) for k in sorted(est.k.unique()))}, {', '.join(sorted(est['mode'].unique()))}"
            f"-ablation, {int(est.draws.max()):,} estimated random sets per pool (matched on layer and layer kind); "
            f"{int(real.draws.max())} of them and every named group also ablated for real.",
            "",
            "Calibration, estimated (sum of the heads' AtP effects) against real margin change over prompt x set:",
            "",
            "| factor | tokens | sets | points | Pearson | Spearman | slope real / estimate | answers agree | "
            "verdicts agree | trusted |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {r.factor}x | {r.length:,} | {r.sets} | {r.points} | {r.pearson:.2f} | {r.spearman:.2f} | "
                f"{r.slope:.2f} | {r.acc_agreement:.2f} | {r.verdicts_agree} of {r.verdicts} | "
                f"{'yes' if r.trusted else 'no'} |"
                for r in calibration.sort_values(["k", "mode", "factor"]).itertuples()
            ),
            "",
            f"Named groups against their pools' estimated draws (Holm over the {int(est.family.max())} tests of the "
            "family; MDE at its level):",
            "",
            "| ranking | group | measure | factor | estimate | null median [95%] | Holm p | verdict | MDE | "
            "real | real's verdict | agree |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        shown = est[
            est.measure.isin(CAUSAL_SHOWN)
            & (
                (est.factor.isin([low, top]) & (est.measure == "acc_drop"))
                | ((est.factor == top) & (est.measure == "length_effect"))
            )
        ].sort_values(["ranking", "group", "measure", "factor"])
        for r in shown.itertuples():
            lines.append(
                f"| {r.ranking} | {r.group} | {r.measure} | {r.factor}x | {r.value:+.2f} | {r.null_median:+.2f} "
                f"[{r.null_lo:+.2f}, {r.null_hi:+.2f}] | {_p(r.p_holm)} | {r.verdict} | {r.mde:.2f} | "
                f"{r.real_value:+.2f} | {r.real_verdict} | {'yes' if r.agrees else 'no'} |"
            )
    return "\n".join([*lines, "", CAUSAL_END])


def write(path: Path, begin: str = BEGIN, end: str = END, make=block) -> None:
    """Rewrite the block of `path` between `begin` and `end` (both kept) with `make()`, which starts with `begin`
    and ends with `end`."""
    text = path.read_text()
    if begin not in text or end not in text:
        sys.exit(f"{path} has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    path.write_text(head + make() + rest.split(end, 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="rewrite the llm-verdicts block of this Markdown file")
    args = parser.parse_args()
    if args.write:
        write(args.write)
        write(args.write, PAST_BEGIN, PAST_END, past_context_block)
        write(args.write, CAUSAL_BEGIN, CAUSAL_END, causal_block)
    else:
        print(block())
        print(past_context_block())
        print(causal_block())


if __name__ == "__main__":
    main()
