"""The `posym` command line: a thin Typer layer over the library modules.

Every command turns user mistakes (`PosymError`) into one line on stderr and exit code 2.
Heavy imports happen inside the commands so that `posym --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posym.errors import PosymError

app = typer.Typer(
    name="posym",
    help="Positional versus symbolic attention heads in RoPE transformers (arXiv 2605.31558).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _progress_bar(total: int, what: str):
    """A rich progress bar over `total` steps; returns (context manager, advance callback)."""
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task(what, total=total)
    return bar, lambda k=1: bar.advance(task, k)


# ---- commands: data (tasks) -------------------------------------------------------------------


@app.command("data")
def data_command(
    task: str = typer.Option("number", help="Which task: 'number' (positional) or 'letter' (symbolic)."),
    n: int = typer.Option(1000, "--n", help="How many sequences to write."),
    seed: int = typer.Option(0, help="Random seed; the same seed, split and config give the same data."),
    split: str = typer.Option("train", help="Which split's random stream: train, val or test."),
    fmt: str = typer.Option("parquet", "--format", help="File format: parquet, jsonl or npz."),
    out: Path = typer.Option(..., help="Output file; its manifest is written next to it as OUT.manifest.json."),
    target_size: Optional[int] = typer.Option(None, help="Target-window tokens (paper: 8)."),
    pretarget_size: Optional[int] = typer.Option(None, help="Pre-target-window tokens (paper: 8)."),
    max_hops: Optional[int] = typer.Option(None, help="Hops run 1..max-hops in equal shares (paper: 4)."),
    alphabet_size: Optional[int] = typer.Option(
        None, help="Symbols (number task, paper 120) or letters (letter task, paper 8)."),
    int_range: Optional[int] = typer.Option(
        None, help="Offsets 1..R (number task, paper 16) or numbers 1..R in target pairs (letter task, paper 8)."),
    extra_target: int = typer.Option(
        0, help="Length extension: extra target-window tokens before the effective target window."),
    markers: bool = typer.Option(False, help="Slot markers: every target-window token carries its place in "
                                 "the window as its own token (n@3); positions and answers are unchanged."),
) -> None:
    """Generate a number- or letter-task dataset (with a JSON manifest) for training or evaluation."""

    from posym import datasets, tasks

    knobs = dict(target_size=target_size, pretarget_size=pretarget_size, max_hops=max_hops,
                 alphabet_size=alphabet_size, int_range=int_range, extra_target=extra_target)
    config = tasks.task_config(task, markers=markers, **{k: v for k, v in knobs.items() if v is not None})
    bar, advance = _progress_bar(n, f"{task} task, {split}")
    with bar:
        path = datasets.save_dataset(config, n, seed, split, out, fmt, progress=advance)
    print(f"wrote {n} {task}-task sequences to {path} (manifest {datasets.manifest_path(path)})")

# ---- commands: train / eval (model, train) ------------------------------------------------------


@app.command("train")
def train_command(
    preset: str = typer.Option("quick", help="Starting point: 'quick' (minutes on a CPU), 'paper' (12 layers "
                               "x 1 head, 6,000 steps, SPEC 2) or 'seed' (6 layers x 8 heads)."),
    task: str = typer.Option("number", help="Task to learn: 'number' (positional) or 'letter' (symbolic)."),
    out: Optional[Path] = typer.Option(None, help="New run directory (must not exist or be empty)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file overriding any field of the "
                                          "preset (e.g. 'lr: 3e-4' or 'model: {n_layer: 4}'); unknown keys are errors."),
    seed: Optional[int] = typer.Option(None, help="Seed of initialisation, dropout and data (default: the preset's, 0)."),
    steps: Optional[int] = typer.Option(None, help="Optimizer steps (default: the preset's)."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or auto (default: auto)."),
    resume: Optional[Path] = typer.Option(None, help="Continue this run directory from its latest checkpoint "
                                          "with its own config.yaml (other options are not allowed)."),
    stop_at: Optional[int] = typer.Option(None, help="Stop after a checkpoint at this step, keeping the "
                                          "schedule of the full run; --resume continues it (train in pieces)."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Train a GPT-J on a multi-hop task, saving checkpoints, metrics.parquet and train.log in a run directory."""
    from posym import train

    if resume is not None:
        given = [name for name, value in (("--out", out), ("--config", config), ("--seed", seed),
                                          ("--steps", steps), ("--device", device)) if value is not None]
        if given:
            raise PosymError(f"--resume continues a run with its own config; drop {', '.join(given)}")
        run_dir = train.train(None, resume, resume=True, progress=progress, stop_at=stop_at)
    else:
        if out is None:
            raise PosymError("give the new run directory with --out (or --resume RUN_DIR)")
        flags = {"seed": seed, "max_steps": steps, "device": device}
        cfg = train.resolve_config(preset, task, config, {k: v for k, v in flags.items() if v is not None})
        run_dir = train.train(cfg, out, progress=progress, stop_at=stop_at)
    print(f"run directory: {run_dir}")


@app.command("eval")
def eval_command(
    path: Path = typer.Argument(..., help="A run directory (uses its latest checkpoint unless --step) or one "
                                "checkpoint directory."),
    step: Optional[int] = typer.Option(None, help="Checkpoint step to evaluate in a run directory."),
    task: Optional[str] = typer.Option(None, help="Task to evaluate on (default: the checkpoint's own task config)."),
    n: int = typer.Option(2000, "--n", help="Test sequences per evaluation."),
    extra_target: Optional[list[int]] = typer.Option(None, help="Extra target-window tokens before the "
                                                     "effective window (length generalization); repeat for several."),
    seed: int = typer.Option(0, help="Seed of the test data."),
    split: str = typer.Option("test", help="Split to draw the data from: train, val or test."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    out: Optional[Path] = typer.Option(None, help="Also write the results as JSON to this file."),
) -> None:
    """Accuracy (overall and per hop count) and loss of one checkpoint on a task, optionally at longer lengths."""
    from rich.console import Console
    from rich.table import Table

    from posym import io, train

    rows = train.evaluate_checkpoint(path, step=step, task=task, n=n, extra_targets=extra_target or [0],
                                     seed=seed, split=split, device=device)
    table = Table(title=f"{rows[0]['task']} task, {rows[0]['checkpoint']}")
    keys = [k for k in rows[0] if k in ("extra_target", "seq_len", "loss") or k.startswith("acc")]
    for key in keys:
        table.add_column(key.replace("acc_", "").replace("extra_target", "extra"), justify="right")
    for row in rows:
        table.add_row(*(f"{row[k]:.4f}" if isinstance(row[k], float) else str(row[k]) for k in keys))
    Console().print(table)
    if out is not None:
        io.write_json(out, rows)

# ---- commands: score (scores) -------------------------------------------------------------------


@app.command("score")
def score_command(
    model: Path = typer.Option(..., help="A checkpoint directory, or a run directory (latest checkpoint unless --step)."),
    step: Optional[int] = typer.Option(None, help="Checkpoint step to score in a run directory."),
    task: Optional[str] = typer.Option(None, help="Draw test-split prompts of this task: number or letter "
                                       "(default: the checkpoint's own task config)."),
    n_prompts: int = typer.Option(100, help="How many task prompts to score (the paper uses 100)."),
    seed: int = typer.Option(0, help="Seed of the task prompts."),
    prompts: Optional[Path] = typer.Option(None, help="JSONL prompt file instead of a task: one "
                                           '{"input_ids": [...], "queries": [...]} per line (posym data JSONL works).'),
    queries: Optional[str] = typer.Option(None, help="Which query positions: last (the final token), hops (every "
                                          "pointer token on the chain) or all (default: the file's queries, else last)."),
    tau: float = typer.Option(1e-4, help="Temperature of the swap weights softmax(|D_i - D_j| / tau)."),
    blocks: Optional[int] = typer.Option(None, help="Swap M contiguous key blocks and compare block means "
                                         "(the 2511 variant) instead of single tokens."),
    compare: str = typer.Option("probs", help="Compare attention probabilities (probs, the paper) or raw logits."),
    gamma: float = typer.Option(0.1, help="Purity threshold of the printed labels (positional: s_pos >= 1-gamma "
                                "and s_sym <= gamma; symbolic: the reverse; uniform: both >= 1-gamma)."),
    batch_size: int = typer.Option(64, help="Prompts of equal length per forward pass."),
    out: Path = typer.Option(..., help="Output Parquet file (one row per prompt, query, layer, head); "
                             "a JSON sidecar OUT.json records model, settings and versions."),
) -> None:
    """Positional and symbolic scores of every head (exact, one forward pass per prompt batch)."""
    from rich.console import Console
    from rich.table import Table

    from posym import io, scores
    from posym.configs import to_dict
    from posym.model import load_model

    if batch_size < 1 or n_prompts < 1:
        raise PosymError("--batch-size and --n-prompts must be positive")
    hf_model, info = load_model(model, step=step)
    task_config = info["task_config"]
    if task is not None and (task_config is None or task_config.task != task):
        from posym.tasks import task_config as paper_task

        task_config = paper_task(task)
    ids, wanted = scores.prompt_set(hf_model, task_config=None if prompts else task_config, n_prompts=n_prompts,
                                    seed=seed, prompts_file=prompts, queries=queries)
    settings = {"model": str(info["path"]), "step": info["step"], "prompts": str(prompts) if prompts else None,
                "task": to_dict(task_config) if task_config is not None and not prompts else None,
                "n_prompts": len(ids), "queries": queries or "file/last", "tau": tau, "blocks": blocks,
                "variant": f"blocks={blocks}" if blocks else "single-token", "compare": compare}
    bar, advance = _progress_bar(len(ids), "scoring prompts")
    with bar:
        frames = scores.iter_scores(hf_model, ids, wanted, tau=tau, blocks=blocks, compare=compare,
                                    batch_size=batch_size, progress=advance)
        rows = scores.write_scores(out, frames, io.manifest(settings, seed=seed, settings=settings,
                                                            hf_config=hf_model.config.to_dict()))
    import pandas as pd

    summary = scores.summarize(pd.read_parquet(out, columns=["layer", "head", "s_pos", "s_sym", "entropy"]), gamma)
    table = Table(title=f"mean scores over {len(ids)} prompts (gamma = {gamma})")
    for column in ("layer", "head", "s_pos", "s_sym", "entropy", "label"):
        table.add_column(column, justify="left" if column == "label" else "right")
    for r in summary.itertuples():
        table.add_row(str(r.layer), str(r.head), f"{r.s_pos:.3f}", f"{r.s_sym:.3f}", f"{r.entropy:.3f}", r.label)
    Console().print(table)
    print(f"wrote {rows} rows to {out} (settings in {out}.json)")

# ---- commands: dynamics / geometry --------------------------------------------------------------


@app.command("dynamics")
def dynamics_command(
    run_dir: Path = typer.Argument(..., help="A posym run directory (checkpoints/step-* and metrics.parquet)."),
    n_prompts: int = typer.Option(100, help="Test prompts scored at every checkpoint (the same ones each time; "
                                  "the paper uses 100)."),
    seed: int = typer.Option(0, help="Seed of the test prompts."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default RUN_DIR/analysis)."),
) -> None:
    """Scores of every head at every checkpoint with the accuracy, purity steps (gamma 0.1 and 0.05),
    cumulative purity counts, positional/symbolic composition, and Fig. 2A/2B/6/7."""
    from rich.console import Console
    from rich.table import Table

    from posym import dynamics
    from posym.model import list_checkpoints

    total = len(list_checkpoints(run_dir)) if Path(run_dir).is_dir() else 0
    bar, advance = _progress_bar(total, "scoring checkpoints")
    with bar:
        result = dynamics.run_dynamics(run_dir, out, n_prompts=n_prompts, seed=seed,
                                       progress=lambda step: advance())
    table = Table(title=f"heads at max accuracy (step {result['max_acc_step']}, acc {result['max_acc']:.3f}) "
                        "and at the end, hop queries")
    for column in ("gamma", "stage", "step", "positional", "symbolic", "mixed", "uniform"):
        table.add_column(column, justify="right")
    for r in result["composition"]:
        if r["query_mode"] == "hops":
            table.add_row(str(r["gamma"]), r["stage"], str(r["step"]),
                          *(f"{r[f'frac_{k}']:.0%} {r[f'layers_{k}']}" for k in ("positional", "symbolic", "mixed", "uniform")))
    Console().print(table)
    out_dir = out or Path(run_dir) / "analysis"
    print(f"{len(result['steps'])} checkpoints in {result['seconds_total']:.1f} s; wrote {out_dir}/dynamics.parquet, "
          "purity*.parquet, composition*.parquet, dynamics.json and fig2a/fig2b/fig6/fig7 PNG+SVG")


@app.command("geometry")
def geometry_command(
    path: Path = typer.Argument(..., help="A posym run directory (latest checkpoint unless --step), a checkpoint "
                                "directory, or a Hugging Face RoPE model directory (with --prompts)."),
    step: Optional[int] = typer.Option(None, help="Checkpoint step to analyse in a run directory."),
    n_prompts: int = typer.Option(100, help="Test prompts of the checkpoint's own task to average over."),
    seed: int = typer.Option(0, help="Seed of the test prompts."),
    prompts: Optional[Path] = typer.Option(None, help='JSONL prompt file ({"input_ids": [...]} per line) instead '
                                           "of task prompts; needed for non-posym models."),
    queries: str = typer.Option("last", help="Query positions: last (the final token), hops (every pointer "
                                "token of the chain) or all."),
    tau: float = typer.Option(1e-4, help="Temperature of the swap weights of the per-plane scores."),
    plane_layer: Optional[int] = typer.Option(None, help="Layer of the q/k plane figure (default 1, as Fig. 4B)."),
    plane_head: int = typer.Option(0, help="Head of the q/k plane figure."),
    example: int = typer.Option(0, help="Which prompt of the set the q/k plane figure shows."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default RUN_DIR/analysis for a run, "
                                       "else required)."),
) -> None:
    """Per head and RoPE plane: frequency use (max logit the plane alone gives), weighted frequency ID
    (Table 1 / Fig. 8), per-plane positional/symbolic scores, and the q/k plane scatter (Fig. 4B)."""
    from transformers.utils import logging as hf_logging

    from posym import geometry

    hf_logging.disable_progress_bar()
    job = geometry.prepare(path, step=step, n_prompts=n_prompts, seed=seed, prompts=prompts, queries=queries,
                           tau=tau, device=device, out=out)
    bar, advance = _progress_bar(len(job["input_ids"]), "scoring planes")
    with bar:
        result = geometry.run_geometry(**job, plane_layer=plane_layer, plane_head=plane_head, example=example,
                                       progress=advance)
    print("weighted frequency ID per layer: " + ", ".join(f"{v:.1f}" for v in result["weighted_id_per_layer"]))
    if result["paper_table1"]:
        print("paper Table 1 (12-layer model):  " + ", ".join(str(v) for v in result["paper_table1"]))
    print(f"wrote {job['out_dir']}/planes.parquet, channels.parquet, frequency.parquet, qk_plane.parquet, geometry.json, "
          "fig8_frequency and fig4b_qk_plane PNG+SVG")

# ---- commands: theory / lengthgen ---------------------------------------------------------------


@app.command("theory")
def theory_command(
    n0: list[int] = typer.Option([8, 16, 32, 64], "--n0", help="Largest length to verify (query position n, "
                                 "n + 1 tokens); every n <= n0 is checked. Repeat for several."),
    out: Path = typer.Option(Path("results/theory"), help="Directory for theory.parquet, discrepancy.parquet, "
                             "theory.json and fig5a.png/svg."),
    index_freq_id: int = typer.Option(2, help="RoPE frequency ID of T_Index's plane (2: theta = 0.866)."),
    retrieval_freq_id: int = typer.Option(42, help="RoPE frequency ID of T_Retrieval's plane (42: theta = "
                                          "0.0027); it must satisfy theta < omega / (2 n0)."),
    curve_freq_id: list[int] = typer.Option([2, 42], help="Frequency IDs drawn in the discrepancy figure "
                                            "(e.g. a trained layer's weighted-average ID). Repeat for several."),
    alphabet_size: int = typer.Option(8, help="Letters of T_Retrieval (omega = 2 pi / letters; paper: 8)."),
    eps: float = typer.Option(0.01, help="Softmax criterion: beta must put >= 1 - eps on the right key."),
    samples: int = typer.Option(100_000, help="Random Retrieval inputs per checked length when there are "
                                "too many to enumerate."),
    seed: int = typer.Option(0, help="Seed of the sampled inputs and task samples."),
) -> None:
    """Check the paper's T_Index / T_Retrieval heads: exactness per length, the inverse temperature softmax
    needs, their positional/symbolic scores, and discrepancy against Theorem 3.2 (Fig. 5A)."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from posym import theory

    config = theory.TheoryConfig(n0=n0, index_freq_id=index_freq_id, retrieval_freq_id=retrieval_freq_id,
                                 curve_freq_ids=curve_freq_id, alphabet_size=alphabet_size, eps=eps,
                                 samples=samples, seed=seed)
    with Progress(transient=True) as bar:
        job = bar.add_task("theory", total=4)
        result = theory.run_theory(config, out, progress=lambda step: bar.update(job, description=step, advance=1))
    table = Table(title=f"T_Index / T_Retrieval (argmax exact, beta for mass >= 1 - {eps})")
    for col in ["head", "n0", "θ", "exact", "softmax", "Δ(n0)", "bound", "β needed", "β Lemma F.1"]:
        table.add_column(col, justify="right")
    for r in result["summary"]:
        table.add_row(r["head"], str(r["n0"]), f"{r['theta']:.3g}", str(r["exact"]), str(r["softmax_exact"]),
                      f"{r['delta_n0']:.3g}", f"{r['bound_n0']:.3g}", f"{r['beta_needed']:.4g}",
                      f"{r['beta_lemma']:.4g}")
    console = Console()
    console.print(table)
    for kind, t in result["tasks"].items():
        console.print(f"T_{kind.capitalize()} on the {t['task']} task (beta {t['beta']:.4g}): s_pos "
                      f"{t['s_pos']:.3f}, s_sym {t['s_sym']:.3f}; answer after h hops: hard "
                      f"{t['hard']['after_h']:.3f}, softmax {t['softmax']['after_h']:.3f}")
    console.print(f"wrote {out}/theory.parquet, discrepancy.parquet, theory.json, fig5a.png/svg")


@app.command("lengthgen")
def lengthgen_command(
    run_dir: Path = typer.Argument(..., help="A run directory (latest checkpoint unless --step) or one checkpoint "
                                   "directory written by posym train."),
    step: Optional[int] = typer.Option(None, help="Checkpoint step to evaluate in a run directory."),
    lengths: str = typer.Option("17,34,51,68,128,256,512,850,1024,2048", help="Paper protocol: comma-separated "
                                "total sequence lengths in tokens (query included; training length 17)."),
    factors: str = typer.Option("1,2,3,4", help="Seed protocol: comma-separated multiples of the training length "
                                "(1 is the reference that retention divides by)."),
    n: int = typer.Option(128, "--n", help="Test sequences per length (the same questions at every length)."),
    protocol: str = typer.Option("both", help="paper (absolute lengths, accuracy), seed (1x-4x the training "
                                 "length, retention) or both. Both lengthen with extra target-window tokens."),
    seed: int = typer.Option(0, help="Seed of the test data."),
    max_tokens: int = typer.Option(16384, help="Tokens per forward pass; bounds memory at long lengths."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    out: Optional[Path] = typer.Option(None, help="Output directory for lengthgen.parquet, lengthgen.json and "
                                       "fig5b.png/svg (default: RUN_DIR/lengthgen)."),
) -> None:
    """Accuracy against sequence length, per hop count (Fig. 5B): extra target-window tokens go before the
    window that holds the answer, so the questions and answers stay the same and only the length grows."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from transformers.utils import logging as hf_logging

    from posym import lengthgen
    from posym.llm import parse_list

    hf_logging.disable_progress_bar()  # our own bar follows the work; no per-load weight bars

    config = lengthgen.LengthGenConfig(lengths=parse_list(lengths, int), factors=parse_list(factors, int),
                                       protocol=protocol, n=n, seed=seed, max_tokens=max_tokens, device=device)
    out = out or Path(run_dir) / "lengthgen"
    with Progress(transient=True) as bar:
        job = bar.add_task("evaluating lengths (tokens read)", total=None)
        result = lengthgen.run_lengthgen(run_dir, config, out, step=step,
                                         progress=lambda done, total: bar.update(job, completed=done, total=total))
    table = result["table"]
    hops = sorted(h for h in table["hop"].unique() if h != lengthgen.ALL_HOPS)
    view = Table(title=f"{result['summary']['task']} task, step {result['step']}: accuracy by length")
    for col in ["protocol", "length", "factor", "all", *(f"hop {h}" for h in hops), "retention"]:
        view.add_column(col, justify="right")
    for (prot, length), rows in table.groupby(["protocol", "length"], sort=False):
        acc = rows.set_index("hop")["acc"]
        view.add_row(prot, str(length), f"{rows['factor'].iloc[0]:.2f}", f"{acc[lengthgen.ALL_HOPS]:.3f}",
                     *(f"{acc[h]:.3f}" for h in hops), f"{rows.set_index('hop')['retention'][0]:.3f}")
    console = Console()
    console.print(view)
    console.print(f"wrote {out}/lengthgen.parquet, lengthgen.json, fig5b.png/svg")


@app.command("discrepancy")
def discrepancy_command(
    path: Path = typer.Argument(..., help="A posym run directory (latest checkpoint unless --step), a checkpoint "
                                "directory, or a Hugging Face RoPE model directory (with --prompts and --out)."),
    step: Optional[int] = typer.Option(None, help="Checkpoint step in a run directory."),
    lengths: Optional[str] = typer.Option(None, help="Comma-separated sequence lengths a posym task is lengthened "
                                          "to (extra target-window tokens; default the lengthgen paper protocol's)."),
    n: int = typer.Option(64, "--n", help="Test questions per length (the same ones at every length)."),
    prompts: Optional[Path] = typer.Option(None, help='JSONL prompt file ({"input_ids": [...]} per line), measured '
                                           "at its own lengths; needed for non-posym models."),
    queries: str = typer.Option("last", help="Query positions: last, hops (chain pointers) or all."),
    seed: int = typer.Option(0, help="Seed of the test questions."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default RUN_DIR/discrepancy)."),
) -> None:
    """Discrepancy of every head by length (Definition 3.1 on trained or real heads): top-1 minus top-2
    attention logit at the query; min (Delta), median and quantiles per layer, head and length."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from posym import discrepancy
    from posym.llm import parse_list

    hf_logging.disable_progress_bar()
    with Progress(transient=True) as bar:
        job = bar.add_task("measuring gaps (prompts)", total=None)
        result = discrepancy.run_discrepancy(
            path, out, step=step, lengths=parse_list(lengths, int) if lengths else None, n=n, seed=seed,
            prompts=prompts, queries=queries, device=device, progress=lambda k: bar.advance(job, k))
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


# ---- commands: llm-scores / llm-bench -----------------------------------------------------------


@app.command("llm-scores")
def llm_scores_cmd(
    model_dir: Path = typer.Argument(..., help="Local Hugging Face model directory (config.json, "
                                     "*.safetensors and a tokenizer); RoPE models only."),
    prompts: str = typer.Option("binding", help="Prompt set: 'binding' (Alice likes red ...), 'number' or "
                                "'letter' (1-hop tasks of Appendix H), or a JSONL file with one "
                                '{"text": ..., "focus": ...} object per line.'),
    text: Optional[str] = typer.Option(None, help="Score this single text instead of a prompt set."),
    n: int = typer.Option(20, help="How many prompts to draw from a built-in set."),
    size: int = typer.Option(12, help="Target-window size of the number/letter prompts."),
    query: str = typer.Option("last", help="Query position: 'last' token, or 'name' (the final token of "
                              "the name asked about, for binding prompts or JSONL 'focus')."),
    heads: Optional[str] = typer.Option(None, help="Heads to score per RoPE frequency plane, as "
                                        "LAYER.HEAD,... e.g. 0.1,5.3."),
    tau: float = typer.Option(1e-4, help="Temperature of the swap weights (1e-4: the swap that moves "
                              "most attention dominates)."),
    seed: int = typer.Option(0, help="Seed of the built-in prompt sets."),
    device: str = typer.Option("auto", help="cpu, cuda, or auto (cuda when available)."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16 weights."),
    allow_pickle: bool = typer.Option(False, help="Accept pickle weights (pytorch_model.bin) when there "
                                      "is no safetensors file; only for files you trust."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default runs/llm-scores/<model>)."),
) -> None:
    """Positional and symbolic score of every head of a real model, per-layer summaries and figures."""
    from posym import llm

    loaded = llm.load_model(model_dir, device=device, dtype=dtype, allow_pickle=allow_pickle)
    chosen = llm.prompt_set(prompts, text=text, n=n, size=size, seed=seed)
    out = out or Path("runs") / "llm-scores" / loaded.name
    settings = {"model_dir": str(model_dir), "prompts": prompts, "text": text, "n": n, "size": size,
                "query": query, "heads": heads, "tau": tau, "seed": seed, "dtype": dtype}
    bar, advance = _progress_bar(len(chosen), "scoring prompts")
    with bar:
        result = llm.write_scores(loaded, chosen, out, query=query, heads=llm.parse_heads(heads), tau=tau,
                                  settings=settings, progress=advance)
    print(f"pearson r(s_pos, s_sym) over heads = {result['pearson_r']:.3f}; wrote {out}")


@app.command("llm-bench")
def llm_bench_cmd(
    model_dir: Optional[Path] = typer.Argument(None, help="Local Hugging Face model directory; omit it "
                                               "to query an endpoint with --base-url."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible API base, e.g. "
                                           "https://api.openai.com/v1 (posym appends /chat/completions)."),
    model_name: Optional[str] = typer.Option(None, help="Model name sent to the endpoint."),
    api_key_env: Optional[str] = typer.Option(None, help="Name of the environment variable that holds "
                                              "the API key (the key itself is never written anywhere)."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for one endpoint reply."),
    retries: int = typer.Option(3, help="Extra attempts after a timeout or an HTTP 408/429/5xx reply."),
    tasks: str = typer.Option("number,letter", help="Comma-separated tasks."),
    sizes: Optional[str] = typer.Option(None, help="Comma-separated target-window sizes (default: all "
                                        "of Appendix H, 12,16,24,32,48,64,80,100,150,200,300)."),
    runs: int = typer.Option(5, help="Runs per task and size; run r draws fresh data with seed r."),
    n: int = typer.Option(20, help="Questions per run."),
    markers: str = typer.Option("off", help="Prompt variant: 'off' (plain Appendix H prompts), 'on' (every "
                                "target-window token tagged with its place, e.g. n@3) or 'both', side by side."),
    device: str = typer.Option("auto", help="cpu, cuda, or auto (local model only)."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16 (local model only)."),
    allow_pickle: bool = typer.Option(False, help="Accept pickle weights (pytorch_model.bin) you trust."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default runs/llm-bench/<model>)."),
) -> None:
    """Appendix H accuracy (1-hop number/letter tasks, 3 worked examples) with the paper's Table 3 beside."""
    from posym import bench, llm

    if markers not in bench.MARKER_CHOICES:
        raise PosymError(f"--markers must be off, on or both, got {markers!r}")
    variants = bench.MARKER_CHOICES[markers]
    judge, label = bench.make_judge(model_dir, base_url=base_url, model_name=model_name,
                                    api_key_env=api_key_env, timeout_s=timeout, retries=retries,
                                    device=device, dtype=dtype, allow_pickle=allow_pickle)
    task_list = llm.parse_list(tasks, str)
    size_list = llm.parse_list(sizes, int) if sizes else list(bench.BENCH_SIZES)
    out = out or Path("runs") / "llm-bench" / label
    settings = {"model": label, "tasks": task_list, "sizes": size_list, "runs": runs, "n": n,
                "markers": markers, "base_url": base_url, "dtype": dtype}
    bar, advance = _progress_bar(len(task_list) * len(size_list) * len(variants) * runs * n, "asking questions")
    with bar:
        table = bench.write_bench(judge, out, label=label, tasks=task_list, sizes=size_list, runs=runs, n=n,
                                  settings=settings, markers=variants, progress=advance)
    print(table)


# ---- commands: run / report / sweep -------------------------------------------------------------


@app.command("run")
def run_command(
    preset: Optional[str] = typer.Option(None, help="Training preset: 'quick' (the default; minutes for everything "
                                         "on 2 CPU cores), 'seed' or 'paper' (the paper's study; hours on a CPU, use "
                                         "--device cuda)."),
    task: Optional[list[str]] = typer.Option(None, help="Task to run: number and/or letter; repeat for several "
                                             "(default: both)."),
    out: Path = typer.Option(Path("runs/main"), help="Output directory: one run directory per task, theory/, "
                             "report/ and stages/ (done-files). Re-running the same command continues it."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or auto for training and length generalization "
                                         "(default auto)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file of pipeline settings (preset, tasks, "
                                          "seed, train overrides, dynamics_prompts, geometry_prompts, lengthgen, "
                                          "theory, workers); unknown keys are errors."),
    workers: Optional[int] = typer.Option(None, help="Jobs run side by side in separate processes (default: one "
                                          "per job up to the number of CPU cores)."),
    bench: Optional[Path] = typer.Option(None, help="An llm-bench output directory whose Table 3 the report "
                                         "should include."),
) -> None:
    """The whole study: train each task, then dynamics, geometry, length generalization, the theory checks
    and an HTML report; prints a summary table. Finished stages are never recomputed."""
    import time

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from posym import pipeline, report

    flags = {"preset": preset, "tasks": task or None, "device": device, "workers": workers}
    cfg = pipeline.resolve_pipeline(config, {k: v for k, v in flags.items() if v is not None})
    console = Console()
    start = time.perf_counter()
    with Live(console=console, transient=True, refresh_per_second=2) as live:
        def show(lines: list[str]) -> None:
            live.update(f"[bold]posym run[/] {time.perf_counter() - start:5.0f} s\n" + "\n".join(lines))

        result = pipeline.run_pipeline(cfg, out, bench=bench, status=show)
    table = Table(title=f"posym run ({cfg.preset} preset), {result['wall_seconds']:.0f} s")
    for column in ("task", "step", "acc", "acc per hop", "positional layers", "symbolic layers", "length generalization"):
        table.add_column(column, justify="left" if "layers" in column or "length" in column else "right")
    for s in result["summary"]:
        table.add_row(s["task"], str(s["step"]), f"{s['acc']:.3f}", " / ".join(f"{v:.3f}" for v in s["acc_hops"].values()),
                      s["positional"] or "n/a", s["symbolic"] or "n/a", report.lengthgen_headline(s["lengthgen"]))
    console.print(table)
    console.print(f"report: {result['report']}")


@app.command("report")
def report_command(
    paths: list[Path] = typer.Argument(..., help="Directories to report on: posym run directories (with their "
                                       "analysis/ and lengthgen/), a posym theory output and/or a posym llm-bench output."),
    out: Optional[Path] = typer.Option(None, help="Output directory for report.html and figures/ (default: "
                                       "report/ beside the first directory)."),
    title: str = typer.Option("posym report", help="Title of the page."),
) -> None:
    """One self-contained HTML page (figures inline, opens offline) with the analogues of the paper's
    Fig. 2, 4B, 5A/B, 6, 7, 8 and Tables 1 and 3, plus every figure as PNG and SVG."""
    from posym import report

    html_path = report.build_report(paths, out or Path(paths[0]).resolve().parent / "report", title=title)
    print(f"report: {html_path}")


@app.command("sweep")
def sweep_command(
    config: Path = typer.Argument(..., help="Sweep YAML: tasks, seeds, presets, rotary_dims, rope_bases, rope_bands, "
                                  "nope_from, train overrides, dynamics, n_prompts, cpus_per_trial, num_cpus (see examples/sweep.yaml)."),
    address: Optional[str] = typer.Option(None, help="Address of an existing Ray cluster (e.g. 'auto' or "
                                          "'ray://host:10001'); default: start a local Ray instance."),
    out: Path = typer.Option(Path("runs/sweep"), help="Output directory: trials/<name> run directories, "
                             "trials.parquet, aggregate.parquet, aggregate.png/svg, sweep.json."),
    max_concurrent: Optional[int] = typer.Option(None, help="Trials running at once (default: as many as Ray's "
                                                 "CPUs allow)."),
) -> None:
    """Train a grid of runs (tasks x seeds x presets x RoPE settings) with Ray and aggregate final accuracy
    per hop (and pure-head fractions) as mean and std over seeds. Finished trials are not rerun."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from posym import sweep

    cfg = sweep.load_sweep(config)
    console = Console()
    with Progress(console=console, transient=True) as bar:
        job = bar.add_task("trials", total=len(sweep.trials(cfg)))

        def advance(row: dict) -> None:
            if row["status"] != "ok":
                console.print(f"[red]trial {row['name']} failed:[/] {row['error']}")
            bar.advance(job)

        result = sweep.run_sweep(cfg, out, address=address, max_concurrent=max_concurrent, progress=advance)
    table = result["table"]
    view = Table(title=f"{result['trials']} trials, {len(result['failed'])} failed: mean ± std over seeds")
    columns = [c[:-5] for c in table.columns if c.endswith("_mean")]
    for column in ["task", "preset", "rotary_dim", "rope_base", "n_seeds", *columns]:
        view.add_column(column.replace("acc_", ""), justify="right")
    for r in table.to_dict("records"):
        view.add_row(r["task"], r["preset"], str(r["rotary_dim"]), f"{r['rope_base']:g}", str(r["n_seeds"]),
                     *(f"{r[c + '_mean']:.3f} ± {r[c + '_std']:.3f}" for c in columns))
    console.print(view)
    console.print(f"wrote {out}/trials.parquet, aggregate.parquet, aggregate.png/svg, sweep.json")
    if result["failed"]:
        raise PosymError(f"{len(result['failed'])} of {result['trials']} trials failed (see {out}/trials.parquet)")


# ---- commands: ablate / finetune -----------------------------------------------------------------

_HEADS_HELP = ("Heads to intervene on; repeat for several conditions: 'positional', 'symbolic' or 'mixed' (labels "
               "from the checkpoint's own scores at hop queries, gamma --gamma), 'each' (every layer on its own) "
               "or indices 'L.H,L.H' ('L' = all heads of layer L).")


def _condition_table(table, title: str, extra: dict | None = None):
    """A rich table: one row per condition, accuracy per hop at the training length and per length."""
    from rich.table import Table

    keys = [c for c in ("condition", "mode") if c in table.columns]
    hops = sorted(c for c in table.columns if c.startswith("acc_hop"))
    lengths = sorted(table["length"].unique())
    view = Table(title=title, caption=f"hopK: accuracy at the training length {lengths[0]}; @L: all-hop accuracy "
                 "at L tokens")
    for col in [*keys, "heads", *(h.replace("acc_", "") for h in hops),
                *(f"@{k}" for k in lengths), *(extra or {}).get("columns", [])]:
        view.add_column(col, justify="left" if col in ("condition", "mode", "heads") else "right")
    for key, rows in table.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        by_length = rows.set_index("length")
        first = by_length.loc[lengths[0]]
        more = (extra or {}).get("rows", {}).get(key[0], ["-"] * len((extra or {}).get("columns", [])))
        names = str(first["heads"]).split()
        view.add_row(*map(str, key), " ".join(names) if len(names) <= 3 else f"{len(names)} heads", *(f"{first[h]:.3f}" for h in hops),
                     *(f"{by_length.loc[k, 'acc']:.3f}" for k in lengths), *more)
    return view


@app.command("ablate")
def ablate_command(
    path: Path = typer.Argument(..., help="A posym run directory (latest checkpoint unless --step) or a checkpoint directory."),
    heads: list[str] = typer.Option(..., "--heads", help=_HEADS_HELP),
    mode: Optional[list[str]] = typer.Option(None, "--mode", help="zero (head output := 0) and/or mean (:= its mean "
                                             "output on train data); repeat for both (default both)."),
    step: Optional[int] = typer.Option(None, help="Checkpoint step in a run directory."),
    factors: str = typer.Option("1,2,4", help="Lengths to evaluate, as comma-separated multiples of the training "
                                "length (extra target-window tokens, as posym lengthgen)."),
    n: int = typer.Option(1000, "--n", help="Test sequences per length."),
    gamma: float = typer.Option(0.1, help="Purity threshold of the positional/symbolic labels (paper: 0.1)."),
    n_prompts: int = typer.Option(100, help="Test prompts the labels are scored on."),
    seed: int = typer.Option(0, help="Seed of the test data, the label prompts and the mean-ablation data."),
    save: Optional[Path] = typer.Option(None, help="Also save the pruned model (one --heads, one --mode) as a plain "
                                        "GPT-J checkpoint: zero = out_proj columns zeroed, mean = also folded into "
                                        "the layer's MLP output bias."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    out: Optional[Path] = typer.Option(None, help="Output directory for ablation.parquet/json/png/svg (default: "
                                       "PATH/ablation)."),
) -> None:
    """Ablate heads (zero or mean) and compare accuracy per hop and across lengths with the intact model."""
    from rich.console import Console
    from rich.status import Status
    from transformers.utils import logging as hf_logging

    from posym.interventions_run import run_ablation
    from posym.llm import parse_list

    hf_logging.disable_progress_bar()
    out = out or Path(path) / "ablation"
    with Status("scoring heads") as status:
        result = run_ablation(path, heads, out, modes=tuple(mode or ("zero", "mean")), step=step,
                              factors=parse_list(factors, int), n=n, seed=seed, n_prompts=n_prompts, gamma=gamma,
                              save=save, device=device, progress=lambda text: status.update(f"evaluating {text}"))
    console = Console()
    console.print(_condition_table(result["table"], f"{result['task']} task, step {result['step']}: ablation"))
    for spec in result["skipped"]:
        console.print(f"no head is labelled {spec!r} at gamma {gamma}: condition skipped")
    if "saved" in result:
        console.print(f"pruned model: {result['saved']}")
    console.print(f"wrote {out}/ablation.parquet, ablation.json, ablation.png/svg")


@app.command("finetune")
def finetune_command(
    path: Path = typer.Argument(..., help="A posym run directory (latest checkpoint unless --step) or one of its checkpoints."),
    freeze: list[str] = typer.Option(["none"], "--freeze", help="Heads kept frozen, one fine-tune per value: 'none' "
                                     "(train everything, the reference) or any --heads value of posym ablate."),
    steps: int = typer.Option(300, help="Fine-tuning steps per condition (linear decay from --lr to 0)."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate (default: the run's)."),
    step: Optional[int] = typer.Option(None, help="Checkpoint step to start from (default: the latest)."),
    factors: str = typer.Option("1,2,4", help="Lengths to evaluate, as multiples of the training length."),
    n: int = typer.Option(1000, "--n", help="Test sequences per length."),
    gamma: float = typer.Option(0.1, help="Purity threshold of the positional/symbolic labels."),
    seed: int = typer.Option(0, help="Seed of the test data and the label prompts."),
    save_models: bool = typer.Option(False, help="Also save each fine-tuned model under OUT/models/."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default: PATH/finetune)."),
) -> None:
    """Continue training with chosen heads frozen (their q/k/v rows and out_proj columns never change) and
    compare accuracy, length generalization, steps/s and trainable parameters across conditions."""
    from rich.console import Console
    from rich.status import Status
    from transformers.utils import logging as hf_logging

    from posym.interventions_run import run_finetune
    from posym.llm import parse_list

    hf_logging.disable_progress_bar()
    out = out or Path(path) / "finetune"
    with Status("scoring heads") as status:
        result = run_finetune(path, freeze, out, step=step, steps=steps, lr=lr, factors=parse_list(factors, int),
                              n=n, seed=seed, gamma=gamma, save_models=save_models, device=device,
                              progress=lambda text: status.update(text))
    costs = {k: [f"{c['steps_per_s']:.1f}", f"{c['trainable_params']:,}", str(c["frozen_unchanged"])]
             for k, c in result["costs"].items()}
    extra = {"columns": ["steps/s", "trainable", "frozen unchanged"], "rows": costs}
    console = Console()
    console.print(_condition_table(result["table"], f"{result['task']} task, from step {result['step']}: "
                                   f"+{steps} steps", extra))
    for spec in result["skipped"]:
        console.print(f"no head is labelled {spec!r} at gamma {gamma}: condition skipped")
    console.print(f"wrote {out}/finetune.parquet, finetune.json, finetune.png/svg")


def main() -> None:
    """Console-script entry point: run the app, answering bad input with one line and exit 2."""
    try:
        app(standalone_mode=False)
    except PosymError as exc:
        print(f"posym: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("posym: aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        # Click usage errors (bad option values, missing arguments) are user errors too. Typer
        # bundles its own copy of click, so recognise them by shape rather than by class.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            print(f"posym: error: {exc.format_message()}", file=sys.stderr)
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
