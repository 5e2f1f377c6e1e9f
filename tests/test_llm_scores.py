"""posym.commands.llm_scores and the llm-scores command on tiny random-init models built in the test (tests/tiny_llms.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from reference_scores import channel_dims, reference_swap_scores
from tiny_llms import run_cli, save_model, tokenizer

from posym import models as model_specs
from posym import prompts as prompt_sets
from posym.commands import llm_scores
from posym.core.scores import head_details
from posym.cli import parse_head_pairs
from posym.errors import PosymError

# ---- tiny models ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm")
    words = tokenizer()
    dirs = {kind: save_model(root / kind, kind, words) for kind in ("llama", "qwen2", "neox", "gptj", "gpt2")}
    dirs["pickle"] = save_model(root / "pickle", "llama", words, pickle=True)
    dirs["short"] = save_model(root / "short", "llama", words, positions=16)
    dirs["notok"] = save_model(root / "notok", "llama", words)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dirs["notok"] / name).unlink()
    return dirs


# ---- loading and errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,reason",
    [
        ("gpt2", "rotary position embeddings"),
        ("notok", "no tokenizer"),
        ("pickle", "--allow-pickle"),
    ],
)
def test_bad_model_dirs_exit_2(models, kind, reason, capsys, monkeypatch):
    code, _, err = run_cli(["llm-scores", models[kind], "--n", 1], capsys, monkeypatch)
    assert code == 2 and reason in err and err.count("\n") == 1


def test_pickle_weights_load_only_with_flag(models):
    with pytest.raises(PosymError, match="pickle"):
        model_specs.load(models["pickle"], device="cpu")
    legacy = model_specs.load(models["pickle"], device="cpu", allow_pickle=True)
    same = model_specs.load(models["llama"], device="cpu")  # same seed, same weights, safetensors
    for a, b in zip(legacy.model.parameters(), same.model.parameters()):
        assert torch.equal(a, b)


def test_prompt_longer_than_positions_exit_2(models, capsys, monkeypatch):
    code, _, err = run_cli(["llm-scores", models["short"], "--n", 1], capsys, monkeypatch)
    assert code == 2 and "only 16 positions" in err


def test_missing_dir_and_bad_options(models, tmp_path):
    with pytest.raises(PosymError, match="config.json"):
        model_specs.check_model_dir(tmp_path)
    with pytest.raises(PosymError, match="float32, bfloat16 or float64"):
        model_specs.load(models["llama"], dtype="float16")
    with pytest.raises(PosymError, match="LAYER.HEAD"):
        parse_head_pairs("1-2")
    assert parse_head_pairs("0.1, 5.3") == [(0, 1), (5, 3)]


def test_bfloat16_load(models):
    loaded = model_specs.load(models["qwen2"], device="cpu", dtype="bfloat16")
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


# ---- prompts ----------------------------------------------------------------------------------


def test_binding_prompts_are_consistent_and_seeded():
    prompts = prompt_sets.binding_prompts(30, n_facts=5, seed=3)
    assert prompts == prompt_sets.binding_prompts(30, n_facts=5, seed=3)
    assert prompts != prompt_sets.binding_prompts(30, n_facts=5, seed=4)
    for p in prompts:
        facts, question = p.text.split(" What colour does ")
        pairs = dict(f.split(" likes ") for f in facts.rstrip(".").split(". "))
        assert len(pairs) == 5 and len(set(pairs.values())) == 5
        assert question == f"{p.focus} like? {p.focus} likes" and pairs[p.focus] == p.answer


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "Alice likes red", "focus": "Alice"}\n\n{"text": "x y z", "answer": "w"}\n')
    first, second = prompt_sets.read_text_prompts(path)
    assert (first.focus, second.answer) == ("Alice", "w")
    path.write_text('{"txt": "oops"}\n')
    with pytest.raises(PosymError, match="line 1"):
        prompt_sets.read_text_prompts(path)


def test_name_query_is_final_token_of_the_name(models):
    loaded = model_specs.load(models["llama"], device="cpu")
    prompt = prompt_sets.binding_prompts(1, seed=5)[0]
    ids = loaded.tokenizer(prompt.text).input_ids
    position = prompt_sets.query_position(loaded, prompt, "name")
    assert loaded.tokenizer.decode([ids[position]]) == prompt.focus
    assert position == len(ids) - 2  # "... Henry likes": the name is second to last
    assert prompt_sets.query_position(loaded, prompt, "last") == len(ids) - 1


# ---- scores on real architectures ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,prompts", [("llama", "binding"), ("neox", "number"), ("qwen2", "letter"), ("gptj", "binding")]
)
def test_llm_scores_end_to_end(models, kind, prompts, tmp_path, capsys, monkeypatch):
    out = tmp_path / kind
    code, stdout, err = run_cli(
        [
            "llm-scores",
            models[kind],
            "--prompts",
            prompts,
            "--n",
            2,
            "--heads",
            "1.2,0.0",
            "--query",
            "name" if prompts == "binding" else "last",
            "--device",
            "cpu",
            "--out",
            out,
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0, err
    frame = pd.read_parquet(out / "scores.parquet")
    assert len(frame) == 2 * 2 * 4 and frame[["s_pos", "s_sym"]].notna().all().all()
    heads = pd.read_parquet(out / "heads.parquet")
    layers = pd.read_parquet(out / "layers.parquet")
    for layer, rows in heads.groupby("layer"):  # the per-layer medians, recomputed by hand
        got = layers.set_index("layer").loc[layer]
        assert got.median_s_pos == pytest.approx(np.median(rows.s_pos))
        assert got.median_s_sym == pytest.approx(np.median(rows.s_sym))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pearson_r"] == pytest.approx(np.corrcoef(heads.s_pos, heads.s_sym)[0, 1])
    planes = pd.read_parquet(out / "planes.parquet")
    rotary = {"llama": 8, "qwen2": 8, "neox": 4, "gptj": 4}[kind]
    assert len(planes) == 2 * (rotary // 2 + (rotary < 8))  # planes + one position-free channel
    for name in ("heads.png", "heads.svg", "planes.png", "planes.svg"):
        assert (out / name).stat().st_size > 0


def test_llm_scores_exclude_keys_and_records(models, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sinks"
    code, stdout, err = run_cli(
        ["llm-scores", models["llama"], "--n", 3, "--exclude-keys", "0", "--device", "cpu", "--out", out],
        capsys,
        monkeypatch,
    )
    assert code == 0, err
    assert "heads change label" in stdout
    plain, excluded = (pd.read_parquet(out / f"{name}.parquet") for name in ("scores", "scores_excluded"))
    assert (excluded.n_swaps == plain.n_swaps - plain["query"] + 1).all()  # every swap of key 0 is gone
    assert plain.attn_first.between(0, 1).all() and (plain.attn_top >= plain.attn_first).all()
    sinks = pd.read_parquet(out / "sinks.parquet")
    assert (
        len(sinks) == 2 * 4 and sinks.changed.sum() == json.loads((out / "summary.json").read_text())["label_changes"]
    )
    prompts = pd.read_parquet(out / "prompts.parquet")
    assert (prompts["query"] == prompts.input_ids.map(len) - 1).all() and prompts.text.str.contains("likes").all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["exclude_keys"] == "0" and summary["excluded_keys"] == [0]
    # --details 8 (the default) on 3 prompts: every head's row and 8 heaviest swaps at each query, for posym explore
    loaded = model_specs.load(models["llama"], device="cpu")
    assert summary["details"] == {"prompts": 3, "top": 8}
    assert prompts.tokens.map(list).tolist() == [
        [loaded.tokenizer.decode([int(t)]) for t in i] for i in prompts.input_ids
    ]
    stored = pd.read_parquet(out / "details.parquet")
    fresh = head_details(loaded.model, [list(i) for i in prompts.input_ids], [[int(q)] for q in prompts["query"]])
    assert (
        len(stored) == 3 * 2 * 4
        and (
            stored[["prompt", "query", "layer", "head", "first"]]
            == fresh[["prompt", "query", "layer", "head", "first"]]
        )
        .all()
        .all()
    )
    for column in ("attention", "weight", "after_a", "cos_sym"):
        assert np.abs(np.concatenate(stored[column].to_list()) - np.concatenate(fresh[column].to_list())).max() <= 1e-12


@pytest.mark.parametrize("kind", ["llama", "neox", "gptj"])
def test_planes_match_the_loop_reference(models, kind, tmp_path):
    """planes.parquet of llm-scores (heads in two layers, query at the name) is the prompt mean of each
    channel's swap-by-swap reference scores and largest logit; the channels sum to HF's own logits."""
    from posym.core.qk import head_qk, rotate

    loaded = model_specs.load(models[kind], device="cpu", attn_implementation="eager")  # reads weights
    prompts, chosen, tau = prompt_sets.binding_prompts(2, seed=7), [(1, 3), (0, 1), (1, 0)], 1e-2
    llm_scores.write_scores(loaded, prompts, tmp_path, query="name", heads=chosen, tau=tau, settings={"seed": 0})
    planes = pd.read_parquet(tmp_path / "planes.parquet")
    expected = []
    for prompt in prompts:
        ids = model_specs.tokenize(loaded, prompt.text)
        p = prompt_sets.query_position(loaded, prompt, "name")
        with torch.no_grad():
            attentions = loaded.model(input_ids=ids, output_attentions=True).attentions
        for layer, head in chosen:
            qk = head_qk(loaded.model, ids, [layer])[layer]
            d, r = qk.q.shape[-1], qk.cos.shape[-1]

            def rotated(x, at):
                return rotate(x.double(), qk.cos[0, at].double(), qk.sin[0, at].double(), qk.pairing)

            q_rot = rotated(qk.q[0, head, p], p)
            total = torch.zeros(p + 1, dtype=torch.float64)
            for channel, dims in enumerate(channel_dims(qk.pairing, r, d)):
                # swapped[a, b]: this channel's logit of the key of content b placed at position a
                swapped = torch.tensor(
                    [
                        [
                            float(qk.scale * (q_rot[dims] * rotated(qk.k[0, head, b], a)[dims]).sum())
                            for b in range(p + 1)
                        ]
                        for a in range(p + 1)
                    ],
                    dtype=torch.float64,
                )
                ref = reference_swap_scores(swapped.diagonal(), swapped, tau=tau)
                expected.append(
                    {
                        "layer": layer,
                        "head": head,
                        "channel": channel,
                        "s_pos": ref["s_pos"],
                        "s_sym": ref["s_sym"],
                        "max_logit": float(swapped.diagonal().max()),
                    }
                )
                total += swapped.diagonal()
            attn = attentions[layer][0, head, p, : p + 1].double()
            torch.testing.assert_close(torch.softmax(total, 0), attn, atol=1e-6, rtol=0)
    want = pd.DataFrame(expected).groupby(["layer", "head", "channel"]).mean().sort_index()
    got = planes.set_index(["layer", "head", "channel"]).sort_index()
    assert got.index.tolist() == want.index.tolist()
    for column in ("s_pos", "s_sym", "max_logit"):
        assert got[column].tolist() == pytest.approx(want[column].tolist(), abs=1e-9)
    assert got.loc[(1, 3)].frequency_id.tolist() == list(range(1, r // 2 + 1)) + ([0] if d > r else [])
