"""Reading a `posym explore` page back without a browser (its numbers unpacked, its prompts and detail
blocks decoded), and what the browser tests await after each action."""

from __future__ import annotations

import base64

import numpy as np
from browser import page_blocks, page_data

from posym import explorer

READY = "explorerReady"
"""Awaited after each action: the promise of the head page's last draw (it decodes its blocks first)."""


def unpack(text: str, step: float) -> np.ndarray:
    codes = np.frombuffer(base64.b64decode(text), dtype="<i2")
    return np.where(codes == explorer.MISSING, np.nan, codes * step)


def embedded(path, index: int = 0) -> tuple[dict, list[dict], dict]:
    """(set `index` of a page, its prompts from their pages, prompt -> its detail block)."""
    data, blocks = page_data(path), page_blocks(path)
    s = data["sets"][index]
    prompts = [p for page in s["pages"] for p in explorer.unblock(blocks[page])["prompts"]]
    assert [p["index"] for p in prompts] == list(range(s["n_prompts"]))
    return s, prompts, {int(k): explorer.unblock(blocks[b]) for k, b in s["details"].items()}
