"""Time the stages of `posym llm-study` that ask what a head type predicts (screen, lengths, causal).

    python benchmarks/prediction_study.py --out ~/posym-runs/llm-study-pred      # run them, then record
    python benchmarks/prediction_study.py --model gemma3-270m --out ~/posym-runs/llm-study-pred-gemma3
    python benchmarks/prediction_study.py --out DIR --record-only                 # record a finished DIR
    python benchmarks/prediction_study.py --out DIR --record-only --stages screen,lengths \
        --output docs/benchmarks/llm_study_past_context.json                     # a study run with its own YAML

Runs the three stages with the default StudyConfig on an embedded model (smollm2-135m, or --model; resuming
whatever OUT already holds) and writes docs/benchmarks/llm_study_prediction.json (the other models:
llm_study_prediction_<model>.json): wall and CPU seconds per stage
(from the stages' done-files), their sum against the issue's 20-minute budget, and the study.yaml. With
--record-only, --stages and --output record any finished study (its study.yaml says what it ran).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import benchmark_header  # noqa: E402

from posym import io  # noqa: E402
from posym.runs import PREDICTION_STAGES as STAGES  # noqa: E402
from posym.stages import done_path  # noqa: E402

BUDGET_S = 20 * 60
OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "llm_study_prediction.json"
MODEL = "smollm2-135m"
"""The model the budget is stated for (issue 50: the default study inside ~20 minutes on 2 cores)."""


def output_for(model: str) -> Path:
    """Where a model's run is recorded: OUTPUT for the default model, a sibling named after any other."""
    return OUTPUT if model == MODEL else OUTPUT.with_name(f"{OUTPUT.stem}_{model.split('-')[0]}.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--record-only", action="store_true")
    parser.add_argument("--note", default="", help="what else the machine was doing")
    parser.add_argument("--stages", default=",".join(STAGES), help="the stages to record (with --record-only)")
    parser.add_argument("--output", type=Path, default=None, help="the JSON written")
    parser.add_argument("--model", default=MODEL, help="the embedded model run (a run only)")
    args = parser.parse_args()
    stages = args.stages.split(",")
    if not args.record_only and (stages != list(STAGES) or args.output is not None):
        parser.error("--stages and --output are for --record-only (a run records the default stages)")
    load = os.getloadavg()
    if not args.record_only:
        from posym import models
        from posym.commands import llm_study

        args.out.mkdir(parents=True, exist_ok=True)
        loaded = models.load(args.model)
        llm_study.run_study(
            loaded,
            args.out,
            llm_study.StudyConfig(),
            settings={"model": args.model, "device": "cpu"},
            only=list(STAGES),
        )
    done = {stage: json.loads(done_path(args.out, "study", stage).read_text()) for stage in stages}
    seconds = {stage: d["seconds"] for stage, d in done.items()}
    manifest = json.loads((args.out / "manifest.json").read_text())
    model = manifest.get("model", MODEL)
    output = args.output or output_for(model)
    identity = manifest.get("identity", {})
    io.write_json(
        output,
        {
            **benchmark_header(None, load),
            "command": f"posym llm-study --stages {','.join(stages)} "
            + (f"(default StudyConfig, {model})" if args.output is None else f"({model}, its study.yaml)"),
            "model": f"{model} ({identity.get('model_type')}, {identity.get('parameters', 0):,} parameters, float32)",
            "how": "wall and CPU seconds of each stage from its done-file (model loading excluded)",
            "stage_seconds": seconds,
            "stage_cpu_seconds": {s: d.get("cpu_seconds") for s, d in done.items()},
            "seconds": round(sum(seconds.values()), 2),
            "budget_seconds": BUDGET_S,
            "within_budget": sum(seconds.values()) <= BUDGET_S,
            "note": args.note,
            "study_yaml": (args.out / "study.yaml").read_text(encoding="utf-8"),
        },
    )
    print(f"{output}: {sum(seconds.values()):.0f} s ({seconds})")


if __name__ == "__main__":
    main()
