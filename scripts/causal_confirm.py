"""A confirmatory causal test on a committed llm-study (posym.commands.llm_study.confirm; issue 50).

`run STUDY MODEL`: the plan (`ConfirmPlan`, from --plan YAML or its defaults) is written to the work directory
before anything is ablated (a work directory holding another plan is refused); then per factor and chunk of
--chunk sets (the named group first, then the plan's random draws) the real ablations of those sets on the
plan's prompts, each chunk saved as soon as it is done ($HOME/posym-runs/confirm/<study>/; done chunks are
skipped, so a cut run resumes). The prompts, heads and format are the study's: STUDY/study.yaml,
STUDY/screen/screen.json, STUDY/lengths/heads.parquet ('between' layout).

`collect STUDY`: the chunks -> STUDY/confirm/{plan.yaml, points.parquet, confirm.parquet} (confirm.json: seed,
versions, the plan's hash, seconds); refuses an unfinished run.

    OMP_WAIT_POLICY=PASSIVE nice python scripts/causal_confirm.py run docs/results/llm-study-gemma3 gemma3-270m
    python scripts/causal_confirm.py collect docs/results/llm-study-gemma3
    python scripts/causal_confirm.py block --write docs/results.md   # the block between its markers
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from posym.runs import StudyDir

RUNS = Path(os.environ.get("POSYM_RUNS", Path.home() / "posym-runs")) / "confirm"


def work_dir(study: Path) -> Path:
    return RUNS / study.resolve().name


def load_plan(given: Path | None):
    from posym import configs, io
    from posym.commands.llm_study.confirm import ConfirmPlan

    return configs.from_dict(ConfirmPlan, io.read_yaml(given) if given else {}, where=str(given or "plan"))


def claim_plan(where: Path, plan) -> None:
    """Write the plan before the first ablation; a work directory with another plan is refused."""
    from posym import configs, io
    from posym.errors import PosymError

    where.mkdir(parents=True, exist_ok=True)
    wanted = configs.to_dict(plan)
    path = where / "plan.yaml"
    if path.is_file():
        held = io.read_yaml(path)
        if held != wanted:
            raise PosymError(f"{io.quote(where)} holds another plan ({io.quote(path)}): use another --work")
        return
    io.write_yaml(path, wanted)


def run(study: Path, model: str, plan_file: Path | None, where: Path, chunk: int, threads: int) -> None:
    import pandas as pd
    import torch

    from posym import configs, io, models
    from posym.commands import llm_study
    from posym.commands.llm_study import prediction
    from posym.commands.llm_study.confirm import NAMED, confirm_points, plan_sets
    from posym.commands.llm_study.estimates import set_text
    from posym.errors import PosymError

    torch.set_num_threads(threads)
    plan = load_plan(plan_file)
    config = configs.from_dict(llm_study.StudyConfig, io.read_yaml(StudyDir(study).marker), where=str(study))
    if plan.first_prompt + plan.prompts > config.prediction.n_length:
        raise PosymError(
            f"prompts {plan.first_prompt}..{plan.first_prompt + plan.prompts - 1} are past the study's "
            f"n_length {config.prediction.n_length}"
        )
    if plan.first_prompt < config.prediction.n_causal:
        print(f"note: prompts from {plan.first_prompt} overlap the causal stage's first {config.prediction.n_causal}")
    claim_plan(where, plan)
    loaded = models.load(model)
    fmt = io.read_json_object(StudyDir(study).file("screen", "choice"))["format"]
    every = llm_study._length_prompts(loaded, config, fmt)["between"]
    heads = io.read_parquet(StudyDir(study).file("lengths", "heads"))
    heads = heads[heads.layout == "between"]
    named, draws = plan_sets(heads, plan, kinds=prediction.layer_kinds(loaded.model))
    sets = [named, *draws]
    for factor in sorted(plan.factors):
        prompts = every[factor][plan.first_prompt : plan.first_prompt + plan.prompts]
        for lo in range(0, len(sets), chunk):
            path = where / f"f{factor:02d}-s{lo:04d}.parquet"
            if path.exists():
                continue
            t0 = time.time()
            part = sets[lo : lo + chunk]
            rows = confirm_points(loaded.model, prompts, part, mode=plan.mode, factor=factor, first_set=NAMED + lo)
            frame = pd.DataFrame(rows)
            frame["heads"] = [set_text(sets[s - NAMED]) for s in frame.set]
            seconds = time.time() - t0
            io.write_parquet(path, frame.assign(chunk=lo, seconds=seconds))
            print(f"{factor}x sets {lo}-{lo + len(part) - 1} of {len(sets)}: {seconds:.0f} s", flush=True)


def collect(study: Path, where: Path) -> None:
    import pandas as pd

    from posym import configs, io
    from posym.commands.llm_study.confirm import confirm_table
    from posym.errors import PosymError

    plan = load_plan(where / "plan.yaml")
    chunks = sorted(where.glob("f*-s*.parquet"))
    if not chunks:
        raise PosymError(f"{io.quote(where)} holds no chunks: run first")
    points = pd.concat([io.read_parquet(c) for c in chunks], ignore_index=True).sort_values(["factor", "set", "prompt"])
    table = confirm_table(points, plan)  # refuses an unfinished run
    out = StudyDir(study)
    io.write_yaml(out.file("confirm", "plan"), configs.to_dict(plan))
    io.write_parquet(out.file("confirm", "points"), points.reset_index(drop=True))
    io.write_parquet(out.file("confirm", "confirm"), table)
    per_factor = points.groupby(["factor", "chunk"]).seconds.first().groupby("factor").sum()  # a chunk's, once
    io.write_json(
        out.file("confirm", "record"),
        {
            "plan_hash": io.config_hash(configs.to_dict(plan)),
            "seed": plan.seed,
            "seconds_by_factor": {str(k): round(float(v), 1) for k, v in per_factor.items()},
            "sets": int(points.set.nunique()),
            "versions": io.versions(),
        },
    )
    print(table.to_string())


BEGIN, END = "<!-- causal-confirm:begin -->", "<!-- causal-confirm:end -->"
STUDIES = {"Gemma 3 270M": Path(__file__).resolve().parents[1] / "docs" / "results" / "llm-study-gemma3"}
"""Model name -> study directory whose confirm/ tables the docs block shows (in this order, where present)."""


def block() -> str:
    """The docs/results.md block: per committed confirmatory test, its plan in one line and one row per measure
    and length (the planned family's with Holm p and verdict, the rest described, not tested)."""
    import pandas as pd

    from posym import io

    lines = [BEGIN, ""]
    for name, study in STUDIES.items():
        path = StudyDir(study).file("confirm", "confirm")
        if not path.is_file():
            continue
        plan = io.read_yaml(StudyDir(study).file("confirm", "plan"))
        table = pd.read_parquet(path)
        lines += [
            f"**{name}** ({study.relative_to(study.parents[2])}/confirm/): the {plan['k']} most {plan['group']} heads "
            f"({plan['ranking']} labels), {plan['mode']}-ablation, prompts {plan['first_prompt']}-"
            f"{plan['first_prompt'] + plan['prompts'] - 1} of the study's, {plan['draws']} real random sets matched on "
            f"layer and layer kind (seed {plan['seed']}); tested: {plan['measure']} at every length, Holm over "
            f"{int(table.family.max())}.",
            "",
            "| measure | tokens | prompts | clean accuracy | ablated | group | random median [95%] | p | Holm p | verdict | MDE |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in table.itertuples():
            holm = f"{r.p_holm:.3f}" if r.tested else "-"
            lines.append(
                f"| {r.measure} | {r.length:,} | {r.prompts} | {r.acc_clean:.2f} | {r.acc:.2f} | {r.value:+.2f} | "
                f"{r.null_median:+.2f} [{r.null_lo:+.2f}, {r.null_hi:+.2f}] | {r.p:.3f} | {holm} | {r.verdict} | "
                f"{r.mde:.2f} |"
            )
        lines.append("")
    return "\n".join([*lines, END])


def write_block(path: Path) -> None:
    from llm_verdicts import write

    write(path, BEGIN, END, block)


def main() -> None:
    from posym.errors import PosymError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("study", type=Path)
    one.add_argument("model")
    one.add_argument("--plan", type=Path, default=None, help="YAML of ConfirmPlan fields (default: its defaults)")
    one.add_argument(
        "--work", type=Path, default=None, help="chunk directory (default $HOME/posym-runs/confirm/<study>)"
    )
    one.add_argument("--chunk", type=int, default=10, help="sets per saved chunk")
    one.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "1")))
    two = sub.add_parser("collect")
    two.add_argument("study", type=Path)
    two.add_argument("--work", type=Path, default=None)
    three = sub.add_parser("block", help="print the docs block of the committed tests (--write FILE rewrites it)")
    three.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    try:
        if args.command == "run":
            run(args.study, args.model, args.plan, args.work or work_dir(args.study), args.chunk, args.threads)
        elif args.command == "collect":
            collect(args.study, args.work or work_dir(args.study))
        elif args.write:
            write_block(args.write)
        else:
            print(block())
    except PosymError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
