"""`posym attribute` (posym.commands.attribute) on a tiny Hugging Face model with a word-level tokenizer:
the tables it writes agree with the engine and with real ablations where the engine must be exact, bad
input is one line and exit 2, and `validation_summary` computes what it says on a hand-made table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tiny_llms import run_cli, save_model, tokenizer

from posym import models
from posym.commands.attribute import length_prompts, validation_summary
from posym.core.attribution import head_effects


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("attr") / "llama", "llama", tokenizer())


def test_attribute_command_writes_the_engines_numbers(llama_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        ["attribute", str(llama_dir), "--n", "3", "--factors", "1,2", "--method", "atp*", "--out", str(out)],
        capsys,
        monkeypatch,
    )
    assert code == 0, stderr
    effects = pd.read_parquet(out / "effects.parquet")
    heads = pd.read_parquet(out / "heads.parquet")
    assert len(effects) == 3 * 2 * 2 * 4 and set(effects.factor) == {1, 2}
    assert set(heads.n) == {3} and sorted(heads[heads.factor == 1]["rank"]) == list(range(1, 9))
    assert "1x: largest atp* heads" in stdout
    # the table holds the engine's numbers for the same prompts
    loaded = models.load(llama_dir)
    prompts = length_prompts(loaded, "kv-code", [2], 3)[2]
    direct = head_effects(loaded.model, [p.ids for p in prompts], [p.answer_id for p in prompts], method="atp*")
    stored = effects[effects.factor == 2].sort_values(["prompt", "layer", "head"])
    np.testing.assert_allclose(stored.effect, direct.effect, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(stored.magnitude, direct.magnitude, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "poem"], "poem"),
        (["--factors", "0"], "--factors must lie in 1..64"),
        (["--n", "1"], "at least 2 prompts"),
        (["--metric", "accuracy"], "accuracy"),
    ],
)
def test_attribute_command_bad_input(llama_dir, tmp_path, capsys, monkeypatch, args, message):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["attribute", str(llama_dir), *args, "--out", str(out)], capsys, monkeypatch)
    assert code == 2 and message in stderr and "Traceback" not in stderr
    assert not out.exists()


def test_validation_summary_on_a_hand_made_table():
    # 20 heads on 2 prompts: AtP right on every head but 1.0 and 1.1 (the true top 2), which it misses
    rows = []
    for prompt in (0, 1):
        for h in range(20):
            exact = 10.0 - h * 0.1 if h < 2 else -(20 - h) * 0.1
            atp = exact if h >= 2 else 0.0
            rows.append({"prompt": prompt, "layer": 1, "head": h, "exact": exact, "atp": atp, "atp_star": abs(exact)})
    heads = pd.DataFrame(rows)
    groups = pd.DataFrame({"prompt": [0, 1], "group": ["1.2,1.3", "1.2,1.3"], "kind": "random", "exact": [-3.6, -3.0]})
    single, grouped = validation_summary(heads, groups)
    atp, star = single.set_index("method").loc["atp"], single.set_index("method").loc["atp*"]
    assert atp.k == 2 and atp.recall_top == 0.0 and atp.false_negatives == "1.0,1.1"
    assert star.recall_top == 1.0 and star.false_negatives == "" and star.spearman_abs == pytest.approx(1.0)
    assert grouped.iloc[0].mean_estimate == pytest.approx(-3.5) and grouped.iloc[0].mean_exact == pytest.approx(-3.3)
