"""posym.core.kvpolicy: policies from head tables, the GQA pooling, the budget and its honest kept-KV count."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import transformers

from posym.core import kvpolicy
from posym.core.kvpolicy import KVPolicy, choose, kept_keys, policy_from_table, visible
from posym.errors import PosymError


def brute_kept(length, sink, recent, window):
    p = length - 1
    j = np.arange(length)
    return int(visible(p, j, sink=sink, recent=recent, window=window).sum())


@pytest.mark.parametrize("window", [None, 1, 3, 7, 20])
@pytest.mark.parametrize("sink,recent", [(None, None), (0, 1), (4, 8), (2, 3), (10, 2), (0, 30)])
def test_kept_keys_is_visible_summed(window, sink, recent):
    for length in range(40):
        expected = brute_kept(length, sink, recent, window) if length else 0
        assert kept_keys(length, sink=sink, recent=recent, window=window) == expected, (length, sink, recent, window)


def test_visible_by_hand():
    # sink 2, recent 3: query 9 sees 0, 1 (sinks) and 7, 8, 9 (recent), never a later key
    seen = visible(9, np.arange(12), sink=2, recent=3, window=None)
    assert np.flatnonzero(seen).tolist() == [0, 1, 7, 8, 9]
    # a window of 5 hides the sinks from query 9 (9 - 0 >= 5) but keeps the recent keys
    seen = visible(9, np.arange(12), sink=2, recent=3, window=5)
    assert np.flatnonzero(seen).tolist() == [7, 8, 9]
    assert np.flatnonzero(visible(9, np.arange(12), sink=None, recent=None, window=None)).tolist() == list(range(10))


def test_choose_streams_the_lowest_and_breaks_ties_in_order():
    keep = np.array([[0.0, 1.0, 0.0], [0.0, 2.0, 3.0]])
    policy = choose(keep, 0.5, sink=1, recent=2, windows=(None, None), n_heads=3)
    assert policy.full.tolist() == [[False, True, False], [False, True, True]]
    assert policy.streaming_fraction == 0.5
    assert choose(keep, 0.0, windows=(None, None), n_heads=3).full.all()
    assert not choose(keep, 1.0, windows=(None, None), n_heads=3).full.any()
    with pytest.raises(PosymError, match="fraction"):
        choose(keep, 1.5, windows=(None, None), n_heads=3)
    with pytest.raises(PosymError, match="finite"):
        choose(np.array([[np.nan, 1.0]]), 0.5, windows=(None,), n_heads=2)
    with pytest.raises(PosymError, match="evenly"):
        choose(keep, 0.5, windows=(None, None), n_heads=4)


def test_kept_fraction_counts_gqa_and_windowed_layers():
    # what the next query (position 100) sees before its own: layer 0 windowed (w = 16), 15 keys full and
    # 7 streaming (recent - 1: the window has long left the sinks behind); layer 1 global: 100 full,
    # sink + recent - 1 = 4 + 7 streaming
    full = np.array([[True, False], [True, False]])
    policy = KVPolicy(full, 4, 8, (16, None), n_heads=8)
    assert policy.kept(100).tolist() == [[15, 7], [100, 11]]
    assert policy.kept_fraction(100) == pytest.approx((15 + 7 + 100 + 11) / (2 * 15 + 2 * 100))
    # a window smaller than sink + recent: streaming saves nothing there
    small = KVPolicy(np.array([[False]]), 4, 8, (6,), n_heads=1)
    assert small.kept_fraction(100) == 1.0
    # the query heads follow their KV head (8 query heads over 2 KV heads: 4 each)
    assert policy.query_full()[0].tolist() == [True] * 4 + [False] * 4
    with pytest.raises(PosymError, match="length"):
        policy.kept_fraction(0)


def test_policy_checks_its_inputs():
    with pytest.raises(PosymError, match="sink"):
        KVPolicy(np.ones((1, 1), bool), 0, 0, (None,), 1)
    with pytest.raises(PosymError, match="windows"):
        KVPolicy(np.ones((2, 1), bool), 0, 1, (None,), 1)
    with pytest.raises(PosymError, match="grid"):
        KVPolicy(np.ones(3, bool), 0, 1, (None,), 1)


def heads_table(n_layers=2, n_heads=4):
    """One row per (layer, head) with posym's, the atlas's and DuoAttention's proxy columns, made up."""
    rng = np.random.default_rng(0)
    rows = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    frame = pd.DataFrame(rows, columns=["layer", "head"])
    for column in ("s_pos", "s_sym", "s_pos_sinkfree", "s_sym_sinkfree", "retrieval", "non_streaming_w64"):
        frame[column] = rng.random(len(frame))
    frame["non_streaming_w128"] = 1.0  # a later window: the proxy reads the first (smallest) one
    return frame


def llama_config(n_kv=2):
    return transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=n_kv)


def test_keep_scores_pool_by_max_over_the_query_heads():
    table = heads_table()
    keep = kvpolicy.keep_scores(table, "posym", 2, 4, 2)
    score = (table.s_sym_sinkfree - table.s_pos_sinkfree).to_numpy().reshape(2, 2, 2)  # [layer, kv, member]
    np.testing.assert_array_equal(keep, score.max(-1))
    # without the sink-free columns: the plain scores
    plain = kvpolicy.keep_scores(table.drop(columns=["s_pos_sinkfree", "s_sym_sinkfree"]), "posym", 2, 4, 2)
    np.testing.assert_array_equal(plain, (table.s_sym - table.s_pos).to_numpy().reshape(2, 2, 2).max(-1))
    np.testing.assert_array_equal(
        kvpolicy.keep_scores(table, "retrieval", 2, 4, 2), table.retrieval.to_numpy().reshape(2, 2, 2).max(-1)
    )
    np.testing.assert_array_equal(
        kvpolicy.keep_scores(table, "duo", 2, 4, 2), table.non_streaming_w64.to_numpy().reshape(2, 2, 2).max(-1)
    )


def test_one_kept_query_head_keeps_its_kv_head_full():
    # KV head 0 of layer 0 serves query heads 0 and 1: head 0 is positional, head 1 symbolic
    table = pd.DataFrame({"layer": [0, 0, 0, 0], "head": [0, 1, 2, 3]})
    table["s_pos"], table["s_sym"] = [1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]
    config = transformers.LlamaConfig(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    policy = policy_from_table("posym", config, 0.5, table=table, sink=1, recent=2)
    assert policy.full.tolist() == [[True, False]]
    assert policy.query_full().tolist() == [[True, True, False, False]]


def test_policy_from_table_every_policy():
    table, config = heads_table(), llama_config()
    for name in ("posym", "retrieval", "duo"):
        policy = policy_from_table(name, config, 0.5, table=table)
        assert policy.name == name and policy.full.shape == (2, 2) and policy.streaming_fraction == 0.5
        assert (policy.sink, policy.recent) == (kvpolicy.SINK, kvpolicy.RECENT)
    assert policy_from_table("full", config, 0.5).full.all()
    assert not policy_from_table("streaming", config, 0.5).full.any()
    # a DuoAttention grid wins over the table's proxy
    grid = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert policy_from_table("duo", config, 0.5, table=table, grid=grid).full.tolist() == [[True, False], [False, True]]
    with pytest.raises(PosymError, match="3 x 2"):
        policy_from_table("duo", config, 0.5, grid=np.zeros((3, 2)))
    with pytest.raises(PosymError, match="unknown"):
        policy_from_table("best", config, 0.5, table=table)
    with pytest.raises(PosymError, match="needs a head table"):
        policy_from_table("posym", config, 0.5)
    with pytest.raises(PosymError, match="retrieval column"):
        policy_from_table("retrieval", config, 0.5, table=table.drop(columns="retrieval"))
    with pytest.raises(PosymError, match="twice"):
        policy_from_table("posym", config, 0.5, table=pd.concat([table, table]))
    with pytest.raises(PosymError, match="every head"):
        policy_from_table("posym", config, 0.5, table=table.iloc[1:])


def test_random_policy_matches_the_layers_and_its_seed():
    table, config = heads_table(n_layers=3, n_heads=8), None
    config = transformers.LlamaConfig(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4)
    base = policy_from_table("posym", config, 0.5, table=table)
    draws = [policy_from_table("random", config, 0.5, table=table, seed=s) for s in range(10)]
    for draw in draws:
        np.testing.assert_array_equal((~draw.full).sum(1), (~base.full).sum(1))  # matched on layer
    assert len({d.full.tobytes() for d in draws}) > 1  # the seeds draw different heads
    again = policy_from_table("random", config, 0.5, table=table, seed=3)
    np.testing.assert_array_equal(again.full, draws[3].full)
    with pytest.raises(PosymError, match="ranked"):
        policy_from_table("random", config, 0.5, table=table, reference="full")


def test_random_draws_match_on_layer_type_where_one_kv_head_per_layer_leaves_no_choice():
    """Gemma 3 270M's shape (one KV head per layer, local and global layers): every layer-matched draw is
    the reference itself, so it is refused; a type-matched draw keeps the streaming count of the windowed
    and of the global layers (and so the kept-KV fraction), differs between seeds, and is reproducible.
    The layer-matched draw of a model with a choice is the loop over layers it always was."""
    n_layers = 6
    config = transformers.Gemma3TextConfig(
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=1,
        sliding_window=5,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    )
    windows = kvpolicy.layer_windows(config)
    assert windows == (5, 5, None, 5, 5, None)
    keep = np.arange(n_layers, dtype=float)[:, None]  # [layers, 1 KV head]: the first layers streamed first
    base = choose(keep, 0.5, sink=1, recent=2, windows=windows, n_heads=config.num_attention_heads, name="posym")
    assert kvpolicy.matched_draws(base, "layer") == 1
    with pytest.raises(PosymError, match="itself.*match the draws on layer type"):
        kvpolicy.check_draws(base, "layer")
    assert kvpolicy.matched_draws(base, "type") > 1
    kvpolicy.check_draws(base, "type")
    draws = [kvpolicy.random_policy(base, s, "type") for s in range(20)]
    for draw in draws:
        for window in set(windows):
            layers = [l for l, w in enumerate(windows) if w == window]
            assert (~draw.full[layers]).sum() == (~base.full[layers]).sum(), window
        assert draw.kept_fraction(40) == pytest.approx(base.kept_fraction(40))
    assert len({d.full.tobytes() for d in draws}) > 1
    np.testing.assert_array_equal(kvpolicy.random_policy(base, 7, "type").full, draws[7].full)
    with pytest.raises(PosymError, match="layer or type"):
        kvpolicy.random_policy(base, 0, "depth")
    # the layer match is unchanged: numpy's draw of each layer in turn (the committed kv-eval runs' draws)
    table = heads_table(n_layers=3, n_heads=8)
    llama = transformers.LlamaConfig(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4)
    reference = policy_from_table("posym", llama, 0.5, table=table)
    rng, expected = np.random.default_rng(5), np.ones_like(reference.full)
    for layer, row in enumerate(reference.full):
        expected[layer, rng.choice(row.size, size=int((~row).sum()), replace=False)] = False
    np.testing.assert_array_equal(kvpolicy.random_policy(reference, 5).full, expected)


def test_layer_windows_of_every_windowed_family():
    from tiny_models import WINDOWED, tiny_model

    expected = {
        "mistral": (5, 5),
        "qwen2": (5, 5),
        "starcoder2": (5, 5),
        "gemma2": (5, None),
        "gemma3_text": (5, None),
    }
    for kind in WINDOWED:
        assert kvpolicy.layer_windows(tiny_model(kind, window=5).config) == expected[kind], kind
    assert kvpolicy.layer_windows(tiny_model("llama").config) == (None, None)
    assert kvpolicy.layer_windows(tiny_model("qwen2_moe").config) == (None, None)  # sliding_window 0: none
    assert kvpolicy.head_counts(tiny_model("llama").config) == (2, 4, 2)
    assert kvpolicy.head_counts(tiny_model("gptj").config) == (2, 2, 2)


# ---- posym kv-policy ------------------------------------------------------------------------------


@pytest.fixture
def tiny_hf(tmp_path):
    """A tiny Mistral directory with a sliding window on every layer, and a head table for it."""
    from tiny_models import tiny_model

    model = tiny_model("mistral", window=5)
    model.save_pretrained(tmp_path / "model")
    table = heads_table()
    table.to_parquet(tmp_path / "heads.parquet", index=False)
    table.to_csv(tmp_path / "heads.csv", index=False)
    return tmp_path


def read_outputs(out):
    import json

    from posym.io import read_kv_table

    return read_kv_table(out / "full_attention_heads.tsv"), json.loads((out / "config.json").read_text())


def test_kv_policy_command_writes_duoattention_files(tiny_hf, capsys, monkeypatch):
    from cli_runner import run_posym

    out = tiny_hf / "kv"
    args = ["kv-policy", tiny_hf / "model", "--table", tiny_hf / "heads.parquet", "--sink", 2, "--recent", 3]
    assert run_posym(monkeypatch, *args, "--out", out) == 0
    printed = capsys.readouterr().out
    assert "posym: 2 of 4 KV heads streaming (sink 2, recent 3)" in printed
    grid, config = read_outputs(out)
    config_ = transformers.AutoConfig.from_pretrained(tiny_hf / "model")
    expected = policy_from_table("posym", config_, 0.5, table=heads_table(), sink=2, recent=3)
    np.testing.assert_array_equal(grid, expected.full.astype(float))
    assert (config["sink_size"], config["recent_size"]) == (2, 3)
    record = config["posym"]
    assert record["policy"] == "posym" and record["streaming_fraction"] == 0.5 and record["layer_windows"] == [5, 5]
    # every layer already keeps a window of 5: streaming (sink 2 + recent 3, inside it) keeps 2 of 4 keys
    assert record["kept_fraction"]["16384"] == pytest.approx(expected.kept_fraction(16384)) == (4 + 2) / 8
    assert "versions" in record and record["model"] == str(tiny_hf / "model")
    # a CSV table gives the same policy; the TSV it wrote is a grid the duo policy reads back
    assert run_posym(monkeypatch, *args[:3], tiny_hf / "heads.csv", *args[4:], "--out", tiny_hf / "csv") == 0
    np.testing.assert_array_equal(read_outputs(tiny_hf / "csv")[0], grid)
    duo = ["kv-policy", tiny_hf / "model", "--kv-table", out / "full_attention_heads.tsv", "--policy", "duo"]
    assert run_posym(monkeypatch, *duo, "--out", tiny_hf / "duo") == 0
    np.testing.assert_array_equal(read_outputs(tiny_hf / "duo")[0], grid)
    # --where keeps one variant of a table holding two (the other one's scores reversed)
    two = pd.concat([heads_table().assign(variant="sink-free"), heads_table().assign(variant="plain")])
    two.loc[two.variant == "plain", ["s_pos_sinkfree", "s_sym_sinkfree"]] *= -1
    two.to_parquet(tiny_hf / "two.parquet", index=False)
    where = ["--where", "variant=sink-free"]
    assert run_posym(monkeypatch, *args[:3], tiny_hf / "two.parquet", *args[4:], *where, "--out", tiny_hf / "w") == 0
    np.testing.assert_array_equal(read_outputs(tiny_hf / "w")[0], grid)
    assert read_outputs(tiny_hf / "w")[1]["posym"]["where"] == ["variant=sink-free"]
    # random: layer-matched to the duo grid, seeded
    rand = ["kv-policy", tiny_hf / "model", "--kv-table", out / "full_attention_heads.tsv", "--policy", "random"]
    assert run_posym(monkeypatch, *rand, "--seed", 1, "--out", tiny_hf / "random") == 0
    np.testing.assert_array_equal(read_outputs(tiny_hf / "random")[0].sum(1), grid.sum(1))


def test_kv_policy_command_refusals(tiny_hf, capsys, monkeypatch):
    from cli_runner import cli, one_line

    model = tiny_hf / "model"
    one_line(*cli(capsys, monkeypatch, "kv-policy", model, "--out", tiny_hf / "a"), "needs a head table")
    retrieval = ["--table", tiny_hf / "heads.parquet", "--kv-table", tiny_hf / "heads.csv", "--policy", "retrieval"]
    one_line(*cli(capsys, monkeypatch, "kv-policy", model, *retrieval, "--out", tiny_hf / "b"), "duo policy")
    (tiny_hf / "bad.csv").write_text("a,b\n1,2\n")
    bad = ["--table", tiny_hf / "bad.csv"]
    one_line(*cli(capsys, monkeypatch, "kv-policy", model, *bad, "--out", tiny_hf / "c"), "not a head table")
    assert cli(capsys, monkeypatch, "kv-policy", model, "--streaming", 1.5, "--out", tiny_hf / "d")[0] == 2
    table = ["--table", tiny_hf / "heads.parquet"]
    for where, needle in (("variant", "COLUMN=VALUE"), ("variant=x", "no 'variant' column"), ("layer=9", "no row")):
        code_err = cli(capsys, monkeypatch, "kv-policy", model, *table, "--where", where, "--out", tiny_hf / "e")
        one_line(*code_err, needle)
    one_line(*cli(capsys, monkeypatch, "kv-policy", model, "--where", "a=b", "--out", tiny_hf / "f"), "--table")
    # the head table must hold every head: a filter that leaves some out is refused
    half = ["--where", "layer=0"]
    one_line(*cli(capsys, monkeypatch, "kv-policy", model, *table, *half, "--out", tiny_hf / "g"), "every head")


def test_kv_policy_defaults_are_the_cores():
    # the CLI spells its defaults (posym --help imports no numpy); they are kvpolicy's
    import typer.main

    from posym.cli import app

    params = {p.name: p.default for p in typer.main.get_command(app).commands["kv-policy"].params}
    assert (params["sink"], params["recent"]) == (kvpolicy.SINK, kvpolicy.RECENT)


def test_kv_policy_random_matches_on_layer_type_where_layers_leave_no_choice(tiny_hf, capsys, monkeypatch):
    """One KV head per layer (Gemma 3 270M's shape): the layer-matched random policy would be posym's own,
    so kv-policy refuses it with the fix; --match type draws among the layers of each type, seeded."""
    from cli_runner import cli, one_line, run_posym

    config = transformers.AutoConfig.from_pretrained(tiny_hf / "model")
    config.num_key_value_heads = 1
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tiny_hf / "one_kv")
    rand = ["kv-policy", tiny_hf / "one_kv", "--table", tiny_hf / "heads.parquet", "--policy", "random"]
    one_line(*cli(capsys, monkeypatch, *rand, "--out", tiny_hf / "layer"), "--match type")
    assert not (tiny_hf / "layer").exists()
    grids = []
    for seed in range(8):
        assert run_posym(monkeypatch, *rand, "--match", "type", "--seed", seed, "--out", tiny_hf / f"t{seed}") == 0
        grid, written = read_outputs(tiny_hf / f"t{seed}")
        assert grid.sum() == 1 and written["posym"]["match"] == "type"  # 1 of the 2 KV heads streams
        grids.append(grid.tobytes())
    assert len(set(grids)) == 2  # both layers (one type, window 5) drawn
