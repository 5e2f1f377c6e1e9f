"""`posym explore`: one self-contained, offline HTML page to browse every head's scores and why.

The page and the readers of the score tables it shows are `posym.explorer`'s (its docstring lists the
inputs it reads and how the page holds them); this command builds it and writes the file.
"""

from __future__ import annotations

from pathlib import Path

from posym import explorer, io


def explore(paths, out, **options) -> dict:
    """`posym explore`: write one self-contained HTML file `out` of the score tables at `paths`
    (`options`: those of `posym.explorer.page`: details, model, detail_prompts, top, device, title,
    max_mb); returns {"path", "bytes", and the page's counts: "limit", "sets", "heads", "prompts",
    "detail_prompts", "dropped", "stored"}."""
    text, counts = explorer.page(paths, **options)
    path = io.write_text(out, text)
    return {"path": str(path), "bytes": Path(path).stat().st_size, **counts}
