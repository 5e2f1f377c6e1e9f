"""posym.prompts: the atlas's prompt sets (needle-in-a-haystack prompts, natural text, repeated random
tokens) on a tiny Llama's tokenizer (tests/tiny_llms.py): exact lengths, where the needle and the answer
sit, and the same prompts for the same seed."""

from __future__ import annotations

import pytest
from tiny_llms import save_model, tokenizer

from posym import models, prompts


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return models.load(save_model(tmp_path_factory.mktemp("prompts") / "llama", "llama", tokenizer()), device="cpu")


def test_the_atlas_prompt_sets_are_exact(loaded):
    needles = prompts.needle_prompts(loaded, lengths=[64, 96], depths=[0.2, 0.8], per_cell=1, n_words=4, seed=0)
    assert [n.length for n in needles] == [64, 64, 96, 96] and all(len(n.ids) == n.length for n in needles)
    for n in needles:
        words = [n.ids[p] for p in n.needle]
        assert [n.ids[q + 1] for q in n.queries] == words  # every answer step generates the next needle word
        assert n.queries[-1] == n.length - 2
    shallow, deep = needles[0], needles[1]
    assert shallow.needle[0] < deep.needle[0]  # depth 0.2 before depth 0.8
    again = prompts.needle_prompts(loaded, lengths=[64, 96], depths=[0.2, 0.8], per_cell=1, n_words=4, seed=0)
    assert again[0].ids == shallow.ids  # seeded
    repeats = prompts.repeated_tokens(loaded, period=10, repeats=3, n=2, seed=0)
    body = repeats[0][-30:]
    assert body[:10] == body[10:20] == body[20:] and len(set(body[:10])) == 10
    text = prompts.natural_text(loaded, length=96, n=1)
    assert [len(t) for t in text] == [96]
