"""posym.explorer: the page's encoding (packed numbers, blocks, rows with fewer swaps padded, NaN as
null) and, on a large synthetic set, its pages of prompts and the size limit, also in a headless Chromium
(tests/browser.py). The readers of score tables are tested through `posym explore` (tests/test_explore.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from browser import CHROMIUM, SKIP_REASON, Chromium
from explorer_pages import READY, embedded, unpack

from posym import explorer
from posym.errors import PosymError


def test_pack_round_trips_and_refuses_what_does_not_fit():
    values = [0.12346, -1.0, float("nan"), 3.2767]
    back = unpack(explorer.pack(values, 1e-4), 1e-4)
    assert np.allclose(back[[0, 1, 3]], [0.1235, -1.0, 3.2767], atol=1e-12) and np.isnan(back[2])
    with pytest.raises(PosymError, match="int16"):
        explorer.pack([3.3], 1e-4)


def _details(heads: int, keys: int, swaps, *, query: int, prompt: int = 0, rng=None) -> pd.DataFrame:
    """head_details-shaped rows of one prompt and query (layer 0, `heads` heads; swaps[h] swaps of head h)."""
    rng = rng or np.random.default_rng(0)
    rows = []
    for h in range(heads):
        n = swaps[h]
        attention = rng.dirichlet(np.ones(keys))
        rows.append(
            {
                "prompt": prompt,
                "query": query,
                "layer": h // 9 if heads > 9 else 0,
                "head": h % 9 if heads > 9 else h,
                "first": 0,
                "attention": attention.tolist(),
                "s_pos": float(rng.random()),
                "s_sym": float(rng.random()),
                "a": [0] * n,
                "b": [1] * n,
                **{
                    c: rng.random(n).round(4).tolist()
                    for c in ("weight", "before_a", "before_b", "after_a", "after_b", "cos_pos", "cos_sym")
                },
            }
        )
    return pd.DataFrame(rows)


def test_rows_with_fewer_swaps_are_padded_and_nan_is_null():
    details = _details(2, 3, [2, 1], query=2)
    s = explorer.HeadSet(
        "toy",
        1,
        2,
        {"s_pos": {(0, 0): 1.0, (0, 1): float("nan")}, "label": {(0, 0): "positional"}},
        prompts=[{"text": "a b c", "ids": [1, 2, 3], "queries": [2]}],
        details={0: details},
        planes={(0, 1): [[1, explorer._num(float("nan")), 0.5, 1.0]]},
    )
    data, blocks = explorer.encode([s], title="t", sources=[])
    assert data == json.loads(
        explorer.render(data, blocks).split('id="data" type="application/json">')[1].split("</script>")[0]
    )
    entry = explorer.unblock(blocks[data["sets"][0]["details"]["0"]])["queries"][0]
    assert entry["query"] == 2 and entry["top"] == 2 and entry["keys"] == [0, 1, 0, 1, 0, 1, -1, -1]
    swaps = unpack(entry["swaps"], explorer.FINE).reshape(2, 2, 7)
    assert np.isnan(swaps[1, 1]).all() and not np.isnan(swaps[:, 0]).any()
    assert np.abs(swaps[0, :, 0] - details.weight[0]).max() <= 5e-5 + 1e-12
    assert data["sets"][0]["planes"]["0.1"] == [[1, None, 0.5, 1.0]] and data["sets"][0]["labels"] == ["positional", ""]
    assert np.isnan(unpack(data["sets"][0]["maps"]["s_pos"], 1e-4)[1])


def test_blocks_round_trip_and_keep_the_payload():
    payload = {
        "prompts": [{"index": 0, "s_pos": explorer.pack([0.25, float("nan")], explorer.FINE), "text": "</script>"}]
    }
    assert explorer.unblock(explorer.block(payload)) == payload
    assert "</" not in explorer.block(payload)  # base64: the block cannot end its script element


# ---- a large set: pages of prompts and the size limit -------------------------------------------

LAYERS, HEADS, KEYS = 30, 9, 40
"""The synthetic set's shape: SmolLM2's 30 x 9 heads, prompts of 40 tokens."""


def _scored(scores, k: int) -> dict:
    """Synthetic prompt k with per-prompt scores [heads, 2] over the LAYERS x HEADS grid."""
    grid = [(l, h) for l in range(LAYERS) for h in range(HEADS)]
    return {
        "text": f"synthetic prompt {k}",
        "ids": list(range(KEYS)),
        "queries": [KEYS - 1],
        "tokens": [f"t{i}" for i in range(KEYS)],
        "scores": {g: tuple(scores[j]) for j, g in enumerate(grid)},
    }


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """400 prompts of random per-prompt scores over 270 heads, 60 of them with random attention rows
    and 8 swaps per head, explored under a 2 MB limit (which the rows of all 60 would break)."""
    rng = np.random.default_rng(1)
    grid = [(l, h) for l in range(LAYERS) for h in range(HEADS)]
    scores = rng.random((400, len(grid), 2)).round(4)
    prompts = [_scored(scores[k], k) for k in range(400)]
    details = {k: _details(len(grid), KEYS, [8] * len(grid), query=KEYS - 1, prompt=k, rng=rng) for k in range(60)}
    maps = {"s_pos": {g: float(scores[:, j, 0].mean()) for j, g in enumerate(grid)}, "label": {}}
    s = explorer.HeadSet("synthetic", LAYERS, HEADS, maps, prompts=prompts, details=details)
    data, blocks = explorer.encode([s], title="large", sources=[], max_bytes=2_000_000)
    path = tmp_path_factory.mktemp("large") / "large.html"
    path.write_text(explorer.render(data, blocks), encoding="utf-8")
    return path, scores, details


def test_a_large_set_pages_its_prompts_and_stays_within_the_limit(large):
    path, scores, details = large
    assert path.stat().st_size <= 2_000_000
    s, prompts, kept = embedded(path)
    assert len(s["pages"]) == 400 // explorer.PAGE and s["n_prompts"] == 400
    assert 0 < len(kept) < 60 and s["dropped"] == 60 - len(kept)
    assert sorted(kept) == list(range(len(kept)))  # the first prompts keep their rows, in order
    last = max(kept)
    got = unpack(kept[last]["queries"][0]["attention"], explorer.FINE).reshape(LAYERS * HEADS, KEYS)
    assert np.abs(got - np.array(details[last].attention.to_list())).max() <= 5e-5 + 1e-12
    assert np.abs(unpack(prompts[337]["s_sym"], explorer.FINE) - scores[337, :, 1]).max() <= 5e-5 + 1e-12
    with pytest.raises(PosymError, match="over the explorer's limit"):
        explorer.encode(
            [explorer.HeadSet("x", LAYERS, HEADS, {}, prompts=[_scored(scores[k], k) for k in range(50)])],
            title="t",
            sources=[],
            max_bytes=50_000,
        )


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_a_later_page_in_chromium(large):
    path, scores, details = large
    s, _, kept = embedded(path)
    last, head = max(kept), 17 * HEADS + 4
    with Chromium() as browser:
        browser.open(path, width=1400, fragment="#head=17.4&prompt=337")
        browser.evaluate(READY)
        assert browser.evaluate("document.getElementById('pageinfo').textContent") == (
            "prompts 325..349 of 400 (page 14 of 16)"
        )
        row = browser.evaluate(
            "[...document.querySelectorAll('#promptscores tr[data-prompt=\"337\"] [data-field]')].map(e => +e.textContent)"
        )
        assert np.abs(np.array(row) - scores[337, head]).max() <= 5.5e-4
        assert "size limit" in browser.evaluate("document.querySelector('#headpage .note').textContent")
        assert browser.evaluate("blocks.size") == 1  # only this page of prompts was decoded
        browser.click("#nextpage")
        browser.evaluate(READY)
        assert browser.evaluate("location.hash").endswith("&prompt=350&query=0")
        assert browser.evaluate("document.getElementById('prompt').value") == "350"
        # a prompt with rows: its attention row of head 17.4, from its own block
        browser.evaluate(
            f"(() => {{ const e = document.getElementById('gotoprompt'); e.value = '{last}'; "
            "e.dispatchEvent(new Event('change')); })()"
        )
        browser.evaluate(READY)
        shown = browser.evaluate("[...document.querySelectorAll('#attention .tok')].map(t => +t.dataset.attn)")
        assert np.abs(np.array(shown) - np.array(details[last].attention[head])).max() <= 5.5e-5
        assert browser.evaluate("blocks.size") == 4  # pages 14, 15 and the page of `last`, and its rows
        assert browser.console_errors == [] and browser.requests == [path.resolve().as_uri()]
