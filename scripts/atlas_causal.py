"""`posym atlas`'s causal check on an atlas already written, without recomputing the atlas.

`posym atlas --causal` computes the atlas and then the causal check (`posym.commands.atlas.causal_check`:
the slowest RoPE planes of the top symbolic, positional and retrieval heads zeroed, against random planes
and layer-matched random heads, on needle prompts). The check reads nothing of the atlas but its per-head
table, so on a busy machine it can run on a committed atlas instead: this script loads the model the
atlas names (summary.json), reads DIR/atlas.parquet and DIR/atlas.yaml, runs the same function with
`causal: true` (and the overrides given) and writes into DIR the tables `--causal` writes
(causal.parquet, causal_summary.parquet, causal_heads.parquet), causal.md (report.md's causal section)
and causal.json (its config, manifest, the summary's causal entry and the time it took). Same seed, same
numbers as `posym atlas --causal` with that config.

    python scripts/atlas_causal.py docs/results/atlas-smollm2 [--prompts 12] [--device cpu]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from posym import configs, io, models
from posym.commands import atlas
from posym.core.atlas import CLEAN
from posym.runs import CAUSAL_PARTIAL, output_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="an atlas written by posym atlas")
    parser.add_argument("--prompts", type=int, default=None, help="causal_prompts (needle prompts per depth)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--finish",
        type=int,
        metavar="PLANES",
        default=None,
        help="load no model: summarise the rows a stopped run left in DIR/causal_partial.parquet (the clean model "
        "and every group whose conditions all finished), PLANES being the model's RoPE planes per head",
    )
    args = parser.parse_args()
    summary = io.read_json_object(output_file(args.dir, "atlas", "summary"))
    given = io.read_yaml(output_file(args.dir, "atlas", "config")) | {"causal": True}
    if args.prompts is not None:
        given["causal_prompts"] = args.prompts
    config = configs.from_dict(atlas.AtlasConfig, given, where=str(output_file(args.dir, "atlas", "config")))
    table = io.read_parquet(output_file(args.dir, "atlas", "atlas"))
    partial = args.dir / CAUSAL_PARTIAL  # the rows so far, removed once the check is complete
    if args.finish is not None:
        return finish(args.dir, config, table, partial, args.finish)
    loaded = models.load(summary["model"], device=args.device)
    start, done = time.perf_counter(), [0.0]

    def progress(step):
        done[0] += step
        print(f"causal check {done[0]:.0%} after {time.perf_counter() - start:.0f} s", flush=True)

    causal = atlas.causal_check(loaded, config, table, progress, lambda rows: io.write_parquet(partial, rows))
    partial.unlink()
    write(args.dir, causal, config, summary["model"], {"seconds": round(time.perf_counter() - start, 2)})


def write(out: Path, causal: dict, config, model: str, extra: dict) -> None:
    """The tables, causal.md and causal.json of one causal check."""
    for name in ("rows", "summary", "heads"):
        io.write_parquet(output_file(out, "atlas", "causal" if name == "rows" else f"causal_{name}"), causal[name])
    io.write_text(out / "causal.md", atlas.causal_section(causal, config) + "\n")
    entry = atlas.causal_entry(causal, config)
    io.write_json(
        out / "causal.json",
        {
            **io.manifest(configs.to_dict(config), seed=config.seed, model=model),
            "config": configs.to_dict(config),
            "causal": entry,
            **extra,
        },
    )
    print(f"{entry['conditions']} conditions x {entry['prompts']} prompts; wrote {out}")


def finish(out: Path, config, table, partial: Path, n_planes: int) -> None:
    """Summarise a stopped run: the clean rows and the groups with every condition, the rest named as not run."""
    rows = io.read_parquet(partial)
    groups, ablations = atlas.causal_plan(table, config, n_planes)
    planned = {g: {(a["control"], a["draw"]) for a in ablations if a["group"] == g} for g in groups}
    complete = [g for g in groups if planned[g] <= set(zip(rows.control[rows.group == g], rows.draw[rows.group == g]))]
    kept = rows[rows.group.isin([CLEAN[0], *complete])]
    causal = atlas.causal_result(kept.reset_index(drop=True), groups, ablations, n_planes, config)
    missing = [g for g in groups if g not in complete]
    write(
        out,
        causal,
        config,
        io.read_json_object(output_file(out, "atlas", "summary"))["model"],
        {"partial": {"groups_run": complete, "groups_not_run": missing}},
    )


if __name__ == "__main__":
    main()
