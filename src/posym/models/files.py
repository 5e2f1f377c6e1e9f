"""Step 2 of a load: check a source's files before transformers reads a weight.

Every check of a model's files is here, in the order a load asks them: a Hugging Face directory's or a
posym checkpoint's config.json (sizes of the right types: `check_config_sizes`; a RoPE architecture:
`posym.core.qk.check_rope`; safetensors weights, never pickles unless allowed: `check_model_dir`) and the
model it describes against what its safetensors headers hold and the machine's memory
(`check_config_weights`); a GGUF file's header, read without transformers' slow reader (`gguf_header`: the
general.* metadata in milliseconds, a truncated or corrupt file refused before anything else), the
transformers model type it loads as (`gguf_model_type`) and its tensors against its metadata
(`check_gguf_weights`). `check(source)` runs a source's checks, `check_checkpoint` a posym checkpoint's.

transformers' own GGUF reader (gguf.GGUFReader) parses every field, the 49k-token vocabulary of
SmolLM2 included, in tens of seconds; posym loads the weights through transformers once this module has
said the file is whole and of a RoPE architecture.
"""

from __future__ import annotations

import importlib.util
import math
import os
import struct
from pathlib import Path

from posym import resources
from posym.core.qk import check_rope
from posym.errors import PosymError
from posym.io import quote, read_json, read_json_object
from posym.models.spec import Source

# ---- config.json and safetensors ------------------------------------------------------------------

SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "head_dim",
    "n_layer",
    "n_head",
    "n_embd",
    "n_positions",
    "rotary_dim",
)
"""The sizes of a config.json that must be positive integers when present (head_dim and rotary_dim may be null)."""


def check_config_sizes(config: dict, where: str | Path) -> dict:
    """A config.json's model_type and sizes as transformers will build them: model_type a string, every
    SIZE_KEYS entry present a positive integer (`"vocab_size": "64"` or `"num_attention_heads": 0` used to pass here and crash
    inside transformers). Returns `config`."""
    if "model_type" in config and not isinstance(config["model_type"], str):
        raise PosymError(f"{where}: model_type must be a string, got {quote(config['model_type'])}")
    for key in SIZE_KEYS:
        value = config.get(key)
        if value is None and key in ("head_dim", "rotary_dim", "num_key_value_heads"):
            continue
        if key in config and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise PosymError(f"{where}: {key} must be a positive integer, got {quote(value)}")
    return config


SIZE_NAMES = {
    "blocks": ("num_hidden_layers", "n_layer", "num_layers"),
    "width": ("hidden_size", "n_embd", "d_model"),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
}
"""The config.json keys the families use for the sizes of `decoder_weights` (first present wins;
a missing feed-forward size is 4 x the width, GPT-J's n_inner null)."""


def check_config_weights(directory: Path, dtype=None, device: str = "cpu") -> None:
    """Before a Hugging Face directory (or posym checkpoint) is built: the model its config.json describes
    must be about what its safetensors files hold and fit in memory (`check_declared_weights`;
    `num_hidden_layers: 100000` over a 2-layer file used to build 100,000 layers before any check)."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        return
    config = read_json_object(config_path)
    config = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    sizes = {}
    for name, keys in SIZE_NAMES.items():
        value = next(
            (config[k] for k in keys if isinstance(config.get(k), int) and not isinstance(config[k], bool)), None
        )
        sizes[name] = value
    if sizes["ffn"] is None and sizes["width"] is not None:
        sizes["ffn"] = 4 * sizes["width"]
    if any(value is None for value in sizes.values()):
        return  # an unusual family: transformers' load report still catches a mismatch after the build
    held = _safetensors_weights(directory)
    width = getattr(dtype, "itemsize", 4) if dtype is not None else 4
    check_declared_weights(
        directory, "its config.json", decoder_weights(**sizes), held, device=device, bytes_per_weight=width
    )


def _safetensors_weights(directory: Path) -> int | None:
    """Weights the safetensors files of `directory` hold, from their headers alone (None: none, or one
    unreadable; the loader then names the damage)."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    try:
        for file in files:
            with safe_open(str(file), "pt") as f:
                total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    except Exception:  # noqa: BLE001 (a damaged header: from_pretrained reports it in one line)
        return None
    return total


def decoder_weights(blocks: int, width: int, ffn: int, vocab: int) -> int:
    """Weights a decoder of these sizes has, about: per block the four attention projections and a gated
    MLP, plus the token embedding and the output head (models with fewer key/value heads or tied
    embeddings have a little less).

    >>> decoder_weights(30, 576, 1536, 49152)  # SmolLM2-135M's sizes (it has 134.5 M: tied, 3 of 9 kv heads)
    176062464
    """
    return blocks * (4 * width * width + 3 * width * ffn) + 2 * width * vocab


def check_declared_weights(
    path, what: str, declared: int, held: int | None, *, device: str = "cpu", bytes_per_weight: int = 4
) -> None:
    """Refuse, before transformers builds anything, a model whose metadata (`what`: config.json, a GGUF
    header) describes about `declared` weights when its files hold only `held` (transformers would
    allocate the described model and fill the rest with random weights: a 96-byte GGUF file built a 7B
    model), or more weights than this machine's memory holds (the build would allocate until the kernel
    steps in). `held` None: unknown (pickle weights are never opened to count them)."""
    if held is not None and declared > 4 * held + 2**20:
        raise PosymError(
            f"{path}: {what} describes a model of about {declared:,} weights, but the file holds "
            f"{held:,}: {what} does not match its weights"
        )
    need, have = declared * bytes_per_weight, resources.machine_memory(device)
    if need > have:
        raise PosymError(
            f"{path}: {what} describes a model of about {declared:,} weights ({need / 2**30:,.1f} GiB), "
            f"more than the {have / 2**30:,.1f} GiB of {device} memory here"
        )


def _config_json(path: Path) -> dict:
    # bounded nesting, one line for anything that is not an object; model_type and sizes of the right types
    return check_config_sizes(read_json_object(path / "config.json"), path / "config.json")


def model_type(source: Source) -> str | None:
    """The transformers model_type of a source (a posym run: gptj), read without loading weights."""
    if source.kind == "gguf":
        return gguf_model_type(source.path)
    if not (source.path / "config.json").is_file():
        return "gptj"  # a posym run directory: its checkpoints are GPT-J
    return _config_json(source.path).get("model_type")


def check_model_dir(model_dir: str | os.PathLike, *, allow_pickle: bool = False) -> dict:
    """Validate a Hugging Face model directory without loading weights; return its config.json."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise PosymError(f"{path} is not a Hugging Face model directory (no config.json)")
    config = _config_json(path)
    check_rope(config.get("model_type"), str(path))
    if not any(path.glob("*.safetensors")):
        if not any(path.glob("*.bin")):
            raise PosymError(f"{path} has no weights (no *.safetensors file)")
        if not allow_pickle:
            raise PosymError(
                f"{path} only has pickle weights (*.bin); unpickling can run arbitrary code, so posym "
                "reads safetensors only: convert the weights, or pass --allow-pickle if you trust the file"
            )
    return config


# ---- GGUF headers --------------------------------------------------------------------------------

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


# ---- a source's checks, in the order a load asks them ---------------------------------------------


def check(source: Source, *, dtype=None, allow_pickle: bool = False) -> dict:
    """Every check of a GGUF file or Hugging Face directory before a weight is read (posym runs:
    `check_checkpoint`); returns the directory's config.json ({} for a GGUF file)."""
    if source.kind == "gguf":
        check_rope(gguf_model_type(source.path), str(source.path))
        check_gguf_weights(source.path, gguf_header(source.path))
        return {}
    config = check_model_dir(source.path, allow_pickle=allow_pickle)
    check_config_weights(source.path, dtype)
    return config


def check_checkpoint(ckpt: Path, dtype) -> None:
    """Every check of a posym (or any GPT-J) checkpoint directory before a weight is read: config.json's
    sizes and architecture, safetensors weights (never a pickle), the model it describes against them."""
    hf_config = read_json(ckpt / "config.json")
    if isinstance(hf_config, dict):
        check_config_sizes(hf_config, ckpt / "config.json")
    if not isinstance(hf_config, dict) or hf_config.get("model_type") != "gptj":
        kind = hf_config.get("model_type") if isinstance(hf_config, dict) else None
        raise PosymError(f"{ckpt} is not a GPT-J model (model_type {kind!r}); posym analyses GPT-J checkpoints")
    if not (ckpt / "model.safetensors").is_file():
        pickled = " (only pickle *.bin weights)" if any(ckpt.glob("*.bin")) else ""
        raise PosymError(
            f"{ckpt} has no model.safetensors{pickled}; posym never loads pickled weights, because "
            "unpickling a file can run arbitrary code"
        )
    check_config_weights(ckpt, dtype)
