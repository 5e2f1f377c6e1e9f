"""posym.core.discrepancy: gaps of trained and real heads equal the model's own attention, by length."""

import json
import math

import pandas as pd
import pytest
import torch
from cli_runner import run_posym
from reference_scores import attention_rows
from tiny_models import KINDS, random_prompts, tiny_model
from tiny_runs import train_tiny

from posym.core.discrepancy import head_gaps, summarize_gaps


@pytest.mark.parametrize("kind", KINDS)
def test_gaps_equal_the_models_own_attention(kind):
    """Reference: the log-ratio of the two largest attention weights the model's eager kernel computes
    (the softmax leaves logit differences unchanged)."""
    model = tiny_model(kind)
    prompts = random_prompts([7, 9, 9], seed=1)
    frame = head_gaps(model, prompts, "all")
    heads = model.config.num_attention_heads
    assert len(frame) == (5 + 7 + 7) * 2 * heads
    worst = 0.0
    for k, ids in enumerate(prompts):
        for layer in range(2):
            probs = attention_rows(model, ids, layer)  # [heads, T, T]
            rows = frame[(frame.prompt == k) & (frame.layer == layer)]
            for r in rows.itertuples():
                top = probs[r.head, r.query, : r.query + 1].topk(2)
                want = math.log(top.values[0]) - math.log(top.values[1])
                assert r.keys == r.query + 1 and r.top_key == int(top.indices[0])
                worst = max(worst, abs(r.gap - want))
    assert worst <= 1e-6, worst  # GPT-J's eager kernel computes its logits in float32
    assert (frame.gap >= 0).all() and frame.gap.max() > 0.5  # peaked heads: the test can tell gaps apart


def test_summary_on_a_hand_made_table():
    frame = pd.DataFrame(
        {"layer": [0, 0, 0, 0, 1], "head": [0] * 5, "length": [17, 17, 17, 34, 17], "gap": [0.5, 0.1, 0.3, 2.0, 1.0]}
    )
    out = summarize_gaps(frame).set_index(["layer", "length"])
    assert out.loc[(0, 17), "delta"] == pytest.approx(0.1) and out.loc[(0, 17), "gap_max"] == pytest.approx(0.5)
    assert out.loc[(0, 17), "gap_q50"] == pytest.approx(0.3) and out.loc[(0, 17), "inputs"] == 3
    assert out.loc[(0, 34), "gap_mean"] == pytest.approx(2.0) and len(out) == 3


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("gap"), "number", steps=20, every=10, model={"n_positions": 128})


def test_cli_discrepancy_on_a_run_by_length(tiny_run, monkeypatch, capsys):
    assert run_posym(monkeypatch, "discrepancy", tiny_run, "--lengths", "17,34,68", "--n", 6) == 0
    assert "median top-1 minus top-2" in capsys.readouterr().out
    out = tiny_run / "discrepancy"
    gaps, summary = pd.read_parquet(out / "gaps.parquet"), pd.read_parquet(out / "discrepancy.parquet")
    assert sorted(gaps.length.unique()) == [17, 34, 68] and (gaps["keys"] == gaps["length"]).all()
    assert gaps.groupby("length").prompt.nunique().eq(6).all()
    assert len(summary) == 3 * 2 and {"delta", "gap_q05", "gap_q50", "gap_q95", "gap_max"} <= set(summary.columns)
    info = json.loads((out / "discrepancy.json").read_text())
    assert info["settings"]["lengths"] == [17, 34, 68] and info["task"] == "number" and "config_hash" in info
    assert (out / "fig_discrepancy.png").stat().st_size > 0 and (out / "fig_discrepancy.svg").is_file()
    # the same questions at every length: the last-token query reads the same answer window
    again = torch.tensor(gaps[(gaps.length == 17)].gap.to_numpy())
    assert run_posym(monkeypatch, "discrepancy", tiny_run, "--lengths", "17", "--n", 6, "--out", out / "b") == 0
    assert torch.equal(again, torch.tensor(pd.read_parquet(out / "b" / "gaps.parquet").gap.to_numpy()))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lengths", "17,256"], "exceeds the model's position table of 128"),
        (["--lengths", "10"], "shorter than the run's training length"),
        (["--queries", "some"], "'some' is not one of 'last', 'hops', 'all'"),
    ],
)
def test_cli_discrepancy_bad_input_is_one_line(tiny_run, tmp_path, monkeypatch, capsys, args, message):
    assert run_posym(monkeypatch, "discrepancy", tiny_run, *args, "--out", tmp_path / "x") == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and not (tmp_path / "x").exists()


def test_cli_discrepancy_on_a_hugging_face_dir(tmp_path, monkeypatch, capsys):
    from tiny_llms import save_model, tokenizer

    model_dir = save_model(tmp_path / "qwen", "qwen2", tokenizer())
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": list(range(3, 3 + n))}) + "\n" for n in (9, 12, 12)))
    assert run_posym(monkeypatch, "discrepancy", model_dir, "--prompts", prompts, "--out", tmp_path / "o") == 0
    summary = pd.read_parquet(tmp_path / "o" / "discrepancy.parquet")
    assert sorted(summary.length.unique()) == [9, 12] and summary[summary.length == 12].inputs.eq(2).all()
    capsys.readouterr()
    assert run_posym(monkeypatch, "discrepancy", model_dir, "--out", tmp_path / "o2") == 2
    assert "give --prompts" in capsys.readouterr().err
    assert run_posym(monkeypatch, "discrepancy", model_dir, "--prompts", prompts) == 2
    assert "give --out" in capsys.readouterr().err
