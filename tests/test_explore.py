"""posym.commands.explore (`posym explore`): the embedded data against the tables, the degraded page
without a model, and the page itself in a headless Chromium (tests/browser.py): a click on a head
shows the tables' numbers, keyboard navigation and permalinks work, and no request leaves the page."""

from __future__ import annotations

import base64
import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from browser import CHROMIUM, SKIP_REASON, Chromium, page_data
from cli_runner import run_posym
from tiny_llms import run_cli, save_model, tokenizer

from posym.commands import explore
from posym.core.scores import head_details, head_scores, prompt_scores
from posym.errors import PosymError
from posym.models import load


def unpack(text: str, step: float) -> np.ndarray:
    codes = np.frombuffer(base64.b64decode(text), dtype="<i2")
    return np.where(codes == explore.MISSING, np.nan, codes * step)


@pytest.fixture(scope="module")
def scores_dir(tmp_path_factory):
    """A tiny Llama with a word-level tokenizer, scored by `posym llm-scores` on 3 binding prompts,
    with the sink left out too and per-plane scores of two heads."""
    root = tmp_path_factory.mktemp("explore")
    model = save_model(root / "llama", "llama", tokenizer())
    out = root / "scores"
    mp = pytest.MonkeyPatch()
    code = run_posym(
        mp, "llm-scores", model, "--n", 3, "--exclude-keys", "0", "--heads", "0.1,1.0", "--device", "cpu", "--out", out
    )
    mp.undo()
    assert code == 0
    return out


@pytest.fixture(scope="module")
def page(scores_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("page") / "explorer.html"
    result = explore.explore([scores_dir], path, detail_prompts=2, top=3, device="cpu")
    return path, result


def test_pack_round_trips_and_refuses_what_does_not_fit():
    values = [0.12346, -1.0, float("nan"), 3.2767]
    back = unpack(explore.pack(values, 1e-4), 1e-4)
    assert np.allclose(back[[0, 1, 3]], [0.1235, -1.0, 3.2767], atol=1e-12) and np.isnan(back[2])
    with pytest.raises(PosymError, match="int16"):
        explore.pack([3.3], 1e-4)


def test_rows_with_fewer_swaps_are_padded_and_nan_is_null():
    details = pd.DataFrame(
        [
            {
                "layer": 0,
                "head": h,
                "first": 0,
                "attention": [0.5, 0.25, 0.25],
                "s_pos": 1.0,
                "s_sym": 0.0,
                "a": [0] * n,
                "b": [1] * n,
                **{
                    c: [0.5] * n for c in ("weight", "before_a", "before_b", "after_a", "after_b", "cos_pos", "cos_sym")
                },
            }
            for h, n in ((0, 2), (1, 1))
        ]
    )
    s = explore.HeadSet(
        "toy",
        1,
        2,
        {"s_pos": {(0, 0): 1.0, (0, 1): float("nan")}, "label": {(0, 0): "positional"}},
        prompts=[{"text": "a b c", "ids": [1, 2, 3], "query": 2}],
        details={0: details},
        planes={(0, 1): [[1, explore._num(float("nan")), 0.5, 1.0]]},
    )
    data = json.loads(
        explore.render(explore.encode([s], title="t", sources=[]))
        .split('type="application/json">')[1]
        .split("</script>")[0]
    )
    entry = data["sets"][0]["prompts"][0]
    assert entry["top"] == 2 and entry["keys"] == [0, 1, 0, 1, 0, 1, -1, -1]
    swaps = unpack(entry["swaps"], explore.FINE).reshape(2, 2, 7)
    assert np.isnan(swaps[1, 1]).all() and not np.isnan(swaps[:, 0]).any()
    assert data["sets"][0]["planes"]["0.1"] == [[1, None, 0.5, 1.0]] and data["sets"][0]["labels"] == ["positional", ""]
    assert np.isnan(unpack(data["sets"][0]["maps"]["s_pos"], 1e-4)[1])


def test_the_page_embeds_the_tables_and_the_models_details(scores_dir, page):
    path, result = page
    assert result["bytes"] == path.stat().st_size and result["heads"] == 8 and result["sets"] == 1
    data = page_data(path)
    s = data["sets"][0]
    heads = pd.read_parquet(scores_dir / "heads.parquet").sort_values(["layer", "head"])
    free = head_scores(pd.read_parquet(scores_dir / "scores_excluded.parquet")).sort_values(["layer", "head"])
    for metric, frame, column in [
        ("s_pos", heads, "s_pos"),
        ("s_sym", heads, "s_sym"),
        ("entropy", heads, "entropy"),
        ("sink", heads, "attn_first"),
        ("s_pos_sf", free, "s_pos"),
        ("s_sym_sf", free, "s_sym"),
    ]:
        got = unpack(s["maps"][metric], explore.STEPS[metric])
        assert np.abs(got - frame[column].to_numpy()).max() <= explore.STEPS[metric] / 2 + 1e-12, metric
    assert s["labels"] == heads.label.tolist()
    assert set(s["planes"]) == {"0.1", "1.0"} and len(s["planes"]["0.1"]) == 4  # head_dim 8: four planes
    per_prompt = prompt_scores(pd.read_parquet(scores_dir / "scores.parquet")).sort_values(["prompt", "layer", "head"])
    prompts = pd.read_parquet(scores_dir / "prompts.parquet")
    loaded = load(scores_dir.parent / "llama")
    fresh = head_details(
        loaded.model, [list(i) for i in prompts.input_ids[:2]], [[int(q)] for q in prompts["query"][:2]], top=3
    )
    for k, entry in enumerate(s["prompts"]):
        rows = per_prompt[per_prompt.prompt == k]
        assert np.abs(unpack(entry["s_pos"], explore.FINE) - rows.s_pos.to_numpy()).max() <= 5e-5 + 1e-12
        assert entry["query"] == int(prompts["query"][k])
        if k >= 2:  # detail_prompts=2: the third prompt has scores but no attention rows
            assert "attention" not in entry
            continue
        assert entry["tokens"] == [
            loaded.tokenizer.decode([int(i)]) for i in prompts.input_ids[k][: entry["query"] + 1]
        ]
        mine = fresh[fresh.prompt == k]
        attention = unpack(entry["attention"], explore.FINE)
        assert len(attention) == 8 * (entry["query"] + 1)
        assert np.abs(attention - np.concatenate(mine.attention.to_list())).max() <= 5e-5 + 1e-12
        assert entry["keys"] == [x for a, b in zip(mine.a, mine.b) for pair in zip(a, b) for x in pair]
        weights = unpack(entry["swaps"], explore.FINE).reshape(8, 3, 7)[:, :, 0]
        assert np.abs(weights - np.array(mine.weight.to_list())).max() <= 5e-5 + 1e-12
    assert s["note"] == ""


def test_without_the_model_the_page_says_so(scores_dir, tmp_path):
    path = tmp_path / "tables.html"
    explore.explore([scores_dir], path, details=False)
    s = page_data(path)["sets"][0]
    assert "--no-details" in s["note"] and all("attention" not in p for p in s["prompts"])
    moved = tmp_path / "moved"
    shutil.copytree(scores_dir, moved)
    summary = json.loads((moved / "summary.json").read_text())
    summary["settings"]["model_dir"] = str(tmp_path / "gone")
    (moved / "summary.json").write_text(json.dumps(summary))
    explore.explore([moved], tmp_path / "gone.html")
    assert "could not be loaded" in page_data(tmp_path / "gone.html")["sets"][0]["note"]


def test_bad_inputs_are_one_line_errors(tmp_path, capsys, monkeypatch):
    with pytest.raises(PosymError, match="not a directory"):
        explore.explore([tmp_path / "nothing"], tmp_path / "x.html")
    with pytest.raises(PosymError, match="holds no score tables"):
        explore.explore([tmp_path], tmp_path / "x.html")
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(["explore", tmp_path / "empty", "--out", tmp_path / "x.html"], capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and "no score tables" in err
    code, _, err = run_cli(["explore", tmp_path, "--out", tmp_path / "x.html"], capsys, monkeypatch)
    assert code == 2 and "would overwrite part of an input" in err


def test_cli_reports_the_file_size(scores_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "e.html"
    code, stdout, err = run_cli(["explore", scores_dir, "--no-details", "--out", out], capsys, monkeypatch)
    assert code == 0, err
    assert f"({out.stat().st_size / 1e6:.2f} MB; 1 head sets, 8 heads)" in stdout


# ---- the page in a browser ----------------------------------------------------------------------


def _luminance(rgb: str) -> float:
    r, g, b = (int(x) / 255 for x in re.findall(r"\d+", rgb)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_page_in_chromium(scores_dir, page, tmp_path):
    path, _ = page
    heads = pd.read_parquet(scores_dir / "heads.parquet").set_index(["layer", "head"])
    per_prompt = prompt_scores(pd.read_parquet(scores_dir / "scores.parquet")).set_index(["prompt", "layer", "head"])
    data = page_data(path)["sets"][0]
    with Chromium() as browser:
        browser.open(path, width=1400)
        assert browser.evaluate("document.querySelectorAll('#map [data-head]').length") == 8
        browser.click('[data-head="1.0"]')
        assert browser.evaluate("document.getElementById('headtitle').textContent") == "Layer 1, head 0"
        assert browser.evaluate("location.hash") == "#set=0&map=s_pos&head=1.0&prompt=0"
        shown = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#summary [data-field]')]"
            ".map(e => [e.dataset.field, e.textContent]))"
        )
        for field, column in [("s_pos", "s_pos"), ("s_sym", "s_sym"), ("entropy", "entropy"), ("sink", "attn_first")]:
            assert abs(float(shown[field]) - heads.loc[(1, 0), column]) <= 5.5e-4, field  # 3 decimals of the 1e-4 code
        assert shown["label"] == heads.loc[(1, 0), "label"]
        rows = browser.evaluate(
            "[...document.querySelectorAll('#promptscores tr[data-prompt]')].map(r => "
            "[...r.querySelectorAll('[data-field]')].map(e => +e.textContent))"
        )
        assert len(rows) == 3
        for k, (s_pos, s_sym) in enumerate(rows):
            assert abs(s_pos - per_prompt.loc[(k, 1, 0), "s_pos"]) <= 5.5e-4
            assert abs(s_sym - per_prompt.loc[(k, 1, 0), "s_sym"]) <= 5.5e-4
        # prompt 0 is shown: its attention row over the tokens, the query last, and the heaviest swaps
        query = data["prompts"][0]["query"]
        tokens = browser.evaluate(
            "[...document.querySelectorAll('#attention .tok')].map(t => "
            "[+t.dataset.pos, +t.dataset.attn, t.querySelector('.t').textContent])"
        )
        row = unpack(data["prompts"][0]["attention"], explore.FINE)[
            4 * (query + 1) : 5 * (query + 1)
        ]  # head 1.0 is the fifth of 2 x 4
        assert [t[0] for t in tokens] == list(range(query + 1))
        assert [t[2] for t in tokens] == data["prompts"][0]["tokens"]
        assert np.abs(np.array([t[1] for t in tokens]) - row).max() <= 5.5e-5
        assert browser.evaluate("document.querySelectorAll('#swaps tr').length") == 1 + 3
        assert browser.evaluate("document.querySelectorAll('#planes tr').length") == 1 + 4
        # keyboard: the opened head has focus on the map after Escape; arrows move; Enter opens
        browser.key("Escape", key_code=27)
        assert browser.evaluate("document.activeElement.dataset.head") == "1.0"
        browser.key("ArrowDown", key_code=40)
        browser.key("ArrowRight", key_code=39)
        assert browser.evaluate("document.activeElement.dataset.head") == "0.1"
        browser.key("Enter", key_code=13)
        assert browser.evaluate("document.getElementById('headtitle').textContent") == "Layer 0, head 1"
        # filters fade heads; the label map carries letters; a permalink restores head, map and prompt
        browser.evaluate(
            "(() => { const e = document.getElementById('tpos'); e.value = '2'; "
            "e.dispatchEvent(new Event('input')); })()"
        )
        assert browser.evaluate("document.querySelectorAll('#map .cell.out').length") == 8
        browser.open(path, width=800, fragment="#set=0&map=label&head=0.1&prompt=1")
        assert browser.evaluate("document.getElementById('headtitle').textContent") == "Layer 0, head 1"
        assert browser.evaluate("document.getElementById('prompt').value") == "1"
        assert set(browser.evaluate("[...document.querySelectorAll('#map .cell')].map(c => c.textContent)")) <= set(
            "PSMU"
        )
        assert browser.evaluate("document.documentElement.scrollWidth") <= 800  # nothing wider than the window
        browser.screenshot(tmp_path / "800.png")
        browser.open(path, width=1400, fragment="#head=0.1")
        side_by_side = browser.evaluate(
            "document.getElementById('headpage').getBoundingClientRect().left >= "
            "document.getElementById('mapbox').getBoundingClientRect().right"
        )
        assert side_by_side
        # greyscale: the sequential ramp's lightness rises monotonically, label colours differ in lightness
        ramp = [_luminance(c) for c in browser.evaluate("[...Array(21).keys()].map(k => ramp(k / 20))")]
        assert all(b > a for a, b in zip(ramp, ramp[1:]))
        labels = sorted(
            _luminance(
                browser.evaluate(
                    f"(() => {{ const d = document.createElement('div'); "
                    f"d.style.background = LABEL_STYLE['{lab}'][0]; document.body.append(d); "
                    f"return getComputedStyle(d).backgroundColor; }})()"
                )
            )
            for lab in ("positional", "symbolic", "mixed", "uniform")
        )
        assert min(b - a for a, b in zip(labels, labels[1:])) > 0.1
        assert browser.console_errors == []
        assert browser.requests == [path.resolve().as_uri()] * 3  # the file itself, once per open; nothing else
