"""Runs on disk: every layout posym writes and reads, in one place.

- run directories (`RunDir`: what `posym train` writes, docs/architecture.md "Run directory") and their
  checkpoints `<run>/checkpoints/step-%08d/` (a `save_pretrained` directory plus `posym.json`):
  `CHECKPOINTS`, `CHECKPOINT_META`, `checkpoint_name`, `checkpoint_step`, `list_checkpoints`; the analyses'
  default output directories inside a run (`ANALYSES`); `VALIDATION`;
- the directories of the resumable commands: their markers (`PIPELINE_MARKER` of `posym run`,
  `STUDY_MARKER` of `posym llm-study`), their done-files (`STAGES`/JOB-STAGE`DONE`: `done_path`), and
  what `posym train` / `posym run` keep (`RUN_FILES`);
- what each command writes into its output directory (`OUTPUTS`), which `posym.io.check_output` guards;
- what a directory is (`is_model_dir`, `is_run_dir`, `is_study_dir`, and `kind_of`: the kind of output a
  path holds, which `posym explore` and `posym report` read);
- posym's cache directory (`cache_dir`: assembled embedded models, their dequantized copies).

Names and predicates only: this module reads no file's contents and imports nothing of posym, so every
floor (posym.io's output guards and the CLI's --help included) asks it. Anything else under checkpoints/
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


# ---- the directories of the resumable commands ----------------------------------------------------

PIPELINE_MARKER = "pipeline.yaml"
"""The file `posym run` keeps in its output directory (the config a re-run must match)."""
STUDY_MARKER = "study.yaml"
"""The file `posym llm-study` keeps in its output directory (the config a re-run must match)."""
STAGES = "stages"
"""The folder of done-files in the directory of a resumable command (`posym.stages`)."""
DONE = ".done.json"
"""How a done-file's name ends (`done_path`: stages/JOB-STAGE.done.json)."""


def done_path(out: Path, job: str, stage: str) -> Path:
    """Where the done-file of `stage` of `job` (a task name or "theory") lives."""
    return Path(out) / STAGES / f"{job}-{stage}{DONE}"


RUN_FILES = (
    CHECKPOINTS,
    "config.yaml",
    "manifest.json",
    "metrics.parquet",
    "train.log",
    PIPELINE_MARKER,
    STAGES,
    VALIDATION,
    "validation.json",
)
"""What `posym train` / `posym run` keep in their directories: outputs may go beside these, never over or into them."""


# ---- what a directory is ----------------------------------------------------------------------------


def is_model_dir(path: Path) -> bool:
    """A Hugging Face model directory or posym checkpoint (config.json)."""
    return (path / "config.json").is_file()


def is_run_dir(path: Path) -> bool:
    """A `posym train` run (config.yaml, checkpoints/) or a `posym run` output (pipeline.yaml)."""
    return (path / "config.yaml").is_file() or (path / CHECKPOINTS).is_dir() or (path / PIPELINE_MARKER).is_file()


def is_study_dir(path: Path) -> bool:
    """A `posym llm-study` output (study.yaml)."""
    return (path / STUDY_MARKER).is_file()


KINDS = ("score", "llm-scores", "pipeline", "run", "study", "theory", "bench")
"""The kinds of output `kind_of` tells apart, in the order it asks (the first a path holds wins)."""


def kind_of(path: Path, among: tuple[str, ...] = KINDS) -> str | None:
    """The first kind of `among` (in `KINDS`' order) that `path` holds, by the files it holds, or None:
    'score' a `posym score` Parquet file beside its JSON sidecar; directories: 'llm-scores' (summary.json,
    heads.parquet, scores.parquet), 'pipeline' (a `posym run` output: pipeline.yaml), 'run' (a `posym train`
    run: config.yaml), 'study' (an llm-study: scores/heads.parquet), 'theory' (theory.json), 'bench' (an
    llm-bench output: table.md, summary.parquet)."""
    path = Path(path)
    holds = {
        "score": lambda: path.is_file() and Path(f"{path}.json").is_file(),
        "llm-scores": lambda: all(
            (path / name).is_file() for name in ("summary.json", "heads.parquet", "scores.parquet")
        ),
        "pipeline": lambda: (path / PIPELINE_MARKER).is_file(),
        "run": lambda: RunDir(path).config.is_file(),
        "study": lambda: (path / "scores" / "heads.parquet").is_file(),
        "theory": lambda: (path / "theory.json").is_file(),
        "bench": lambda: (path / "table.md").is_file() and (path / "summary.parquet").is_file(),
    }
    return next((kind for kind in KINDS if kind in among and holds[kind]()), None)


# ---- what each command writes into its output directory ---------------------------------------------

_ANALYSIS = (
    "dynamics.parquet",
    "dynamics_prompts.parquet",
    "purity.parquet",
    "purity_counts.parquet",
    "composition.parquet",
    "composition_summary.parquet",
    "dynamics.json",
    "fig2a_accuracy.*",
    "fig2b_scores.*",
    "fig6_entropy.*",
    "fig7_purity.*",
    "fig7_roles.*",  # posym dynamics
    "planes.parquet",
    "channels.parquet",
    "frequency.parquet",
    "qk_plane.parquet",
    "fig8_frequency.*",
    "fig4b_qk_plane.*",
    "geometry.json",
)  # posym geometry (both default to RUN/analysis)

OUTPUTS: dict[str, tuple[str, ...]] = {
    "dynamics": _ANALYSIS,
    "geometry": _ANALYSIS,
    "theory": ("theory.parquet", "discrepancy.parquet", "fig5a.*", "theory.json"),
    "lengthgen": (
        "lengthgen.parquet",
        "fig5b.*",
        "lengthgen.json",
        "head_retention.parquet",
        "head_groups.parquet",
        "head_retention.*",
    ),
    "discrepancy": ("gaps.parquet", "discrepancy.parquet", "fig_discrepancy.*", "discrepancy.json"),
    "report": ("report.html", "figures", "explorer.html"),
    "sweep": ("trials", "trials.parquet", "aggregate.parquet", "aggregate.*", "sweep.json", "stages"),
    "ablate": ("ablation.parquet", "ablation.json", "ablation.png", "ablation.svg"),
    "finetune": ("finetune.parquet", "finetune.json", "finetune.png", "finetune.svg", "models"),
    "attribute": ("effects.parquet", "heads.parquet", "summary.json"),
    "llm-scores": (
        "scores.parquet",
        "scores_excluded.parquet",
        "sinks.parquet",
        "heads.parquet",
        "prompts.parquet",
        "layers.parquet",
        "heads.png",
        "heads.svg",
        "planes.parquet",
        "planes.png",
        "planes.svg",
        "details.parquet",
        "summary.json",
    ),
    "atlas": (
        "atlas.parquet",
        "atlas_kv.parquet",
        "retrieval.parquet",
        "needles.parquet",
        "causal*.parquet",
        "agreement_*.parquet",
        "compare.parquet",
        "compare_confusion.parquet",
        "full_attention_heads.tsv",
        "full_attention_mask.tsv",
        "maps.png",
        "maps.svg",
        "scatter.png",
        "scatter.svg",
        "atlas.yaml",
        "summary.json",
        "report.md",
    ),
    "llm-bench": ("bench.parquet", "summary.parquet", "table.md", "bench.png", "bench.svg", "manifest.json"),
    "kv-policy": ("full_attention_heads.tsv", "config.json"),
}
"""Glob patterns of the entries each command writes in its output directory: `posym.io.check_output`
refuses an existing directory holding anything else (a re-run into the command's own output is fine;
a directory of other files is never written into, nor replaced)."""


# ---- posym's cache ---------------------------------------------------------------------------------

CACHE_ENV = "POSYM_CACHE_DIR"
"""Environment variable naming the cache directory (default $XDG_CACHE_HOME/posym, else ~/.cache/posym)."""


def cache_dir() -> Path:
    """Where posym keeps files it builds once (assembled embedded models, their dequantized copies):
    $POSYM_CACHE_DIR, else $XDG_CACHE_HOME/posym, else ~/.cache/posym."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posym"
