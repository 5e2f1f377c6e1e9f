"""posym: positional versus symbolic attention heads in RoPE transformers.

Implements the study of arXiv 2605.31558 (Urrutia et al., 2026) and the head metric of
arXiv 2511.11579: multi-hop tasks, GPT-J training, exact head scores, RoPE geometry, theory,
length generalization and the same analysis on real Hugging Face models.

The handful of entry points a notebook needs are importable from here (loaded on first use, so
that `import posym` stays cheap); examples/quickstart.ipynb walks through them:

>>> import posym
>>> sorted(posym.__all__)  # doctest: +NORMALIZE_WHITESPACE
['LoadedModel', 'head_labels', 'head_scores', 'load', 'plot_heads', 'save_figure', 'score_model',
 'summarize_heads']

    loaded = posym.load("smollm2-135m")                     # or a .gguf, an HF directory, a posym run
    frame = posym.score_model(loaded.model, [loaded.text_ids("Alice likes red. Bob likes")])
    heads = posym.summarize_heads(frame)                    # per head: s_pos, s_sym, label
    posym.save_figure(posym.plot_heads(heads, heads.s_pos.corr(heads.s_sym)), "heads")
"""

import os

# torch's OpenMP threads spin-wait by default, which makes the many small ops of a tiny model
# 5-20x slower on a 2-core machine; passive waiting must be chosen before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = [
    "load",
    "LoadedModel",
    "score_model",
    "head_scores",
    "summarize_heads",
    "head_labels",
    "plot_heads",
    "save_figure",
]


def __getattr__(name: str):
    """The entry points of __all__, imported on first use (torch and transformers load only then)."""
    if name in ("load", "LoadedModel"):
        from posym import models as module
    elif name in ("score_model", "head_scores", "summarize_heads", "head_labels"):
        from posym.core import scores as module
    elif name == "plot_heads":
        from posym import figures as module
    elif name == "save_figure":
        from posym import figures as module
    elif name == "__version__":  # pyproject.toml is its one source, read from the installed distribution's metadata
        from posym.io import package_version

        globals()[name] = package_version()
        return globals()[name]
    else:
        raise AttributeError(f"module 'posym' has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
