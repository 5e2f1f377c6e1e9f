"""`posym score`, `dynamics`, `geometry`, `theory`, `lengthgen`, `discrepancy`: the analyses."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posym.cli import app, checkpoint_step, progress_bar
from posym.cli.options import (
    EMBEDDED_HELP,
    Compare,
    Device,
    Exactness,
    Protocol,
    Queries,
    Task,
    announce,
    budget_option,
    device_of,
    device_option,
    flags_from,
    list_option,
    n_option,
    path_argument,
    score_workers_option,
    step_option,
    values,
)
from posym.core.paper import GAMMA, TAU
from posym.runs import OUTPUTS
from posym.score_options import ScoreOptions


# ---- commands: score (scores) -------------------------------------------------------------------


MODEL_HELP = (
    "The model: a posym run (latest checkpoint unless --step) or checkpoint directory, a Hugging Face "
    "directory, a .gguf file (or a directory holding one), or " + EMBEDDED_HELP + "."
)


@app.command("score")
@flags_from(ScoreOptions, choices={"task": Task, "queries": Queries, "compare": Compare, "exact": Exactness})
def score_command(
    path: Path = path_argument(MODEL_HELP),
    step: Optional[str] = step_option(),
    options: ScoreOptions = ScoreOptions(),  # one flag per field (posym.score_options)
    budget: Optional[int] = budget_option(),
    workers: int = score_workers_option(),
    device: Device = device_option(),
    out: Path = typer.Option(
        ...,
        help="Output Parquet file (one row per prompt, query, layer, head); "
        "a JSON sidecar OUT.json records model, settings and versions.",
    ),
) -> None:
    """Positional and symbolic scores of every head (exact, one forward pass per prompt batch)."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from posym import io
    from posym.commands import score

    io.check_output(out, inputs=[path, options.prompts])
    device = device_of(device)
    with Progress(transient=True) as bar:
        job = bar.add_task("scoring prompts", total=None)

        def started(settings: dict, total: int) -> None:
            print(announce(settings["model"], settings["step"], settings["queries"]))
            bar.update(job, total=total)

        result = score.run_score(
            path,
            out,
            options,
            step=checkpoint_step(path, step, device),
            budget=budget and budget << 20,
            workers=workers,
            device=device,
            progress=lambda k=1: bar.advance(job, k),
            started=started,
        )
    summary, n_prompts = result["summary"], result["settings"]["n"]
    table = Table(title=f"mean scores over {n_prompts} prompts (gamma = {options.gamma})")
    for column in ("layer", "head", "s_pos", "s_sym", "entropy", "label"):
        table.add_column(column, justify="left" if column == "label" else "right")
    for r in summary.itertuples():
        table.add_row(str(r.layer), str(r.head), f"{r.s_pos:.3f}", f"{r.s_sym:.3f}", f"{r.entropy:.3f}", r.label)
    Console().print(table)
    print(f"wrote {result['rows']} rows to {out} (settings in {out}.json)")


# ---- commands: dynamics / geometry --------------------------------------------------------------


@app.command("dynamics")
def dynamics_command(
    path: Path = path_argument("A posym run directory (checkpoints/step-* and metrics.parquet)."),
    n: int = n_option(100, "Test prompts scored at every checkpoint (the same ones each time; the paper uses 100)."),
    seed: int = typer.Option(0, help="Seed of the test prompts."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default RUN_DIR/analysis)."),
) -> None:
    """Scores of every head at every checkpoint with the accuracy, purity steps (gamma 0.1 and 0.05),
    cumulative purity counts, positional/symbolic composition, and Fig. 2A/2B/6/7."""
    from rich.console import Console
    from rich.table import Table

    from posym import io
    from posym.commands import dynamics
    from posym.models import RunDir, list_checkpoints

    run_dir = path
    io.check_output(out or RunDir(run_dir).output("analysis"), inputs=[run_dir], is_dir=True, owns=OUTPUTS["dynamics"])
    total = len(list_checkpoints(run_dir)) if Path(run_dir).is_dir() else 0
    print(announce(run_dir, None, "hops and last") + f" (every checkpoint, {total})")
    bar, advance = progress_bar(total, "scoring checkpoints")
    with bar:
        result = dynamics.run_dynamics(run_dir, out, n_prompts=n, seed=seed, progress=lambda step: advance())
    table = Table(
        title=f"heads at max accuracy (step {result['max_acc_step']}, acc {result['max_acc']:.3f}) "
        "and at the end, hop queries"
    )
    for column in ("gamma", "stage", "step", "positional", "symbolic", "mixed", "uniform"):
        table.add_column(column, justify="right")
    for r in result["composition"]:
        if r["query_mode"] == "hops":
            table.add_row(
                str(r["gamma"]),
                r["stage"],
                str(r["step"]),
                *(f"{r[f'frac_{k}']:.0%} {r[f'layers_{k}']}" for k in ("positional", "symbolic", "mixed", "uniform")),
            )
    roles = Table(title="by query role at max accuracy, gamma 0.1 (label of the mean; docs: posym.commands.dynamics)")
    for column in ("query mode", "positional", "symbolic", "mixed", "uniform"):
        roles.add_column(column, justify="right")
    for r in result["composition"]:
        if r["gamma"] == GAMMA and r["stage"] == "max_acc":
            roles.add_row(
                r["query_mode"],
                *(f"{r[f'frac_{k}']:.0%} {r[f'layers_{k}']}" for k in ("positional", "symbolic", "mixed", "uniform")),
            )
    Console().print(table)
    Console().print(roles)
    out_dir = out or RunDir(run_dir).output("analysis")
    print(
        f"{len(result['steps'])} checkpoints in {result['seconds_total']:.1f} s; wrote {out_dir}/dynamics.parquet, "
        "purity*.parquet, composition*.parquet, dynamics.json and fig2a/fig2b/fig6/fig7/fig7_roles PNG+SVG"
    )


@app.command("geometry")
def geometry_command(
    path: Path = path_argument(MODEL_HELP + " Other than posym runs need --prompts and --out."),
    step: Optional[str] = step_option(),
    n: int = n_option(100, "Test prompts of the checkpoint's own task to average over."),
    seed: int = typer.Option(0, help="Seed of the test prompts."),
    prompts: Optional[Path] = typer.Option(
        None,
        help='JSONL prompt file ({"input_ids": [...], "queries": [...]} '
        'or {"text": ...} per line) instead of task prompts; needed for non-posym models.',
    ),
    queries: Optional[Queries] = typer.Option(
        None,
        help="Query positions: last (the final token), hops (every "
        "pointer token of the chain) or all (default: the file's queries, else last).",
    ),
    tau: float = typer.Option(TAU, help="Temperature of the swap weights of the per-plane scores."),
    plane_layer: Optional[int] = typer.Option(None, help="Layer of the q/k plane figure (default 1, as Fig. 4B)."),
    plane_head: int = typer.Option(0, help="Head of the q/k plane figure."),
    example: int = typer.Option(0, help="Which prompt of the set the q/k plane figure shows."),
    device: Device = device_option(),
    out: Optional[Path] = typer.Option(
        None, help="Output directory (default RUN_DIR/analysis for a run, else required)."
    ),
) -> None:
    """Per head and RoPE plane: frequency use (max logit the plane alone gives), weighted frequency ID
    (Table 1 / Fig. 8), per-plane positional/symbolic scores, and the q/k plane scatter (Fig. 4B)."""
    from transformers.utils import logging as hf_logging

    from posym import io
    from posym.commands import geometry

    io.check_output(out, inputs=[path, prompts], is_dir=True, owns=OUTPUTS["geometry"])
    hf_logging.disable_progress_bar()
    device = device_of(device)
    job = geometry.prepare(
        path,
        step=checkpoint_step(path, step, device),
        n_prompts=n,
        seed=seed,
        prompts=prompts,
        queries=queries and str(queries),
        tau=tau,
        device=device,
        out=out,
    )
    print(announce(path, job["settings"]["step"], queries or "the file's (else last)"))
    bar, advance = progress_bar(len(job["input_ids"]), "scoring planes")
    with bar:
        result = geometry.run_geometry(
            **job, plane_layer=plane_layer, plane_head=plane_head, example=example, progress=advance
        )
    print(
        f"weighted frequency ID per layer, by weighting ({result['planes']} planes, uniform baseline "
        f"(planes + 1) / 2 = {result['uniform_id']:g}; posym.core.geometry defines each):"
    )
    for name, ids in result["weightings"].items():
        print(f"  {name:<10}" + ", ".join(f"{v:.1f}" for v in ids))
    if result["paper_table1"]:
        print("  paper     " + ", ".join(str(v) for v in result["paper_table1"]) + "  (Table 1, 12 layers, 64 planes)")
    print(
        f"wrote {job['out_dir']}/planes.parquet, channels.parquet, frequency.parquet, qk_plane.parquet, geometry.json, "
        "fig8_frequency and fig4b_qk_plane PNG+SVG"
    )


# ---- commands: theory / lengthgen ---------------------------------------------------------------


@app.command("theory")
def theory_command(
    n0: list[str] = list_option(
        ["8", "16", "32", "64"],
        "Largest lengths to verify (query position n, n + 1 tokens); every n <= n0 is checked.",
        name="--n0",
    ),
    out: Path = typer.Option(
        Path("results/theory"), help="Directory for theory.parquet, discrepancy.parquet, theory.json and fig5a.png/svg."
    ),
    index_freq_id: int = typer.Option(2, help="RoPE frequency ID of T_Index's plane (2: theta = 0.866)."),
    retrieval_freq_id: int = typer.Option(
        42,
        help="RoPE frequency ID of T_Retrieval's plane (42: theta = 0.0027); it must satisfy theta < omega / (2 n0).",
    ),
    curve_freq_id: list[str] = list_option(
        ["2", "42"], "Frequency IDs drawn in the discrepancy figure (e.g. a trained layer's weighted-average ID)."
    ),
    alphabet_size: int = typer.Option(8, help="Letters of T_Retrieval (omega = 2 pi / letters; paper: 8)."),
    eps: float = typer.Option(0.01, help="Softmax criterion: beta must put >= 1 - eps on the right key."),
    samples: int = typer.Option(
        100_000, help="Random Retrieval inputs per checked length when there are too many to enumerate."
    ),
    seed: int = typer.Option(0, help="Seed of the sampled inputs and task samples."),
) -> None:
    """Check the paper's T_Index / T_Retrieval heads: exactness per length, the inverse temperature softmax
    needs, their positional/symbolic scores, and discrepancy against Theorem 3.2 (Fig. 5A)."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from posym import io
    from posym.commands import theory
    from posym.core.theory import TheoryConfig

    io.check_output(out, is_dir=True, owns=OUTPUTS["theory"])
    config = TheoryConfig(
        n0=values(n0, int, option="--n0"),
        index_freq_id=index_freq_id,
        retrieval_freq_id=retrieval_freq_id,
        curve_freq_ids=values(curve_freq_id, int, option="--curve-freq-id"),
        alphabet_size=alphabet_size,
        eps=eps,
        samples=samples,
        seed=seed,
    )
    with Progress(transient=True) as bar:
        job = bar.add_task("theory", total=4)
        result = theory.run_theory(config, out, progress=lambda step: bar.update(job, description=step, advance=1))
    table = Table(title=f"T_Index / T_Retrieval (argmax exact, beta for mass >= 1 - {eps})")
    for col in ["head", "n0", "θ", "exact", "softmax", "Δ(n0)", "bound", "β needed", "β Lemma F.1"]:
        table.add_column(col, justify="right")
    for r in result["summary"]:
        table.add_row(
            r["head"],
            str(r["n0"]),
            f"{r['theta']:.3g}",
            str(r["exact"]),
            str(r["softmax_exact"]),
            f"{r['delta_n0']:.3g}",
            f"{r['bound_n0']:.3g}",
            f"{r['beta_needed']:.4g}",
            f"{r['beta_lemma']:.4g}",
        )
    console = Console()
    console.print(table)
    for kind, t in result["tasks"].items():
        console.print(
            f"T_{kind.capitalize()} on the {t['task']} task (beta {t['beta']:.4g}): s_pos "
            f"{t['s_pos']:.3f}, s_sym {t['s_sym']:.3f}; answer after h hops: hard "
            f"{t['hard']['after_h']:.3f}, softmax {t['softmax']['after_h']:.3f}"
        )
    console.print(f"wrote {out}/theory.parquet, discrepancy.parquet, theory.json, fig5a.png/svg")


@app.command("lengthgen")
def lengthgen_command(
    path: Path = path_argument(),
    step: Optional[str] = step_option(),
    lengths: list[str] = list_option(
        ["17,34,51,68,128,256,512,850,1024,2048"],
        "Paper protocol: total sequence lengths in tokens (query included; training length 17).",
    ),
    factors: list[str] = list_option(
        ["1,2,3,4"],
        "Fixed-multiple protocol: multiples of the training length (1 is the reference that retention divides by).",
    ),
    n: int = n_option(128, "Test sequences per length (the same questions at every length)."),
    protocol: Protocol = typer.Option(
        Protocol.both,
        help="paper (absolute lengths, accuracy), seed (1x-4x the "
        "training length, retention) or both. Both lengthen with extra target-window "
        "tokens.",
    ),
    seed: int = typer.Option(0, help="Seed of the test data."),
    max_tokens: int = typer.Option(16384, help="Tokens per forward pass; bounds memory at long lengths."),
    head_retention: bool = typer.Option(
        True,
        help="Also measure every head at every length (margin and attention "
        "on the chain key at each pointer of the chain) and write head_retention.parquet, "
        "head_groups.parquet (per label and layer-matched random heads, 95% bootstrap "
        "intervals) and head_retention.png/svg.",
    ),
    head_prompts: int = typer.Option(64, help="Test sequences per length of the head-level retention."),
    device: Device = device_option(),
    out: Optional[Path] = typer.Option(
        None,
        help="Output directory for lengthgen.parquet, lengthgen.json and fig5b.png/svg (default: RUN_DIR/lengthgen).",
    ),
) -> None:
    """Accuracy against sequence length, per hop count (Fig. 5B): extra target-window tokens go before the
    window that holds the answer, so the questions and answers stay the same and only the length grows."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from posym import io
    from posym.commands import lengthgen
    from posym.core.lengthgen import ALL_HOPS, LengthGenConfig
    from posym.models import RunDir

    hf_logging.disable_progress_bar()  # our own bar follows the work; no per-load weight bars

    run_dir = path
    config = LengthGenConfig(
        lengths=values(lengths, int, option="--lengths"),
        factors=values(factors, int, option="--factors"),
        protocol=str(protocol),
        n=n,
        seed=seed,
        max_tokens=max_tokens,
        device=device_of(device),
        heads=head_retention,
        head_prompts=head_prompts,
    )
    step = checkpoint_step(run_dir, step, config.device)
    out = io.check_output(
        out or RunDir(run_dir).output("lengthgen"), inputs=[run_dir], is_dir=True, owns=OUTPUTS["lengthgen"]
    )
    with Progress(transient=True) as bar:
        job = bar.add_task("evaluating lengths (tokens read)", total=None)
        result = lengthgen.run_lengthgen(
            run_dir, config, out, step=step, progress=lambda done, total: bar.update(job, completed=done, total=total)
        )
    print(announce(result["checkpoint"], result["step"], "last (the answer token)"))
    table = result["table"]
    hops = sorted(h for h in table["hop"].unique() if h != ALL_HOPS)
    view = Table(title=f"{result['summary']['task']} task, step {result['step']}: accuracy by length")
    for col in ["protocol", "length", "factor", "all", *(f"hop {h}" for h in hops), "retention"]:
        view.add_column(col, justify="right")
    for (prot, length), rows in table.groupby(["protocol", "length"], sort=False):
        acc = rows.set_index("hop")["acc"]
        view.add_row(
            prot,
            str(length),
            f"{rows['factor'].iloc[0]:.2f}",
            f"{acc[ALL_HOPS]:.3f}",
            *(f"{acc[h]:.3f}" for h in hops),
            f"{rows.set_index('hop')['retention'][0]:.3f}",
        )
    console = Console()
    console.print(view)
    if "group_table" in result and not len(result["group_table"]):
        labels = result["head_retention"]["labels"]
        console.print(
            "head-level retention: no positional, symbolic or mixed head to group (labels: "
            + ", ".join(f"{label} {len(heads)}" for label, heads in labels.items())
            + ")"
        )
    elif "group_table" in result:
        groups = result["group_table"]
        margin = groups[groups["measure"] == "margin"]
        heads = Table(
            title=f"head-level retention of the margin (median over heads, 95% bootstrap over "
            f"{result['config']['head_prompts']} prompts)"
        )
        heads.add_column("group")
        for length in sorted(margin["length"].unique()):
            heads.add_column(str(length), justify="right")
        for name, rows in margin.groupby("group", sort=False):
            heads.add_row(
                name, *(f"{r.value:.2f} [{r.lo:.2f}, {r.hi:.2f}]" for r in rows.sort_values("length").itertuples())
            )
        console.print(heads)
    console.print(
        f"wrote {out}/lengthgen.parquet, lengthgen.json, fig5b.png/svg"
        + (", head_retention.parquet, head_groups.parquet, head_retention.png/svg" if head_retention else "")
    )


@app.command("discrepancy")
def discrepancy_command(
    path: Path = path_argument(MODEL_HELP + " Other than posym runs need --prompts and --out."),
    step: Optional[str] = step_option(),
    lengths: Optional[list[str]] = list_option(
        None,
        "Sequence lengths a posym task is lengthened to (extra "
        "target-window tokens; default the lengthgen paper protocol's).",
    ),
    n: int = n_option(64, "Test questions per length (the same ones at every length)."),
    prompts: Optional[Path] = typer.Option(
        None,
        help='JSONL prompt file ({"input_ids": [...], "queries": [...]} '
        'or {"text": ...} per line), measured at its own lengths; needed for non-posym models.',
    ),
    queries: Optional[Queries] = typer.Option(
        None, help="Query positions: last, hops (chain pointers) or all (default: the file's queries, else last)."
    ),
    seed: int = typer.Option(0, help="Seed of the test questions."),
    max_tokens: int = typer.Option(16384, help="Tokens per forward pass; bounds memory at long lengths."),
    device: Device = device_option(),
    out: Optional[Path] = typer.Option(None, help="Output directory (default RUN_DIR/discrepancy)."),
) -> None:
    """Discrepancy of every head by length (Definition 3.1 on trained or real heads): top-1 minus top-2
    attention logit at the query; min (Delta), median and quantiles per layer, head and length."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from posym import io
    from posym.commands import discrepancy

    io.check_output(out, inputs=[path, prompts], is_dir=True, owns=OUTPUTS["discrepancy"])
    hf_logging.disable_progress_bar()
    device = device_of(device)
    with Progress(transient=True) as bar:
        job = bar.add_task("measuring gaps (prompts)", total=None)
        result = discrepancy.run_discrepancy(
            path,
            out,
            step=checkpoint_step(path, step, device),
            lengths=values(lengths, int, option="--lengths") or None,
            n=n,
            seed=seed,
            prompts=prompts,
            queries=queries and str(queries),
            max_tokens=max_tokens,
            device=device,
            progress=lambda k: bar.advance(job, k),
        )
    print(announce(result["settings"]["model"], result["settings"]["step"], queries or "the file's (else last)"))
    summary = result["summary"]
    view = Table(title="median top-1 minus top-2 logit at the query, by layer (head 0) and length")
    lengths_seen = sorted(summary["length"].unique())
    for col in ["layer", *(str(v) for v in lengths_seen)]:
        view.add_column(col, justify="right")
    for layer, rows in summary[summary["head"] == 0].groupby("layer"):
        median = rows.set_index("length")["gap_q50"]
        view.add_row(f"L{layer}", *(f"{median[v]:.3g}" for v in lengths_seen))
    Console().print(view)
    print(f"wrote {result['out_dir']}/gaps.parquet, discrepancy.parquet, discrepancy.json, fig_discrepancy PNG+SVG")
