"""Tests of posym.core.theory: the hardest inputs and the beta search against exhaustive sets, Theorem
3.2's bounds on a grid, gap statistics and errors; files and CLI of `posym theory`."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from posym.core import constructions as C
from posym.commands import theory as theory_command
from posym.core import theory as T
from posym.cli import app
from posym.errors import PosymError
from posym.core.tasks import TaskConfig, task_config


# ---- discrepancy, bounds and beta -----------------------------------------------------------------


def _exhaustive_letters(A, n):
    grid = torch.cartesian_prod(*[torch.arange(A)] * (n + 2)).reshape(-1, n + 2)
    keep = (grid[:, :-1] == grid[:, -1:]).sum(1) == 1
    return grid[keep, :-1], grid[keep, -1]


@pytest.mark.parametrize("A,n", [(5, 4), (8, 3), (6, 5)])
def test_hardest_retrieval_inputs_are_the_worst_of_all(A, n):
    cfg = TaskConfig("letter", alphabet_size=A)
    theta = 0.8 * (2 * math.pi / A) / (2 * n)
    head = C.retrieval_head(cfg, theta)
    letters, y = _exhaustive_letters(A, n)
    ids = T._letter_tokens(cfg, letters, y, torch.Generator().manual_seed(0))
    logits = C.attention_logits(head, ids, last_only=True)[:, 0]
    all_beta = T.min_beta(logits, T.target_key(cfg, ids), 0.01).max().item()
    beta, lemma = T.needed_beta(head, cfg, n, 0.01)
    assert beta == pytest.approx(all_beta, rel=1e-9)
    delta = T.logit_gaps(logits).min().item()
    assert T.logit_gaps(
        C.attention_logits(head, T.hardest_inputs(cfg, n, theta), last_only=True)[:, 0]
    ).min().item() == pytest.approx(delta, abs=1e-12)
    assert lemma == pytest.approx(math.log(n * 0.99 / 0.01) / delta)


def test_min_beta_is_the_threshold():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 9, generator=gen, dtype=torch.float64)
    target = logits.argmax(1)
    eps = 0.05
    beta = T.min_beta(logits, target, eps)
    mass = lambda b: torch.softmax(b[:, None] * logits, 1).gather(1, target[:, None])[:, 0]  # noqa: E731
    assert torch.allclose(mass(beta), torch.full_like(beta, 1 - eps), atol=1e-9)
    assert (mass(beta * 0.999) < 1 - eps).all()
    gap = T.logit_gaps(logits)
    assert (beta <= T.lemma_beta(gap, 9, eps) + 1e-9).all()
    assert (beta >= math.log((1 - eps) / eps) / gap - 1e-9).all()
    wrong = (target + 1) % 9  # not the argmax: no beta works
    assert torch.isinf(T.min_beta(logits, wrong, eps)).all()


def test_theorem_3_2_bounds_on_a_grid():
    ns = range(1, 101)
    for theta in (2.5, 1.0, 0.866, 0.3, 0.05, 0.0027):
        for r in T.discrepancy_curve(theta, ns):
            if r["valid"]:
                assert r["delta"] <= r["bound"] + 1e-12, r
        # T_Index's minimum over sigma is attained by sigma = n: 1 - max_{k=1..n} cos(k theta)
        for r in T.discrepancy_curve(theta, [7, 40]):
            if r["head"] == "index":
                assert r["delta"] == pytest.approx(1 - max(math.cos(k * theta) for k in range(1, r["n"] + 1)))
    omega = 2 * math.pi / 8
    for r in T.discrepancy_curve(0.0027, ns):  # the retrieval bound is nearly attained
        if r["head"] == "retrieval":
            n = r["n"]
            assert r["delta"] == pytest.approx(math.cos((n - 1) * 0.0027) - math.cos(omega - n * 0.0027), abs=1e-12)
    nope = [r["delta"] for r in T.discrepancy_curve(0.0, ns) if r["head"] == "retrieval"]
    assert nope == pytest.approx([1 - math.cos(omega)] * 100, abs=1e-12)  # NoPE never vanishes


def test_max_over_inputs_would_break_the_index_bound():
    # why Delta is the minimum gap: the largest gap over inputs exceeds 2 pi^2 / n^2 at theta = 0.866
    cfg = TaskConfig("number", int_range=100)
    head = C.index_head(cfg, 0.866)
    broken = [
        n
        for n in range(2, 101)
        if T.logit_gaps(C.attention_logits(head, T.hardest_inputs(cfg, n, 0.866), last_only=True)[:, 0]).max().item()
        > T.index_bound(0.866, n)
    ]
    assert len(broken) > 10


def test_gap_stats_and_errors():
    logits = torch.tensor([[3.0, 1.0, float("-inf")], [0.0, 0.5, 0.25]])
    assert T.logit_gaps(logits).tolist() == [2.0, 0.25]
    stats = T.gap_stats(T.logit_gaps(logits))
    assert stats["delta"] == 0.25 and stats["gap_max"] == 2.0 and stats["inputs"] == 2
    with pytest.raises(PosymError, match="two visible keys"):
        T.logit_gaps(torch.tensor([[1.0, float("-inf")]]))
    with pytest.raises(PosymError, match="frequency ID"):
        T.frequency_angle(65)
    assert T.frequency_angle(2) == pytest.approx(0.866, abs=1e-3)
    assert T.frequency_angle(42) == pytest.approx(0.0027, abs=1e-4)
    with pytest.raises(PosymError, match="number task"):
        C.index_head(task_config("letter"), 0.5)
    with pytest.raises(PosymError, match="n0"):
        T.TheoryConfig(n0=[])
    with pytest.raises(PosymError, match="omega"):
        T.verify(T.TheoryConfig(n0=[200]))


# ---- files and CLI -----------------------------------------------------------------------------------


def test_run_theory_writes_everything(tmp_path):
    config = T.TheoryConfig(n0=[3, 6], samples=2000, task_samples=60, curve_max_n=12, curve_freq_ids=[2, 42])
    result = theory_command.run_theory(config, tmp_path)
    for name in ("theory.parquet", "discrepancy.parquet", "theory.json", "fig5a.png", "fig5a.svg"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "theory.json").read_text())["summary"] == result["summary"]
    assert all(r["exact"] and r["softmax_exact"] for r in result["summary"])
    assert all(r["beta_needed"] <= r["beta_lemma"] for r in result["summary"])
    assert (tmp_path / "fig5a.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_theory(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["theory", "--n0", "4", "--samples", "500", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "index" in res.output and (tmp_path / "theory.json").exists()
    res = runner.invoke(app, ["theory", "--n0", "500", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and isinstance(res.exception, PosymError)
