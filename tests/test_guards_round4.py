"""Issue 55 (reliability, round four): the newest features under hostile input. Each test failed before its
fix; docs/reliability.md ("Round four") lists them. Bad input: exit 2, one `posym: error:` line, no traceback,
nothing written or replaced."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import cli, one_line

GRID = "layer\tkv_head_0\tkv_head_1\n0\t0.9\t0.1\n1\t0.2\t0.7\n"
"""A user's layer x KV-head table, as another tool writes it."""


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from tiny_llms import save_model, tokenizer

    return save_model(tmp_path_factory.mktemp("round4") / "llama", "llama", tokenizer())


# ---- data loss: every path a command reads is an input of the overwrite guard ------------------------------------


@pytest.mark.parametrize("given_out", [True, False], ids=["--out", "default out"])
def test_atlas_never_overwrites_its_kv_table(llama, tmp_path, capsys, monkeypatch, given_out):
    out = tmp_path / "runs" / "atlas" / "llama" if not given_out else tmp_path / "atlas"
    out.mkdir(parents=True)
    table = out / "full_attention_heads.tsv"
    table.write_text(GRID)
    monkeypatch.chdir(tmp_path)
    argv = ["atlas", llama, "--kv-table", table, "--device", "cpu"]
    code, err = cli(capsys, monkeypatch, *argv, *(["--out", out] if given_out else []))
    one_line(code, err, "would overwrite an input of this command", "full_attention_heads.tsv")
    assert table.read_text() == GRID and sorted(p.name for p in out.iterdir()) == ["full_attention_heads.tsv"]
