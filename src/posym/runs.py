"""Runs on disk: every layout posym writes and reads, in one place.

- run directories (`RunDir`: what `posym train` writes, docs/architecture.md "Run directory") and their
  checkpoints `<run>/checkpoints/step-%08d/` (a `save_pretrained` directory plus `posym.json`):
  `CHECKPOINTS`, `CHECKPOINT_META`, `checkpoint_name`, `checkpoint_step`, `list_checkpoints`; the analyses'
  default output directories inside a run (`ANALYSES`); `VALIDATION`;
- the files and figures each command writes into its output directory, which other parts of posym read
  (`FILES`, `output_file`, `kv_eval_prompts`, `kv_eval_piece`; `FIGURES`, `figure_file`);
- an llm-study's directory (`StudyDir`: `STUDY_FILES`, its folders and their files; `STUDY_STAGES`, `PREDICTION_STAGES`);
- the directories of the resumable commands: their markers (`PIPELINE_MARKER` of `posym run`,
  `STUDY_MARKER` of `posym llm-study`, `KV_EVAL_MARKER` of `posym kv-eval`), their done-files (`STAGES`/JOB-STAGE`DONE`: `done_path`), and
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
ANALYSIS_DIRS = {"dynamics": "analysis", "geometry": "analysis", "lengthgen": "lengthgen", "discrepancy": "discrepancy"}
"""Each analysis command's default output directory inside a run (RUN_DIR/<directory>)."""
ANALYSES = tuple(dict.fromkeys(ANALYSIS_DIRS.values()))
"""The analyses' default output directories inside a run: analysis, lengthgen, discrepancy."""


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

    def analysis_dir(self, command: str) -> Path:
        """The default output directory of analysis `command` (`ANALYSIS_DIRS`)."""
        if command not in ANALYSIS_DIRS:
            raise ValueError(f"{command!r} is not an analysis of a run ({', '.join(ANALYSIS_DIRS)})")
        return self.output(ANALYSIS_DIRS[command])

    def analysis_file(self, command: str, name: str) -> Path:
        """The file `name` (`FILES[command]`) that analysis `command` writes into its default directory.

        >>> RunDir(Path("runs/number")).analysis_file("dynamics", "record").as_posix()
        'runs/number/analysis/dynamics.json'
        """
        return output_file(self.analysis_dir(command), command, name)

    def analysis_figure(self, command: str, name: str) -> Path:
        """The stem of figure `name` (`FIGURES[command]`) that analysis `command` draws into its default
        directory.

        >>> RunDir(Path("runs/number")).analysis_figure("dynamics", "accuracy").as_posix()
        'runs/number/analysis/fig2a_accuracy'
        """
        return figure_file(self.analysis_dir(command), command, name)


# ---- the directories of the resumable commands ----------------------------------------------------

PIPELINE_MARKER = "pipeline.yaml"
"""The file `posym run` keeps in its output directory (the config a re-run must match)."""
STUDY_MARKER = "study.yaml"
"""The file `posym llm-study` keeps in its output directory (the config a re-run must match)."""
KV_EVAL_MARKER = "kv_eval.yaml"
"""The file `posym kv-eval` keeps in its output directory (the config a re-run must match)."""
STAGES = "stages"
"""The folder of done-files in the directory of a resumable command (`posym.stages`)."""
DONE = ".done.json"
"""How a done-file's name ends (`done_path`: stages/JOB-STAGE.done.json)."""


def done_path(out: Path, job: str, stage: str) -> Path:
    """Where the done-file of `stage` of `job` (a task name or "theory") lives."""
    return Path(out) / STAGES / f"{job}-{stage}{DONE}"


# ---- the files and figures of each command's output directory -------------------------------------

REPORT = "report.html"
"""The page `posym report` and `posym llm-study` write."""
EXPLORER = "explorer.html"
"""The tables-only head explorer `posym report` and `posym llm-study` write beside their report."""
REPORT_FIGURES = "figures"
"""The folder of the figures (PNG and SVG) `posym report` and `posym llm-study` copy or draw beside their report."""

FILES: dict[str, dict[str, str]] = {
    "dynamics": {
        "dynamics": "dynamics.parquet",
        "dynamics_prompts": "dynamics_prompts.parquet",
        "purity": "purity.parquet",
        "purity_counts": "purity_counts.parquet",
        "composition": "composition.parquet",
        "composition_summary": "composition_summary.parquet",
        "record": "dynamics.json",
    },
    "geometry": {
        "planes": "planes.parquet",
        "channels": "channels.parquet",
        "frequency": "frequency.parquet",
        "qk_plane": "qk_plane.parquet",
        "record": "geometry.json",
    },
    "lengthgen": {
        "lengthgen": "lengthgen.parquet",
        "head_retention": "head_retention.parquet",
        "head_groups": "head_groups.parquet",
        "record": "lengthgen.json",
    },
    "discrepancy": {"gaps": "gaps.parquet", "discrepancy": "discrepancy.parquet", "record": "discrepancy.json"},
    "theory": {"theory": "theory.parquet", "discrepancy": "discrepancy.parquet", "record": "theory.json"},
    "llm-scores": {
        "scores": "scores.parquet",
        "excluded": "scores_excluded.parquet",
        "sinks": "sinks.parquet",
        "heads": "heads.parquet",
        "prompts": "prompts.parquet",
        "layers": "layers.parquet",
        "planes": "planes.parquet",
        "details": "details.parquet",
        "summary": "summary.json",
    },
    "llm-bench": {
        "bench": "bench.parquet",
        "summary": "summary.parquet",
        "table": "table.md",
        "manifest": "manifest.json",
    },
    "atlas": {
        "atlas": "atlas.parquet",
        "atlas_kv": "atlas_kv.parquet",
        "retrieval": "retrieval.parquet",
        "needles": "needles.parquet",
        "agreement_spearman": "agreement_spearman.parquet",
        "agreement_auroc": "agreement_auroc.parquet",
        "agreement_confusion": "agreement_confusion.parquet",
        "agreement_sink_decides": "agreement_sink_decides.parquet",
        "causal": "causal.parquet",
        "causal_summary": "causal_summary.parquet",
        "causal_heads": "causal_heads.parquet",
        "compare": "compare.parquet",
        "compare_confusion": "compare_confusion.parquet",
        "full_attention_heads": "full_attention_heads.tsv",
        "full_attention_mask": "full_attention_mask.tsv",
        "config": "atlas.yaml",
        "summary": "summary.json",
        "report": "report.md",
    },
    "attribute": {"effects": "effects.parquet", "heads": "heads.parquet", "summary": "summary.json"},
    "sweep": {"trials": "trials.parquet", "aggregate": "aggregate.parquet", "record": "sweep.json"},
    "kv-eval": {
        "config": KV_EVAL_MARKER,
        "manifest": "manifest.json",
        "heads": "heads.parquet",
        "summary": "summary.parquet",
        "tests": "tests.parquet",
        "primary": "primary.parquet",
        "record": "summary.json",
    },
    "kv-policy": {"full_attention_heads": "full_attention_heads.tsv", "config": "config.json"},
    "ablate": {"conditions": "ablation.parquet", "record": "ablation.json"},
    "finetune": {"conditions": "finetune.parquet", "record": "finetune.json"},
}
"""The tables, JSON records and other files each command writes into its output directory, by name: the
run analyses (read by `posym report`, `posym explore`), llm-scores (`posym explore`), llm-bench (`posym
report`; an llm-study's bench stage writes the same folder), atlas (scripts/atlas_causal.py), attribute,
sweep, kv-eval (and its per-task tables: `kv_eval_prompts`), kv-policy, ablate and finetune. Their
figures are in `FIGURES`. Writers and readers ask `output_file` (or, inside a run, `RunDir.analysis_file`)."""


def output_file(out: str | Path, command: str, name: str) -> Path:
    """The file `name` (a key of `FILES[command]`) in `out`, the output directory of `command`.

    >>> output_file("runs/number/lengthgen", "lengthgen", "record").as_posix()
    'runs/number/lengthgen/lengthgen.json'
    """
    return Path(out) / _named(FILES, "files", "writes", command, name)


def _named(table: dict[str, dict[str, str]], what: str, verb: str, command: str, name: str) -> str:
    """table[command][name] (FILES or FIGURES), or a ValueError naming the choices."""
    names = table.get(command)
    if names is None:
        raise ValueError(f"posym names no {what} of {command!r} ({', '.join(table)})")
    if name not in names:
        raise ValueError(f"{command} {verb} no {name!r} ({', '.join(names)})")
    return names[name]


KV_EVAL_PROMPTS = "prompts_{task}.parquet"
"""The per-prompt table of one task in a `posym kv-eval` output directory (`kv_eval_prompts`)."""
KV_EVAL_PIECES = "pieces"
"""The folder of a `posym kv-eval` output directory keeping each finished length of a task still running
(`kv_eval_piece`), removed once the task's table is written."""


def kv_eval_prompts(out: str | Path, task: str) -> Path:
    """The per-prompt table of `task` (a task name) in `out`, a `posym kv-eval` output directory.

    >>> kv_eval_prompts("runs/kv-eval", "number").as_posix()
    'runs/kv-eval/prompts_number.parquet'
    """
    return Path(out) / KV_EVAL_PROMPTS.format(task=task)


def kv_eval_piece(out: str | Path, task: str, factor: int) -> Path:
    """The kept rows of `task` at `factor` x its base length in `out`, a `posym kv-eval` output directory,
    while the task runs (a killed run resumes at its first missing length).

    >>> kv_eval_piece("runs/kv-eval", "length", 4).as_posix()
    'runs/kv-eval/pieces/length-4x.parquet'
    """
    return Path(out) / KV_EVAL_PIECES / f"{task}-{factor}x.parquet"


FIGURES: dict[str, dict[str, str]] = {
    "dynamics": {
        "accuracy": "fig2a_accuracy",
        "scores": "fig2b_scores",
        "entropy": "fig6_entropy",
        "purity": "fig7_purity",
        "roles": "fig7_roles",
    },
    "geometry": {"frequency": "fig8_frequency", "qk_plane": "fig4b_qk_plane"},
    "theory": {"discrepancy": "fig5a"},
    "lengthgen": {"lengthgen": "fig5b", "head_retention": "head_retention"},
    "discrepancy": {"gaps": "fig_discrepancy"},
    "llm-scores": {"heads": "heads", "planes": "planes"},
    "llm-bench": {"bench": "bench"},
    "atlas": {"maps": "maps", "scatter": "scatter"},
    "sweep": {"aggregate": "aggregate"},
    "kv-eval": {"accuracy": "accuracy"},
    "ablate": {"conditions": "ablation"},
    "finetune": {"conditions": "finetune"},
}
"""The figures each command draws into its output directory, by name: file stems, each written as
stem.png and stem.svg (`posym.figures.save_figure`). Writers and readers (`posym report`) ask
`figure_file` (or, inside a run, `RunDir.analysis_figure`). An llm-study's figures live in its
`StudyDir.figures`."""


def figure_file(out: str | Path, command: str, name: str) -> Path:
    """The stem of figure `name` (a key of `FIGURES[command]`) in `out`, the output directory of `command`.

    >>> figure_file("runs/number/lengthgen", "lengthgen", "lengthgen").as_posix()
    'runs/number/lengthgen/fig5b'
    >>> figure_file("out", "atlas", "map")
    Traceback (most recent call last):
    ...
    ValueError: atlas draws no 'map' (maps, scatter)
    """
    return Path(out) / _named(FIGURES, "figures", "draws", command, name)


TRIALS = "trials"
"""The folder of `posym sweep`'s trials (one run directory per trial)."""
MODELS = "models"
"""The folder of the models `posym finetune --save-models` keeps (one per condition)."""
CAUSAL_PARTIAL = "causal_partial.parquet"
"""The rows so far of scripts/atlas_causal.py's causal check in an atlas directory (removed once complete)."""


# ---- an llm-study's directory ----------------------------------------------------------------------

STUDY_FILES: dict[str, dict[str, str]] = {
    "scores": {
        "scores": "scores.parquet",
        "heads": "heads.parquet",
        "prompts": "prompts.parquet",
        "sinks": "sinks.json",
    },
    "profile": {
        "layers": "layers.parquet",
        "labels": "labels.parquet",
        "agreement": "agreement.parquet",
        "sink_changes": "sink_changes.parquet",
        "profile": "profile.json",
    },
    "frequency": {"planes": "planes.parquet", "behaviour": "behaviour.parquet", "frequency": "frequency.json"},
    "discrepancy": {"gaps": "gaps.parquet", "discrepancy": "discrepancy.json"},
    "bench": FILES["llm-bench"],
    "ablation": {"ablation": "ablation.parquet", "ablation_summary": "ablation_summary.parquet"},
    "screen": {"screen": "screen.parquet", "summary": "summary.parquet", "choice": "screen.json"},
    "lengths": {
        "accuracy": "accuracy.parquet",
        "accuracy_summary": "accuracy_summary.parquet",
        "accuracy_tests": "accuracy_tests.parquet",
        "heads": "heads.parquet",
        "measures": "measures.parquet",
        "head_retention": "head_retention.parquet",
        "group_retention": "group_retention.parquet",
        "label_moves": "label_moves.parquet",
        "lengths": "lengths.json",
    },
    "causal": {
        "causal": "causal.parquet",
        "causal_summary": "causal_summary.parquet",
        "estimates": "estimates.parquet",
        "calibration": "calibration.parquet",
        "calibration_points": "calibration_points.parquet",
    },
    "confirm": {
        "plan": "plan.yaml",
        "points": "points.parquet",
        "confirm": "confirm.parquet",
        "record": "confirm.json",
    },
}
"""An llm-study's folders and, in each, its files by name: one folder per stage (`STUDY_STAGES`; the bench
folder also holds llm-bench's figure) and `confirm/`, the confirmatory causal test of
scripts/causal_confirm.py. Writers and readers ask `StudyDir.file(folder, name)`."""
STUDY_STAGES = ("scores", "profile", "frequency", "discrepancy", "bench", "ablation", "screen", "lengths", "causal")
"""`posym llm-study`'s stages in the order they run; each writes the folder of its name."""
PREDICTION_STAGES = STUDY_STAGES[6:]
"""The stages that ask whether a head's label predicts its fate at length (screen, lengths, causal); the
first six are the papers' lens (scores to ablation)."""


@dataclass(frozen=True)
class StudyDir:
    """A `posym llm-study` output directory, its layout written and read through here:
    `study.yaml` (the config a re-run must match), `manifest.json`, `stages/` (done-files), one folder per
    stage holding `STUDY_FILES[stage]`, `figures/`, `report.html`, `explorer.html`.

    >>> study = StudyDir(Path("docs/results/llm-study"))
    >>> study.file("lengths", "heads").as_posix(), study.file("screen", "choice").name
    ('docs/results/llm-study/lengths/heads.parquet', 'screen.json')
    >>> study.file("lengths", "head")
    Traceback (most recent call last):
    ...
    ValueError: an llm-study's lengths/ holds no 'head' (accuracy, accuracy_summary, accuracy_tests, heads, measures, head_retention, group_retention, label_moves, lengths)
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def marker(self) -> Path:
        """study.yaml: the resolved StudyConfig."""
        return self.path / STUDY_MARKER

    @property
    def manifest(self) -> Path:
        """manifest.json: versions, seed, config hash and the model's identity."""
        return self.path / "manifest.json"

    @property
    def figures(self) -> Path:
        """figures/: the report's figures (PNG, and SVG where drawn)."""
        return self.path / REPORT_FIGURES

    @property
    def report(self) -> Path:
        """report.html."""
        return self.path / REPORT

    @property
    def explorer(self) -> Path:
        """explorer.html: the report's tables-only head explorer."""
        return self.path / EXPLORER

    def folder(self, name: str) -> Path:
        """The folder of a stage (or `confirm`)."""
        if name not in STUDY_FILES:
            raise ValueError(f"an llm-study has no folder {name!r} ({', '.join(STUDY_FILES)})")
        return self.path / name

    def pieces(self, stage: str) -> Path:
        """`stage`/pieces/: the finished pieces of a long stage, kept until its tables are written (a killed
        run resumes at the first missing one)."""
        return self.folder(stage) / "pieces"

    def piece(self, stage: str, name: str) -> Path:
        """One kept piece of `stage`, a Parquet table: `stage`/pieces/`name`.parquet."""
        return self.pieces(stage) / f"{name}.parquet"

    def file(self, folder: str, name: str) -> Path:
        """The file `name` (a key of `STUDY_FILES[folder]`) in `folder`."""
        where = self.folder(folder)  # an unknown folder fails here
        names = STUDY_FILES[folder]
        if name not in names:
            raise ValueError(f"an llm-study's {folder}/ holds no {name!r} ({', '.join(names)})")
        return where / names[name]


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
    return StudyDir(path).marker.is_file()


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
        "llm-scores": lambda: all(output_file(path, "llm-scores", n).is_file() for n in ("summary", "heads", "scores")),
        "pipeline": lambda: (path / PIPELINE_MARKER).is_file(),
        "run": lambda: RunDir(path).config.is_file(),
        "study": lambda: StudyDir(path).file("scores", "heads").is_file(),
        "theory": lambda: (path / "theory.json").is_file(),
        "bench": lambda: all(output_file(path, "llm-bench", n).is_file() for n in ("table", "summary")),
    }
    return next((kind for kind in KINDS if kind in among and holds[kind]()), None)


# ---- what each command writes into its output directory ---------------------------------------------

ANY_SUFFIX = ("dynamics", "geometry", "theory", "lengthgen", "discrepancy", "sweep")
"""Commands whose figures `OUTPUTS` owns as stem.* (any suffix); the others' as stem.png and stem.svg."""


def _owns(command: str, *extras: str) -> tuple[str, ...]:
    """`command`'s files (`FILES`), its figures (`FIGURES`, as `ANY_SUFFIX` says) and `extras`."""
    suffixes = (".*",) if command in ANY_SUFFIX else (".png", ".svg")
    figures = [f"{stem}{suffix}" for stem in FIGURES.get(command, {}).values() for suffix in suffixes]
    return (*FILES.get(command, {}).values(), *figures, *extras)


_ANALYSIS = (*_owns("dynamics"), *_owns("geometry"))  # posym dynamics and posym geometry (both default to RUN/analysis)

OUTPUTS: dict[str, tuple[str, ...]] = {
    "dynamics": _ANALYSIS,
    "geometry": _ANALYSIS,
    "theory": _owns("theory"),
    "lengthgen": _owns("lengthgen"),
    "discrepancy": _owns("discrepancy"),
    "report": (REPORT, REPORT_FIGURES, EXPLORER),
    "sweep": _owns("sweep", TRIALS, STAGES),
    "ablate": _owns("ablate"),
    "finetune": _owns("finetune", MODELS),
    "attribute": _owns("attribute"),
    "llm-scores": _owns("llm-scores"),
    "atlas": _owns("atlas", CAUSAL_PARTIAL),
    "llm-bench": _owns("llm-bench"),
    "kv-policy": _owns("kv-policy"),
    "kv-eval": _owns("kv-eval", KV_EVAL_PROMPTS.format(task="*"), KV_EVAL_PIECES, STAGES),
}
"""Glob patterns of the entries each command writes in its output directory, built from `FILES` and
`FIGURES`: `posym.io.check_output` refuses an existing directory holding anything else (a re-run into the
command's own output is fine; a directory of other files is never written into, nor replaced). kv-eval's
entry lists its layout; its guard is its marker (`KV_EVAL_MARKER`)."""


# ---- posym's cache ---------------------------------------------------------------------------------

CACHE_ENV = "POSYM_CACHE_DIR"
"""Environment variable naming the cache directory (default $XDG_CACHE_HOME/posym, else ~/.cache/posym)."""


def cache_dir() -> Path:
    """Where posym keeps files it builds once (assembled embedded models, their dequantized copies):
    $POSYM_CACHE_DIR, else $XDG_CACHE_HOME/posym, else ~/.cache/posym."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posym"
