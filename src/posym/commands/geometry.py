"""`posym geometry`: RoPE frequency use and per-plane scores of a trained or real model, as files.

Loads any model spec (`posym.models`: a posym run/checkpoint, smollm2-135m, a GGUF file, a Hugging
Face directory), computes with
`posym.core.geometry` (plane scores, channel means, frequency use, the q/k plane projection) and
writes planes/channels/frequency/qk_plane.parquet, geometry.json and the Fig. 8 / Fig. 4B figures.
"""

from __future__ import annotations

from pathlib import Path

from posym import figures
from posym.core.paper import TABLE1 as PAPER_TABLE1, TAU
from posym.core.geometry import (
    WEIGHTINGS,
    channel_means,
    frequency_use,
    index_alignment,
    layer_bases,
    plane_scores,
    qk_projection,
)
from posym.core.qk import check_layers
from posym.core.tasks import offset_ids, token_names
from posym.errors import PosymError
from posym.io import manifest, write_json, write_parquet
from posym.models import load_analysable
from posym.prompts import score_prompts
from posym.runs import figure_file, output_file


def prepare(
    path,
    *,
    step: int | None = None,
    n_prompts: int = 100,
    seed: int = 0,
    prompts=None,
    queries: str | None = None,
    tau: float = TAU,
    device: str = "cpu",
    out=None,
) -> dict:
    """Load what `posym geometry PATH` analyses (`posym.models.load_analysable`) and its prompts: the
    run's own task's test prompts, or the JSONL file `prompts` (token ids, or text for the model's
    tokenizer; required for other models). queries: last, hops, all or None (a file's own
    "queries", else the last token).

    Returns the keyword arguments of `run_geometry` but `progress` and the figure options: model,
    input_ids, queries, out_dir, tau, token_names, paper_task, offsets and settings (recorded in geometry.json).
    """
    loaded, out = load_analysable(path, step=step, device=device, out=out)
    task_config, step = loaded.info.get("task_config"), loaded.info.get("step")
    ids, wanted = score_prompts(
        loaded.model,
        task_config=None if prompts else task_config,
        n_prompts=n_prompts,
        seed=seed,
        prompts_file=prompts,
        queries=queries,
        encode=loaded.text_ids,
    )
    names = token_names(task_config) if task_config is not None and not prompts else None
    settings = {
        "model": str(path),
        "step": step,
        "prompts": str(prompts) if prompts else None,
        "n_prompts": len(ids),
        "queries": queries or "file/last",
        "tau": tau,
        "seed": seed,
    }
    return {
        "model": loaded.model,
        "input_ids": ids,
        "queries": wanted,
        "out_dir": out,
        "tau": tau,
        "token_names": names,
        "paper_task": task_config.task if names else None,
        "offsets": offset_ids(task_config) if names else None,
        "settings": settings,
    }


def run_geometry(
    model,
    input_ids,
    queries,
    out_dir,
    *,
    tau: float = TAU,
    plane_layer: int | None = None,
    plane_head: int = 0,
    example: int = 0,
    token_names=None,
    paper_task: str | None = None,
    offsets: dict[int, int] | None = None,
    settings: dict,
    progress=None,
) -> dict:
    """Write planes.parquet (per-prompt channel rows), channels.parquet (channel means),
    frequency.parquet (per head, Table 1), qk_plane.parquet (prompt `example` on the dominant plane
    of plane_layer/plane_head;
    plane_layer None = layer 1 as in the paper's Fig. 4B, or 0 for a 1-layer model), geometry.json and fig8_frequency / fig4b_qk_plane PNG+SVG to out_dir.

    token_names: optional id -> text table for the figure labels; paper_task: "number"/"letter" to
    draw the paper's Table 1 beside ours; offsets: token id -> offset (`posym.core.tasks.offset_ids`) to
    read the Fig. 4B plane against T_Index (`index_alignment`). Returns the summary dict.
    """
    n_layers = len(check_layers(model, None))
    plane_layer = min(1, n_layers - 1) if plane_layer is None else plane_layer
    if not 0 <= plane_layer < n_layers:
        raise PosymError(f"--plane-layer must lie in 0..{n_layers - 1}, got {plane_layer}")
    if not 0 <= example < len(input_ids):
        raise PosymError(f"--example must lie in 0..{len(input_ids) - 1} (the prompt set), got {example}")
    out_dir = Path(out_dir)
    planes = plane_scores(model, input_ids, queries, tau=tau, progress=progress)
    means = channel_means(planes)
    heads = frequency_use(means)
    chosen = heads[(heads.layer == plane_layer) & (heads["head"] == plane_head)]
    if chosen.empty:
        raise PosymError(f"--plane-head {plane_head} does not exist in layer {plane_layer}")
    dominant = int(chosen.dominant_id.iloc[0])
    projection = qk_projection(model, input_ids[example], plane_layer, plane_head, dominant)
    write_parquet(output_file(out_dir, "geometry", "planes"), planes)
    write_parquet(output_file(out_dir, "geometry", "channels"), means)
    write_parquet(output_file(out_dir, "geometry", "frequency"), heads)
    write_parquet(output_file(out_dir, "geometry", "qk_plane"), projection)
    paper = PAPER_TABLE1.get(paper_task) if paper_task else None
    paths = figures.save_figure(
        figures.plot_frequency_use(means, heads, paper=paper), figure_file(out_dir, "geometry", "frequency")
    )
    paths += figures.save_figure(
        figures.plot_qk_plane(projection, token_names=token_names), figure_file(out_dir, "geometry", "qk_plane")
    )
    per_layer = heads.groupby("layer").mean(numeric_only=True)
    alignment = index_alignment(projection, offsets) if offsets else None  # number-task runs only
    summary = {
        **manifest(settings, seed=settings.get("seed")),
        "settings": settings,
        "weighted_id_per_layer": per_layer.weighted_id.round(2).tolist(),
        "weightings": {name: per_layer[f"weighted_id_{name}"].round(2).tolist() for name in WEIGHTINGS},
        "planes": int(heads.planes.max()),
        "uniform_id": float(heads.uniform_id.max()),
        "rope_base_per_layer": [round(base, 1) for base in layer_bases(means).values()],
        "paper_table1": paper,
        "plane_figure": {
            "layer": plane_layer,
            "head": plane_head,
            "frequency_id": dominant,
            "prompt": example,
            "index_alignment": alignment,
        },
        "figures": [str(p) for p in paths],
    }
    write_json(output_file(out_dir, "geometry", "record"), summary)
    return summary
