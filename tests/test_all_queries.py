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
