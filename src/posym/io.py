"""Atomic file writes, YAML/JSON helpers and run manifests.

Every file posym writes goes through `atomic_path`: the content is written to a temporary name in
the same directory and renamed into place, so a killed process never leaves a half-written file
visible under the final name.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import yaml

import posym
from posym.errors import PosymError


_HOST = platform.node().replace("-", "_") or "host"


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of `path` that killed processes of this host left; return them.

    Only names `atomic_path` made on this host whose writer pid no longer runs are touched.
    """
    path = Path(path)
    removed = []
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.tmp-{glob.escape(_HOST)}-*"):
        pid = leftover.name[len(f".{path.name}.tmp-{_HOST}-"):].split("-", 1)[0]
        if not pid.isdigit() or _running(int(pid)):
            continue
        shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
        removed.append(leftover)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling path; on success rename it to `path` (replacing it).

    On any exception the temporary file or directory is removed and `path` is left untouched.
    """
    path = Path(path)
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PosymError(f"cannot create directory {parent}: {exc.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise PosymError(f"output directory {parent} is not writable")
    # the writer's host and pid in the name let a later write of the same path tell a temporary that
    # a killed process left behind from one that a live process is still writing
    prefix = f".{path.name}.tmp-{_HOST}-{os.getpid()}-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent)) if is_dir else Path(
        tempfile.mktemp(prefix=prefix, dir=parent)
    )
    try:
        yield tmp
        if is_dir and path.exists():
            # A directory cannot be renamed over a non-empty one: move the old one aside first.
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=parent))
            os.replace(path, old / "x")
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        remove_stale_temporaries(path)
    except BaseException as exc:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
        if isinstance(exc, OSError) and not isinstance(exc, PosymError):
            raise PosymError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write `obj` as pretty, key-sorted JSON atomically."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_yaml(path: str | os.PathLike, obj: Any) -> Path:
    """Write `obj` as YAML (block style, keys in insertion order) atomically."""
    return write_text(path, yaml.safe_dump(obj, sort_keys=False))


def write_parquet(path: str | os.PathLike, frame) -> Path:
    """Write a pandas DataFrame to Parquet atomically."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)
    return Path(path)


def read_yaml(path: str | os.PathLike) -> dict:
    """Read a YAML mapping; a missing file or non-mapping content is a `PosymError`."""
    path = Path(path)
    if not path.is_file():
        raise PosymError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PosymError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PosymError(f"config file {path} must hold a mapping of keys to values")
    return data


def config_hash(obj: Any) -> str:
    """Stable short hash of a JSON-able object (key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def versions() -> dict[str, str]:
    """Versions of Python, posym and the libraries whose behaviour changes numbers."""
    import numpy
    import torch
    import transformers

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "posym": posym.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
    }


def manifest(config: dict, *, seed: int | None = None, **extra: Any) -> dict:
    """What to store next to every result: config hash, seed and versions."""
    return {"config_hash": config_hash(config), "seed": seed, "versions": versions(), **extra}
