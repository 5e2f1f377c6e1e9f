"""Runs on disk: every layout posym writes and reads, in one place.

- run directories (`RunDir`: what `posym train` writes, docs/architecture.md "Run directory") and their
  checkpoints `<run>/checkpoints/step-%08d/` (a `save_pretrained` directory plus `posym.json`):
  `CHECKPOINTS`, `CHECKPOINT_META`, `checkpoint_name`, `checkpoint_step`, `list_checkpoints`; the analyses'
  default output directories inside a run (`ANALYSES`); `VALIDATION`;
- posym's cache directory (`cache_dir`: assembled embedded models, their dequantized copies);

Names and predicates only: this module reads no file's contents and imports nothing of posym but its
errors, so every floor (posym.io's output guards included) asks it. Anything else under checkpoints/
(for example the temporary directory of a checkpoint being written) is ignored.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# ---- posym checkpoints and run directories -------------------------------------------------------


CHECKPOINTS = "checkpoints"  # <run>/checkpoints/step-%08d/
CHECKPOINT_META = "posym.json"  # what posym adds next to the weights of a checkpoint
CHECKPOINT_RE = re.compile(r"^step-(\d{8})$")


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint after `step` optimizer steps."""
    return f"step-{step:08d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint directory's name (`checkpoint_name`), or None for any other name."""
    match = CHECKPOINT_RE.match(name)
    return int(match.group(1)) if match else None


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """All complete checkpoints of a run as (step, directory), sorted by step."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        step = checkpoint_step(child.name)
        if step is not None and child.is_dir():
            found.append((step, child))
    return sorted(found)


VALIDATION = "validation.parquet"
"""The val metrics `posym.models.validation_table` computed for checkpoints that recorded none."""
ANALYSES = ("analysis", "lengthgen", "discrepancy")
"""The analyses' default output directories inside a run: dynamics and geometry write RUN_DIR/analysis,
lengthgen RUN_DIR/lengthgen, discrepancy RUN_DIR/discrepancy."""


@dataclass(frozen=True)
class RunDir:
    """A posym run directory: the layout `posym train` writes (docs/architecture.md, "Run directory")
    and where the analyses of the run go by default.

    >>> run = RunDir(Path("runs/number"))
    >>> run.metrics.as_posix(), run.checkpoint(1000).as_posix()
    ('runs/number/metrics.parquet', 'runs/number/checkpoints/step-00001000')
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        """config.yaml: the resolved TrainConfig."""
        return self.path / "config.yaml"

    @property
    def manifest(self) -> Path:
        """manifest.json: versions, seed, config hash."""
        return self.path / "manifest.json"

    @property
    def metrics(self) -> Path:
        """metrics.parquet: one row per checkpoint (step, loss, accuracies)."""
        return self.path / "metrics.parquet"

    @property
    def validation(self) -> Path:
        """validation.parquet: val metrics `posym.models.validation_table` computed for checkpoints that recorded none."""
        return self.path / VALIDATION

    @property
    def validation_json(self) -> Path:
        """validation.json: what `posym validate` found (best step by validation)."""
        return self.path / "validation.json"

    @property
    def log(self) -> Path:
        """train.log."""
        return self.path / "train.log"

    @property
    def checkpoints(self) -> Path:
        """checkpoints/: one directory per saved step."""
        return self.path / CHECKPOINTS

    def checkpoint(self, step: int) -> Path:
        """The directory of the checkpoint after `step` optimizer steps."""
        return self.checkpoints / checkpoint_name(step)

    def output(self, name: str) -> Path:
        """The default output directory of an analysis of this run: RUN_DIR/NAME (`ANALYSES`)."""
        if name not in ANALYSES:
            raise ValueError(f"unknown analysis directory {name!r}")
        return self.path / name


# ---- posym's cache ---------------------------------------------------------------------------------

CACHE_ENV = "POSYM_CACHE_DIR"
"""Environment variable naming the cache directory (default $XDG_CACHE_HOME/posym, else ~/.cache/posym)."""


def cache_dir() -> Path:
    """Where posym keeps files it builds once (assembled embedded models, their dequantized copies):
    $POSYM_CACHE_DIR, else $XDG_CACHE_HOME/posym, else ~/.cache/posym."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posym"
