"""posym.commands.lengthgen: extension keeps answers, planning and its errors, the batched evaluation against a
per-sample reference on a tiny trained run, files, figure and the CLI."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from cli_runner import run_posym
from tiny_runs import train_tiny

from posym.commands import lengthgen as lg
from posym.core import lengthgen as core_lengthgen
from posym.core.tasks import follow_chain, generate, task_config
from posym.errors import PosymError

TINY_POSITIONS = 256


@pytest.mark.parametrize("task", ["number", "letter"])
@pytest.mark.parametrize("length", [17, 18, 60, 300])
def test_extension_leaves_questions_and_answers_unchanged(task, length):
    base = task_config(task)
    ext = core_lengthgen.extension(base, length)
    assert ext.seq_len == length and ext.extra_target == length - 17
    s, ref = generate(ext, 96, 3, "test"), generate(base, 96, 3, "test")
    assert s.input_ids.shape == (96, length)
    # the last 17 tokens are the training-length sample: same hop instructions and query
    np.testing.assert_array_equal(s.input_ids[:, -17:], ref.input_ids)
    np.testing.assert_array_equal(s.answer, ref.answer)
    np.testing.assert_array_equal(s.hops, ref.hops)
    for row in range(0, 96, 7):  # and the chain read from the tokens alone still lands on it
        answer, chain = follow_chain(ext, s.input_ids[row])
        assert answer == s.answer[row] and min(chain) >= length - 17


def test_extension_and_plan_errors():
    base = task_config("number")
    with pytest.raises(PosymError, match="shorter than the run's training length 17"):
        core_lengthgen.extension(base, 16)
    with pytest.raises(PosymError, match="exceeds the model's position table of 100"):
        core_lengthgen.plan(base, core_lengthgen.LengthGenConfig(lengths=[17, 101]), n_positions=100)
    with pytest.raises(PosymError, match="exceeds the model's position table of 50"):
        core_lengthgen.plan(base, core_lengthgen.LengthGenConfig(protocol="seed", factors=[1, 3]), n_positions=50)
    with pytest.raises(PosymError, match="shorter"):
        core_lengthgen.plan(base, core_lengthgen.LengthGenConfig(lengths=[10, 20]), n_positions=100)
    for bad, message in [
        (dict(protocol="nope"), "protocol must be one of paper, seed, both, got 'nope'"),
        (dict(n=0), "n and max_tokens must be positive, got n=0"),
        (dict(max_tokens=0), "n and max_tokens must be positive, got n=128, max_tokens=0"),
        (dict(lengths=[]), "the paper protocol needs at least one length"),
        (dict(protocol="seed", factors=[0, 2]), "the seed protocol needs at least one factor"),
    ]:
        with pytest.raises(PosymError, match=message):
            core_lengthgen.LengthGenConfig(**bad)


def test_plan_orders_lengths_and_factors():
    base = task_config("letter", target_size=4, pretarget_size=4, max_hops=3)  # training length 9
    points = core_lengthgen.plan(
        base, core_lengthgen.LengthGenConfig(lengths=[90, 9, 30, 30], factors=[4, 1, 2]), n_positions=100
    )
    assert points == [
        ("paper", 9, 1.0),
        ("paper", 30, 30 / 9),
        ("paper", 90, 10.0),
        ("seed", 9, 1.0),
        ("seed", 18, 2.0),
        ("seed", 36, 4.0),
    ]
    assert [
        p[1] for p in core_lengthgen.plan(base, core_lengthgen.LengthGenConfig(protocol="paper", lengths=[9]), 9)
    ] == [9]


@pytest.mark.parametrize("length, max_tokens", [(17, 16384), (2048, 16384), (5000, 4096), (3, 7)])
def test_batch_is_bounded_by_tokens(length, max_tokens):
    b = core_lengthgen.batch_size(length, max_tokens)
    assert b >= 1 and (b * length <= max_tokens or b == 1) and (b + 1) * length > max_tokens


def test_discrepancy_bound_is_theorem_3_2_at_the_query_position():
    cfg = core_lengthgen.LengthGenConfig()
    th_i, th_r = 10000 ** (-2 / 128), 10000 ** (-82 / 128)  # IDs 2 and 42 of the 128-dim RoPE
    for length in [17, 100, 2048]:
        n = length - 1
        assert core_lengthgen.discrepancy_bound(task_config("number"), length, cfg) == pytest.approx(
            min(1 - math.cos(th_i), 2 * math.pi**2 / n**2)
        )
    omega = 2 * math.pi / 8
    assert core_lengthgen.discrepancy_bound(task_config("letter"), 17, cfg) == pytest.approx(
        1 - math.cos(omega - 16 * th_r)
    )
    last_valid = math.ceil(omega / 2 / th_r)  # n theta < omega / 2 fails from n = last_valid on
    assert not math.isnan(core_lengthgen.discrepancy_bound(task_config("letter"), last_valid, cfg))
    assert math.isnan(core_lengthgen.discrepancy_bound(task_config("letter"), last_valid + 1, cfg))


# ---- a tiny trained run ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """150 steps of a 2-layer, width-32 number model whose position table ends at 256 tokens. Four
    symbols (chance 1/4) so that its accuracies are neither 0 nor 1 and differ by length and hop."""
    return train_tiny(
        tmp_path_factory.mktemp("run"),
        "number",
        steps=150,
        every=150,
        task_overrides={"alphabet_size": 4},
        model={"n_positions": TINY_POSITIONS},
    )


def _reference_accuracy(run_dir, length, n, seed):
    """Slow, obvious path: one sequence at a time through the full forward (all positions' logits)."""
    from posym.models import load_checkpoint

    model, info = load_checkpoint(run_dir, dtype=torch.float64)  # eager attention, float64
    s = generate(core_lengthgen.extension(info["task_config"], length), n, seed, "test")
    with torch.no_grad():
        pred = np.array(
            [model(input_ids=torch.as_tensor(ids)[None]).logits[0, -1].argmax().item() for ids in s.input_ids]
        )
    right = pred == s.answer
    return {0: right.mean(), **{h: right[s.hops == h].mean() for h in range(1, 5)}}, s.hops


def test_run_matches_reference_and_writes_table_and_figure(tiny_run, tmp_path):
    cfg = core_lengthgen.LengthGenConfig(lengths=[40, 17, 256, 100], factors=[1, 2, 3], n=64, seed=5, max_tokens=512)
    ticks = []
    result = lg.run_lengthgen(tiny_run, cfg, tmp_path, progress=lambda done, total: ticks.append((done, total)))
    table = result["table"]
    H = 4
    assert len(table) == (4 + 3) * (H + 1)
    # each distinct length once, for the accuracy (n = 64) and the head-level retention (head_prompts = 64)
    assert ticks[-1] == ((64 + cfg.head_prompts) * (17 + 34 + 40 + 51 + 100 + 256),) * 2
    for protocol, lengths in [("paper", [17, 40, 100, 256]), ("seed", [17, 34, 51])]:
        sub = table[table["protocol"] == protocol]
        for hop in range(H + 1):
            rows = sub[sub["hop"] == hop]
            assert rows["length"].tolist() == lengths  # monotone in length
            assert (rows["extra_target"] == rows["length"] - 17).all()
        assert sub.groupby("length")["n"].apply(lambda n: n.iloc[0] == n.iloc[1:].sum()).all()
    for length in [17, 51, 256]:
        want, hops = _reference_accuracy(tiny_run, length, 64, 5)
        got = table[table["length"] == length].drop_duplicates("hop").set_index("hop")
        for hop, acc in want.items():
            assert got.loc[hop, "acc"] == pytest.approx(acc, abs=1e-12), (length, hop)
            assert got.loc[hop, "n"] == (64 if hop == 0 else (hops == hop).sum())
    assert 0.05 < table["acc"].min() and table["acc"].max() < 0.95 and table["acc"].nunique() > 5
    ref = table[(table["length"] == 17)].set_index(["protocol", "hop"])["acc"]
    for row in table[table["protocol"] == "seed"].itertuples():
        expect = row.acc / ref[("seed", row.hop)] if ref[("seed", row.hop)] > 0 else math.nan
        assert row.retention == pytest.approx(expect, nan_ok=True)
    stored = pd.read_parquet(tmp_path / "lengthgen.parquet")
    pd.testing.assert_frame_equal(stored, table)
    assert (tmp_path / "fig5b.png").stat().st_size > 10_000 and (tmp_path / "fig5b.svg").is_file()
    r1 = result["summary"]["seed"]["retention"][1.0]
    assert r1 == 1.0 or (math.isnan(r1) and ref[("seed", 0)] == 0)


def test_summary_longest_length_above_090():
    task = task_config("letter")
    table = pd.DataFrame(
        {
            "protocol": "paper",
            "hop": 0,
            "length": [17, 34, 68, 128],
            "acc": [1.0, 0.95, 0.5, 0.97],
            "factor": 1.0,
            "retention": 1.0,
        }
    )
    assert (
        core_lengthgen.summarize_protocols(table, task)["paper"]["longest_length_acc_ge_0.9"] == 34
    )  # no credit for 128
    table["acc"] = [0.8, 0.95, 0.95, 0.95]
    assert core_lengthgen.summarize_protocols(table, task)["paper"]["longest_length_acc_ge_0.9"] is None


def test_cli_lengthgen_and_too_long_error(tiny_run, tmp_path, monkeypatch, capsys):
    code = run_posym(
        monkeypatch,
        "lengthgen",
        tiny_run,
        "--lengths",
        "17,64",
        "--protocol",
        "paper",
        "--n",
        "8",
        "--out",
        tmp_path / "lg",
    )
    assert code == 0, capsys.readouterr()
    table = pd.read_parquet(tmp_path / "lg" / "lengthgen.parquet")
    assert sorted(table["length"].unique()) == [17, 64] and set(table["protocol"]) == {"paper"}
    capsys.readouterr()
    code = run_posym(
        monkeypatch, "lengthgen", tiny_run, "--lengths", f"17,{TINY_POSITIONS + 1}", "--out", tmp_path / "bad"
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"exceeds the model's position table of {TINY_POSITIONS}" in err
    assert not (tmp_path / "bad").exists()
