"""`posym llm-scores`: positional and symbolic head scores of a real model (docs/method.md section 7).

Models come from `posym.models.load` (the embedded models, a GGUF file, a Hugging Face directory or a posym
run; RoPE models only, safetensors unless the user opts in); the prompt sets are `posym.prompts`' (the
binding task of arXiv 2511.11579, the 1-hop number/letter tasks of Appendix H, a JSONL file), rendered as
text for the model's own tokenizer. `write_scores` runs the exact head scores of `posym.core.scores` on
them, plus the per-plane scores of `posym.core.geometry` for chosen heads. The Appendix H benchmark
itself is `posym.commands.llm_bench`.
"""

from __future__ import annotations


from posym.core.geometry import layer_bases, plane_scores
from posym.core.paper import TAU
from posym.core.scores import head_details, score_model, summarize_heads
from posym.core.stats import pearson
from posym.core.study import find_sinks, layer_profile, sink_changes
from posym.errors import PosymError
from posym.figures import plot_heads, save_figure, subplots
from posym.io import manifest, output_set, write_json, write_parquet
from posym.models import LoadedModel, tokenize
from posym.prompts import Prompt, query_position
from posym.runs import figure_file, output_file

# ---- figures ------------------------------------------------------------------------------------


# ---- command drivers ----------------------------------------------------------------------------


def _heads_by_layer(heads: list[tuple[int, int]]) -> dict[int, list[int]]:
    """(layer, head) pairs -> {layer: [heads]} in ascending order."""
    out: dict[int, list[int]] = {}
    for layer, head in sorted(set(heads)):
        out.setdefault(layer, []).append(head)
    return out


def plot_planes(planes):
    """Per chosen head: s_pos and s_sym of every RoPE plane vs frequency ID (x = 0: position-free dims),
    over grey bars of each plane's use (its largest logit contribution at the query, prompt mean)."""
    chosen = list(planes.groupby(["layer", "head"]))
    fig, axes = subplots(len(chosen), 1, figsize=(8, 2.6 * len(chosen)), squeeze=False)
    for ax, ((layer, head), rows) in zip(axes[:, 0], chosen):
        rows = rows.sort_values("frequency_id")
        use = ax.twinx()  # how much each plane can move the logits: a plane with no use has no say
        use.bar(rows.frequency_id, rows.max_logit, color="grey", alpha=0.3, width=0.8)
        use.set_ylabel("use (max logit)", fontsize=8)
        ax.set_zorder(use.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.plot(rows.frequency_id, rows.s_pos, "o-", ms=3, label="s_pos")
        ax.plot(rows.frequency_id, rows.s_sym, "s-", ms=3, label="s_sym")
        base = layer_bases(rows).get(int(layer), float("nan"))  # local and global layers differ (Gemma 3)
        ax.set(title=f"layer {layer} head {head}, RoPE base {base:,.0f}", ylabel="score", ylim=(-0.05, 1.05))
    axes[-1, 0].set_xlabel("frequency ID (1 = fastest plane; 0 = non-rotary dims)")
    axes[0, 0].legend(fontsize=8)
    return fig


def write_scores(
    loaded: LoadedModel,
    prompts: list[Prompt],
    out_dir,
    *,
    query: str = "last",
    heads: list[tuple[int, int]] = (),
    tau: float = TAU,
    epsilon: float = 1e-12,
    exact: str = "pruned",
    exclude_keys=None,
    details: int = 0,
    top: int = 8,
    budget: int | None = None,
    settings: dict,
    progress=None,
    owns: tuple[str, ...] = (),
) -> dict:
    """Score every head on `prompts` and write scores/heads/layers(/planes).parquet, figures, summary.json.

    Files: scores.parquet (posym.core.scores.COLUMNS: scores, kept swaps and bound (epsilon/exact: see
    `posym.core.scores.iter_scores`), and the sink view, attention on key 0 and on the top key),
    heads.parquet (prompt means and labels, posym.core.scores.summarize_heads), prompts.parquet (index,
    text, answer, input_ids, query position and token), layers.parquet (per-layer medians), with
    exclude_keys (positions, or "auto": `posym.core.study.find_sinks`) also scores_excluded.parquet and
    sinks.parquet (each head's label with and without them),
    planes.parquet (prompt-mean per-plane scores of --heads), heads.png/svg, planes.png/svg,
    with `details` > 0 details.parquet (`posym.core.scores.head_details` of the first `details`
    prompts at their query, the `top` heaviest swaps: what `posym explore` shows, written here while
    the model is loaded so that explore need not load it again), summary.json (manifest, Pearson r,
    per-layer medians, "details": {"prompts", "top"}). Returns the summary dict.

    The files are written as one set (`posym.io.output_set`: `owns`, the names an earlier set of
    out_dir may hold): a kill or a failed write leaves out_dir as it was.
    """
    import pandas as pd

    config = loaded.model.config
    for layer, head in heads:
        if not (layer < config.num_hidden_layers and head < config.num_attention_heads):
            raise PosymError(
                f"--heads {layer}.{head} does not exist: the model has {config.num_hidden_layers} "
                f"layers of {config.num_attention_heads} heads"
            )
    ids = [tokenize(loaded, p.text)[0] for p in prompts]  # checks every length before any work
    queries = [[query_position(loaded, p, query)] for p in prompts]
    if exclude_keys is not None and exclude_keys != "auto":
        shortest = min(min(q) for q in queries)  # keys lie before the query of every prompt
        outside = [k for k in exclude_keys if not 0 <= k < shortest]
        if outside:
            raise PosymError(
                f"--exclude-keys {outside[0]} is not a key of every prompt: key positions lie in "
                f"0..{shortest - 1} (before the earliest query)"
            )
    frame = score_model(
        loaded.model, ids, queries, tau=tau, epsilon=epsilon, exact=exact, budget=budget, progress=progress
    )
    head_means = summarize_heads(frame)
    layers, r = layer_profile(head_means), pearson(head_means.s_pos, head_means.s_sym)
    with output_set(out_dir, owns=owns) as out_dir:
        extra = {}
        if exclude_keys is not None:
            keys = find_sinks(frame) if exclude_keys == "auto" else list(exclude_keys)
            excluded = score_model(
                loaded.model,
                ids,
                queries,
                tau=tau,
                epsilon=epsilon,
                exact=exact,
                exclude_keys=keys,
                budget=budget,
                progress=progress,
            )
            changes = sink_changes(head_means, summarize_heads(excluded))
            write_parquet(output_file(out_dir, "llm-scores", "excluded"), excluded)
            write_parquet(output_file(out_dir, "llm-scores", "sinks"), changes)
            extra = {"excluded_keys": keys, "label_changes": int(changes.changed.sum())}
        write_parquet(output_file(out_dir, "llm-scores", "scores"), frame)
        write_parquet(output_file(out_dir, "llm-scores", "heads"), head_means)
        write_parquet(
            output_file(out_dir, "llm-scores", "prompts"),
            pd.DataFrame(
                [
                    {
                        "prompt": k,
                        "text": p.text,
                        "answer": p.answer,
                        "input_ids": i.tolist(),
                        "query": q[0],
                        "query_token": loaded.tokenizer.decode([int(i[q[0]])]),
                        "tokens": [loaded.tokenizer.decode([int(t)]) for t in i[: q[0] + 1]],
                    }
                    for k, (p, i, q) in enumerate(zip(prompts, ids, queries))
                ]
            ),
        )
        write_parquet(output_file(out_dir, "llm-scores", "layers"), layers)
        if details > 0:
            chosen = min(details, len(ids))
            rows = head_details(loaded.model, [i.tolist() for i in ids[:chosen]], queries[:chosen], tau=tau, top=top)
            write_parquet(output_file(out_dir, "llm-scores", "details"), rows)
            extra["details"] = {"prompts": chosen, "top": top}
        save_figure(plot_heads(head_means, r), figure_file(out_dir, "llm-scores", "heads"))
        if heads:
            # one pass per chosen layer scores all of its chosen heads (posym.core.geometry's channel engine)
            per_prompt = pd.concat(
                [
                    plane_scores(loaded.model, ids, queries, layers=[layer], heads=chosen, tau=tau)
                    for layer, chosen in _heads_by_layer(heads).items()
                ]
            )
            planes = per_prompt.groupby(["layer", "head", "channel", "frequency_id", "frequency"], as_index=False)[
                ["s_pos", "s_sym", "max_logit"]
            ].mean()
            write_parquet(output_file(out_dir, "llm-scores", "planes"), planes)
            save_figure(plot_planes(planes), figure_file(out_dir, "llm-scores", "planes"))
        summary = {
            **manifest(settings, seed=settings.get("seed")),
            "settings": settings,
            "model_type": loaded.model_type,
            "prompts": len(prompts),
            "pearson_r": r,
            "layers": layers.to_dict("records"),
            **extra,
        }
        write_json(output_file(out_dir, "llm-scores", "summary"), summary)
        return summary
