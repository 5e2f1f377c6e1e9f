"""GGUF files without transformers' slow reader: the general.* metadata from the header in milliseconds,
a truncated or corrupt file refused before anything else, and the transformers model type it loads as.

transformers' own reader (gguf.GGUFReader) parses every field, the 49k-token vocabulary of
SmolLM2 included, in tens of seconds; `posym.sources` loads the weights through transformers once
this module has said the file is whole and of a RoPE architecture.
"""

from __future__ import annotations

import importlib.util
import math
import struct
from pathlib import Path

from posym.errors import PosymError

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


def gguf_header(path: Path) -> dict:
    """The general.* metadata of a GGUF file, read from its header in milliseconds (transformers' own
    reader parses every field, the 49k-token vocabulary included, in tens of seconds), after checking
    that the file holds every tensor byte the header declares: a truncated or corrupt file is a
    PosymError before anything else happens."""
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

        def value(kind: int, keep: bool):
            if kind == _GGUF_STRING:
                return string().decode("utf-8", "replace")
            if kind == _GGUF_ARRAY:
                item, count = read("<I"), read("<Q")
                if item in _GGUF_SCALARS and not keep:  # skip a numeric array (the size check catches a short one)
                    f.seek(count * struct.calcsize(_GGUF_SCALARS[item]), 1)
                    return None
                return [value(item, keep) for _ in range(count)]
            return read(_GGUF_SCALARS[kind])

        try:
            if f.read(4) != b"GGUF":
                raise PosymError(f"{path} is not a GGUF file (no GGUF magic number)")
            read("<I")  # format version
            n_tensors, n_fields = read("<Q"), read("<Q")
            meta = {}
            for _ in range(n_fields):
                key = string().decode("utf-8", "replace")
                got = value(read("<I"), key.startswith("general."))
                if key.startswith("general."):
                    meta[key] = got
            end = 0
            for _ in range(n_tensors):
                string()  # tensor name
                dims = [read("<Q") for _ in range(read("<I"))]
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(read("<I"))]
                end = max(end, read("<Q") + math.prod(dims) // block * size)
        except (_Short, KeyError, ValueError, struct.error):
            raise PosymError(f"{path} is not a readable GGUF model: its header is truncated or corrupt") from None
        alignment = int(meta.get("general.alignment", 32))
        needed = -(-f.tell() // alignment) * alignment + end
    if have < needed:
        raise PosymError(f"{path} is truncated: its header declares {needed:,} bytes of tensors and metadata, "
                         f"the file holds {have:,}")
    return meta


def gguf_model_type(path: Path) -> str:
    """The transformers model_type a GGUF file loads as (transformers' own renames of llama.cpp names)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    meta = gguf_header(path)
    arch = str(meta.get("general.architecture"))
    kind = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}.get(arch, arch)
    if arch not in GGUF_SUPPORTED_ARCHITECTURES and kind not in GGUF_SUPPORTED_ARCHITECTURES:
        import transformers

        raise PosymError(f"{path} holds a GGUF model of architecture {arch!r}, which transformers "
                         f"{transformers.__version__} cannot read")
    if "llama" in arch and "mistral" in str(meta.get("general.name", "")).lower():
        return "mistral"
    return kind
