"""posym.commands.dynamics: the purity rule on hand-made score tables (against a brute-force reading of the
rule), counts, composition, entropy normalisation, and `posym dynamics` end to end on a tiny run
(scores checked against posym.core.scores on the same checkpoints, accuracy against metrics.parquet)."""

import math

import pandas as pd
import pytest
from cli_runner import run_posym
from tiny_runs import train_tiny

from posym.commands import dynamics
from posym.core import purity as purity_core
from posym.core.scores import label_column
from posym.core.tasks import generate
from posym.errors import PosymError

# (s_pos, s_sym) giving each label at gamma 0.1 AND 0.05, and one that is pure only at gamma 0.1
P, S, M, U, P10 = (1.0, 0.0), (0.0, 1.0), (0.5, 0.5), (1.0, 1.0), (0.93, 0.07)
STEPS = [0, 10, 20, 30, 40]
SEQUENCES = {  # layer -> score pairs over STEPS
    0: [U, P, M, P, P],  # positional, pure for good from 30
    1: [U, S, S, S, S],  # symbolic from 10
    2: [S, S, S, S, M],  # impure at the end: kind none
    3: [P, P, S, S, S],  # changes kind: symbolic from 20
    4: [U, M, P10, P10, P10],  # positional from 20 at gamma 0.1, none at 0.05
}


def _hand_table():
    rows = []
    for layer, pairs in SEQUENCES.items():
        for step, (s_pos, s_sym) in zip(STEPS, pairs):
            k = STEPS.index(step)  # validation and test disagree on the best step
            rows.append(
                {
                    "step": step,
                    "query_mode": "hops",
                    "layer": layer,
                    "head": 0,
                    "s_pos": s_pos,
                    "s_sym": s_sym,
                    "entropy": 1.0 + layer,
                    "val_acc": [0.1, 0.5, 0.9, 0.9, 0.8][k],
                    "acc": [0.1, 0.5, 0.6, 0.7, 0.95][k],
                }
            )
    return purity_core.label(pd.DataFrame(rows))


def _brute_force(labels, steps):
    """The documented rule, read literally: kind = final label if pure; pure_from = the smallest step
    s such that every label at a step >= s equals kind."""
    kind = labels[-1] if labels[-1] in ("positional", "symbolic") else "none"
    if kind == "none":
        return kind, math.nan
    return kind, min(s for k, s in enumerate(steps) if all(x == kind for x in labels[k:]))


def test_purity_rule_on_hand_made_table():
    table = _hand_table()
    pure = purity_core.purity(table)
    expected = {
        0.1: {
            0: ("positional", 30),
            1: ("symbolic", 10),
            2: ("none", None),
            3: ("symbolic", 20),
            4: ("positional", 20),
        },
        0.05: {0: ("positional", 30), 1: ("symbolic", 10), 2: ("none", None), 3: ("symbolic", 20), 4: ("none", None)},
    }
    for r in pure.itertuples():
        kind, start = expected[r.gamma][r.layer]
        assert r.kind == kind
        assert math.isnan(r.pure_from) if start is None else r.pure_from == start
        labels = table[table.layer == r.layer].sort_values("step")[label_column(r.gamma)].tolist()
        ref_kind, ref_start = _brute_force(labels, STEPS)
        assert r.kind == ref_kind and (r.pure_from == ref_start or (math.isnan(ref_start) and math.isnan(r.pure_from)))


def test_purity_counts_are_cumulative_and_instantaneous():
    table = _hand_table()
    counts = purity_core.purity_counts(table, purity_core.purity(table))
    g = counts[(counts.gamma == 0.1)].set_index("step")
    assert g.positional.tolist() == [0, 0, 1, 2, 2]  # layer 4 from 20, layer 0 from 30
    assert g.symbolic.tolist() == [0, 1, 2, 2, 2]  # layer 1 from 10, layer 3 from 20
    assert g.positional_now.tolist() == [1, 2, 1, 2, 2]
    assert g.symbolic_now.tolist() == [1, 2, 3, 3, 2]
    assert (g.heads == 5).all()
    assert counts[counts.gamma == 0.05].set_index("step").positional.tolist() == [0, 0, 0, 1, 1]


def test_max_accuracy_composition_and_layer_ranges():
    table = _hand_table()
    assert purity_core.max_accuracy_step(table) == 20  # earliest of the tied validation maxima (test: 40)
    heads, summary = purity_core.composition(table, 20)
    at_max = summary[(summary.gamma == 0.1) & (summary.stage == "max_acc")].iloc[0]
    assert at_max.step == 20 and at_max.heads == 5
    assert (at_max.frac_symbolic, at_max.layers_symbolic) == (0.6, "L1-L3")
    assert (at_max.frac_positional, at_max.layers_positional) == (0.2, "L4")
    assert (at_max.frac_mixed, at_max.layers_mixed) == (0.2, "L0")
    end = summary[(summary.gamma == 0.05) & (summary.stage == "end")].iloc[0]
    assert (end.layers_positional, end.layers_symbolic, end.layers_mixed) == ("L0", "L1, L3", "L2, L4")
    assert len(heads) == 2 * 2 * 5
    assert purity_core.layer_ranges([5, 0, 1, 2, 3, 7, 8]) == "L0-L3, L5, L7-L8"
    assert purity_core.layer_ranges([]) == ""


def test_normalised_entropy():
    table = pd.DataFrame(
        {"query_mode": "last", "layer": [0, 0, 0, 1, 1], "head": 0, "entropy": [2.0, 1.0, 1.5, 0.7, 0.7]}
    )
    assert purity_core.normalised_entropy(table).tolist() == [1.0, 0.0, 0.5, 0.0, 0.0]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("dyn"), "number", steps=60, every=30, eval_size=100)


def test_dynamics_tables_agree_with_scores_and_metrics(tiny_run):
    from posym.core.scores import score_model
    from posym.models import list_checkpoints, load_checkpoint
    from posym.prompts import score_prompts

    table, per_prompt = dynamics.collect_dynamics(tiny_run, n_prompts=8, seed=3)
    steps = [s for s, _ in list_checkpoints(tiny_run)]
    assert sorted(table.step.unique()) == steps == [0, 1, 2, 4, 8, 16, 30, 60]
    assert len(table) == len(steps) * 4 * 2  # steps x query modes x layers (one head)
    metrics = pd.read_parquet(tiny_run / "metrics.parquet").set_index("step")
    for step, g in table.groupby("step"):
        assert (g.acc == metrics.acc[step]).all() and (g.acc_hop4 == metrics.acc_hop4[step]).all()
        assert (g.val_acc == metrics.val_acc[step]).all()
    # the scores of one checkpoint, recomputed directly with posym.core.scores
    step = 60
    model, info = load_checkpoint(tiny_run, step=step)
    ids, hops = score_prompts(model, task_config=info["task_config"], n_prompts=8, seed=3, queries="hops")
    direct = score_model(model, ids, hops)
    last = direct[direct["query"] == 16].groupby("layer").s_pos.mean()
    hop_means = direct.groupby(["layer", "prompt"]).s_sym.mean().groupby("layer").mean()
    at = table[table.step == step].set_index(["query_mode", "layer"])
    for layer in (0, 1):
        assert at.loc[("last", layer), "s_pos"] == pytest.approx(last[layer], abs=1e-12)
        assert at.loc[("hops", layer), "s_sym"] == pytest.approx(hop_means[layer], abs=1e-12)
    # roles, read off each prompt's chain: last = the query, target = the last pointer of a chain of
    # >= 2 hops, inner = the pointers between; a head's role score is the mean over prompts with one
    chains = generate(info["task_config"], 8, 3, split="test").chain
    role_of = {}
    for prompt, chain in enumerate(chains):
        pointers = [int(p) for p in chain if p >= 0][:-1]
        for k, position in enumerate(pointers):
            role_of[prompt, position] = "last" if k == 0 else ("target" if k == len(pointers) - 1 else "inner")
    direct["role"] = [role_of[key] for key in zip(direct.prompt, direct["query"])]
    for role in ("last", "target", "inner"):
        ref = (
            direct[direct.role == role].groupby(["layer", "prompt"])[["s_pos", "s_sym"]].mean().groupby("layer").mean()
        )
        for layer in (0, 1):
            assert at.loc[(role, layer), "s_pos"] == pytest.approx(ref.s_pos[layer], abs=1e-12)
            assert at.loc[(role, layer), "s_sym"] == pytest.approx(ref.s_sym[layer], abs=1e-12)
    # prompt purity: the fraction of prompts whose own scores pass the gamma rule
    own = direct.groupby(["layer", "prompt"])[["s_pos", "s_sym"]].mean()
    for layer in (0, 1):
        o = own.loc[layer]
        expected = sum(1 for r in o.itertuples() if r.s_pos >= 0.9 and r.s_sym <= 0.1) / len(o)
        assert at.loc[("hops", layer), "pure_positional_gamma_0p1"] == pytest.approx(expected, abs=1e-12)
        expected = sum(1 for r in o.itertuples() if r.s_sym >= 0.95 and r.s_pos <= 0.05) / len(o)
        assert at.loc[("hops", layer), "pure_symbolic_gamma_0p05"] == pytest.approx(expected, abs=1e-12)
    prompts_per_mode = per_prompt[per_prompt.step == step].groupby("query_mode").prompt.nunique()
    hop_counts = [int((c >= 0).sum()) - 1 for c in chains]
    assert prompts_per_mode.to_dict() == {
        "hops": 8,
        "last": 8,
        "target": sum(h >= 2 for h in hop_counts),
        "inner": sum(h >= 3 for h in hop_counts),
    }
    assert table.entropy_norm.between(0, 1).all()
    again, _ = dynamics.collect_dynamics(tiny_run, n_prompts=8, seed=3)
    pd.testing.assert_frame_equal(table, again)


def test_ablate_and_dynamics_give_every_head_the_same_scores_and_label(tiny_run):
    """`posym ablate` labels (core.interventions.label_heads) and dynamics' hop-query table use one
    rule, the prompt mean: equal scores to 1e-12 and equal labels at both paper gammas. The prompts
    have 1 to 4 hops, so the pooled row mean the old summarize used differs from the prompt mean."""
    from posym.core.interventions import label_heads
    from posym.core.scores import score_model
    from posym.core.tasks import generate
    from posym.models import load_checkpoint

    table, _ = dynamics.collect_dynamics(tiny_run, n_prompts=8, seed=3)
    model, info = load_checkpoint(tiny_run, step=60)
    at = table[(table.step == 60) & (table.query_mode == "hops")].set_index(["layer", "head"])
    for gamma in dynamics.GAMMAS:
        labels = label_heads(model, info["task_config"], n_prompts=8, seed=3, gamma=gamma).set_index(["layer", "head"])
        assert list(labels.index) == list(at.index)
        assert labels.s_pos.to_numpy() == pytest.approx(at.s_pos.to_numpy(), abs=1e-12)
        assert labels.s_sym.to_numpy() == pytest.approx(at.s_sym.to_numpy(), abs=1e-12)
        assert labels.label.tolist() == at[label_column(gamma)].tolist()
    # score_model takes the task samples themselves at their hop queries, as `posym score --queries hops`
    samples = generate(info["task_config"], 8, 3, split="test")
    frame = score_model(model, samples, "hops")
    assert len(set(frame.groupby("prompt").size())) > 1  # prompts differ in their number of hop queries
    pooled = frame.groupby("layer").s_pos.mean().to_numpy()
    assert abs(pooled - at.s_pos.to_numpy()).max() > 1e-9  # so the rule matters on this run


def test_cli_dynamics_end_to_end(tiny_run, monkeypatch, capsys):
    import json

    assert run_posym(monkeypatch, "dynamics", tiny_run, "--n", 5) == 0
    assert "checkpoints in" in capsys.readouterr().out
    out = tiny_run / "analysis"
    result = json.loads((out / "dynamics.json").read_text())
    assert result["steps"] == [0, 1, 2, 4, 8, 16, 30, 60] and result["settings"]["n_prompts"] == 5
    for name in ("dynamics", "dynamics_prompts", "purity", "purity_counts", "composition", "composition_summary"):
        assert len(pd.read_parquet(out / f"{name}.parquet")) > 0
    assert result["max_acc_chosen_on"] == "val" and 0 <= result["max_acc_val"] <= 1
    heads = pd.read_parquet(out / "composition.parquet")
    assert set(heads.query_mode) == {"hops", "last", "target", "inner"}
    assert heads.pure_positional.between(0, 1).all() and heads.pure_symbolic.between(0, 1).all()
    for name in ("fig2a_accuracy", "fig2b_scores", "fig6_entropy", "fig7_purity", "fig7_roles"):
        assert (out / f"{name}.png").stat().st_size > 1000 and (out / f"{name}.svg").is_file()


def test_bad_run_directories_are_posym_errors(tmp_path, monkeypatch, capsys):
    with pytest.raises(PosymError, match="no checkpoints"):
        dynamics.collect_dynamics(tmp_path)
    assert run_posym(monkeypatch, "dynamics", tmp_path / "missing") == 2
    err = capsys.readouterr().err
    assert err.startswith("posym: error:") and err.count("\n") == 1
