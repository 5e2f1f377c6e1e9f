"""posym.commands.atlas and `posym atlas` on a tiny GQA Llama (4 query heads sharing 2 KV heads, tests/tiny_llms.py):
the per-head table, pooling per KV head, the export round trip and the import's cross-tabulation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from cli_runner import run_posym
from tiny_llms import run_cli, save_model, tokenizer

from posym import prompts
from posym.commands import atlas as atlas_command
from posym.commands import atlas as command
from posym.core import atlas, stats
from posym.errors import PosymError

SMALL = dict(
    n_binding=3,
    frequency_prompts=2,
    needle_lengths=[64, 96],
    needle_depths=[0.2, 0.8],
    stream_length=96,
    stream_prompts=1,
    windows=[8, 32],
    sink=2,
    repeat_period=10,
    repeats=3,
    repeat_prompts=2,
    top_share=0.25,
    draws=100,
)
CAUSAL = dict(causal=True, causal_length=64, causal_prompts=3, causal_heads=2, causal_planes=2)
"""The causal check on the tiny model: 2 heads per group, their 2 slowest of 4 planes, 6 prompts of 64 tokens."""
GRID = [[0.9, 0.1], [0.2, 0.7]]
"""An imported layer x KV-head table (2 layers x 2 KV heads), as another tool would write it."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("atlas") / "llama", "llama", tokenizer())


@pytest.fixture(scope="module")
def run(model_dir, tmp_path_factory):
    """`posym atlas` once through the CLI with the causal check (tables and report; figures are tested
    without rendering)."""
    root = tmp_path_factory.mktemp("atlas-run")
    (root / "atlas.yaml").write_text("".join(f"{k}: {v}\n" for k, v in (SMALL | CAUSAL).items()))
    (root / "other.tsv").write_text("\n".join("\t".join(map(str, row)) for row in GRID) + "\n")
    patch = pytest.MonkeyPatch()  # the fixture is module-wide: its own patcher, undone at once
    try:
        code = run_posym(
            patch,
            "atlas",
            str(model_dir),
            "--out",
            str(root / "out"),
            "--config",
            str(root / "atlas.yaml"),
            "--kv-table",
            str(root / "other.tsv"),
            "--no-figures",
            "--device",
            "cpu",
        )
    finally:
        patch.undo()
    assert code == 0
    return root / "out"


def test_one_row_per_head_with_every_score(run):
    table = pd.read_parquet(run / "atlas.parquet")
    config = command.AtlasConfig(**SMALL)
    assert len(table) == 8 and set(command.score_columns(config)) <= set(table.columns)
    assert table.kv_head.tolist() == [0, 0, 1, 1] * 2
    for column in ("sink_mass", "previous_token", "streaming_w8", "streaming_w32", "retrieval", "echo", "induction"):
        assert table[column].between(0, 1).all(), column
    assert (table.streaming_w32 >= table.streaming_w8 - 1e-12).all()  # a larger window keeps more
    assert np.allclose(table.non_streaming_w8, 1 - table.streaming_w8)
    # the retrieval score is the prompt mean of the per-prompt table (one row per needle prompt and head)
    per_prompt = pd.read_parquet(run / "retrieval.parquet")
    assert len(per_prompt) == 4 * 8 and sorted(per_prompt.length.unique()) == [64, 96]
    means = per_prompt.groupby(["layer", "head"]).retrieval.mean().to_numpy()
    assert np.allclose(table.sort_values(["layer", "head"]).retrieval.to_numpy(), means)


def test_pooling_per_kv_head_keeps_max_and_mean(run):
    table = pd.read_parquet(run / "atlas.parquet")
    kv = pd.read_parquet(run / "atlas_kv.parquet")
    assert len(kv) == 4 and (kv.query_heads == 2).all()
    for row in kv.itertuples():
        group = table[(table.layer == row.layer) & (table.kv_head == row.kv_head)]
        assert list(group["head"]) == [2 * row.kv_head, 2 * row.kv_head + 1]
        for column in ("retrieval", "non_streaming_w8", "s_sym_sinkfree"):
            assert getattr(row, f"{column}_max") == group[column].max()
            assert getattr(row, f"{column}_mean") == pytest.approx(group[column].mean(), abs=1e-12)


def test_export_round_trips(run):
    kv = pd.read_parquet(run / "atlas_kv.parquet")
    grid = atlas.kv_grid(kv, "non_streaming_w8_max", 2, 2)
    back = atlas_command.read_kv_table(run / "full_attention_heads.tsv")
    assert back.shape == (2, 2) and np.array_equal(back, grid)  # repr(float) is exact
    mask = atlas_command.read_kv_table(run / "full_attention_mask.tsv")
    assert np.array_equal(mask.astype(bool), atlas.full_attention_mask(grid, 0.5)) and mask.sum() == 2
    # importing the export cross-tabulates exactly the heads the export marked
    table = pd.read_parquet(run / "atlas.parquet")
    compared, confusion = command.compare_table(table, back, 0.5)
    assert compared.imported_full.tolist() == [bool(mask[r.layer, r.kv_head]) for r in compared.itertuples()]
    assert confusion.heads.sum() == 2 * len(table)


def test_import_cross_tabulates_with_the_labels(run):
    compared = pd.read_parquet(run / "compare.parquet")
    assert compared.imported.tolist() == [GRID[r.layer][r.kv_head] for r in compared.itertuples()]
    assert compared.imported_full.tolist() == [True, True, False, False, False, False, True, True]  # median 0.45
    confusion = pd.read_parquet(run / "compare_confusion.parquet")
    assert set(confusion.table) == {"label x imported_full", "label_sinkfree x imported_full"}
    plain = confusion[confusion.table == "label x imported_full"]
    expected = compared.groupby(["label", "imported_full"]).size()
    assert {(r.a, r.b == "True"): r.heads for r in plain.itertuples()} == expected.to_dict()


def test_agreement_tables_and_report(run):
    rho = pd.read_parquet(run / "agreement_spearman.parquet")
    columns = command.score_columns(command.AtlasConfig(**SMALL))
    assert len(rho) == len(columns) * (len(columns) - 1) // 2
    auroc = pd.read_parquet(run / "agreement_auroc.parquet")
    assert set(auroc.target) == {"retrieval", "non-streaming", "induction"} and (auroc.positives >= 1).all()
    table = pd.read_parquet(run / "atlas.parquet")
    top = atlas.top_heads(table.retrieval, 0.25)
    row = auroc[(auroc.target == "retrieval") & (auroc.scorer == "s_sym_sinkfree")].iloc[0]
    assert row.auroc == stats.auroc(table.s_sym_sinkfree, top) and row.low <= row.auroc <= row.high
    decides = pd.read_parquet(run / "agreement_sink_decides.parquet")
    assert (decides.sink_decides == (decides.plain * decides.sinkfree < 0))[
        decides.measure.str.startswith("spearman")
    ].all()
    text = (run / "report.md").read_text()
    assert "Needle recall" in text and "AUROC" in text and "Wilson" in text
    summary = (run / "summary.json").read_text()
    assert '"config_hash"' in summary and '"needle_recall"' in summary


def test_figures_are_figures():
    from matplotlib.figure import Figure

    table = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "a": [0.1, 0.2, 0.3, 0.4], "b": [1.0, 0, 1, 0]})
    maps = command.plot_maps(table, ["a", "b"])
    scatter = command.plot_scatter(table, ["a", "b"])
    assert isinstance(maps, Figure) and isinstance(scatter, Figure)
    assert sum(ax.get_visible() for ax in maps.axes if ax.get_label() != "<colorbar>") == 2 and len(scatter.axes) == 4


def test_bad_input_is_one_line(model_dir, tmp_path, capsys, monkeypatch):
    wrong = tmp_path / "wrong.tsv"
    wrong.write_text("1\t2\t3\n4\t5\t6\n")
    code, _, err = run_cli(
        [
            "atlas",
            model_dir,
            "--kv-table",
            wrong,
            "--out",
            tmp_path / "o",
            "--lengths",
            "64",
            "--depths",
            "0.5",
            "--n",
            "5",
            "--no-figures",
        ],
        capsys,
        monkeypatch,
    )
    assert code == 2 and err.count("\n") == 1 and "is 2 x 3 but the model has 2 layers x 2 KV heads" in err
    ragged = tmp_path / "ragged.tsv"
    ragged.write_text("1\t2\n3\n")
    with pytest.raises(PosymError, match="different lengths"):
        atlas_command.read_kv_table(ragged)
    ragged.write_text("1\tx\n")
    with pytest.raises(PosymError, match="not a number"):
        atlas_command.read_kv_table(ragged)
    with pytest.raises(PosymError, match="depths"):
        command.AtlasConfig(needle_depths=[1.5])
    with pytest.raises(PosymError, match="no query"):
        command.AtlasConfig(stream_length=200, windows=[256])


# ---- the causal check --------------------------------------------------------------------------------

HAY, KEYS, VALUES, QUESTIONS, UNKNOWN = range(0, 6), range(6, 10), range(10, 14), range(14, 18), 18
"""The hand-built retrieval model's vocabulary: haystack, needle keys a_i, their values b_i, the
questions Q_i ("which value goes with a_i?") and the answer it gives when it retrieves nothing."""
SLOW = [3, 7, 2, 6]
"""Head 0's query/key dim of pair i: dims 3 and 7 form plane 3 (the slowest of 4), 2 and 6 plane 2."""


def retrieval_model():
    """A 1-layer Llama (hidden 24, 2 query heads of 8 dims sharing 1 KV head, 4 RoPE planes of
    frequencies 1, 0.1, 0.01, 0.001) built by hand so that the answer to Q_i is b_i only through head
    0's attention from Q_i to a_i, which lives on the two slowest planes alone: Q_i's query and a_i's key
    both point along SLOW[i] (logit ~30 at the match, ~0 elsewhere), a_i's value writes b_i's output
    direction, and Q_i's own embedding writes UNKNOWN's at half that strength (what uniform attention
    leaves standing). Head 1 and the MLP are zero."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=19,
        hidden_size=24,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.norm.weight.fill_(1.0)
        layer = model.model.layers[0]
        layer.input_layernorm.weight.fill_(1.0)
        layer.post_attention_layernorm.weight.fill_(1.0)
        embed, attn = model.model.embed_tokens.weight, layer.self_attn
        for t in HAY:
            embed[t, 13 + t] = 1.0
        for i, (a, b, q) in enumerate(zip(KEYS, VALUES, QUESTIONS)):
            embed[a, i] = 1.0  # key content
            embed[q, 4 + i], embed[q, 12] = 1.0, 0.5  # query content; UNKNOWN's output direction
            embed[b, 19] = 1.0
            attn.q_proj.weight[SLOW[i], 4 + i] = 2.0
            attn.k_proj.weight[SLOW[i], i] = 2.0
            attn.v_proj.weight[i, i] = 1.0
            attn.o_proj.weight[8 + i, i] = 1.0
            model.lm_head.weight[b, 8 + i] = 1.0
        embed[UNKNOWN, 20] = 1.0
        model.lm_head.weight[UNKNOWN, 12] = 1.0
    return model


def retrieval_needles():
    """For each pair i: the four keys among the haystack, then Q_i, teacher-forced answer b_i."""
    out = []
    for i in range(4):
        ids = [0, 1, 2, KEYS[0], 3, KEYS[1], 4, KEYS[2], 5, KEYS[3], 1, 2, QUESTIONS[i], VALUES[i]]
        out.append(prompts.Needle(ids, [ids.index(KEYS[i])], [len(ids) - 2], len(ids), 0.5, [f"b{i}"], i))
    return out


def test_hand_built_head_retrieves_through_its_slow_planes_only():
    from posym.core.interventions import ablated_planes

    model, needles = retrieval_model(), retrieval_needles()
    clean = command.needle_answers(model, needles)
    assert [a["recalled"] for a in clean] == [True] * 4
    with ablated_planes(model, {(0, 0): [2, 3]}):  # the slowest two of head 0's four planes
        slow = command.needle_answers(model, needles)
    assert [a["recalled"] for a in slow] == [False] * 4  # uniform attention: UNKNOWN wins every time
    assert max(a["logprob"] for a in slow) < min(a["logprob"] for a in clean) - 1
    with torch.no_grad(), ablated_planes(model, {(0, 0): [2, 3]}):
        top = model(torch.tensor([needles[0].ids])).logits[0, -2].argmax().item()
    assert top == UNKNOWN
    for planes in ({(0, 0): [0, 1]}, {(0, 1): [2, 3]}):  # the fast planes, or another head's slow ones
        with ablated_planes(model, planes):
            assert command.needle_answers(model, needles) == clean  # exactly: those query dims are zero already
    with ablated_planes(model, {(0, 0): [3]}):  # plane 3 alone carries pairs 0 and 1
        half = command.needle_answers(model, needles)
    assert [a["recalled"] for a in half] == [False, False, True, True]


def test_causal_check_on_the_tiny_model(run):
    """`causal_check` end to end (the module's run has CAUSAL on): every condition on the same prompts, the
    clean rows equal to the recall of the same prompts in needles.parquet, the ablated planes as planned,
    the summary's numbers its rows'."""
    import json

    out = run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kv_table"].endswith("other.tsv")
    assert summary["causal"]["prompts"] == 6 and summary["causal"]["planes"] == "2 of 4"
    rows = pd.read_parquet(out / "causal.parquet")
    assert summary["causal"]["conditions"] == 1 + 3 * 3 and len(rows) == 10 * 6
    needles = pd.read_parquet(out / "needles.parquet")
    at_length = needles[(needles.length == 64) & (needles["index"] < 3)].sort_values(["depth", "index"])
    clean = rows[rows.control == "clean"].sort_values("prompt")
    assert clean.recalled.tolist() == at_length.recalled.tolist()
    assert np.allclose(clean.logprob, at_length.logprob, atol=1e-12)
    heads = pd.read_parquet(out / "causal_heads.parquet")
    table = pd.read_parquet(out / "atlas.parquet")
    top = table.sort_values(["retrieval", "layer", "head"], ascending=[False, True, True]).head(2)
    chosen = heads[(heads.group == "retrieval") & (heads.control == "slowest")]
    assert sorted(zip(chosen.layer, chosen["head"])) == sorted(zip(top.layer, top["head"]))
    assert all(list(p) == [2, 3] for p in chosen.planes)
    matched = heads[(heads.group == "retrieval") & (heads.control == "matched heads")]
    assert sorted(matched.layer) == sorted(top.layer)  # layer-matched: 4 heads a layer leave room in each
    assert not set(zip(matched.layer, matched["head"])) & set(zip(top.layer, top["head"]))
    frame = pd.read_parquet(out / "causal_summary.parquet")
    for r in frame.itertuples():
        mine = rows[(rows.group == r.group) & (rows.control == r.control)]
        assert r.n == 6 and r.recalled == pytest.approx(mine.recalled.mean())
        assert r.logprob == pytest.approx(mine.logprob.mean()) and r.logprob_low <= r.logprob <= r.logprob_high
    text = (out / "report.md").read_text()
    assert "Causal check" in text and "layer-matched random heads" in text
