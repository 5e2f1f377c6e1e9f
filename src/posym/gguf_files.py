"""GGUF files without transformers' slow reader: the general.* metadata from the header in milliseconds,
a truncated or corrupt file refused before anything else, and the transformers model type it loads as.

transformers' own reader (gguf.GGUFReader) parses every field, the 49k-token vocabulary of
SmolLM2 included, in tens of seconds; `posym.models` loads the weights through transformers once
this module has said the file is whole and of a RoPE architecture.
"""

from __future__ import annotations

import importlib.util
import math
import struct
from pathlib import Path

from posym.errors import PosymError
from posym.resources import check_declared_weights, decoder_weights

GGUF_EXTRA = "pip install 'posym-rope[gguf]'"


def _require_gguf() -> None:
    """A PosymError naming the extra when the packages transformers reads GGUF files with are missing."""
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise PosymError(f"reading GGUF files needs the gguf extra ({module} is not installed): {GGUF_EXTRA}")


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _Short(Exception):
    """The file ended inside the GGUF header."""


MAX_DEPTH = 8
"""Deepest nesting of arrays a GGUF header may hold (llama.cpp writes one level; a deeper one is corrupt)."""


def gguf_header(path: Path) -> dict:
    """The general.* metadata of a GGUF file, read from its header in milliseconds (transformers' own
    reader parses every field, the 49k-token vocabulary included, in tens of seconds), after checking
    that the file holds every tensor byte the header declares: a truncated or corrupt file is a
    PosymError before anything else happens. The other scalar fields are kept as well, and the tensors'
    shapes under "tensors" (name -> dims). Read once per process while the file's size and mtime stay
    (a load asks twice; gemma3-270m's 262,144-token vocabulary takes about 2 s to walk). Not to be
    modified by the caller."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HEADERS:
        header = _read_header(path)
        _HEADERS.clear()  # one file at a time
        _HEADERS[key] = header
    return _HEADERS[key]


_HEADERS: dict = {}


def _read_header(path: Path) -> dict:
    _require_gguf()
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    have = path.stat().st_size
    with open(path, "rb") as f:

        def read(fmt: str):
            data = f.read(struct.calcsize(fmt))
            if len(data) < struct.calcsize(fmt):
                raise _Short
            return struct.unpack(fmt, data)[0]

        def string() -> bytes:
            length = read("<Q")
            if length > have - f.tell():  # a corrupt length: never allocate more than the file holds
                raise _Short
            return f.read(length)

        def value(kind: int, keep: bool, depth: int = 0):
            if kind == _GGUF_STRING:
                return string().decode("utf-8", "replace")
            if kind == _GGUF_ARRAY:
                if depth >= MAX_DEPTH:  # nested arrays: a corrupt or hostile header, never a recursion error
                    raise ValueError("arrays nested too deep")
                item, count = read("<I"), read("<Q")
                if item in _GGUF_SCALARS and not keep:  # skip a numeric array (the size check catches a short one)
                    f.seek(count * struct.calcsize(_GGUF_SCALARS[item]), 1)
                    return None
                return [value(item, keep, depth + 1) for _ in range(count)]
            return read(_GGUF_SCALARS[kind])

        try:
            if f.read(4) != b"GGUF":
                raise PosymError(f"{path} is not a GGUF file (no GGUF magic number)")
            read("<I")  # format version
            n_tensors, n_fields = read("<Q"), read("<Q")
            meta, tensors = {}, {}
            for _ in range(n_fields):
                key = string().decode("utf-8", "replace")
                got = value(read("<I"), key.startswith("general."))
                if key.startswith("general.") or not isinstance(got, (list, type(None))):
                    meta[key] = got
            end = 0
            for _ in range(n_tensors):
                name = string().decode("utf-8", "replace")
                n_dims = read("<I")
                if n_dims > MAX_DEPTH:
                    raise ValueError("too many dimensions")
                dims = [read("<Q") for _ in range(n_dims)]
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(read("<I"))]
                end = max(end, read("<Q") + math.prod(dims) // block * size)
                tensors[name] = dims
        except (_Short, KeyError, ValueError, struct.error):
            raise PosymError(f"{path} is not a readable GGUF model: its header is truncated or corrupt") from None
        alignment = meta.get("general.alignment", 32)
        if isinstance(alignment, bool) or not isinstance(alignment, int) or not 1 <= alignment <= 2**20:
            raise PosymError(
                f"{path} is not a readable GGUF model: general.alignment must be a positive integer, "
                f"got {str(alignment)[:40]!r}"
            )
        needed = -(-f.tell() // alignment) * alignment + end
    if have < needed:
        raise PosymError(
            f"{path} is truncated: its header declares {needed:,} bytes of tensors and metadata, "
            f"the file holds {have:,}"
        )
    return {**meta, "tensors": tensors}


def check_gguf_weights(path: Path, meta: dict) -> None:
    """Refuse, before transformers builds anything, a GGUF file whose tensors do not make the model its
    metadata describes: transformers fills every missing size with a 7B default and every missing tensor
    with random weights (a 96-byte file holding only general.architecture allocated 23 GB). The file must
    hold the token embedding, and one set of attention tensors for each of its `ARCH.block_count` blocks,
    of the `ARCH.embedding_length` width; transformers' load report catches any other missing tensor."""
    tensors, arch = meta.get("tensors") or {}, str(meta.get("general.architecture"))
    if not tensors:
        raise PosymError(f"{path} holds no tensors (only metadata): it is not a model posym can load")
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise PosymError(f"{path} has no token_embd.weight tensor: its weights are incomplete")
    blocks, width = meta.get(f"{arch}.block_count"), meta.get(f"{arch}.embedding_length")
    if not (isinstance(blocks, int) and isinstance(width, int)) or isinstance(blocks, bool) or isinstance(width, bool):
        raise PosymError(
            f"{path} does not give {arch}.block_count and {arch}.embedding_length as integers: its "
            "metadata is incomplete"
        )
    present = {int(n.split(".")[1]) for n in tensors if n.startswith("blk.") and n.split(".")[1].isdigit()}
    if present != set(range(blocks)):
        missing = sorted(set(range(blocks)) - present)
        raise PosymError(
            f"{path} declares {blocks} blocks ({arch}.block_count) but holds tensors for "
            f"{len(present & set(range(blocks)))}"
            + (f" (first missing: blk.{missing[0]})" if missing else f" and for blocks beyond {blocks - 1}")
        )
    if not embedding or embedding[0] != width:
        raise PosymError(
            f"{path}: token_embd.weight has shape {embedding[:4]}, not the {width} of "
            f"{arch}.embedding_length: its metadata does not match its weights"
        )
    # what transformers will allocate from the metadata, against what the file holds: a huge
    # feed_forward_length or vocab_size over small tensors would otherwise allocate before any check
    sizes = [meta.get(f"{arch}.{key}") for key in ("feed_forward_length", "vocab_size")]
    ffn, vocab = (int(s) if isinstance(s, int) and not isinstance(s, bool) else 0 for s in sizes)
    held = sum(math.prod(dims) for dims in tensors.values())
    check_declared_weights(path, "its metadata", decoder_weights(blocks, width, ffn, max(vocab, embedding[-1])), held)


def gguf_model_type(path: Path) -> str:
    """The transformers model_type a GGUF file loads as (transformers' own renames of llama.cpp names)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    meta = gguf_header(path)
    arch = str(meta.get("general.architecture"))
    kind = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}.get(arch, arch)
    if arch not in GGUF_SUPPORTED_ARCHITECTURES and kind not in GGUF_SUPPORTED_ARCHITECTURES:
        import transformers

        raise PosymError(
            f"{path} holds a GGUF model of architecture {arch!r}, which transformers "
            f"{transformers.__version__} cannot read"
        )
    if "llama" in arch and "mistral" in str(meta.get("general.name", "")).lower():
        return "mistral"
    return kind
