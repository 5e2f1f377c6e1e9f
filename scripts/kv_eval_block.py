"""Issue 53's evaluation, printed from the committed tables of `posym kv-eval` (docs/results/kv-eval-*/).

The block of docs/results.md between `<!-- kv-eval:begin -->` and `<!-- kv-eval:end -->` (`--write FILE`
rewrites it): per model, task and length, the accuracy of every policy at each budget with its Wilson 95%
interval and kept-KV fraction, the random draws' median and range, and the exact McNemar test of each
ranked policy against the full cache and the randomization p among the draws (both Holm over the table),
after the run's primary tests (primary.parquet: each ranked policy against the draws on its answers pooled
over every task and length, with the smallest Holm p that family can give). Nothing is computed here that
the tables do not hold: tests/test_kv_eval.py checks the block against this script's output and the tables
against `kv_eval.summarize` / `accuracy_tests` / `primary_tests` of the per-prompt rows.

    python scripts/kv_eval_block.py [--write docs/results.md]

A run still going (its tasks are stages, each written when done) can be committed in part: `--partial RUN
DEST` copies the finished tasks' per-prompt tables, the head table, config and manifest of the kv-eval
directory RUN into DEST and writes DEST's summary, tests and primary tests over those tasks alone (Holm
over those smaller tables) and partial.json naming the finished tasks; the block then says which tasks a
run holds, and kv-eval's accuracy figure over them (a row of panels per task). Once every task is finished the
same call commits the whole run (and removes partial.json). `--partial RUN MORE... DEST` also takes the finished tasks of further
directories run in parallel processes with the first's config but fewer `tasks` (a task's rows do not
depend on the other tasks): their configs, head tables and model must be the first's, and a task finished
in several is taken from the first that holds it. A DEST that already holds a partial commit of the same
config, model and head table keeps the tasks it holds that no run does, so tasks run later (a one-task
config, in another session) join an earlier commit. `--of TASKS` names the tasks the commit is of when
no run's config does (one-task runs only, started in parallel): the first commit of such runs is then
partial, not a whole one-task run. DEST's manifest.json is the first run's with the config hash of the
config DEST holds (every task) and, under `task_config_hashes`, the hash of the run each task came from.

    python scripts/kv_eval_block.py --partial RUN [MORE ...] DEST [--of length,multikey,vartrack]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from posym import configs, io
from posym.core.stats import holm_floor
from posym.runs import done_path, figure_file, kv_eval_prompts, output_file

PARTIAL = "partial.json"
"""What a run committed in part holds: {"finished": [tasks], "of": [the config's tasks]}."""

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- kv-eval:begin -->", "<!-- kv-eval:end -->"
RESULTS = ROOT / "docs" / "results"
RUNS = {
    "SmolLM2-135M-Instruct, 1x / 2x / 4x": RESULTS / "kv-eval-smollm2",
    "SmolLM2-135M-Instruct, 1x / 2x / 4x, 100 draws": RESULTS / "kv-eval-smollm2-draws100",
    "SmolLM2-135M-Instruct, 1x / 2x / 4x, budgets 0.25 / 0.5 / 0.75": RESULTS / "kv-eval-smollm2-budgets",
    "SmolLM2-135M-Instruct, 1x / 4x / 16x": RESULTS / "kv-eval-smollm2-16x",
    "Gemma 3 270M, 1x / 2x / 4x": RESULTS / "kv-eval-gemma3",
    "Qwen2.5-Coder-0.5B-Instruct, 1x / 2x / 4x": RESULTS / "kv-eval-qwen2.5-coder-0.5b",
}
RANKED = ("posym", "retrieval", "duo")
"""The policies that rank heads (random and streaming are their controls)."""


def run_config(run: Path):
    """The `KVEvalConfig` a kv-eval directory ran with (a field added since, at its default)."""
    from posym.commands import kv_eval

    return configs.from_dict(kv_eval.KVEvalConfig, io.read_yaml(output_file(run, "kv-eval", "config")))


def _p(value: float) -> str:
    return "-" if pd.isna(value) else (f"{value:.3f}" if value >= 0.001 else f"{value:.1e}")


OVERVIEW_BUDGET = 0.5
"""The budget of the block's first table, one row per run: every run has it (half the KV heads streaming,
issue 53's goal)."""


def overview() -> list[str]:
    """The block's first table: per run, each ranked policy's accuracy at half the KV heads streaming pooled
    over the run's tasks and lengths (its primary tests' rows), beside the full cache and the median draw,
    posym's McNemar test against the full cache (Holm over the run's primary tests) and the ranked policy
    with the highest pooled accuracy (point values: no table holds a test between two ranked policies)."""
    lines = [
        f"One row per run at half the KV heads streaming (budget {OVERVIEW_BUDGET}), pooled over the run's tasks and "
        "lengths (primary.parquet; intervals Wilson 95%):",
        "",
        "| run | tasks | prompts | full | posym | retrieval | duo | median draw | posym vs full (b / c) | Holm p | "
        "highest ranked |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, run in RUNS.items():
        primary = pd.read_parquet(output_file(run, "kv-eval", "primary"))
        at = {r.policy: r for r in primary[primary.budget == OVERVIEW_BUDGET].itertuples()}
        first = at["posym"]
        top = max(at[policy].accuracy for policy in RANKED)
        ties = [policy for policy in RANKED if at[policy].accuracy == top]
        lines.append(
            f"| {model} | {first.tasks.replace(',', ', ')} | {first.n} | {first.full_accuracy:.2f} | "
            + " | ".join(f"{at[p].accuracy:.2f} [{at[p].lo:.2f}, {at[p].hi:.2f}]" for p in RANKED)
            + f" | {first.random_median:.2f} | {first.diff_full:+.2f} ({first.b_full} / {first.c_full}) | "
            f"{_p(first.p_full_holm)} | {' = '.join(ties)} |"
        )
    return lines


def block() -> str:
    lines = [BEGIN, "", *overview()]
    for model, run in RUNS.items():
        summary = pd.read_parquet(output_file(run, "kv-eval", "summary"))
        tests = pd.read_parquet(output_file(run, "kv-eval", "tests")).set_index(["task", "factor", "budget", "policy"])
        draws = int(summary.draws.max())
        match = run_config(run).random_match
        ranked = int(tests.p_random.notna().sum())  # the rank tests Holm adjusts together
        part = ""
        if (run / PARTIAL).is_file():
            held = json.loads((run / PARTIAL).read_text())
            part = f"; the {', '.join(held['finished'])} task{'s' * (len(held['finished']) > 1)} of {len(held['of'])}, the run goes on"
        lines += [
            "",
            f"**{model}** (docs/results/{run.name}/; {int(summary.n.max())} prompts a cell, {draws} random draws "
            f"matched on layer{' type' * (match == 'type')}; Holm over the {len(tests)} rows of tests.parquet, "
            f"so no rank p among the draws can come out under {holm_floor(ranked, draws):.3f} after Holm "
            f"({ranked} rank tests, floor 1 / {draws + 1} each){part}):",
            "",
            "| task | tokens | budget | kept KV | full | posym | retrieval | duo | random median [min, max] | "
            "streaming |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for (task, factor, length), cell in summary.groupby(["task", "factor", "length"], sort=True):
            at = {(r.budget, r.policy): r for r in cell.itertuples()}
            full = at[(0.0, "full")]
            for budget in sorted(b for b in cell.budget.unique() if 0 < b < 1):
                shown = []
                for policy in RANKED:
                    r = at[(budget, policy)]
                    shown.append(f"{r.accuracy:.2f} [{r.lo:.2f}, {r.hi:.2f}]")
                rnd = at[(budget, "random")]
                stream = at[(1.0, "streaming")]
                lines.append(
                    f"| {task} | {length:,} | {budget:.2f} | {rnd.kept_fraction:.2f} | {full.accuracy:.2f} | "
                    + " | ".join(shown)
                    + f" | {rnd.draw_median:.2f} [{rnd.draw_min:.2f}, {rnd.draw_max:.2f}] | {stream.accuracy:.2f} |"
                )
        primary = pd.read_parquet(output_file(run, "kv-eval", "primary"))
        lines += (
            []
            if primary.empty
            else [
                "",
                f"Primary tests (primary.parquet): each ranked policy against the {draws} random draws on its answers "
                f"pooled over every task and length above ({', '.join(primary.tasks.iloc[0].split(','))}); Holm over "
                f"these {len(primary)}, whose floor is {primary.holm_floor.iloc[0]:.3f} ({int(primary.draws_needed.iloc[0])} "
                "draws reach 0.05):",
                "",
                "| budget | policy | prompts | accuracy | full | random median [min, max] | draws reaching it | "
                "rank p two-sided | Holm p | above the draws p | Holm p | vs median draw (b / c) | Holm p |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            ]
        )
        for r in primary.itertuples():
            lines.append(
                f"| {r.budget:.2f} | {r.policy} | {r.n} | {r.accuracy:.2f} [{r.lo:.2f}, {r.hi:.2f}] | "
                f"{r.full_accuracy:.2f} | {r.random_median:.2f} [{r.random_min:.2f}, {r.random_max:.2f}] | "
                f"{r.draws_reaching} of {r.random_draws} | {_p(r.p_random)} | {_p(r.p_random_holm)} | "
                f"{_p(r.p_above)} | {_p(r.p_above_holm)} | "
                f"{r.diff_median:+.2f} ({r.b_median} / {r.c_median}) | {_p(r.p_median_holm)} |"
            )
        lines += [
            "",
            "Tests of the ranked policies (exact McNemar against the full cache; randomization p of the accuracy "
            "among the random draws, whose floor is 1 / (draws + 1)):",
            "",
            "| task | tokens | budget | policy | vs full (b / c) | Holm p | MDE | rank among draws p | Holm p |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for (task, factor, budget, policy), r in tests.iterrows():
            if policy not in RANKED:
                continue
            lines.append(
                f"| {task} | {int(r.length):,} | {budget:.2f} | {policy} | {r.diff_full:+.2f} "
                f"({int(r.b_full)} / {int(r.c_full)}) | {_p(r.p_full_holm)} | {r.mde_full:.2f} | "
                f"{_p(r.p_random)} | {_p(r.p_random_holm)} |"
            )
    return "\n".join([*lines, "", END])


def write(path: Path) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"{path} has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    path.write_text(head + block() + rest.split(END, 1)[1])


def partial(run: Path, dest: Path, *more: Path, of: list[str] | None = None) -> list[str]:
    """Commit the finished tasks of the kv-eval directory `run` (and of the directories `more`, run with its
    config for some of its tasks) into `dest` (see the module docstring); `of`: the tasks the commit is of,
    when `run`'s config names fewer. Returns the finished tasks."""
    import shutil
    from posym.commands import kv_eval
    from posym.figures import save_figure
    from posym.io import read_json_object, write_json, write_parquet, write_yaml

    def setup(path: Path) -> tuple[dict, dict, pd.DataFrame, str]:
        # through the config class, so a field added since a run started (its default) compares equal
        config = configs.to_dict(run_config(path))
        tasks = config.pop("tasks")
        digest = read_json_object(output_file(path, "kv-eval", "manifest")).get("identity", {}).get("digest")
        return config, tasks, pd.read_parquet(output_file(path, "kv-eval", "heads")), digest

    config, tasks, heads, digest = setup(run)
    source = {t: run for t in tasks if done_path(run, kv_eval.JOB, t).is_file()}
    if of is not None:
        if unknown := [t for t in of if t not in kv_eval.TASKS] or [t for t in tasks if t not in of]:
            sys.exit(f"--of {','.join(of)} must name kv-eval tasks, every task of {run} among them: {unknown[0]}")
        tasks = list(of)
    kept: list[str] = []  # tasks an earlier partial commit of this config in DEST holds and no run does
    if (dest / PARTIAL).is_file():
        held = read_json_object(dest / PARTIAL)
        dest_config, _, dest_heads, dest_digest = setup(dest)
        if dest_config == config and dest_digest == digest and dest_heads.equals(heads):
            tasks = [*held["of"], *(t for t in tasks if t not in held["of"])]
            kept = [t for t in held["finished"] if kv_eval_prompts(dest, t).is_file()]
    for other in more:
        other_config, other_tasks, other_heads, other_digest = setup(other)
        if other_config != config or not set(other_tasks) <= set(tasks):
            sys.exit(f"{other} was not run with {run}'s config (apart from fewer tasks)")
        if other_digest != digest or not other_heads.equals(heads):
            sys.exit(f"{other} was run on another model or head table than {run}")
        for task in other_tasks:
            if done_path(other, kv_eval.JOB, task).is_file():
                source.setdefault(task, other)
    for task in kept:
        source.setdefault(task, dest)
    finished = [t for t in tasks if t in source]
    if not finished:
        sys.exit(f"{', '.join(map(str, (run, *more)))} hold no finished task")
    dest.mkdir(parents=True, exist_ok=True)
    # each task's run config hash, read before DEST's manifest is replaced (a task kept from DEST has its own)
    held_hashes = (
        read_json_object(output_file(dest, "kv-eval", "manifest")).get("task_config_hashes", {}) if kept else {}
    )
    hashes = {
        t: held_hashes.get(t)
        if source[t] == dest
        else read_json_object(output_file(source[t], "kv-eval", "manifest"))["config_hash"]
        for t in finished
    }
    shutil.copyfile(output_file(run, "kv-eval", "heads"), output_file(dest, "kv-eval", "heads"))
    # the config of every task held (a run of fewer tasks committed beside an earlier commit's)
    whole = {**configs.to_dict(run_config(run)), "tasks": tasks}
    write_yaml(output_file(dest, "kv-eval", "config"), whole)
    manifest = read_json_object(output_file(run, "kv-eval", "manifest"))
    write_json(
        output_file(dest, "kv-eval", "manifest"),
        {**manifest, "config_hash": io.config_hash(whole), "task_config_hashes": hashes},
    )
    for task in tasks:  # a task no longer finished in the runs or an earlier commit is not kept
        if source.get(task) != dest:
            kv_eval_prompts(dest, task).unlink(missing_ok=True)
    for task in finished:
        if source[task] != dest:
            shutil.copyfile(kv_eval_prompts(source[task], task), kv_eval_prompts(dest, task))
    frame = pd.concat([pd.read_parquet(kv_eval_prompts(dest, t)) for t in finished], ignore_index=True)
    summary = kv_eval.summarize(frame)
    write_parquet(output_file(dest, "kv-eval", "summary"), summary)
    write_parquet(output_file(dest, "kv-eval", "tests"), kv_eval.accuracy_tests(frame, config["effect"]))
    write_parquet(output_file(dest, "kv-eval", "primary"), kv_eval.primary_tests(frame, config["effect"]))
    save_figure(kv_eval.plot_accuracy(summary), figure_file(dest, "kv-eval", "accuracy"))  # a row per task held
    if finished == tasks:  # the whole run: nothing is partial any more
        (dest / PARTIAL).unlink(missing_ok=True)
    else:
        write_json(dest / PARTIAL, {"finished": finished, "of": tasks})
    return finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="rewrite the kv-eval block of this Markdown file")
    parser.add_argument(
        "--partial",
        nargs="+",
        type=Path,
        metavar="RUN [MORE ...] DEST",
        help="commit the finished tasks of a run (and of runs of some of its tasks) into DEST",
    )
    parser.add_argument(
        "--of", help="with --partial: the tasks the commit is of (comma-separated), when RUN's are fewer"
    )
    args = parser.parse_args()
    if args.of and not args.partial:
        parser.error("--of is for --partial")
    if args.partial:
        if len(args.partial) < 2:
            parser.error("--partial needs RUN and DEST")
        *runs, dest = args.partial
        of = args.of.split(",") if args.of else None
        print("finished:", ", ".join(partial(runs[0], dest, *runs[1:], of=of)))
        return
    if args.write:
        write(args.write)
    else:
        print(block())


if __name__ == "__main__":
    main()
