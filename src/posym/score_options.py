"""The options of `posym score`, defined once: name, type, default and the help the command line shows.

`posym.commands.score.run_score` takes them as one `ScoreOptions`; `posym.cli.analysis` builds the
command's flags from its fields (`posym.cli.options.flags_from`), so an option is added, renamed or
re-documented here and nowhere else. This module imports nothing heavy: the CLI reads it for `posym --help`.
Not among them: the model and its `--step`, `--budget` and `--device` (where and how the same numbers are
computed) and `--out`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from posym.core.paper import GAMMA, TAU


def option(default, help: str, **click) -> object:
    """A dataclass field with its command-line help (and click settings such as min=1) as metadata."""
    return field(default=default, metadata={"help": help, **click})


@dataclass(frozen=True)
class ScoreOptions:
    """What `posym score` scores and how (posym.prompts.score_prompts, posym.core.scores.iter_scores)."""

    task: Optional[str] = option(
        None, "Draw test-split prompts of this task (default: the checkpoint's own task config)."
    )
    n: int = option(100, "How many task prompts to score (the paper uses 100).", min=1)
    seed: int = option(0, "Seed of the task prompts.")
    prompts: Optional[Path] = option(
        None,
        "JSONL prompt file instead of a task: one "
        '{"input_ids": [...], "queries": [...]} per line (posym data JSONL works), '
        'or {"text": "..."} for the model\'s own tokenizer.',
    )
    queries: Optional[str] = option(
        None,
        "Which query positions: last (the final token), hops "
        "(every pointer token on the chain) or all (default: the file's "
        "queries, else last).",
    )
    tau: float = option(TAU, "Temperature of the swap weights softmax(|D_i - D_j| / tau).")
    blocks: Optional[int] = option(
        None,
        "Swap M contiguous key blocks and compare block means "
        "(the block variant of arXiv 2511.11579) instead of single tokens.",
    )
    compare: str = option("probs", "Compare attention probabilities (probs, the paper) or raw logits.")
    epsilon: float = option(
        1e-12,
        "Weigh only the swaps carrying all but EPSILON of the swap "
        "weights: each score lies within 2 * EPSILON of weighing every swap.",
    )
    exact: str = option(
        "pruned", "pruned (the EPSILON bound) or dense (weigh every swap: the reference, O(n^2) per head and query)."
    )
    gamma: float = option(
        GAMMA,
        "Purity threshold of the printed labels (positional: s_pos >= 1-gamma "
        "and s_sym <= gamma; symbolic: the reverse; uniform: both >= 1-gamma).",
    )
    batch_size: int = option(64, "Prompts of equal length per forward pass.", min=1)
