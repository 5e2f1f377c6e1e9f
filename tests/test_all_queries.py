"""benchmarks/all_queries.py: its options (the quick subset parses) and its docs table of a results file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "all_queries.py"


def bench():
    spec = importlib.util.spec_from_file_location("all_queries", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: nothing runs
    return module


def test_the_quick_subset_parses():
    args = bench().parser().parse_args(["--models", "smollm2-135m", "--lengths", "256,1024", "--no-command"])
    assert (args.models, args.lengths, args.threads, args.no_command, args.no_forked) == (
        "smollm2-135m",
        "256,1024",
        "default,1",
        True,
        False,
    )


def test_the_table_shows_both_thread_settings_and_the_command_beside_the_library():
    entry = {
        "model": "smollm2-135m",
        "tokens": 1024,
        "forward_s": 2.0,
        "all_s": 10.0,
        "all_ratio": 5.0,
        "all_cpu_ratio": 4.5,
        "last_ratio": 1.05,
        "forward_peak_bytes": 200 * 2**20,
        "all_peak_bytes": 150 * 2**20,
    }
    default = {
        **entry,
        "threads": "default",
        "forked_workers": 2,
        "forked_s": 6.0,
        "command_s": 30.0,
        "command_beyond_s": 12.0,
    }
    table = bench().markdown_table({"runs": [default, {**entry, "threads": "1"}]}).splitlines()
    assert len(table) == 4
    assert (
        "| smollm2-135m | 1,024 | default | 2.00 s | 10.0 s | 5.00x / 4.50x | 2 x 1: 3.00x | 12.0 s: 6.00x |"
        in table[2]
    )
    assert table[3].startswith("| smollm2-135m | 1,024 | 1 |") and "| - | - |" in table[3]


def test_a_last_query_only_length_shows_dashes_for_every_query():
    entry = {
        "model": "gemma3-270m",
        "tokens": 4096,
        "threads": "1",
        "forward_s": 60.0,
        "last_ratio": 0.5,
        "forward_peak_bytes": 4096 * 2**20,
    }
    (line,) = bench().markdown_table({"runs": [entry]}).splitlines()[2:]
    assert line == "| gemma3-270m | 4,096 | 1 | 60.00 s | - | - | - | - | 0.50x | 4096 / - MiB |"


def test_the_committed_benchmark_is_the_docs_table_and_its_claims():
    """docs/benchmarks/all_queries.json: both models, both thread settings, every query at 256 and 1,024 tokens
    and the last query at 4,096; the forked workers' rows equal this process's bit for bit (both score in one
    thread); docs/commands/analysis.md's table is the file's, and its sentences carry the file's ratios."""
    import json

    root = SCRIPT.parents[1]
    record = json.loads((root / "docs" / "benchmarks" / "all_queries.json").read_text())
    runs = {(r["model"], r["tokens"], r["threads"]): r for r in record["runs"]}
    assert set(runs) == {
        (model, tokens, threads)
        for model in ("smollm2-135m", "gemma3-270m")
        for tokens in (256, 1024, 4096)
        for threads in ("default", "1")
    }
    for (_, tokens, threads), r in runs.items():
        assert ("all_s" in r) == (tokens in (256, 1024))
        if "all_s" in r and threads == "default":
            assert r["forked_rows_identical"] and r["forked_max_abs_diff"] == 0.0
    page = (root / "docs" / "commands" / "analysis.md").read_text()
    block = page.split("<!-- all-queries:begin -->\n")[1].split("\n<!-- all-queries:end -->")[0]
    assert block == bench().markdown_table(record)
    smol, gemma = runs["smollm2-135m", 1024, "default"], runs["gemma3-270m", 1024, "default"]
    assert f"{smol['forked_s']:.1f} s over 2 workers, {smol['forked_ratio']:.2f}x the forward" in page
    assert f"{gemma['forked_s']:.1f} s, {gemma['forked_ratio']:.2f}x" in page
    assert f"costs {runs['smollm2-135m', 4096, 'default']['last_ratio']:.2f}x SmolLM2's forward" in page
    assert smol["forked_ratio"] > 3 > gemma["forked_ratio"]  # the goal: met on Gemma, not on SmolLM2
    before = {(r["tokens"], r["threads"]): r for r in record["before_one_scoring_thread"]["runs"]}
    assert before[1024, "default"]["all_s"] > 1.5 * smol["all_s"]  # 2 scoring threads cost more than 1
