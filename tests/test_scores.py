"""Tests of posym.core.scores: the pure swap maths against a loop-per-swap reference, then the model
fast path against re-running the layer once per swap (tests/reference_scores.py)."""

from __future__ import annotations

import math

import pytest
import torch
from reference_scores import reference_blocks, reference_swap_scores

from posym.core.scores import swap_scores
from posym.errors import PosymError


def _random_row(n, gen, scale=3.0, batch=()):
    clean = torch.randn(*batch, n, generator=gen, dtype=torch.float64) * scale
    swapped = torch.randn(*batch, n, n, generator=gen, dtype=torch.float64) * scale
    swapped.diagonal(dim1=-2, dim2=-1).copy_(clean)
    return clean, swapped


@pytest.mark.parametrize("blocks", [None, 2, 3, 5])
@pytest.mark.parametrize("compare", ["probs", "logits"])
@pytest.mark.parametrize("tau", [1e-4, 0.05])
def test_swap_scores_match_loop_reference(blocks, compare, tau):
    gen = torch.Generator().manual_seed(0)
    clean, swapped = _random_row(12, gen, batch=(3,))
    fast = swap_scores(clean, swapped, tau=tau, blocks=blocks, compare=compare)
    for k in range(3):
        ref = reference_swap_scores(clean[k], swapped[k], tau=tau, blocks=blocks, compare=compare)
        assert fast["s_pos"][k].item() == pytest.approx(ref["s_pos"], abs=1e-12)
        assert fast["s_sym"][k].item() == pytest.approx(ref["s_sym"], abs=1e-12)
        assert fast["entropy"][k].item() == pytest.approx(ref["entropy"], abs=1e-12)
        assert fast["n_swaps"] == ref["n_swaps"]


@pytest.mark.parametrize("blocks,exclude", [(None, [0]), (None, [0, 3, 99]), (3, [0]), (None, [])])
def test_excluded_keys_match_loop_reference(blocks, exclude):
    gen = torch.Generator().manual_seed(7)
    clean, swapped = _random_row(12, gen, batch=(3,))
    fast = swap_scores(clean, swapped, tau=0.05, blocks=blocks, exclude_keys=exclude)
    for k in range(3):
        ref = reference_swap_scores(clean[k], swapped[k], tau=0.05, blocks=blocks, exclude_keys=exclude)
        assert fast["n_swaps"] == ref["n_swaps"] < math.comb(11, 2) or not exclude
        for key in ("s_pos", "s_sym", "attn_first", "attn_top"):
            assert fast[key][k].item() == pytest.approx(ref[key], abs=1e-12)
        assert fast["top_key"][k].item() == ref["top_key"]
    with pytest.raises(PosymError, match="leaves no swap"):
        swap_scores(clean[0, :4], swapped[0, :4, :4], exclude_keys=[0, 1])


def test_swap_count_and_blocks():
    gen = torch.Generator().manual_seed(1)
    clean, swapped = _random_row(9, gen)
    assert swap_scores(clean, swapped)["n_swaps"] == math.comb(8, 2)
    assert swap_scores(clean, swapped, blocks=3)["n_swaps"] == 3
    # n-1 blocks of one key each are the single-token swaps
    one, many = swap_scores(clean, swapped, blocks=8), swap_scores(clean, swapped)
    assert torch.equal(one["s_pos"], many["s_pos"]) and torch.equal(one["s_sym"], many["s_sym"])
    # 10 keys in 3 blocks of 3: the oldest key stays put
    assert reference_blocks(10, 3)[0] == ([1, 2, 3], [4, 5, 6])


def test_uniform_attention_scores_one_one():
    out = swap_scores(torch.zeros(7), torch.zeros(7, 7))
    assert out["s_pos"].item() == pytest.approx(1.0, abs=1e-12)
    assert out["s_sym"].item() == pytest.approx(1.0, abs=1e-12)
    assert out["entropy"].item() == pytest.approx(math.log(7), abs=1e-12)


def test_positional_and_symbolic_constructions():
    gen = torch.Generator().manual_seed(2)
    clean = torch.randn(10, generator=gen, dtype=torch.float64) * 4
    by_position = clean[:, None].expand(10, 10)  # logit depends on where the key is
    by_content = clean[None, :].expand(10, 10)  # logit follows the content wherever it goes
    pos = swap_scores(clean, by_position)
    sym = swap_scores(clean, by_content)
    assert pos["s_pos"].item() == pytest.approx(1.0, abs=1e-12) and pos["s_sym"].item() < 0.9
    assert sym["s_sym"].item() == pytest.approx(1.0, abs=1e-12) and sym["s_pos"].item() < 0.9


def test_extreme_logits_stay_finite_and_exact():
    # differences of thousands underflow every probability but the largest: the scores must not
    clean = torch.tensor([0.0, -3000.0, 2000.0, -1000.0, 5.0])
    by_position = clean[:, None].expand(5, 5)
    out = swap_scores(clean, by_position)
    assert out["s_pos"].item() == 1.0
    assert torch.isfinite(out["s_sym"]) and torch.isfinite(out["entropy"])


def test_bad_inputs_are_posym_errors():
    with pytest.raises(PosymError, match="at least 2 earlier keys"):
        swap_scores(torch.zeros(2), torch.zeros(2, 2))
    with pytest.raises(PosymError, match="shape"):
        swap_scores(torch.zeros(4), torch.zeros(4, 5))
    with pytest.raises(PosymError, match="blocks"):
        swap_scores(torch.zeros(5), torch.zeros(5, 5), blocks=5)
    with pytest.raises(PosymError, match="blocks"):
        swap_scores(torch.zeros(5), torch.zeros(5, 5), blocks=1)
    with pytest.raises(PosymError, match="compare"):
        swap_scores(torch.zeros(5), torch.zeros(5, 5), compare="probabilities")
    with pytest.raises(PosymError, match="tau"):
        swap_scores(torch.zeros(5), torch.zeros(5, 5), tau=0.0)


# ---- model level: fast path == re-running the layer once per swap --------------------------------

import pandas as pd  # noqa: E402
import transformers  # noqa: E402
from reference_scores import attention_rows, reference_model_scores  # noqa: E402
from tiny_models import KINDS, VOCAB, tiny_model  # noqa: E402
from tiny_models import random_prompts as _prompts  # noqa: E402

from posym.core.qk import head_qk  # noqa: E402
from posym.core.scores import hop_queries, iter_scores, score_model, summarize_heads  # noqa: E402


def _assert_matches_reference(model, prompts, frame, tol, blocks=None, tau=1e-4, exclude_keys=()):
    """Every (prompt, query, layer) of frame against the per-swap reference; returns the max error."""
    worst = 0.0
    for (prompt, query, layer), rows in frame.groupby(["prompt", "query", "layer"]):
        ref = reference_model_scores(
            model, prompts[prompt], query, layer, tau=tau, blocks=blocks, exclude_keys=exclude_keys
        )
        assert list(rows["head"]) == [r["head"] for r in ref]
        for (_, row), r in zip(rows.iterrows(), ref):
            assert row["n_swaps"] == r["n_swaps"]
            assert row["top_key"] == r["top_key"]
            for col in ("s_pos", "s_sym", "entropy", "attn_first", "attn_top"):
                err = abs(row[col] - r[col])
                worst = max(worst, err)
                assert err <= tol, (prompt, query, layer, row["head"], col, row[col], r[col])
    return worst


@pytest.mark.parametrize("kind", KINDS)
def test_reference_row_is_the_models_own_attention(kind):
    model = tiny_model(kind, torch.float32)
    ids = _prompts([9])[0]
    with torch.no_grad():
        own = model(torch.tensor([ids]), output_attentions=True).attentions  # eager kernel
    for layer in range(2):
        assert torch.allclose(attention_rows(model, ids, layer), own[layer][0], atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_fast_path_equals_reference_float64(kind):
    model = tiny_model(kind)
    prompts = _prompts([6, 8, 8])
    frame = score_model(model, prompts, "all")
    assert len(frame) == (4 + 6 + 6) * 2 * model.config.num_attention_heads
    assert frame["s_pos"].min() < 0.9 or frame["s_sym"].min() < 0.9  # peaked enough to mean something
    _assert_matches_reference(model, prompts, frame, 1e-6)  # measured <= 2e-8 (GPT-J: float32 logits upstream)
    explicit = score_model(model, prompts, [[5], [4, 7], [3]], blocks=2, layers=[1])
    assert set(explicit["layer"]) == {1}
    _assert_matches_reference(model, prompts, explicit, 1e-6, blocks=2)
    sinkless = score_model(model, prompts, [[5], [4, 7], [6]], exclude_keys=[0, 2])
    assert (
        sinkless["n_swaps"]
        < frame.set_index(["prompt", "query", "layer", "head"])
        .loc[pd.MultiIndex.from_frame(sinkless[["prompt", "query", "layer", "head"]]), "n_swaps"]
        .to_numpy()
    ).all()
    _assert_matches_reference(model, prompts, sinkless, 1e-6, exclude_keys=[0, 2])


@pytest.mark.parametrize("kind", KINDS)
def test_fast_path_equals_reference_float32(kind):
    model = tiny_model(kind, torch.float32, seed=1)
    prompts = _prompts([7, 9], seed=1)
    chains = [[6, 4, 1, -1], [8, 5, 3, 0]]
    frame = score_model(model, prompts, [hop_queries(c) for c in chains])
    assert sorted(set(frame["query"][frame["prompt"] == 1])) == [3, 5, 8]
    _assert_matches_reference(model, prompts, frame, 1e-4)
    last = score_model(model, prompts, blocks=3, tau=1e-3)
    _assert_matches_reference(model, prompts, last, 1e-4, blocks=3, tau=1e-3)


# ---- hand-made heads, summaries, streaming and bad input -----------------------------------------


def _one_head_gptj(rotary_dim):
    config = transformers.GPTJConfig(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=16,
        n_layer=1,
        n_head=1,
        rotary_dim=rotary_dim,
        attn_implementation="eager",
    )
    torch.manual_seed(3)
    return transformers.GPTJForCausalLM(config).double().eval()


def test_hand_made_heads_get_their_labels():
    prompts = _prompts([10, 12], seed=3)
    attn = lambda m: m.transformer.h[0].attn  # noqa: E731
    with torch.no_grad():
        # identical keys (and queries) for every token: LayerNorm output = its bias, whatever the token
        positional = _one_head_gptj(16)
        positional.transformer.h[0].ln_1.weight.zero_()
        positional.transformer.h[0].ln_1.bias.normal_(0, 1.0)
        attn(positional).q_proj.weight.normal_(0, 1.0)
        attn(positional).k_proj.weight.normal_(0, 1.0)
        # queries and keys live only in the 12 dimensions RoPE leaves alone: logits follow content
        symbolic = _one_head_gptj(4)
        for proj in (attn(symbolic).q_proj, attn(symbolic).k_proj):
            proj.weight.normal_(0, 1.0)
            proj.weight[:4] = 0
        uniform = _one_head_gptj(16)
        attn(uniform).q_proj.weight.zero_()
    got = {}
    for name, model in [("positional", positional), ("symbolic", symbolic), ("uniform", uniform)]:
        frame = score_model(model, prompts, "all")
        got[name] = frame
        assert summarize_heads(frame)["label"].tolist() == [name]
    assert got["positional"]["s_pos"].min() == pytest.approx(1.0, abs=1e-12)
    assert got["positional"]["s_sym"].mean() < 0.5
    assert got["symbolic"]["s_sym"].min() == pytest.approx(1.0, abs=1e-12)
    assert got["symbolic"]["s_pos"].mean() < 0.5
    assert got["uniform"][["s_pos", "s_sym"]].min().min() == pytest.approx(1.0, abs=1e-12)


def test_summarize_means_and_thresholds():
    import pandas as pd

    frame = pd.DataFrame(
        {
            "prompt": [0, 1] * 3,
            "layer": [0, 0, 1, 1, 2, 2],
            "head": [0] * 6,
            "s_pos": [1.0, 0.9, 0.5, 0.7, 0.05, 0.0],
            "s_sym": [0.0, 0.1, 0.9, 0.95, 1.0, 0.95],
            "entropy": [1.0] * 6,
        }
    )
    out = summarize_heads(frame)
    assert out["s_pos"].tolist() == pytest.approx([0.95, 0.6, 0.025])
    assert out["rows"].tolist() == [2, 2, 2] and out["prompts"].tolist() == [2, 2, 2]
    assert out["label"].tolist() == ["positional", "mixed", "symbolic"]
    assert summarize_heads(frame, gamma=0.45)["label"].tolist() == ["positional", "uniform", "symbolic"]
    with pytest.raises(PosymError, match="gamma"):
        summarize_heads(frame, gamma=0.6)


def test_head_score_is_the_mean_over_prompts_of_each_prompts_query_mean():
    import pandas as pd

    from posym.core.scores import head_scores, label_column, prompt_scores

    # prompt 0: one query at s_pos 1; prompt 1: three queries at 0.85 -> prompt means 1 and 0.85.
    frame = pd.DataFrame(
        {
            "prompt": [0, 1, 1, 1],
            "query": [16, 16, 12, 9],
            "layer": 0,
            "head": 0,
            "s_pos": [1.0, 0.85, 0.85, 0.85],
            "s_sym": 0.0,
            "entropy": [1.0, 2.0, 3.0, 4.0],
        }
    )
    per_prompt = prompt_scores(frame)
    assert per_prompt.s_pos.tolist() == [1.0, 0.85] and per_prompt.queries.tolist() == [1, 3]
    head = head_scores(frame).iloc[0]
    assert head.s_pos == pytest.approx(0.925, abs=1e-15) and head.entropy == pytest.approx(2.0)
    assert (head.prompts, head.rows) == (2, 4)
    assert frame.s_pos.mean() == pytest.approx(0.8875)  # the pooled row mean, which posym does not use
    # the label flips between the two rules at gamma 0.1: positional by prompt mean, mixed pooled
    assert summarize_heads(frame, 0.1).label.tolist() == ["positional"]
    assert head_scores(per_prompt).equals(head_scores(frame))  # per-prompt tables give the same
    assert label_column(0.1) == "label_gamma_0p1" and label_column(0.05) == "label_gamma_0p05"
    assert label_column(0.05).isidentifier()
    with pytest.raises(PosymError, match="need the columns prompt"):
        summarize_heads(frame.drop(columns="prompt"))


def test_text_prompts_use_the_tokenizer_and_hops_need_chains():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "[UNK] alice bob likes red blue".split()
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    model = tiny_model("llama")
    text = "alice likes red bob likes blue"
    assert tokenizer(text).input_ids == [1, 3, 4, 2, 3, 5]
    by_text = score_model(model, [text, [5, 4, 3, 2]], "all", tokenizer=tokenizer)
    assert by_text.equals(score_model(model, [[1, 3, 4, 2, 3, 5], [5, 4, 3, 2]], "all"))
    with pytest.raises(PosymError, match="tokenizer"):
        score_model(model, [text])
    with pytest.raises(PosymError, match="chains"):
        score_model(model, [[1, 2, 3, 4]], "hops")
    hops = score_model(model, [[1, 2, 3, 4, 5, 6]], "hops", chains=[[5, 3, 2, -1]])
    assert sorted(hops["query"].unique()) == [3, 5]


def test_streaming_batches_and_determinism():
    model = tiny_model("llama", torch.float32)
    prompts = _prompts([5, 7, 7, 7], seed=4)
    parts = list(iter_scores(model, prompts, batch_size=2))
    assert [sorted(set(p["prompt"])) for p in parts] == [[0], [1, 2], [3]]
    whole = score_model(model, prompts)
    assert whole.equals(score_model(model, prompts))
    assert list(whole.columns) == [
        "prompt",
        "query",
        "layer",
        "head",
        "keys",
        "s_pos",
        "s_sym",
        "entropy",
        "n_swaps",
        "kept",
        "bound",
        "attn_first",
        "top_key",
        "attn_top",
        "low_mass",
    ]


def test_chunks_of_one_row_and_one_head_give_the_same_scores(monkeypatch):
    """A query too long for all heads at once is scored a few heads at a time (bounded memory)."""
    import posym.core.swaps

    model = tiny_model("llama")  # 4 query heads sharing 2 key heads
    prompts = _prompts([9, 9, 12], seed=2)
    whole = score_model(model, prompts, "all")
    monkeypatch.setattr(posym.core.swaps, "BUDGET", 40)  # below one head's 55 swaps at the last query
    chunked = score_model(model, prompts, "all")
    pd.testing.assert_frame_equal(whole, chunked, check_exact=False, rtol=0, atol=1e-12)
    _assert_matches_reference(model, prompts[2:], chunked[chunked["prompt"] == 2].assign(prompt=0), 1e-6)


def test_head_qk_rebuilds_the_models_logits():
    model = tiny_model("gpt_neox")
    ids = _prompts([7])[0]
    qk = head_qk(model, [ids], layers=[1])[1]
    from posym.core.qk import pair_planes, rotate

    q = rotate(qk.q[0], qk.cos[0], qk.sin[0], qk.pairing)  # [H, T, d]
    k = rotate(qk.k[0], qk.cos[0], qk.sin[0], qk.pairing)
    logits = qk.scale * q @ k.transpose(-1, -2) + torch.full((7, 7), float("-inf")).triu(1)
    assert torch.allclose(torch.softmax(logits, -1), attention_rows(model, ids, 1), atol=1e-12)
    r = qk.cos.shape[-1]
    planes = qk.scale * (pair_planes(q, qk.pairing, r)[:, 6:7, None] * pair_planes(k, qk.pairing, r)[:, None]).sum(-1)
    rest = qk.scale * (q[:, 6:7, None, r:] * k[:, None, :, r:]).sum(-1)  # [H, 1, T]
    assert torch.allclose(planes.sum(-1) + rest, logits[:, 6:7], atol=1e-12)


def test_bad_models_and_prompts_are_posym_errors():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=1))
    with pytest.raises(PosymError, match="rotary"):
        score_model(gpt2, [[1, 2, 3]])
    model = tiny_model("qwen2", torch.float32)
    with pytest.raises(PosymError, match="prompt 1: token ids"):
        score_model(model, [[1, 2, 3], [1, VOCAB]])
    with pytest.raises(PosymError, match="exceed"):
        score_model(model, [list(range(1, 30)) * 3])
    with pytest.raises(PosymError, match="query positions"):
        score_model(model, [[1, 2, 3, 4]], [[1]])
    with pytest.raises(PosymError, match="query positions"):
        score_model(model, [[1, 2, 3, 4]], [[4]])
    with pytest.raises(PosymError, match="layers"):
        score_model(model, [[1, 2, 3, 4]], layers=[2])
    with pytest.raises(PosymError, match="integers"):
        score_model(model, [[1.5, 2.0, 3.0]])
    with pytest.raises(PosymError, match="2 entries for 1 prompts"):
        score_model(model, [[1, 2, 3, 4]], [[3], [3]])


# ---- a trained posym checkpoint and the `posym score` command ------------------------------------

import json  # noqa: E402

from cli_runner import run_posym  # noqa: E402
from tiny_runs import train_tiny  # noqa: E402


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """200 steps of a 2-layer number model (built here: tests never read what a machine happens to hold)."""
    return str(train_tiny(tmp_path_factory.mktemp("run"), "number", steps=200, every=100, eval_size=200))


@pytest.mark.parametrize("dtype, tol, first", [(torch.float64, 1e-6, True), (torch.float32, 1e-4, False)])
def test_trained_checkpoint_hops_match_reference(trained_run, dtype, tol, first):
    from posym.models import load_checkpoint
    from posym.prompts import score_prompts

    model, info = load_checkpoint(trained_run, dtype=dtype)
    ids, wanted = score_prompts(model, task_config=info["task_config"], n_prompts=2, seed=5, queries="hops")
    wanted = [w[-2:] for w in wanted]  # the reference costs C(q, 2) model runs per query: two hops each
    layers = [0, model.config.n_layer - 1] if first else [model.config.n_layer - 1]
    frame = score_model(model, ids, wanted, layers=layers)
    assert frame["s_pos"].min() < 0.9 or frame["s_sym"].min() < 0.9  # training made some head non-uniform
    _assert_matches_reference(model, ids, frame, tol)


@pytest.mark.parametrize("limit", [None, 1.0])
def test_trained_checkpoint_pruned_equals_dense_at_hops(trained_run, monkeypatch, limit):
    """The pruned path (default; limit 1.0 prunes wherever the bound allows) against weighing every swap."""
    from posym.core import pruning
    from posym.models import load_checkpoint
    from posym.prompts import score_prompts

    if limit is not None:
        monkeypatch.setattr(pruning, "SPARSE_LIMIT", limit)
    model, info = load_checkpoint(trained_run, dtype=torch.float64)
    ids, wanted = score_prompts(model, task_config=info["task_config"], n_prompts=20, seed=7, queries="hops")
    pruned, dense = score_model(model, ids, wanted), score_model(model, ids, wanted, exact="dense")
    assert (pruned["kept"] < pruned["n_swaps"]).any()  # training peaked some heads enough to prune
    assert (pruned["bound"] <= 2e-12).all() and (dense["bound"] == 0).all()
    for key in ("s_pos", "s_sym"):
        assert ((pruned[key] - dense[key]).abs() <= pruned["bound"] + 1e-13).all()


def test_cli_score_writes_parquet_and_sidecar(trained_run, tmp_path, monkeypatch, capsys):
    import pandas as pd

    from posym.models import load_checkpoint
    from posym.prompts import score_prompts

    out = tmp_path / "scores.parquet"
    assert (
        run_posym(
            monkeypatch,
            "score",
            trained_run,
            "--n",
            5,
            "--seed",
            2,
            "--queries",
            "hops",
            "--batch-size",
            2,
            "--out",
            out,
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "label" in printed and "checkpoint: step 200 of " in printed and "queries: hops" in printed
    written = pd.read_parquet(out)
    model, info = load_checkpoint(trained_run)
    ids, wanted = score_prompts(model, task_config=info["task_config"], n_prompts=5, seed=2, queries="hops")
    expected = score_model(model, ids, wanted)  # one batch of 5: float32 rounding differs from batches of 2
    pd.testing.assert_frame_equal(written, expected, check_exact=False, rtol=0, atol=1e-4)
    assert written[["prompt", "query", "layer", "head", "n_swaps"]].equals(
        expected[["prompt", "query", "layer", "head", "n_swaps"]]
    )
    sidecar = json.loads((tmp_path / "scores.parquet.json").read_text())
    assert sidecar["settings"]["tau"] == 1e-4 and sidecar["settings"]["variant"] == "single-token"
    assert sidecar["settings"]["epsilon"] == 1e-12 and sidecar["settings"]["exact"] == "pruned"
    dense = tmp_path / "dense.parquet"
    assert (
        run_posym(
            monkeypatch,
            "score",
            trained_run,
            "--n",
            5,
            "--seed",
            2,
            "--queries",
            "hops",
            "--exact",
            "dense",
            "--epsilon",
            1e-6,
            "--out",
            dense,
        )
        == 0
    )
    dense = pd.read_parquet(dense)
    assert (dense["kept"] == dense["n_swaps"]).all() and (dense["bound"] == 0).all()
    assert ((dense["s_pos"] - written["s_pos"]).abs() <= written["bound"] + 1e-4).all()  # float32 batches differ
    capsys.readouterr()
    assert run_posym(monkeypatch, "score", trained_run, "--exact", "sparse", "--out", tmp_path / "x") == 2
    assert "'sparse' is not one of 'pruned', 'dense'" in capsys.readouterr().err
    assert sidecar["rows"] == len(expected) and "torch" in sidecar["versions"]
    assert sidecar["settings"]["step"] == 200 and sidecar["settings"]["queries"] == "hops"  # what was scored


def test_cli_budget_reaches_the_batched_engine_in_bytes(trained_run, tmp_path, monkeypatch, capsys):
    """--budget MIB is the bytes `batched.query_blocks` sizes blocks by (a tiny budget making more blocks
    with the same numbers: tests/test_batched.py); the table does not change; 0 is a usage error."""
    import pandas as pd

    from posym.core import batched

    budgets = []
    original = batched.query_blocks

    def spy(positions, first_key, rows, budget, dtype=None):
        budgets.append(budget)
        return original(positions, first_key, rows, budget, dtype)

    monkeypatch.setattr(batched, "query_blocks", spy)
    tables = {}
    for name, extra in (("default", []), ("budget", ["--budget", 3])):
        out = tmp_path / f"{name}.parquet"
        args = ["score", trained_run, "--n", 4, "--seed", 3, "--queries", "all", *extra, "--out", out]
        assert run_posym(monkeypatch, *args) == 0
        tables[name] = pd.read_parquet(out)
    assert set(budgets) == {batched.FLOOR_BYTES, 3 << 20}
    pd.testing.assert_frame_equal(tables["budget"], tables["default"], check_exact=True)
    assert run_posym(monkeypatch, "score", trained_run, "--budget", 0, "--out", tmp_path / "x.parquet") == 2
    capsys.readouterr()


def test_cli_prompt_file_and_its_errors(trained_run, tmp_path, monkeypatch, capsys):
    import pandas as pd

    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"input_ids": [1, 2, 3, 4, 5], "queries": [3, 4]}\n\n{"input_ids": [5, 4, 3], "chain": [2, 1, 0]}\n'
    )
    out = tmp_path / "file.parquet"
    assert run_posym(monkeypatch, "score", trained_run, "--prompts", good, "--blocks", 2, "--out", out) == 0
    written = pd.read_parquet(out)
    assert sorted(set(zip(written["prompt"], written["query"]))) == [(0, 3), (0, 4), (1, 2)]
    capsys.readouterr()
    cases = [
        ('{"input_ids": [1, 2, 3]}\n{"input_ids": [1, 2,\n', "line 2 is not valid JSON"),
        ('{"input_ids": [1, 2, 3.5]}\n', "line 1: input_ids must be a list of integers"),
        ('{"input_ids": [1, 2, 100000]}\n', "line 1: token ids must lie in"),
        ('{"input_ids": [1, 2, 3], "queries": [7]}\n', "line 1: query positions must lie in 2..2"),
        ('{"input_ids": [1, 2, 3, 4]}\n', "needs a chain for every prompt"),
        ('{"input_ids": [' + ", ".join(["1"] * 9000) + "]}\n", "line 1: 9000 tokens exceed"),
    ]
    for text, message in cases:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        assert (
            run_posym(
                monkeypatch,
                "score",
                trained_run,
                "--prompts",
                bad,
                "--queries",
                "hops",
                "--out",
                tmp_path / "bad.parquet",
            )
            == 2
        )
        assert message in capsys.readouterr().err
    assert not (tmp_path / "bad.parquet").exists()


# ---- swap_details / head_details: what the explorer's head page shows ---------------------------

from posym.core.scores import DETAIL_LISTS, head_details, swap_details  # noqa: E402


def test_swap_details_weights_and_rows_match_a_loop():
    gen = torch.Generator().manual_seed(3)
    clean = torch.randn(7, generator=gen, dtype=torch.float64) * 3
    swapped = torch.randn(7, 7, generator=gen, dtype=torch.float64) * 3
    swapped[range(7), range(7)] = clean
    d = swap_details(clean, swapped, tau=0.05, top=4, exclude_keys=[2])
    ref = reference_swap_scores(clean, swapped, tau=0.05, exclude_keys=[2])
    assert abs(float(d["s_pos"]) - float(ref["s_pos"])) < 1e-12 and abs(float(d["s_sym"]) - float(ref["s_sym"])) < 1e-12
    p = torch.softmax(clean, -1)
    pairs = [(i, j) for i in range(6) for j in range(i + 1, 6) if 2 not in (i, j)]
    gaps = torch.tensor([abs(float(p[i] - p[j])) for i, j in pairs], dtype=torch.float64) / 0.05
    alpha = torch.softmax(gaps, -1)
    order = sorted(range(len(pairs)), key=lambda s: -float(alpha[s]))[:4]
    assert [(int(a), int(b)) for a, b in zip(d["a"], d["b"])] == [pairs[s] for s in order]
    for k, s in enumerate(order):
        i, j = pairs[s]
        row = clean.clone()
        row[i], row[j] = swapped[i, j], swapped[j, i]
        after = torch.softmax(row, -1)
        assert abs(float(d["weight"][k] - alpha[s])) < 1e-12
        assert abs(float(d["before_a"][k] - p[i])) < 1e-12 and abs(float(d["after_b"][k] - after[j])) < 1e-12
        assert abs(float(d["after_a"][k] - after[i])) < 1e-12
        v, w = torch.stack([p[i], p[j]]), torch.stack([after[i], after[j]])
        assert abs(float(d["cos_pos"][k]) - float(v @ w / v.norm() / w.norm())) < 1e-12
        assert abs(float(d["cos_sym"][k]) - float(v.flip(0) @ w / v.norm() / w.norm())) < 1e-12
    with pytest.raises(PosymError, match="one query row"):
        swap_details(clean[None], swapped[None])


@pytest.mark.parametrize("kind", ["llama", "gptj"])
def test_head_details_match_the_model_rerun_per_swap(kind):
    model = tiny_model(kind)
    prompts = _prompts([7, 9])
    details = head_details(model, prompts, "last", top=3)
    dense = score_model(model, prompts, "last", exact="dense")
    assert len(details) == len(dense) == 2 * 2 * model.config.num_attention_heads
    assert (
        details[["prompt", "query", "layer", "head"]].to_numpy()
        == dense[["prompt", "query", "layer", "head"]].to_numpy()
    ).all()
    assert (details.s_pos - dense.s_pos).abs().max() < 1e-9 and (details.s_sym - dense.s_sym).abs().max() < 1e-9
    for row in details.itertuples():
        ids, q = prompts[row.prompt], row.query
        clean = attention_rows(model, ids, row.layer, query=q)[row.head]  # [T]
        assert torch.allclose(torch.tensor(row.attention, dtype=clean.dtype), clean[: q + 1], atol=1e-9)
        assert all(len(getattr(row, key)) == 3 for key in DETAIL_LISTS)
        for a, b, after_a, after_b in zip(row.a, row.b, row.after_a, row.after_b):
            moved = attention_rows(model, ids, row.layer, swap=([a], [b]), query=q)[row.head]
            assert abs(after_a - float(moved[a])) < 1e-9 and abs(after_b - float(moved[b])) < 1e-9


def test_low_mass_flags_exactly_the_rows_resting_on_attention_below_the_floor():
    """A Llama whose layer-0 keys are its queries, scaled up: most rows put nearly all attention on the
    query itself, and the scores of those rows turn on the little mass left (issue 55). low_mass must be
    True exactly where the reference attention row puts less than MASS_FLOOR off the query."""
    from posym.core.scores import MASS_FLOOR, head_scores, score_model

    model = tiny_model("llama", seed=3)
    attention = model.model.layers[0].self_attn
    with torch.no_grad():  # heads 0, 1 share kv head 0: its keys become query head 0's queries x 40
        attention.k_proj.weight[:8] = 40 * attention.q_proj.weight[:8]
    prompts = _prompts([9, 12], seed=5)
    frame = score_model(model, prompts, "all", layers=[0])
    flags = []
    for row in frame.itertuples():
        probs = attention_rows(model, prompts[row.prompt], 0, query=row.query)[row.head]  # [T]
        flags.append(bool(1 - float(probs[row.query]) < MASS_FLOOR))
    assert frame.low_mass.tolist() == flags
    assert 0 < sum(flags) < len(flags)  # both kinds of rows occur
    heads = head_scores(frame)
    share = frame.groupby(["prompt", "layer", "head"]).low_mass.mean().groupby(["layer", "head"]).mean()
    assert heads.set_index(["layer", "head"]).low_mass.tolist() == pytest.approx(share.tolist())
