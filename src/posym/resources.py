"""What a training config asks of the machine, checked before a run directory is created.

`memory_estimate` is a lower bound on the bytes a `posym.train.TrainConfig` needs; `check_resources`
refuses, with one line, a config that needs more memory than the device has (an n_embd of 10^7 would
otherwise try a 400 TB allocation, an n_layer of 10^5 hang while building) or more threads than cores.
"""

from __future__ import annotations

import os
from pathlib import Path

from posym.errors import PosymError
from posym.core.model import resolve_device


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
    one evaluation batch. A lower bound (allocator slack and framework buffers come on top)."""
    m, t = config.model, config.task
    width, layers, seq = m.n_embd, m.n_layer, t.seq_len
    params = parameter_count(m, t.vocab_size)
    rotary = layers * m.n_positions * m.resolved_rotary_dim
    activations = config.batch_size * seq * layers * ((8 + 2 * m.mlp_ratio) * width + 2 * m.n_head * seq)
    evaluation = config.eval_batch_size * seq * ((4 + m.mlp_ratio) * width + m.n_head * seq)
    return 4 * (4 * params + rotary + activations + evaluation)


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
        raise PosymError(f"threads: {config.threads} is more than this machine's {cores} CPU cores; "
                         f"use at most {cores} (or null for torch's default)")
    need, have = memory_estimate(config), machine_memory(device)
    if need > have:
        m = config.model
        raise PosymError(f"this config needs at least {need / 2**30:,.1f} GiB to train (n_layer {m.n_layer}, n_embd "
                         f"{m.n_embd}, n_positions {m.n_positions}, batch_size {config.batch_size}), more than the "
                         f"{have / 2**30:,.1f} GiB of {device} memory here")
    return device
