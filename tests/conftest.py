"""Shared pytest setup: passive OpenMP waiting and deterministic torch before any test imports it."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The endpoint tests serve on 127.0.0.1; a proxy of the machine running the tests (posym's client honours
# HTTP_PROXY / HTTPS_PROXY as urllib does) would otherwise carry those requests away.
os.environ["NO_PROXY"] = os.environ["no_proxy"] = ",".join(
    filter(None, [os.environ.get("NO_PROXY") or os.environ.get("no_proxy"), "127.0.0.1", "localhost"]))

import torch  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))
