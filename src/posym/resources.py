"""What a training config asks of the machine, checked before a run directory is created.

`memory_estimate` is a lower bound on the bytes a `posym.train.TrainConfig` needs; `check_resources`
refuses, with one line, a config that needs more memory than the device has (an n_embd of 10^7 would
otherwise try a 400 TB allocation, an n_layer of 10^5 hang while building) or more threads than cores.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from posym.core.lengthgen import extension
from posym.core.model import resolve_device
from posym.errors import PosymError


def parameter_count(model, vocab_size: int) -> int:
    """Parameters of the GPT-J a `posym.model.ModelConfig` builds (without building it): token embedding
    and untied lm_head (+ bias), per layer one LayerNorm, q/k/v/out projections without bias and the MLP
    with biases, and the final LayerNorm."""
    width, inner = model.n_embd, model.mlp_ratio * model.n_embd
    layer = 2 * width + 4 * width * width + 2 * width * inner + inner + width
    return vocab_size * width + model.n_layer * layer + 2 * width + vocab_size * width + vocab_size


def memory_estimate(config) -> int:
    """Bytes training needs at least: float32 weights, gradients and AdamW's two moments, GPT-J's
    rotary table (one per layer), the activations one training batch keeps for backward and those of
    one evaluation batch, and the eval_size + val_size sequences each evaluation generates at once.
    A lower bound (allocator slack and framework buffers come on top)."""
    m, t = config.model, config.task
    width, layers, seq = m.n_embd, m.n_layer, t.seq_len
    params = parameter_count(m, t.vocab_size)
    rotary = layers * m.n_positions * m.resolved_rotary_dim
    activations = config.batch_size * seq * layers * ((8 + 2 * m.mlp_ratio) * width + 2 * m.n_head * seq)
    evaluation = config.eval_batch_size * seq * ((4 + m.mlp_ratio) * width + m.n_head * seq)
    held = (config.eval_size + config.val_size) * sequence_bytes(t)
    return 4 * (4 * params + rotary + activations + evaluation) + held


def machine_memory(device: str) -> int:
    """Bytes of memory on `device`: the GPU's, else physical RAM (or the cgroup limit, if lower)."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        return min(total, int(limit)) if limit.isdigit() else total
    except OSError:
        return total


def check_resources(config) -> str:
    """Refuse (before anything is created) a config this machine cannot train: more memory than it has
    or more threads than CPU cores. Returns the resolved device."""
    device = resolve_device(config.device)
    cores = os.cpu_count() or 1
    if config.threads is not None and config.threads > cores:
        raise PosymError(
            f"threads: {config.threads} is more than this machine's {cores} CPU cores; "
            f"use at most {cores} (or null for torch's default)"
        )
    need, have = memory_estimate(config), machine_memory(device)
    if need > have:
        m = config.model
        raise PosymError(
            f"this config needs at least {need / 2**30:,.1f} GiB to train (n_layer {m.n_layer}, n_embd "
            f"{m.n_embd}, n_positions {m.n_positions}, batch_size {config.batch_size}, eval_size "
            f"{config.eval_size}), more than the "
            f"{have / 2**30:,.1f} GiB of {device} memory here"
        )
    return device


# ---- count options (--n, --size, --extra-target, eval_size) ------------------------------------------

SAMPLE_BYTES_PER_TOKEN = 64
"""Bytes one token of a generated or scored sequence costs at least while a command holds it: the int64 id,
generate()'s temporaries, its copy as a Python list and tensor, its text and one score row's share."""


def sequence_bytes(task_config) -> int:
    """Bytes one generated task sequence (ids, answer, hops, chain, text) costs a command at least."""
    return SAMPLE_BYTES_PER_TOKEN * (task_config.seq_len + task_config.max_hops + 3)


def check_count(
    option: str, value: int, each: int, *, what: str, device: str = "cpu", disk: str | os.PathLike | None = None
) -> int:
    """The range check of every count option: `value` items of `each` bytes (a lower bound, from the
    command's own memory estimate) must fit the machine's memory (RAM or the cgroup limit; the GPU's
    for device cuda), or with `disk` (a directory, for a command that streams its items to a file) the
    free space of the disk that directory (or its nearest existing parent) lies on. A count that does not
    is one line naming the most that fits, before any work: `--n 10**12` used to allocate until the
    kernel stepped in. Returns `value`.

    >>> check_count("--n", 10, 1000, what="prompt")
    10
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise PosymError(f"{option} must be an integer, got {value!r}")
    if value < 0:
        raise PosymError(f"{option} must not be negative, got {value}")
    if disk is None:
        have, where = machine_memory(device), f"{device} memory here"
    else:
        have, where = free_disk(disk), f"free disk space under {disk}"
    each = max(int(each), 1)
    if value * each > have:
        most = have // each
        raise PosymError(
            f"{option} {value:,} asks for at least {value * each / 2**30:,.1f} GiB ({each:,} bytes per "
            f"{what}), more than the {have / 2**30:,.1f} GiB of {where}; "
            + (f"use at most {most:,}" if most else f"not even one {what} fits")
        )
    return value


def free_disk(directory: str | os.PathLike) -> int:
    """Bytes free for an unprivileged writer on the disk of `directory` (its nearest existing parent if it
    does not exist yet)."""
    path = Path(directory).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError as exc:
        raise PosymError(f"cannot read the free disk space under {directory}: {exc.strerror}") from None


def check_lengths(task_config, config, points) -> None:
    """Refuse (PosymError) more test sequences of a length-generalization plan than memory holds at its
    longest length: `config.n` (and `config.head_prompts` with `config.heads`) of
    `posym.core.lengthgen.LengthGenConfig`; `points` are `posym.core.lengthgen.plan`'s. Each length's
    test sequences are generated at once, so the longest bounds the counts."""
    longest = max(length for _, length, _ in points)
    each = sequence_bytes(extension(task_config, longest))
    check_count("--n", config.n, each, what=f"{longest}-token test sequence")
    if config.heads:
        check_count("--head-prompts", config.head_prompts, each, what=f"{longest}-token test sequence")


# ---- the bounds of every count and length a user gives (flags and YAML alike) ---------------------

MOST_PROMPTS = 100_000
"""The most prompts of one kind any posym command builds (each is at least a forward pass)."""
MOST_TOKENS = 2**20
"""The longest prompt any posym command builds (1,048,576 tokens), before the model's own position table
bounds it further (`check_positions`)."""
MOST_DRAWS = 100_000
"""The most random draws (bootstrap resamples, random head groups) of one interval or control."""

BOUNDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(
        (
            "n",
            "n_binding",
            "n_bench",
            "frequency_prompts",
            "needle_prompts",
            "recall_prompts",
            "stream_prompts",
            "repeat_prompts",
            "causal_prompts",
            "gap_prompts",
            "bench_n",
        ),
        (1, MOST_PROMPTS),
    ),
    **dict.fromkeys(("draws", "causal_draws", "estimate_draws", "calibration_draws"), (1, MOST_DRAWS)),
    **dict.fromkeys(("bench_runs",), (1, 1_000)),
    **dict.fromkeys(("seed",), (0, 2**32 - 1)),
    **dict.fromkeys(("exclude_keys",), (0, MOST_TOKENS)),  # key positions  # numpy's generators take no negative seed
    **dict.fromkeys(("causal_heads", "causal_planes", "gap_heads", "needle_words"), (1, 4_096)),
    **dict.fromkeys(("repeats",), (2, MOST_TOKENS)),
    **dict.fromkeys(
        (
            "needle_lengths",
            "stream_length",
            "causal_length",
            "repeat_period",
            "lengths",
            "bench_size",
            "bench_sizes",
            "size",
            "sink",
            "windows",
            "ablation_ks",
        ),
        (1, MOST_TOKENS),
    ),
}
"""Every count and length a user can give `posym atlas`, `llm-study` and `llm-scores` (a field of
AtlasConfig or StudyConfig, or the option of the same name): (least, most). The most bounds the work a
number asks for (a draw or prompt is at least a forward pass or a resample of every head); what the
model and the machine allow on top is checked before anything is built (`check_positions`, `check_count`)."""

PROMPT_TOKENS = {"n": 64, "n_binding": 64, "frequency_prompts": 64, "n_bench": 64}
"""Tokens a built-in prompt of these counts holds at least (a binding prompt or a 12-slot puzzle), for
the memory estimate of `check_bounds` (the needle, stream and repeat prompts are bounded by their lengths)."""


def check_bounds(values: dict, *, device: str = "cpu") -> None:
    """Refuse (one line, before anything is built) a count or length outside `BOUNDS`, or a prompt count
    whose prompts do not fit memory (`check_count`). `values`: name -> int or list of ints; a name is a
    field (`n_binding`) or an option (`--n`, looked up as `n`) and the message says it as given; names
    outside BOUNDS are ignored.

    >>> check_bounds({"n_binding": 20, "needle_lengths": [256, 512]})
    >>> check_bounds({"draws": 10**9})
    Traceback (most recent call last):
    ...
    posym.errors.PosymError: draws 1,000,000,000 is more than the 100,000 posym allows; use at most 100,000
    """
    for name, value in values.items():
        key = name.lstrip("-").replace("-", "_")
        if key not in BOUNDS or value is None:
            continue
        least, most = BOUNDS[key]
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, bool) or not isinstance(item, int):
                raise PosymError(f"{name} must be an integer, got {item!r}")
            if item < least:
                raise PosymError(f"{name} must be at least {least}, got {item}")
            if item > most:
                raise PosymError(f"{name} {item:,} is more than the {most:,} posym allows; use at most {most:,}")
        if key in PROMPT_TOKENS:
            check_count(name, value, SAMPLE_BYTES_PER_TOKEN * PROMPT_TOKENS[key], what="prompt", device=device)


def check_positions(lengths: dict, positions: int) -> None:
    """Refuse (one line, before any prompt is built) a prompt length past the model's position table:
    `lengths` name -> tokens (an int or a list).

    >>> check_positions({"stream_length": 1024}, 8192)
    >>> check_positions({"needle_lengths": [256, 10**9]}, 8192)
    Traceback (most recent call last):
    ...
    posym.errors.PosymError: needle_lengths asks for 1,000,000,000 tokens, more than the model's 8,192 positions
    """
    for name, value in lengths.items():
        longest = max(value) if isinstance(value, (list, tuple)) else value
        if longest > positions:
            raise PosymError(f"{name} asks for {longest:,} tokens, more than the model's {positions:,} positions")
