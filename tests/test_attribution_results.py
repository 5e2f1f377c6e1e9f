"""The committed validation of AtP / AtP* on the real models (docs/results/attribution/, written by
scripts/attribution_validation.py collect) and the benchmark (docs/benchmarks/attribution_speed.json), read
back: the summaries follow from the per-prompt tables, docs/attribution.md shows exactly these tables, and
its stated verdicts follow from them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from posym.commands.attribute import disagreements, speed_markdown, validation_markdown, validation_summary

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "attribution"
DOC = ROOT / "docs" / "attribution.md"
SPEED = ROOT / "docs" / "benchmarks" / "attribution_speed.json"


def block(name: str) -> str:
    match = re.search(rf"<!-- {name}:begin -->\n(.*?)\n<!-- {name}:end -->", DOC.read_text(encoding="utf-8"), re.S)
    assert match, f"docs/attribution.md has no {name} block"
    return match.group(1)


def jobs() -> list[tuple[str, str]]:
    return sorted(
        (m.group(1), m.group(2))
        for p in RESULTS.glob("heads_*.parquet")
        if (m := re.match(r"heads_(.+)_(\d+x)\.parquet", p.name))
    )


def test_every_model_is_validated_on_enough_prompts():
    found = jobs()
    assert {model for model, _ in found} == {"smollm2-135m", "gemma3-270m"}
    summary = pd.read_parquet(RESULTS / "summary.parquet")
    heads = {"smollm2-135m": 270, "gemma3-270m": 72}
    for model, factor in found:
        frame = pd.read_parquet(RESULTS / f"heads_{model}_{factor}.parquet")
        assert frame.groupby("prompt").size().eq(heads[model]).all()  # every head of every prompt
        stated = summary[(summary.model == model) & (summary.factor == int(factor[:-1]))]
        assert set(stated.n_prompts) == {frame.prompt.nunique()}


@pytest.mark.parametrize("job", jobs())
def test_summary_follows_from_the_per_prompt_tables(job):
    model, factor = job
    heads = pd.read_parquet(RESULTS / f"heads_{model}_{factor}.parquet")
    groups = pd.read_parquet(RESULTS / f"groups_{model}_{factor}.parquet")
    single, grouped = validation_summary(heads, groups)
    where = lambda t: t[(t.model == model) & (t.factor == int(factor[:-1]))].drop(columns=["model", "factor"])  # noqa: E731
    stated = where(pd.read_parquet(RESULTS / "summary.parquet")).reset_index(drop=True)
    stated_groups = where(pd.read_parquet(RESULTS / "groups_summary.parquet")).reset_index(drop=True)
    pd.testing.assert_frame_equal(single.reset_index(drop=True), stated, check_dtype=False, atol=1e-12)
    pd.testing.assert_frame_equal(grouped.reset_index(drop=True), stated_groups, check_dtype=False, atol=1e-12)


def test_docs_show_the_committed_tables():
    summary = pd.read_parquet(RESULTS / "summary.parquet")
    groups = pd.read_parquet(RESULTS / "groups_summary.parquet")
    worst = pd.concat(
        [
            disagreements(pd.read_parquet(RESULTS / f"heads_{model}_{factor}.parquet")).assign(
                model=model, factor=int(factor[:-1])
            )
            for model, factor in jobs()
        ],
        ignore_index=True,
    )
    assert block("attribution-validation") == validation_markdown(summary, groups, worst)
    assert block("attribution-speed") == speed_markdown(json.loads(SPEED.read_text()))


def test_stated_verdicts_follow():
    """The sentences of docs/attribution.md's 'What the validation shows', as numbers: each assert is one
    sentence's claim, and the numbers the sentences quote are checked against the tables."""
    summary = pd.read_parquet(RESULTS / "summary.parquet").set_index(["model", "factor", "method"])
    groups = pd.read_parquet(RESULTS / "groups_summary.parquet").set_index(["model", "factor", "kind"])
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    for model, name in (("smollm2-135m", "SmolLM2"), ("gemma3-270m", "Gemma")):
        atp, star = summary.loc[(model, 1, "atp")], summary.loc[(model, 1, "atp*")]
        # 1. AtP's signed prompt-mean effects rank the heads as real ablation does
        assert atp.spearman_signed >= 0.9, model
        assert f"{atp.spearman_signed:.2f} ({name})" in text
        # 2. GradDrop finds no more of the true top 10% than plain AtP
        assert star.recall_top <= atp.recall_top, model
        # 3. the largest disagreement: a head whose harm AtP underestimates
        heads = pd.read_parquet(RESULTS / f"heads_{model}_1x.parquet")
        worst = disagreements(heads, 1).iloc[0]
        assert worst.exact < 0 and abs(worst.atp) < abs(worst.exact) / 2, model
        assert f"{int(worst.layer)}.{int(worst['head'])} of {name}" in text
        # 4. the sum of AtP over random sets of 8 tracks their real ablation but underestimates it
        random = groups.loc[(model, 1, "random")]
        assert random.pearson >= 0.6 and abs(random.mean_estimate) < abs(random.mean_exact), model
        assert f"{random.mean_estimate:.3f} against {random.mean_exact:.3f} ({name})" in text
    speed = json.loads(SPEED.read_text())["rows"]
    ratios = {(r["model"], r["tokens"]): r["atp_x_forward"] for r in speed}
    star_ratios = {(r["model"], r["tokens"]): r["atp*_x_forward"] for r in speed}
    # 5. AtP costs at most 4 forward passes (the goal) at every model and length; GradDrop more
    assert max(ratios.values()) <= 4.0, ratios
    assert min(star_ratios.values()) > 4.0, star_ratios
    assert np.isfinite(list(ratios.values())).all()


STUDIES = {
    "smollm2-135m": ROOT / "docs" / "results" / "llm-study",
    "gemma3-270m": ROOT / "docs" / "results" / "llm-study-gemma3",
}


@pytest.mark.parametrize("job", jobs())
def test_the_studys_named_groups_are_validated(job):
    """Each job's groups hold the llm-study's four named groups (the K most symbolic / positional heads by its
    sink-free and plain rankings, as its causal stage ablates them) on every prompt of the job."""
    from posym.commands.llm_study.prediction import CAUSAL_GROUPS, RANKINGS, ranked_group

    model, factor = job
    groups = pd.read_parquet(RESULTS / f"groups_{model}_{factor}.parquet")
    prompts = set(pd.read_parquet(RESULTS / f"heads_{model}_{factor}.parquet").prompt)
    heads = pd.read_parquet(STUDIES[model] / "lengths" / "heads.parquet")
    heads = heads[heads.layout == "between"]
    for ranking in RANKINGS:
        for group in CAUSAL_GROUPS:
            rows = groups[groups.kind == f"named {ranking} {group}"]
            want = ",".join(f"{a}.{b}" for a, b in ranked_group(heads, ranking, group, 8))
            assert set(rows.group) == {want} and set(rows.prompt) == prompts and len(rows) == len(prompts)


def test_named_groups_sentence_follows():
    """docs/attribution.md's bullet on the named groups: at 1x the sum of AtP underestimates every named
    group's real effect, the positional groups the most; the numbers it quotes are the table's."""
    groups = pd.read_parquet(RESULTS / "groups_summary.parquet").set_index(["model", "factor", "kind"]).sort_index()
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    for model in ("smollm2-135m", "gemma3-270m"):
        named = groups.loc[model, 1]
        named = named[named.index.str.startswith("named ")]
        assert len(named) == 4 and (named.mean_estimate.abs() < named.mean_exact.abs()).all(), model
        share = named.mean_estimate / named.mean_exact
        assert share[share.index.str.endswith("positional")].max() < share[share.index.str.endswith("symbolic")].min()
        for kind in ("named sink-free positional", "named sink-free symbolic"):
            r = named.loc[kind]
            assert f"{r.mean_estimate:.3f} against {r.mean_exact:.3f}" in text, (model, kind)
    wrong = groups.loc[("gemma3-270m", 16, "named sink-free positional")]
    assert wrong.mean_estimate > 0 > wrong.mean_exact
    assert f"{wrong.mean_estimate:+.3f} against {wrong.mean_exact:.3f}" in text
