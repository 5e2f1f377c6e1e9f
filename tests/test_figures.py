"""posym.figures: plot functions return a Figure and write nothing, `save_figure` writes PNG + SVG,
and neither importing posym nor drawing touches the user's matplotlib backend or pyplot."""

import os
import subprocess
import sys
import textwrap

import pandas as pd

from posym import figures

STEPS = [0, 10, 20]


def _dynamics_table():
    rows = [
        {
            "step": s,
            "query_mode": mode,
            "layer": layer,
            "head": 0,
            "s_pos": 0.5,
            "s_sym": 0.5,
            "entropy_norm": 0.5,
            "acc": 0.1 * k,
            "acc_hop1": 0.2 * k,
        }
        for k, s in enumerate(STEPS)
        for mode in ("hops", "last")
        for layer in (0, 1)
    ]
    return pd.DataFrame(rows)


def test_plot_functions_return_a_figure_and_save_figure_writes_png_and_svg(tmp_path):
    from matplotlib.figure import Figure

    fig = figures.plot_accuracy(_dynamics_table(), 20)
    assert isinstance(fig, Figure) and fig.axes
    assert list(tmp_path.iterdir()) == []  # drawing wrote nothing
    paths = figures.save_figure(fig, tmp_path / "accuracy")
    assert [p.name for p in paths] == ["accuracy.png", "accuracy.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in paths[1].read_bytes()[:400]


def _viewbox(svg: bytes) -> list[float]:
    import re

    return [float(v) for v in re.search(rb'viewBox="([^"]+)"', svg).group(1).split()]


def test_save_figure_crops_as_savefig_tight_does(tmp_path):
    """One tight box for both files: the PNG is byte-identical to savefig's own bbox_inches="tight"; the
    SVG's box (measured with the PNG's text metrics) within half the 0.1-inch pad (3.6 pt) of the one its
    own renderer measures, so the pad absorbs the difference and nothing is cut; the figure's canvas and
    dpi are kept. A legend outside the axes and a suptitle are what the box must reach."""
    import io

    fig = figures.plot_accuracy(_dynamics_table(), 20)
    ax = fig.axes[0]
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("a title above the axes")
    fig.tight_layout()
    canvas, dpi = fig.canvas, fig.dpi
    png, svg = figures.save_figure(fig, tmp_path / "f")
    assert fig.canvas is canvas and fig.dpi == dpi
    theirs = {}
    for fmt in ("png", "svg"):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, dpi=120, bbox_inches="tight")
        theirs[fmt] = buffer.getvalue()
    assert png.read_bytes() == theirs["png"]
    ours, tight = _viewbox(svg.read_bytes()), _viewbox(theirs["svg"])
    assert max(abs(a - b) for a, b in zip(ours, tight)) <= 3.6, (ours, tight)  # 1.7 pt wider here


def test_importing_posym_and_drawing_leave_the_backend_and_pyplot_alone(tmp_path):
    # In a fresh interpreter with a non-default backend: the old pyplot() helper switched it to Agg.
    script = textwrap.dedent(f"""
        import importlib, pkgutil, sys
        import matplotlib
        import posym
        for module in pkgutil.walk_packages(posym.__path__, "posym."):
            if not module.name.endswith("__main__"):  # those run the command line
                importlib.import_module(module.name)
        sys.path.insert(0, {str(__file__.rsplit("/", 1)[0])!r})
        from test_figures import _dynamics_table
        from posym import figures
        from posym.commands import theory
        figures.save_figure(figures.plot_layer_scores(_dynamics_table(), 10, title="t"), {str(tmp_path / "scores")!r})
        theory.plot_discrepancy([{{"head": "index", "theta": 0.5, "n": n, "delta": 1 / n, "bound": 2 / n, "valid": True}}
                                for n in (4, 8)])
        print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "svg"}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["svg", "False"]
    assert (tmp_path / "scores.png").is_file()
