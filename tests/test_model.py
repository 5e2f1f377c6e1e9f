"""posym.core.model: GPT-J construction, checkpoint discovery and the safe loader."""

import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPTJForCausalLM

from posym.core.model import ModelConfig, build_model, gptj_config
from posym.errors import PosymError
from posym.models import list_checkpoints, load_checkpoint

TINY = ModelConfig(n_layer=2, n_head=2, n_embd=32, dropout=0.1)


def test_build_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = (build_model(TINY, 20, s) for s in (0, 0, 1))
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert a.training


def test_paper_shape_and_multi_head_rotary():
    paper = gptj_config(ModelConfig(), 137)
    assert (paper.n_layer, paper.n_head, paper.n_embd, paper.rotary_dim) == (12, 1, 128, 128)
    assert (paper.n_inner, paper.activation_function, paper.resid_pdrop) == (512, "gelu_new", 0.1)
    assert paper.n_positions >= 4096
    # rotary_dim None must mean "the whole head" (16 dims here), not n_embd, or several heads break
    assert gptj_config(TINY, 20).rotary_dim == 16
    model = build_model(TINY, 20, 0).eval()
    out = model(torch.randint(1, 20, (2, 9))).logits  # [2, 9, vocab]
    assert out.shape == (2, 9, 20) and torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(n_embd=30, n_head=4), r"n_embd \(30\) must be divisible by model\.n_head \(4\)"),
        (dict(rotary_dim=3), r"rotary_dim must be an even number between 2 and the head dimension 128, got 3"),
        (dict(rotary_dim=64, n_embd=32), r"between 2 and the head dimension 32, got 64"),
        (dict(dropout=1.0), r"model\.dropout must be in \[0, 1\), got 1\.0"),
        (dict(embd_dropout=-0.1), r"embd_dropout must be in \[0, 1\), got -0\.1"),
        (dict(attn_dropout=1.0), r"attn_dropout must be in \[0, 1\), got 1\.0"),
        (dict(activation="nope"), "'nope' is not a transformers activation name"),
        (dict(n_layer=0), "n_layer must be a positive integer, got 0"),
        (dict(rope_base=1.0), r"rope_base must be a number > 1, got 1\.0"),
        (dict(rope_bands=[[0, 4]]), r"1 <= first <= last <= 64, got \[0, 4\]"),
        (dict(nope_from=13), r"nope_from must be a layer index in 0\.\.12, got 13"),
    ],
)
def test_bad_model_config(kwargs, message):
    with pytest.raises(PosymError, match=message):
        ModelConfig(**kwargs)


def test_each_dropout_site_reaches_gptj_and_defaults_to_the_shared_value():
    config = gptj_config(ModelConfig(dropout=0.2, embd_dropout=0.0, attn_dropout=0.05), 20)
    assert (config.embd_pdrop, config.attn_pdrop, config.resid_pdrop) == (0.0, 0.05, 0.2)
    model = build_model(ModelConfig(n_layer=1, n_embd=16, embd_dropout=0.0, resid_dropout=0.3), 20, 0)
    assert model.transformer.drop.p == 0.0 and model.transformer.h[0].attn.resid_dropout.p == 0.3
    assert model.transformer.h[0].attn.attention_dropout == 0.1 and model.transformer.h[0].mlp.dropout.p == 0.3


def _fake_run(tmp_path, steps):
    run = tmp_path / "run"
    model = build_model(TINY, 20, 0)
    for s in steps:
        model.save_pretrained(run / "checkpoints" / f"step-{s:08d}")
    (run / "config.yaml").write_text("preset: x\n")
    (run / "checkpoints" / ".step-00000009.tmp-abc").mkdir()  # a half-written checkpoint: ignored
    return run, model


def test_list_and_load_checkpoints(tmp_path):
    run, model = _fake_run(tmp_path, [8, 0, 2])
    assert [s for s, _ in list_checkpoints(run)] == [0, 2, 8]
    assert list_checkpoints(tmp_path / "nothing") == []
    loaded, info = load_checkpoint(run)
    assert info["path"].name == "step-00000008" and info["step"] == 8 and info["run_dir"] == run
    assert info["task_config"] is None and not loaded.training
    x = torch.randint(1, 20, (3, 7))
    assert torch.allclose(loaded(x).logits, model.eval()(x).logits, atol=1e-6)
    _, info = load_checkpoint(run, step=2)
    assert info["step"] == 2
    with pytest.raises(PosymError, match="available steps: 0, 2, 8"):
        load_checkpoint(run, step=5)
    _, info = load_checkpoint(run / "checkpoints" / "step-00000000")
    assert info["run_dir"] == run and info["step"] == 0


def test_loader_rejects_bad_directories(tmp_path):
    with pytest.raises(PosymError, match="does not exist"):
        load_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PosymError, match="neither a model"):
        load_checkpoint(tmp_path / "empty")
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20))
    gpt2.save_pretrained(tmp_path / "gpt2")
    with pytest.raises(PosymError, match="not a GPT-J model"):
        load_checkpoint(tmp_path / "gpt2")
    build_model(TINY, 20, 0).save_pretrained(tmp_path / "corrupt")
    (tmp_path / "corrupt" / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(PosymError, match="cannot load"):
        load_checkpoint(tmp_path / "corrupt")
    (tmp_path / "corrupt" / "model.safetensors").unlink()
    (tmp_path / "corrupt" / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(PosymError, match="never loads pickled"):
        load_checkpoint(tmp_path / "corrupt")
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "config.json").write_text("{not json")
    with pytest.raises(PosymError, match="not valid JSON"):
        load_checkpoint(tmp_path / "badjson")


def test_plain_transformers_reads_a_posym_checkpoint(tmp_path):
    model = build_model(TINY, 20, 3).eval()
    model.save_pretrained(tmp_path / "ck")
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["model_type"] == "gptj"
    plain = GPTJForCausalLM.from_pretrained(tmp_path / "ck").eval()
    x = torch.randint(1, 20, (2, 11))
    assert torch.equal(plain(x).logits, model(x).logits)
