"""The readers under every step of a load: transformers' `from_pretrained`, called once in posym
(`pretrained`: never remote code, never the network), its load report as one line (`from_pretrained`),
a Hugging Face directory's weights and tokenizer (`read_hf`), weights refused when they hold NaN
(`check_finite`) and the digest that tells two loaded models apart (`weights_digest`).

Like `posym.io`, this module calls no step of a load (`posym.models.spec`, `files`, `cache`,
`checkpoints`, `loader`); the steps call it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from posym.errors import PosymError
from posym.io import quote, read_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")
"""Files from which AutoTokenizer can build a tokenizer (fast JSON, SentencePiece, GPT-2 BPE)."""


def pretrained(loader, path: str | Path, **kwargs: Any) -> Any:
    """The one call of transformers' `from_pretrained` in posym (models, configs, tokenizers, GGUF files):
    `trust_remote_code=False`, so an `auto_map` in config.json or tokenizer_config.json never runs the
    directory's Python (transformers would otherwise ask "run the custom code? [y/N]" in a terminal),
    and `local_files_only`, so a model spec is never fetched from the network. The directory's JSON files
    (`TRANSFORMERS_JSON`) are read first with the bounded reader."""
    kwargs.pop("trust_remote_code", None)
    kwargs.setdefault("local_files_only", True)
    if "gguf_file" not in kwargs:  # transformers' own json.load would meet a 100,000-deep file with RecursionError
        kind = "tokenizer" if "Tokenizer" in getattr(loader, "__name__", "") else "model"
        for name in TRANSFORMERS_JSON[kind]:
            if (Path(path) / name).is_file():
                read_json(Path(path) / name)
    return loader.from_pretrained(path, trust_remote_code=False, **kwargs)


TRANSFORMERS_JSON = {
    "model": ("config.json", "generation_config.json"),
    "tokenizer": (
        "config.json",
        "tokenizer_config.json",
        "tokenizer.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.json",
    ),
}
"""The JSON files of a model directory that transformers reads for a model and for a tokenizer; `pretrained`
reads each first with posym's bounded reader (`posym.io.read_json`), so nesting past MAX_DEPTH or a file
that is not JSON is one line."""


def from_pretrained(loader, path: str | Path, **kwargs: Any) -> Any:
    """`loader.from_pretrained(path, **kwargs)`, a broken weights file (bad safetensors header, truncated or
    missing tensors, a config.json that disagrees with the weights) answered with one PosymError line naming
    `path` (shared by `load_checkpoint` and `posym.models.load`, which check the files first:
    `posym.models.files`)."""
    from safetensors import SafetensorError
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' multi-line load report; the check below says it in one line
    try:
        model, report = pretrained(loader, path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 (only the kinds below are the file's fault; the rest re-raise)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if type(exc).__name__ == "UnpicklingError":  # torch's weights_only unpickler refused a pickle (--allow-pickle)
            raise PosymError(
                f"cannot load the model in {path}: its pickle weights hold more than tensors (torch's "
                f"restricted unpickler refused them: {quote(first)}); posym never runs code from a "
                "weights file"
            ) from None
        # TypeError / a strict-dataclass error: a config.json value of the wrong type ("rms_norm_eps": -1,
        # "rope_theta": "abc"), found by transformers' config validation or while it builds the model
        strict = type(exc).__name__.startswith("StrictDataclass")
        first = " ".join(str(exc).split())[:300] if strict else first  # its reason is on the second line
        if not (strict or isinstance(exc, (OSError, ValueError, RuntimeError, KeyError, TypeError, SafetensorError))):
            raise
        raise PosymError(f"cannot load the model in {path}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    # weights that config.json does not describe would be randomly initialised or silently dropped
    for kind, what in (
        ("missing_keys", "missing from"),
        ("unexpected_keys", "unexpected in"),
        ("mismatched_keys", "of another shape in"),
    ):
        keys = sorted(k if isinstance(k, str) else k[0] for k in report.get(kind) or ())
        if keys:
            raise PosymError(
                f"config.json of {path} does not match its weights: {len(keys)} tensors are {what} the "
                f"weights file (first: {keys[0]}); was config.json edited or copied from another model?"
            )
    return model


def check_finite(model, where: str | Path):
    """Refuse weights holding NaN or infinity (a diverged training, a damaged file): scores of them are
    meaningless (they read as "rotates its queries differently from RoPE") and an evaluation says loss
    nan. Returns `model`."""
    import torch

    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise PosymError(
                f"the weights of {where} hold NaN or infinite values (first: {name}): a diverged "
                "training or a damaged file; posym cannot score or evaluate them"
            )
    return model


def tokenizer_loader(directory: Path, **kwargs):
    """A loader of the tokenizer in `directory` (read when called; one PosymError line if it cannot be)."""

    def read():
        from transformers import AutoTokenizer

        try:
            return pretrained(AutoTokenizer, directory, **kwargs)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PosymError(f"cannot load the tokenizer of {directory}: {str(exc).splitlines()[0]}") from None

    return read


def read_hf(directory: Path, dtype, attn_implementation: str | None):
    """(model, a loader of its tokenizer or None) of a Hugging Face directory that `posym.models.files`
    checked: float weights refused when not finite."""
    from transformers import AutoModelForCausalLM

    safetensors = any(directory.glob("*.safetensors"))
    # weights_only=True: even with --allow-pickle, torch's restricted unpickler refuses code objects
    model = from_pretrained(
        AutoModelForCausalLM,
        directory,
        dtype=dtype,
        attn_implementation=attn_implementation,
        use_safetensors=safetensors,
        weights_only=True,
    )
    check_finite(model, directory)
    has_tokenizer = any((directory / name).is_file() for name in TOKENIZER_FILES)
    return model, tokenizer_loader(directory) if has_tokenizer else None


IDENTITY_SAMPLE = 4096
"""Values per weight tensor that `posym.models.identity` digests (evenly spaced; all of a smaller tensor)."""


def weights_digest(model, model_type: str) -> str:
    """16 hex digits of the architecture, its config (paths, dtype and private keys left out) and the
    weights (every tensor's name and shape and IDENTITY_SAMPLE evenly spaced values of it, as float64)."""
    import torch

    config = {
        k: v
        for k, v in model.config.to_dict().items()
        if not k.startswith("_") and k not in ("name_or_path", "transformers_version", "torch_dtype", "dtype")
    }
    digest = hashlib.sha256(json.dumps([model_type, config], sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            flat = tensor.detach().reshape(-1)  # [numel]
            count = min(flat.numel(), IDENTITY_SAMPLE)  # exact integer steps (a float linspace rounds past the end)
            picked = torch.arange(count) * max(flat.numel() - 1, 0) // max(count - 1, 1)
            digest.update(f"{name}{tuple(tensor.shape)}".encode())
            digest.update(flat[picked.to(flat.device)].to("cpu", torch.float64).numpy().tobytes())  # [<= sample]
    return digest.hexdigest()[:16]
