"""Shared pytest setup: passive OpenMP waiting and deterministic torch before any test imports it."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))
