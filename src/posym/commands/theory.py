"""`posym theory`: the paper's T_Index / T_Retrieval heads checked, scored and drawn (Fig. 5A), as files.

The maths (constructions, exactness per length, needed inverse temperature, Theorem 3.2's bounds)
is `posym.core.theory` and `posym.core.constructions`; this module runs it for a `TheoryConfig`
and writes theory.parquet, discrepancy.parquet, theory.json and fig5a PNG + SVG.
"""

from __future__ import annotations

from pathlib import Path

from posym.configs import to_dict
from posym.core.constructions import (
    construction_scores,
    index_head,
    multihop,
    retrieval_head,
    with_beta,
)
from posym.core.tasks import generate, task_config
from posym.core.theory import (
    TheoryConfig,
    discrepancy_curve,
    frequency_angle,
    needed_beta,
    summarize_lengths,
    verify,
)
from posym.figures import save_figure, subplots
from posym.io import manifest, write_json, write_parquet
from posym.resources import check_count, sequence_bytes
from posym.runs import figure_file, output_file


def plot_discrepancy(curves: list[dict]):
    """Fig. 5A: measured Delta(n) and Theorem 3.2's bounds, one panel per theta."""
    thetas = sorted({r["theta"] for r in curves if r["theta"] > 0}, reverse=True)
    fig, axes = subplots(1, len(thetas), figsize=(5 * len(thetas), 3.8), squeeze=False)
    for ax, theta in zip(axes[0], thetas):
        for kind, color in [("index", "tab:blue"), ("retrieval", "tab:orange")]:
            sub = [r for r in curves if r["head"] == kind and r["theta"] == theta and r["valid"]]
            if sub:
                n = [r["n"] for r in sub]
                ax.plot(n, [r["delta"] for r in sub], color=color, label=f"T_{kind.capitalize()} measured")
                ax.plot(n, [r["bound"] for r in sub], color=color, ls="--", label=f"T_{kind.capitalize()} bound")
        nope = [r for r in curves if r["head"] == "retrieval" and r["theta"] == 0]
        if nope:
            ax.plot(
                [r["n"] for r in nope],
                [r["delta"] for r in nope],
                color="gray",
                ls=":",
                label="T_Retrieval, NoPE (theta = 0)",
            )
        ax.set(
            yscale="log",
            xlabel="length n (query position)",
            ylabel="discrepancy Delta(n)",
            title=f"theta = {theta:.4g}",
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def run_theory(config: TheoryConfig, out_dir, progress=None) -> dict:
    """Verify, score and plot; write theory.parquet, discrepancy.parquet, theory.json and fig5a.png/svg
    into `out_dir`. `progress(step_name)` is called before each step. Returns the JSON summary."""
    import pandas as pd
    import torch

    step = progress or (lambda name: None)
    out_dir = Path(out_dir)
    # a sampled length holds its inputs, their tokens and logits at once: a few int64 per position
    check_count("--samples", config.samples, 4 * 8 * (max(config.n0) + 2), what=f"input of {max(config.n0) + 1} tokens")
    check_count("task_samples", config.task_samples, sequence_bytes(task_config("number")), what="task sample")
    step("verifying the constructions at every length")
    rows = verify(config)
    summary = summarize_lengths(rows, config.n0)
    step("composing hops and scoring the heads on task samples")
    tasks = {}
    for kind, task in [("index", "number"), ("retrieval", "letter")]:
        cfg = task_config(task) if task == "number" else task_config(task, alphabet_size=config.alphabet_size)
        s = generate(cfg, config.task_samples, config.seed, "test")
        ids, ans, hops = (torch.as_tensor(a) for a in (s.input_ids, s.answer, s.hops))
        freq = config.index_freq_id if kind == "index" else config.retrieval_freq_id
        head = (index_head if kind == "index" else retrieval_head)(
            cfg, frequency_angle(freq, base=config.rope_base, rotary_dim=config.rotary_dim)
        )
        n = cfg.seq_len - 1
        beta = max(needed_beta(head, cfg, m, config.eps)[0] for m in range(1, n + 1))
        soft = with_beta(head, beta)
        tasks[kind] = {
            "task": task,
            "beta": beta,
            **construction_scores(soft, ids),
            "hard": multihop(head, cfg, ids, ans, hops),
            "softmax": multihop(soft, cfg, ids, ans, hops, hard=False),
        }
    step("measuring discrepancy curves")
    curves = []
    ns = range(1, config.curve_max_n + 1)
    for freq in config.curve_freq_ids:
        theta = frequency_angle(freq, base=config.rope_base, rotary_dim=config.rotary_dim)
        curves += [{**r, "freq_id": freq} for r in discrepancy_curve(theta, ns, alphabet_size=config.alphabet_size)]
    curves += [
        {**r, "freq_id": 0}
        for r in discrepancy_curve(0.0, ns, alphabet_size=config.alphabet_size)
        if r["head"] == "retrieval"
    ]
    step("writing tables and figure")
    write_parquet(output_file(out_dir, "theory", "theory"), pd.DataFrame(rows))
    write_parquet(output_file(out_dir, "theory", "discrepancy"), pd.DataFrame(curves))
    figures = save_figure(plot_discrepancy(curves), figure_file(out_dir, "theory", "discrepancy"), dpi=150)
    result = {
        "summary": summary,
        "tasks": tasks,
        "figures": [str(p) for p in figures],
        "manifest": manifest(to_dict(config), seed=config.seed),
    }
    write_json(output_file(out_dir, "theory", "record"), result)
    return result
