"""Conditions of the interventions on a posym run (`posym ablate`, `posym finetune`): which heads, at
which lengths, measured how, and written where.

A condition is a head set (`posym.core.interventions.select_heads`: "L0H1", a layer, "positional", ...;
`EACH_LAYER` expands to one condition per layer). Accuracy against length is
`posym.core.lengthgen.measure` (the paper protocol: extra target-window tokens before the effective
window; the same questions at every length), so the first length, the training length, is also the
accuracy-per-hop table. The head operations themselves are `posym.core.interventions`.
"""

from __future__ import annotations

from pathlib import Path

from posym.core.lengthgen import LengthGenConfig, measure, plan
from posym.errors import PosymError
from posym.figures import save_figure, subplots
from posym.io import write_json, write_parquet
from posym.models import load_checkpoint, resolve
from posym.resources import check_count, check_lengths, sequence_bytes
from posym.runs import figure_file, output_file

EACH_LAYER = "each"
"""Condition keyword: one condition per layer (every head of that layer)."""


def head_text(heads) -> str:
    return " ".join(f"{layer}.{h}" for layer, h in heads)


def expand_conditions(specs: list[str], model) -> list[str]:
    out: list[str] = []
    for spec in specs:
        out += [str(layer) for layer in range(model.config.n_layer)] if spec == EACH_LAYER else [spec]
    return list(dict.fromkeys(out))


def condition_lengths(model, task, factors: list[int], n: int, n_prompts: int) -> list[int]:
    """The lengths (factors of the training length) to measure, checked as `posym lengthgen` checks its
    own (`plan` and `check_lengths`: within the position table, `n` test sequences that fit in memory at the longest),
    and the `n_prompts` label prompts against memory too."""
    if not factors or min(factors) < 1:
        raise PosymError(f"length factors must be positive integers, got {factors}")
    if 1 not in factors:  # the figure's top panel compares every condition at the training length
        raise PosymError(
            f"--factors must include 1 (the training length, where the conditions are compared), "
            f"got {','.join(map(str, factors))}"
        )
    lengths = sorted({k * task.seq_len for k in factors})
    config = LengthGenConfig(lengths=lengths, protocol="paper", n=n, heads=False)
    check_lengths(task, config, plan(task, config, model.config.n_positions))
    rows = model.config.n_layer * model.config.n_head * task.max_hops  # score rows per label prompt
    check_count("--label-prompts", n_prompts, sequence_bytes(task) + 80 * rows, what="label prompt")
    return lengths


def measure_rows(model, task, lengths, n: int, seed: int, **labels) -> list[dict]:
    """One row per length: the labels, length, factor and `posym.core.train.evaluate`'s metrics."""
    config = LengthGenConfig(lengths=lengths, protocol="paper", n=n, seed=seed, device=str(model.device))
    return [
        {**labels, "length": length, "factor": length / task.seq_len, **metrics}
        for length, metrics in measure(model, task, lengths, config).items()
    ]


def load_run(path, step, device):
    source = resolve(path)
    if source.kind != "posym":
        raise PosymError(
            f"ablate and finetune intervene on posym runs (a GPT-J trained on a task); {path} is a "
            f"{'GGUF' if source.kind == 'gguf' else 'Hugging Face'} model: analyse it with score, "
            "llm-scores, geometry or discrepancy"
        )
    model, info = load_checkpoint(path, step=step, device=device, attn_implementation="sdpa")
    if info["task_config"] is None:
        raise PosymError(f"{info['path']} has no posym.json with its task config; interventions need a posym model")
    return model, info


def write_conditions(out_dir: Path, command: str, table, result: dict, title: str) -> dict:
    """Write `command`'s ("ablate" or "finetune") table, figure and JSON record (`posym.runs`: FILES and
    FIGURES) into out_dir; returns the record with the table."""
    write_parquet(output_file(out_dir, command, "conditions"), table)
    figure = figure_file(out_dir, command, "conditions")
    result["figures"] = [str(p) for p in save_figure(plot_conditions(table, title), figure)]
    write_json(output_file(out_dir, command, "record"), result)
    return {**result, "table": table}


def plot_conditions(table, title: str):
    """Top: accuracy per hop at the training length per condition; bottom: accuracy vs length."""
    import numpy as np

    keys = [c for c in ("condition", "mode") if c in table.columns]
    table = table.assign(name=table[keys].astype(str).agg(" / ".join, axis=1).str.replace(" / none", ""))
    names = list(dict.fromkeys(table["name"]))
    base = table[table["factor"] == 1].set_index("name").loc[names]
    hops = ["acc"] + sorted(c for c in table.columns if c.startswith("acc_hop"))
    fig, (left, right) = subplots(
        2, 1, figsize=(min(16.0, max(7.0, 0.5 * len(names) + 3)), 8.5), gridspec_kw={"height_ratios": [1, 1]}
    )
    x = np.arange(len(names))
    width = 0.8 / len(hops)
    for k, column in enumerate(hops):
        left.bar(x + (k - (len(hops) - 1) / 2) * width, base[column], width, label=column.replace("acc_", ""))
    left.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    left.set(ylim=(0, 1.05), ylabel="accuracy at the training length")
    left.legend(fontsize=7, ncol=len(hops))
    for name in names:
        rows = table[table["name"] == name].sort_values("length")
        right.plot(
            rows["length"],
            rows["acc"],
            marker="o",
            ms=3,
            lw=2.2 if name in ("none", "start") else 1,
            color="black" if name in ("none", "start") else None,
            label=name,
        )
    lengths = sorted(table["length"].unique())
    right.set(xscale="log", ylim=(-0.02, 1.05), xlabel="sequence length (tokens)", ylabel="accuracy (all hops)")
    right.set_xticks(lengths, [str(k) for k in lengths], minor=False)
    right.minorticks_off()
    right.legend(fontsize=6, ncol=max(1, len(names) // 6), loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
