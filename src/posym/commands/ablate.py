"""`posym ablate`: accuracy per hop and against length with chosen heads ablated (zero or mean).

The conditions, lengths and outputs are `posym.conditions`'; the head operations `posym.core.interventions`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from posym.conditions import (
    condition_lengths,
    expand_conditions,
    head_text,
    load_run,
    measure_rows,
    write_conditions,
)
from posym.core.interventions import (
    ABLATION_MODES,
    LABEL_QUERIES,
    ablated,
    fold_ablation,
    head_means,
    label_heads,
    select_heads,
)
from posym.core.tasks import generate
from posym.core.paper import GAMMA
from posym.errors import PosymError
from posym.models import save_model


def run_ablation(
    path,
    conditions: list[str],
    out_dir,
    *,
    modes=ABLATION_MODES,
    step: int | None = None,
    factors=(1, 2, 4),
    n: int = 1000,
    seed: int = 0,
    n_prompts: int = 100,
    gamma: float = GAMMA,
    mean_samples: int = 512,
    save: str | Path | None = None,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Accuracy (per hop, per length) of the model with each condition's heads ablated, per mode.

    conditions: "positional", "symbolic", "mixed", "each" (every layer on its own) or "L.H,..."; a
    label no head carries is reported under "skipped". Writes ablation.parquet/json/png/svg to
    out_dir; `save` writes the single (condition, mode) pruned model as a plain GPT-J checkpoint.
    """
    if not conditions:
        raise PosymError("give at least one set of heads to ablate (--heads)")
    model, info = load_run(path, step, device)
    task = info["task_config"]
    lengths = condition_lengths(model, task, list(factors), n, n_prompts)
    labels = label_heads(model, task, n_prompts=n_prompts, seed=seed, gamma=gamma)
    every = [(layer, h) for layer in range(model.config.n_layer) for h in range(model.config.n_head)]
    means = head_means(model, generate(task, mean_samples, seed, split="train").input_ids, every)
    chosen, skipped = {}, []
    for spec in expand_conditions(conditions, model):
        heads = select_heads(spec, model, labels)
        if heads:
            chosen[spec] = heads
        else:
            skipped.append(spec)
    if save is not None and (len(chosen) != 1 or len(modes) != 1):
        raise PosymError("--save writes one pruned model: give exactly one --heads condition and one --mode")

    note = progress or (lambda text: None)
    note("baseline")
    rows = measure_rows(model, task, lengths, n, seed, condition="none", mode="none", heads="")
    for spec, heads in chosen.items():
        for mode in modes:
            note(f"{spec} ({mode})")
            with ablated(model, heads, mode, means):
                rows += measure_rows(model, task, lengths, n, seed, condition=spec, mode=mode, heads=head_text(heads))
    import pandas as pd

    table = pd.DataFrame(rows)
    out_dir = Path(out_dir)
    result = {
        "checkpoint": str(info["path"]),
        "step": info["step"],
        "queries": LABEL_QUERIES,
        "task": task.task,
        "gamma": gamma,
        "labels": labels.to_dict("records"),
        "conditions": {k: head_text(v) for k, v in chosen.items()},
        "skipped": skipped,
        "mean_samples": mean_samples,
    }
    if save is not None:
        (spec, heads), mode = next(iter(chosen.items())), modes[0]
        fold_ablation(model, heads, mode, means)
        result["saved"] = str(save_model(model, info, save, {"ablation": {"heads": head_text(heads), "mode": mode}}))
    return write_conditions(out_dir, "ablate", table, result, f"{task.task} task, step {info['step']}: head ablation")
