"""posym.commands.explore (`posym explore`) and the readers of posym.explorer behind it: the embedded data
against the tables, the details that llm-scores stores against a fresh recomputation, the degraded page
without a model, and the page itself in a headless Chromium (tests/browser.py): a click on a head shows
the tables' numbers, a chosen query of a `posym score --queries all` table shows its own, keyboard
navigation and permalinks work, and no request leaves the page (the encoding, the pages of prompts and
the size limit: tests/test_explorer.py)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from browser import CHROMIUM, SKIP_REASON, Chromium, page_data
from cli_runner import run_posym
from explorer_pages import READY, embedded, unpack
from tiny_llms import run_cli, save_model, tokenizer

from posym import explorer
from posym.commands import explore
from posym.core.scores import head_details, head_scores, prompt_scores
from posym.errors import PosymError
from posym.runs import output_file
from posym.models import load


@pytest.fixture(scope="module")
def scores_dir(tmp_path_factory):
    """A tiny Llama with a word-level tokenizer, scored by `posym llm-scores` on 3 binding prompts,
    with the sink left out too, per-plane scores of two heads and the details of 2 prompts stored."""
    root = tmp_path_factory.mktemp("explore")
    model = save_model(root / "llama", "llama", tokenizer())
    out = root / "scores"
    mp = pytest.MonkeyPatch()
    code = run_posym(
        mp,
        "llm-scores",
        model,
        "--n",
        3,
        "--exclude-keys",
        "0",
        "--heads",
        "0.1,1.0",
        "--details",
        2,
        "--device",
        "cpu",
        "--out",
        out,
    )
    mp.undo()
    assert code == 0
    return out


@pytest.fixture(scope="module")
def page(scores_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("page") / "explorer.html"
    result = explore.explore([scores_dir], path, detail_prompts=2, top=3, device="cpu")
    return path, result


def test_the_page_embeds_the_tables_and_the_stored_details(scores_dir, page):
    path, result = page
    assert result["bytes"] == path.stat().st_size and result["heads"] == 8 and result["sets"] == 1
    assert result["stored"] == 1 and result["detail_prompts"] == 2 and result["dropped"] == 0
    s, prompts, details = embedded(path)
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
        got = unpack(s["maps"][metric], explorer.STEPS[metric])
        assert np.abs(got - frame[column].to_numpy()).max() <= explorer.STEPS[metric] / 2 + 1e-12, metric
    assert s["labels"] == heads.label.tolist()
    assert set(s["planes"]) == {"0.1", "1.0"} and len(s["planes"]["0.1"]) == 4  # head_dim 8: four planes
    per_prompt = prompt_scores(pd.read_parquet(scores_dir / "scores.parquet")).sort_values(["prompt", "layer", "head"])
    table = pd.read_parquet(scores_dir / "prompts.parquet")
    loaded = load(scores_dir.parent / "llama")
    # the stored rows are what a fresh pass gives (llm-scores wrote them with the same model and prompts)
    fresh = head_details(
        loaded.model, [list(i) for i in table.input_ids[:2]], [[int(q)] for q in table["query"][:2]], top=3
    )
    assert set(details) == {0, 1}
    for k, entry in enumerate(prompts):
        rows = per_prompt[per_prompt.prompt == k]
        assert np.abs(unpack(entry["s_pos"], explorer.FINE) - rows.s_pos.to_numpy()).max() <= 5e-5 + 1e-12
        assert entry["queries"] == [int(table["query"][k])]
        assert entry["tokens"] == [
            loaded.tokenizer.decode([int(i)]) for i in table.input_ids[k][: entry["queries"][0] + 1]
        ]
        if k >= 2:  # --details 2: the third prompt has scores but no attention rows
            continue
        mine, (at,) = fresh[fresh.prompt == k], details[k]["queries"]
        attention = unpack(at["attention"], explorer.FINE)
        assert at["query"] == entry["queries"][0] and len(attention) == 8 * (at["query"] + 1)
        assert np.abs(attention - np.concatenate(mine.attention.to_list())).max() <= 5e-5 + 1e-12
        assert at["keys"] == [x for a, b in zip(mine.a, mine.b) for pair in zip(a, b) for x in pair]
        weights = unpack(at["swaps"], explorer.FINE).reshape(8, 3, 7)[:, :, 0]  # the 8 stored swaps cut to --top 3
        assert np.abs(weights - np.array(mine.weight.to_list())).max() <= 5e-5 + 1e-12
    assert s["note"] == ""


def test_stored_details_match_a_recomputation_and_no_details_keeps_them(scores_dir, page, tmp_path):
    path, _ = page
    _, _, stored = embedded(path)
    again = tmp_path / "again.html"
    result = explore.explore(
        [scores_dir], again, detail_prompts=2, top=3, model=str(scores_dir.parent / "llama")
    )  # --model: the stored rows are set aside and recomputed
    assert result["stored"] == 0 and result["detail_prompts"] == 2
    assert embedded(again)[2] == stored
    tables = tmp_path / "tables.html"
    assert explore.explore([scores_dir], tables, details=False, top=3)["detail_prompts"] == 2  # loads no model
    assert embedded(tables)[2] == stored
    # 3 prompts asked for, 2 stored: recomputed when the model may be loaded, else the 2 stored shown
    more = explore.explore([scores_dir], tmp_path / "more.html", detail_prompts=3, top=3)
    assert more["stored"] == 0 and more["detail_prompts"] == 3
    assert {k: v for k, v in embedded(tmp_path / "more.html")[2].items() if k < 2} == stored
    assert explore.explore([scores_dir], tmp_path / "two.html", details=False, top=3)["detail_prompts"] == 2


def test_without_the_model_the_page_says_so(scores_dir, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(scores_dir, moved)
    output_file(moved, "llm-scores", "details").unlink()
    explore.explore([moved], tmp_path / "tables.html", details=False)
    s, prompts, details = embedded(tmp_path / "tables.html")
    assert "--no-details" in s["note"] and details == {} and len(prompts) == 3
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
    assert (
        f"({out.stat().st_size / 1e6:.2f} MB of at most {explorer.MAX_MB:g} MB; 1 head sets, 8 heads, 3 prompts, "
        "attention rows of 2)" in stdout
    )
    code, _, err = run_cli(["explore", scores_dir, "--max-mb", "0.001", "--out", out], capsys, monkeypatch)
    assert code == 2 and "over the explorer's limit of 0.001 MB (--max-mb)" in err
    code, stdout, err = run_cli(["explore", "--help"], capsys, monkeypatch)
    assert f"default {explorer.MAX_MB:g}" in " ".join(stdout.split())  # the help names the constant's value


# ---- the page in a browser ----------------------------------------------------------------------


def _luminance(rgb: str) -> float:
    r, g, b = (int(x) / 255 for x in re.findall(r"\d+", rgb)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_page_in_chromium(scores_dir, page, tmp_path):
    path, _ = page
    heads = pd.read_parquet(scores_dir / "heads.parquet").set_index(["layer", "head"])
    per_prompt = prompt_scores(pd.read_parquet(scores_dir / "scores.parquet")).set_index(["prompt", "layer", "head"])
    _, prompts, details = embedded(path)
    with Chromium() as browser:
        browser.open(path, width=1400)
        assert browser.evaluate("document.querySelectorAll('#map [data-head]').length") == 8
        browser.click('[data-head="1.0"]')
        browser.evaluate(READY)
        assert browser.evaluate("document.getElementById('headtitle').textContent") == "Layer 1, head 0"
        assert browser.evaluate("location.hash") == "#set=0&map=s_pos&head=1.0&prompt=0&query=0"
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
        (query,) = prompts[0]["queries"]
        tokens = browser.evaluate(
            "[...document.querySelectorAll('#attention .tok')].map(t => "
            "[+t.dataset.pos, +t.dataset.attn, t.querySelector('.t').textContent])"
        )
        row = unpack(details[0]["queries"][0]["attention"], explorer.FINE)[
            4 * (query + 1) : 5 * (query + 1)
        ]  # head 1.0 is the fifth of 2 x 4
        assert [t[0] for t in tokens] == list(range(query + 1))
        assert [t[2] for t in tokens] == prompts[0]["tokens"]
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
        browser.evaluate(READY)
        assert browser.evaluate("document.getElementById('headtitle').textContent") == "Layer 0, head 1"
        # filters fade heads; the label map carries letters; a permalink restores head, map and prompt
        browser.evaluate(
            "(() => { const e = document.getElementById('tpos'); e.value = '2'; "
            "e.dispatchEvent(new Event('input')); })()"
        )
        assert browser.evaluate("document.querySelectorAll('#map .cell.out').length") == 8
        browser.open(path, width=800, fragment="#set=0&map=label&head=0.1&prompt=1")
        browser.evaluate(READY)
        assert browser.evaluate("document.getElementById('headtitle').textContent") == "Layer 0, head 1"
        assert browser.evaluate("document.getElementById('prompt').value") == "1"
        assert set(browser.evaluate("[...document.querySelectorAll('#map .cell')].map(c => c.textContent)")) <= set(
            "PSMU"
        )
        assert browser.evaluate("document.documentElement.scrollWidth") <= 800  # nothing wider than the window
        browser.screenshot(tmp_path / "800.png")
        browser.open(path, width=1400, fragment="#head=0.1")
        browser.evaluate(READY)
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


# ---- several queries per prompt: a `posym score --queries all` table -----------------------------


@pytest.fixture(scope="module")
def all_queries(scores_dir, tmp_path_factory):
    """`posym score --queries all` of the tiny Llama on 3 prompt files lines (ids from its tokenizer)
    and its explorer (rows of 2 prompts at every query, 3 swaps)."""
    root = tmp_path_factory.mktemp("queries")
    model = scores_dir.parent / "llama"
    ids = pd.read_parquet(scores_dir / "prompts.parquet").input_ids
    (root / "p.jsonl").write_text("".join(json.dumps({"input_ids": [int(i) for i in x[:12]]}) + "\n" for x in ids))
    mp = pytest.MonkeyPatch()
    code = run_posym(
        mp,
        "score",
        model,
        "--prompts",
        root / "p.jsonl",
        "--queries",
        "all",
        "--device",
        "cpu",
        "--out",
        root / "q.parquet",
    )
    mp.undo()
    assert code == 0
    path = root / "explorer.html"
    explore.explore([root / "q.parquet"], path, detail_prompts=2, top=3)
    return root / "q.parquet", path, [[int(i) for i in x[:12]] for x in ids], model


def test_every_query_of_a_score_table_is_embedded(all_queries):
    table_path, path, ids, model = all_queries
    table = pd.read_parquet(table_path)
    s, prompts, details = embedded(path)
    assert s["n_prompts"] == 3 and set(details) == {0, 1}
    for k, p in enumerate(prompts):
        queries = sorted(table[table.prompt == k]["query"].unique().tolist())
        assert p["queries"] == queries and len(queries) > 5
        rows = table[table.prompt == k].sort_values(["query", "layer", "head"])
        assert np.abs(unpack(p["q_s_pos"], explorer.FINE) - rows.s_pos.to_numpy()).max() <= 5e-5 + 1e-12
        if k in details:
            assert [d["query"] for d in details[k]["queries"]] == queries


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_chosen_query_in_chromium(all_queries):
    table_path, path, ids, model = all_queries
    table = pd.read_parquet(table_path).set_index(["prompt", "query", "layer", "head"])
    _, prompts, _ = embedded(path)
    queries = prompts[1]["queries"]
    j, position = 3, queries[3]
    fresh = head_details(load(model).model, [ids[1]], [[position]], top=3)
    fresh = fresh[(fresh.layer == 1) & (fresh["head"] == 2)].iloc[0]
    with Chromium() as browser:
        browser.open(path, width=1400)
        browser.click('[data-head="1.2"]')
        browser.evaluate(READY)
        assert browser.evaluate("document.getElementById('query').options.length") == len(prompts[0]["queries"])
        for select, value in (("prompt", 1), ("query", j)):
            browser.evaluate(
                f"(() => {{ const e = document.getElementById('{select}'); e.value = '{value}'; "
                "e.dispatchEvent(new Event('change')); })()"
            )
            browser.evaluate(READY)
        assert browser.evaluate("location.hash") == f"#set=0&map=s_pos&head=1.2&prompt=1&query={j}"
        shown = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#queryscores tr[data-row]')].map(r => "
            "[r.dataset.row, [...r.querySelectorAll('[data-field]')].map(e => +e.textContent)]))"
        )
        expected = table.loc[(1, position, 1, 2)]
        assert np.abs(np.array(shown["table"]) - [expected.s_pos, expected.s_sym]).max() <= 5.5e-4
        assert np.abs(np.array(shown["dense"]) - [fresh.s_pos, fresh.s_sym]).max() <= 5.5e-4
        attention = browser.evaluate(
            "[...document.querySelectorAll('#attention .tok')].map(t => [+t.dataset.pos, +t.dataset.attn])"
        )
        assert [a[0] for a in attention] == list(range(fresh["first"], position + 1))
        assert np.abs(np.array([a[1] for a in attention]) - np.array(fresh.attention)).max() <= 5.5e-5
        keys = browser.evaluate("[...document.querySelectorAll('#swaps [data-field=keys]')].map(e => e.textContent)")
        assert keys == [f"{a}, {b}" for a, b in zip(fresh.a, fresh.b)]
        browser.open(path, width=800, fragment=f"#head=1.2&prompt=1&query={j}")  # the permalink
        browser.evaluate(READY)
        assert browser.evaluate("document.getElementById('query').value") == str(j)
        assert browser.evaluate("document.documentElement.scrollWidth") <= 800
        assert browser.console_errors == [] and browser.requests == [path.resolve().as_uri()] * 2


HOSTILE = "__DATA__ __BLOCKS__ __TITLE__<img src=x onerror=window.pwned=1><script>window.pwned=2</script><!--"
"""A name an adversary chooses: every placeholder of the template, a tag with a handler, a script and an
open comment (issue 55: the template filled by successive replaces pulled the raw data into the heading)."""


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_a_hostile_directory_name_or_title_runs_no_script(scores_dir, tmp_path):
    source = tmp_path / HOSTILE.replace("/", "_")
    shutil.copytree(scores_dir, source)
    path = tmp_path / "explorer.html"
    explore.explore([source], path, details=False, title=HOSTILE)
    text = path.read_text(encoding="utf-8")
    assert "<img" not in text and "<script>window" not in text and "<!--" not in text
    assert page_data(path)["title"] == HOSTILE and HOSTILE.replace("/", "_") in json.dumps(page_data(path))
    with Chromium() as browser:
        browser.open(path, width=1200)
        assert browser.evaluate("document.querySelectorAll('#map [data-head]').length") == 8  # the page works
        assert browser.evaluate("typeof window.pwned") == "undefined"
        assert browser.evaluate("document.getElementById('title').textContent") == HOSTILE
        assert browser.evaluate("document.title") == HOSTILE
        assert browser.evaluate("document.querySelectorAll('img, h1 *').length") == 0
