"""AtP and AtP* against exhaustive single-head ablation on the real models (issue 51's validation).

`run`: for each (model, factor) job, the length task's prompts (kv-code, 'between' layout, seed 0, the
llm-study family) at factor x the base length; mean-ablation, the reference set being REFERENCE prompts of
that length; the margin metric. Per chunk of prompts: AtP* (which holds AtP's signed estimate too), every
head ablated alone (`posym.core.attribution.ablation_effects`) and GROUP_DRAWS random sets of k = 8 heads
plus the top-8 heads by mean AtP and by mean AtP* ablated together. Each chunk is saved under
$HOME/posym-runs/attribution/<model>/<factor>x/ as soon as it is done (resumable: done chunks are skipped).

`collect`: the chunks -> docs/results/attribution/{heads,groups}_<model>_<factor>x.parquet (per prompt and
head / group), then `tables`.

`named`: the llm-study's own named groups (the K most symbolic and most positional heads by its sink-free and
plain rankings, `prediction.ranked_group` over the study's committed lengths/heads.parquet, 'between'
layout: the groups its causal stage ablates) ablated for real on the committed job's prompts, with the same
reference, and written into its groups_<model>_<factor>x.parquet as kind 'named <ranking> <group>' (rows of
an earlier `named` replaced), then `tables`: so each named group's sum of AtP is validated against its real
ablation on the job's prompts.

`tables`: the committed per-prompt tables -> summary.parquet and groups_summary.parquet
(`posym.commands.attribute.validation_summary`) and the generated tables of docs/attribution.md (with the
benchmark's, docs/benchmarks/attribution_speed.json).

    OMP_WAIT_POLICY=PASSIVE nice -n 10 python scripts/attribution_validation.py run smollm2-135m:1:50 ...
    python scripts/attribution_validation.py collect
    python scripts/attribution_validation.py named smollm2-135m:1:docs/results/llm-study \
        gemma3-270m:1:docs/results/llm-study-gemma3 gemma3-270m:16:docs/results/llm-study-gemma3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import random
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RUNS = Path(os.environ.get("POSYM_RUNS", Path.home() / "posym-runs")) / "attribution"
OUT = ROOT / "docs" / "results" / "attribution"
DOC = ROOT / "docs" / "attribution.md"
SPEED = ROOT / "docs" / "benchmarks" / "attribution_speed.json"
REFERENCE = 50
"""Prompts of each length whose per-position mean is the mean-ablation reference."""
K = 8
"""Heads per ablated group."""
GROUP_DRAWS = 20
"""Random sets of K heads per job (uniform over all heads, seed 0)."""
CHUNK = {1: 5}
"""Prompts per saved chunk by factor (1 for longer prompts)."""


def prompts_for(loaded, factor: int, n: int):
    from posym.prompts import Builder, LengthFamily, build

    family = LengthFamily("kv-code", factors=sorted({1, factor}))
    return build(family, Builder(loaded.tokenizer), n, seed=0, max_positions=loaded.max_positions)[factor]


def run_job(name: str, factor: int, n: int) -> None:
    import torch

    from posym.core.attribution import ablation_effects, attribute
    from posym.models import load

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    loaded = load(name)
    model = loaded.model
    config = model.config
    n_layer, n_head = config.num_hidden_layers, config.num_attention_heads
    reference = [p.ids for p in prompts_for(loaded, factor, REFERENCE)]
    prompts = prompts_for(loaded, factor, max(n, REFERENCE))[:n]
    where = RUNS / name / f"{factor}x"
    where.mkdir(parents=True, exist_ok=True)
    singles = [[(l, h)] for l in range(n_layer) for h in range(n_head)]
    rng = random.Random(0)
    every = [(l, h) for l in range(n_layer) for h in range(n_head)]
    draws = [sorted(rng.sample(every, K)) for _ in range(GROUP_DRAWS)]
    step = CHUNK.get(factor, 1)
    for lo in range(0, n, step):
        path = where / f"chunk{lo:04d}.npz"
        if path.exists():
            continue
        chunk = prompts[lo : lo + step]
        ids, answers = [p.ids for p in chunk], [p.answer_id for p in chunk]
        t0 = time.time()
        est = attribute(model, ids, answers, mode="mean", method="atp*", metric="margin", reference=reference)
        t1 = time.time()
        exact = ablation_effects(model, ids, answers, singles, mode="mean", metric="margin", reference=reference)
        t2 = time.time()
        # the groups of this chunk's own top heads (by the chunk's mean estimate) beside the random draws
        top_atp = [every[i] for i in np.argsort(-np.abs(est["effect"]).mean(0).ravel(), kind="stable")[:K]]
        top_star = [every[i] for i in np.argsort(-est["magnitude"].mean(0).ravel(), kind="stable")[:K]]
        groups = [sorted(top_atp), sorted(top_star), *draws]
        real = ablation_effects(model, ids, answers, groups, mode="mean", metric="margin", reference=reference)
        t3 = time.time()
        np.savez(
            path,
            index=np.array([p.index for p in chunk]),
            length=np.array([p.length for p in chunk]),
            effect=est["effect"],
            magnitude=est["magnitude"],
            clean=est["clean"],
            exact=exact["effect"].reshape(len(chunk), n_layer, n_head),
            exact_correct=exact["correct"].reshape(len(chunk), n_layer, n_head),
            clean_correct=exact["clean_correct"],
            groups=np.array([",".join(f"{a}.{b}" for a, b in g) for g in groups]),
            group_kind=np.array(["top-atp", "top-atp*", *(["random"] * len(draws))]),
            group_exact=real["effect"],
            group_correct=real["correct"],
            seconds=np.array([t1 - t0, t2 - t1, t3 - t2]),
        )
        print(
            f"{name} {factor}x prompts {lo}-{lo + len(chunk)}: atp* {t1 - t0:.0f}s exact {t2 - t1:.0f}s "
            f"groups {t3 - t2:.0f}s",
            flush=True,
        )


def collect() -> None:
    import pandas as pd

    from posym.io import write_parquet

    OUT.mkdir(parents=True, exist_ok=True)
    for model_dir in sorted(p for p in RUNS.iterdir() if p.is_dir()):
        for job in sorted(p for p in model_dir.iterdir() if p.is_dir()):
            chunks = [np.load(c) for c in sorted(job.glob("chunk*.npz"))]
            if not chunks:
                continue
            heads, groups = [], []
            for c in chunks:
                n_p, n_layer, n_head = c["effect"].shape
                for i in range(n_p):
                    layer, head = np.meshgrid(np.arange(n_layer), np.arange(n_head), indexing="ij")
                    heads.append(
                        pd.DataFrame(
                            {
                                "prompt": int(c["index"][i]),
                                "length": int(c["length"][i]),
                                "layer": layer.ravel(),
                                "head": head.ravel(),
                                "exact": c["exact"][i].ravel(),
                                "atp": c["effect"][i].ravel(),
                                "atp_star": c["magnitude"][i].ravel(),
                                "clean": float(c["clean"][i]),
                                "clean_correct": bool(c["clean_correct"][i]),
                                "exact_correct": c["exact_correct"][i].ravel(),
                            }
                        )
                    )
                    groups.append(
                        pd.DataFrame(
                            {
                                "prompt": int(c["index"][i]),
                                "group": c["groups"],
                                "kind": c["group_kind"],
                                "exact": c["group_exact"][i],
                                "correct": c["group_correct"][i],
                            }
                        )
                    )
            tag = f"{model_dir.name}_{job.name}"
            write_parquet(OUT / f"heads_{tag}.parquet", pd.concat(heads, ignore_index=True))
            write_parquet(OUT / f"groups_{tag}.parquet", pd.concat(groups, ignore_index=True))
    tables()


def committed_jobs() -> list[tuple[str, str]]:
    """(model, 'Nx') of every committed heads_<model>_<Nx>.parquet."""
    return sorted(
        (m.group(1), m.group(2))
        for p in OUT.glob("heads_*.parquet")
        if (m := re.match(r"heads_(.+)_(\d+x)\.parquet", p.name))
    )


def tables() -> None:
    import pandas as pd

    from posym.commands.attribute import disagreements, speed_markdown, validation_markdown, validation_summary
    from posym.io import write_parquet

    summaries, group_summaries, worst = [], [], []
    for model, job in committed_jobs():
        heads_frame = pd.read_parquet(OUT / f"heads_{model}_{job}.parquet")
        groups_frame = pd.read_parquet(OUT / f"groups_{model}_{job}.parquet")
        single, grouped = validation_summary(heads_frame, groups_frame)
        where = {"model": model, "factor": int(job[:-1])}
        worst.append(disagreements(heads_frame).assign(**where))
        summaries.append(single.assign(**where))
        group_summaries.append(grouped.assign(**where))
    summary = pd.concat(summaries, ignore_index=True)
    group_summary = pd.concat(group_summaries, ignore_index=True)
    write_parquet(OUT / "summary.parquet", summary)
    write_parquet(OUT / "groups_summary.parquet", group_summary)
    worst_frame = pd.concat(worst, ignore_index=True)
    tables = {"attribution-validation": validation_markdown(summary, group_summary, worst_frame)}
    if SPEED.exists():
        tables["attribution-speed"] = speed_markdown(json.loads(SPEED.read_text()))
    text = DOC.read_text(encoding="utf-8")
    for name, table in tables.items():
        text = re.sub(
            rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)",
            lambda m, t=table: m.group(1) + t + "\n" + m.group(2),
            text,
            flags=re.S,
        )
    DOC.write_text(text, encoding="utf-8")


def named(name: str, factor: int, study: Path) -> None:
    """The study's named groups ablated for real on the committed job's prompts (see the module docstring)."""
    import pandas as pd
    import torch

    from posym.commands.llm_study.prediction import CAUSAL_GROUPS, RANKINGS, ranked_group
    from posym.core.attribution import ablation_effects
    from posym.io import read_parquet, write_parquet
    from posym.models import load
    from posym.runs import StudyDir

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    path = OUT / f"groups_{name}_{factor}x.parquet"
    committed = read_parquet(path)
    wanted = sorted(read_parquet(OUT / f"heads_{name}_{factor}x.parquet").prompt.unique())
    loaded = load(name)
    reference = [p.ids for p in prompts_for(loaded, factor, REFERENCE)]
    prompts = [p for p in prompts_for(loaded, factor, max(max(wanted) + 1, REFERENCE)) if p.index in set(wanted)]
    if [p.index for p in prompts] != wanted:
        raise SystemExit(f"{path}: its prompts {wanted[:5]}... are not the length task's (seed 0)")
    heads = read_parquet(StudyDir(study).file("lengths", "heads"))
    heads = heads[heads.layout == "between"]
    kinds = {
        f"named {ranking} {group}": ranked_group(heads, ranking, group, K)
        for ranking in RANKINGS
        for group in CAUSAL_GROUPS
    }
    t0 = time.time()
    real = ablation_effects(
        loaded.model,
        [p.ids for p in prompts],
        [p.answer_id for p in prompts],
        list(kinds.values()),
        mode="mean",
        metric="margin",
        reference=reference,
    )
    rows = pd.DataFrame(
        [
            {
                "prompt": p.index,
                "group": ",".join(f"{a}.{b}" for a, b in members),
                "kind": kind,
                "exact": float(real["effect"][i, g]),
                "correct": bool(real["correct"][i, g]),
            }
            for g, (kind, members) in enumerate(kinds.items())
            for i, p in enumerate(prompts)
        ]
    )
    kept = committed[~committed.kind.str.startswith("named ")]
    write_parquet(path, pd.concat([kept, rows.astype(kept.dtypes.to_dict())], ignore_index=True))
    print(
        f"{name} {factor}x: {len(kinds)} named groups on {len(prompts)} prompts in {time.time() - t0:.0f}s", flush=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    go = sub.add_parser("run")
    go.add_argument("jobs", nargs="+", help="MODEL:FACTOR:N, run in order")
    sub.add_parser("collect")
    sub.add_parser("tables")
    study = sub.add_parser("named")
    study.add_argument("jobs", nargs="+", help="MODEL:FACTOR:STUDY_DIR (a committed job and the study labelling it)")
    args = parser.parse_args()
    if args.what == "collect":
        collect()
        return
    if args.what == "tables":
        tables()
        return
    if args.what == "named":
        for job in args.jobs:
            name, factor, where = job.split(":", 2)
            named(name, int(factor), Path(where))
        tables()
        return
    for job in args.jobs:
        name, factor, n = job.split(":")
        run_job(name, int(factor), int(n))


if __name__ == "__main__":
    main()
