"""posym report: hand-made run/theory/bench directories -> one self-contained HTML page."""

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
import yaml
from cli_runner import run_posym

from posym.commands import report
from posym.errors import PosymError

RUN_STEMS = [
    ("analysis", s)
    for s in (
        "fig2a_accuracy",
        "fig2b_scores",
        "fig6_entropy",
        "fig7_purity",
        "fig7_roles",
        "fig4b_qk_plane",
        "fig8_frequency",
    )
] + [("lengthgen", "fig5b"), ("discrepancy", "fig_discrepancy")]


def _png(path: Path, seed: int) -> None:
    """A tiny distinct figure as PNG and SVG (matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [0, seed])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path.with_suffix(".png"))
    fig.savefig(path.with_suffix(".svg"))
    plt.close(fig)


def make_run(root: Path, task: str, *, analysed: bool = True) -> Path:
    run = root / task
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "preset": "quick",
                "task": {"task": task},
                "model": {"n_layer": 3, "n_embd": 64, "n_head": 1},
                "max_steps": 40,
            }
        )
    )
    (run / "manifest.json").write_text(
        json.dumps({"config_hash": f"hash-{task}", "seed": 7, "versions": {"posym": "0.1.0", "torch": "2.x"}})
    )
    pd.DataFrame(
        {
            "step": [0, 10, 20, 40],
            "acc": [0.0, 0.5, 0.9, 0.99],
            "acc_hop1": [0.0, 0.96, 1.0, 1.0],
            "acc_hop2": [0.0, 0.2, 0.95, 0.98],
        }
    ).to_parquet(run / "metrics.parquet")
    if analysed:
        rows = [
            {
                "gamma": g,
                "stage": st,
                "query_mode": q,
                "frac_positional": 1 / 3,
                "frac_symbolic": 2 / 3,
                "layers_positional": "L0" if (g, st, q) == (0.1, "end", "hops") else "L9",
                "layers_symbolic": "L1-L2",
            }
            for g in (0.1, 0.05)
            for st in ("max_acc", "end")
            for q in ("hops", "last")
        ]
        (run / "analysis").mkdir()
        pd.DataFrame(rows).to_parquet(run / "analysis" / "composition_summary.parquet")
        pd.DataFrame(
            {
                "layer": [0, 1, 2, 2],
                "head": [0, 0, 0, 1],
                "weighted_id": [1.0, 5.0, 10.0, 20.0],
                "weighted_id_linear": [1.0, 5.0, 10.0, 20.0],
                "weighted_id_floor": [1.0, 2.0, 3.0, 3.0],
                "planes": 32,
                "uniform_id": 16.5,
            }
        ).to_parquet(run / "analysis" / "frequency.parquet")
        if task == "number":  # posym geometry's reading of the Fig. 4B plane against T_Index
            alignment = {
                "key_concentration": 0.9998,
                "query_concentration": 0.43,
                "phase_error_deg": 10.65,
                "target_nearest": 8 / 9,
                "queries": 9,
            }
            (run / "analysis" / "geometry.json").write_text(
                json.dumps(
                    {
                        "plane_figure": {
                            "layer": 1,
                            "head": 0,
                            "frequency_id": 1,
                            "prompt": 0,
                            "index_alignment": alignment,
                        }
                    }
                )
            )
        (run / "lengthgen").mkdir()
        (run / "lengthgen" / "lengthgen.json").write_text(
            json.dumps(
                {
                    "summary": {
                        "task": task,
                        "paper": {"acc": {"17": 1.0}, "longest_length_acc_ge_0.9": 850},
                        "seed": {"acc": {}, "retention": {"1.0": 1.0, "4.0": 0.25, "2.0": 0.5}},
                    }
                }
            )
        )
        for k, (sub, stem) in enumerate(RUN_STEMS):
            _png(run / sub / stem, k)
    return run


def make_theory(root: Path) -> Path:
    theory = root / "theory"
    theory.mkdir()
    summary = [
        {
            "head": h,
            "n0": 8,
            "theta": 0.5,
            "exact": True,
            "softmax_exact": True,
            "delta_n0": 0.1,
            "bound_n0": 0.2,
            "beta_needed": 10.0,
            "beta_lemma": 20.0,
        }
        for h in ("index", "retrieval")
    ]
    tasks = {
        k: {"task": t, "s_pos": 1.0, "s_sym": 0.0, "softmax": {"after_h": 1.0}}
        for k, t in (("index", "number"), ("retrieval", "letter"))
    }
    (theory / "theory.json").write_text(json.dumps({"summary": summary, "tasks": tasks}))
    _png(theory / "fig5a", 99)
    return theory


def make_bench(root: Path) -> Path:
    bench = root / "bench"
    bench.mkdir()
    (bench / "table.md").write_text("| size | m number | m letter |\n| --- | --- | --- |\n| 12 | 0.50 ± 0.10 | 0.9 |\n")
    pd.DataFrame({"task": ["number"], "size": [12], "acc_mean": [0.5]}).to_parquet(bench / "summary.parquet")
    _png(bench / "bench", 7)
    return bench


class Resources(HTMLParser):
    """Every (tag, attribute, value) that loads or links something, the style text, and <script> tags."""

    def __init__(self):
        super().__init__()
        self.refs, self.styles, self.tags = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.refs += [(tag, k, v) for k, v in attrs if k in ("src", "href", "srcset", "data", "poster")]
        self.styles += [v for k, v in attrs if k == "style"]
        self._in_style = tag == "style"

    def handle_data(self, data):
        if getattr(self, "_in_style", False):
            self.styles.append(data)
            self._in_style = False


def check_offline(html: str) -> Resources:
    """Assert the page loads nothing from the network: only <a href> may point outside."""
    parsed = Resources()
    parsed.feed(html)
    assert not {"script", "link", "iframe", "object", "embed"} & set(parsed.tags)
    for tag, attr, value in parsed.refs:
        if tag == "a":
            continue
        assert not value.lower().startswith(("http:", "https:", "//")), (tag, attr, value)
    for style in parsed.styles:
        assert "url(" not in style and "@import" not in style and "@font-face" not in style
    return parsed


def test_check_offline_catches_remote_resources():
    for bad in [
        '<img src="https://x.org/a.png">',
        '<script src="a.js"></script>',
        '<link href="//cdn/x.css">',
        '<style>@import "https://x/y.css";</style>',
        '<div style="background:url(http://x)"></div>',
    ]:
        with pytest.raises(AssertionError):
            check_offline(bad)
    check_offline('<a href="https://arxiv.org/abs/2605.31558">paper</a><img src="data:image/png;base64,AA==">')


def test_full_report(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1800000000")
    runs = [make_run(tmp_path, "number"), make_run(tmp_path, "letter")]
    html_path = report.build_report([*runs, make_theory(tmp_path), make_bench(tmp_path)], tmp_path / "rep")
    html = html_path.read_text()
    parsed = check_offline(html)
    images = [v for tag, attr, v in parsed.refs if tag == "img"]
    assert len(images) == 2 * len(RUN_STEMS) + 2  # every run figure, Fig. 5A and the Table 3 figure
    sources = [run / sub / f"{stem}.png" for run in runs for sub, stem in RUN_STEMS]
    sources += [tmp_path / "theory" / "fig5a.png", tmp_path / "bench" / "bench.png"]
    for image, source in zip(images, sources):  # inline bytes are exactly the figure files, in order
        assert image.startswith("data:image/png;base64,")
        assert base64.b64decode(image.split(",", 1)[1]) == source.read_bytes()
    for run in runs:
        for _, stem in RUN_STEMS:
            for ext in ("png", "svg"):
                copied = tmp_path / "rep" / "figures" / f"{run.name}-{stem}.{ext}"
                assert copied.read_bytes() == (run / _ / f"{stem}.{ext}").read_bytes()
    for text in (
        "Fig. 2A",
        "Fig. 2B",
        "Fig. 4B",
        "Fig. 5A",
        "Fig. 5B",
        "Fig. 6",
        "Fig. 7",
        "Fig. 8",
        "Table 1",
        "Table 3",
        "Paper:",
        "L4-L11",
        "850 tokens",
        "0.50 ± 0.10",
    ):
        assert text in html, text
    assert "first step with &gt;= 95% per hop: 1 hop 10, 2 hops 20" in html
    assert "positional L0, symbolic L1-L2" in html  # gamma 0.1, end, hop queries only
    assert "key concentration 1.000 (1 = one direction)" in html and html.count("key concentration") == 1
    assert "within 10.7 degrees (median), the nearest key in angle for 89% of 9 queries" in html
    assert "acc &gt;= 0.9 up to 850 tokens; 4x retention 0.25" in html  # the largest factor, not the last key
    # heads of a layer averaged, one column per weighting; 64 / 1 head = 32 planes; both scales and the
    # uniform baseline
    assert (
        "<th>number (ours, linear)</th><th>number (ours, floor)</th><th>letter (ours, linear)</th>"
        "<th>letter (ours, floor)</th><th>number (paper)</th><th>letter (paper)</th>"
    ) in html
    assert ('<td class="text">planes</td>' + '<td class="num">32</td>' * 4 + '<td class="num">64</td>') in html
    assert (
        '<td class="text">uniform (planes + 1) / 2</td>'
        + '<td class="num">16.5 (0.52)</td>' * 4
        + '<td class="num">32.5 (0.51)</td>'
    ) in html
    assert (
        '<td class="text">L2</td>'
        + '<td class="num">15 (0.47)</td><td class="num">3 (0.09)</td>' * 2
        + '<td class="num">2 (0.03)</td>'
    ) in html
    anchors = re.findall(r'<a href="#([^"]+)">', html)  # the contents list: every anchor has its target
    assert len(anchors) >= 6 and all(f'id="{a}"' in html for a in anchors)
    assert "config hash hash-number, seed 7" in html and "2027-01-15 08:00 UTC" in html  # provenance
    for word in ("seed summary", "SPEC", "step-0"):
        assert word not in html
    assert 'class="absent"' not in html
    # the same inputs give the same bytes (headless, deterministic)
    assert report.build_report([*runs, tmp_path / "theory", tmp_path / "bench"], tmp_path / "rep2").read_text() == html


def test_absent_parts_are_named(tmp_path):
    html = report.build_report([make_run(tmp_path, "letter", analysed=False)], tmp_path / "rep").read_text()
    check_offline(html)
    assert "Fig. 2A (letter): absent; run posym dynamics RUN_DIR and posym geometry RUN_DIR first" in html
    assert "Fig. 5B (letter): absent; run posym lengthgen RUN_DIR first" in html
    assert "Theorem 3.2 on trained heads (letter)" not in html  # an optional extra is not named when absent
    assert "Fig. 5A and the constructions: absent" in html
    assert "Table 3 (real models): absent; no llm-bench result was given" in html
    assert "<img" not in html


def test_first_pure_steps_matches_loop():
    metrics = pd.DataFrame(
        {
            "step": [0, 5, 9, 12],
            "acc_hop1": [0.1, 0.95, 0.2, 1.0],
            "acc_hop2": [0.0, 0.1, 0.94, 0.951],
            "acc_hop3": [0.0, 0.0, 0.0, 0.0],
        }
    )
    expected = {}
    for h in (1, 2, 3):
        expected[h] = next((s for s, a in zip(metrics.step, metrics[f"acc_hop{h}"]) if a >= 0.95), None)
    assert report.first_pure_steps(metrics) == expected == {1: 5, 2: 12, 3: None}


def test_bad_inputs(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PosymError, match="not a posym run, theory or llm-bench directory"):
        report.build_report([tmp_path / "empty"], tmp_path / "rep")
    with pytest.raises(PosymError, match="at least one"):
        report.build_report([], tmp_path / "rep")
    assert run_posym(monkeypatch, "report", tmp_path / "missing") == 2
    err = capsys.readouterr().err
    assert err.startswith("posym: error: ") and "is not a directory" in err


def test_cli_report_default_out(tmp_path, monkeypatch, capsys):
    run = make_run(tmp_path, "number")
    assert run_posym(monkeypatch, "report", run, make_theory(tmp_path)) == 0
    assert f"report: {tmp_path / 'report' / 'report.html'}" in capsys.readouterr().out


@pytest.mark.slow
def test_screenshots_at_desktop_and_narrow_width(tmp_path):
    """scripts/screenshot_report.py renders the page in headless Chromium at 1400 and 800 px (~15 s)."""
    import importlib.util

    from PIL import Image

    spec = importlib.util.spec_from_file_location(
        "screenshot_report", Path(__file__).parents[1] / "scripts" / "screenshot_report.py"
    )
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    if shots.browser() is None:
        pytest.skip("no chromium installed (apt-get install -y chromium)")
    runs = [make_run(tmp_path, "number"), make_run(tmp_path, "letter")]
    html = report.build_report([*runs, make_theory(tmp_path), make_bench(tmp_path)], tmp_path / "rep")
    paths = shots.screenshots(html, tmp_path / "shots")
    for width in (1400, 800):
        mine = [p for p in paths if p.name.startswith(f"{width}-")]
        assert mine and all(Image.open(p).width == width for p in mine)
        assert sum(Image.open(p).height for p in mine) > 1500  # the whole page, not one screen
