"""The one stage runner of the long jobs (`posym run`, `posym llm-study`, `posym sweep`): work that survives
being killed and continues when the same command runs again.

- `resumable(out, kept)`: one process per output directory (`posym.io.locked`) and the Ctrl-C line that
  says what was kept (`posym.io.interruptible`);
- `claim(out, marker, config)`: the config of a resumable directory (its marker file: pipeline.yaml,
  study.yaml) is written once; a second run with another config, or a foreign non-empty directory, is
  refused with one line;
- `run_stage(out, job, stage, work)`: a stage runs unless its done-file exists, and its done-file
  (written atomically, after the stage's outputs) records its wall and CPU seconds;
- `die_with_parent`: worker processes tied to the driver, so a killed run leaves no orphan still
  writing into the directory a re-run is about to use.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from posym import io
from posym.errors import PosymError
from posym.parallel import cpu_seconds
from posym.runs import done_path


def is_done(out: Path, job: str, stage: str) -> bool:
    """Whether `stage` of `job` finished (its done-file exists)."""
    return done_path(out, job, stage).is_file()


def mark_done(out: Path, job: str, stage: str, seconds: float, **info: Any) -> Path:
    """Write the done-file of a stage (atomically, after its outputs)."""
    return io.write_json(
        done_path(out, job, stage),
        {"job": job, "stage": stage, "seconds": round(seconds, 2), "finished": time.time(), **info},
    )


def die_with_parent() -> None:
    """Have Linux end this worker process when its parent dies (`posym run`'s pool initializer; a
    `posym sweep` trial in its Ray worker), so a killed run leaves no orphan still writing into the
    output directory a re-run is about to use."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux/glibc: workers end when they next read their queue
        pass


@contextlib.contextmanager
def resumable(out: Path, kept: Callable[[], str]) -> Iterator[Path]:
    """Hold `out`'s lock for the body (a second process on the same output is refused) and, on Ctrl-C or
    SIGTERM, end with the one line `kept()` returns (what is kept, how to continue)."""
    with io.locked(out), io.interruptible(kept):
        yield Path(out)


def claim(out: Path, marker: str, config: dict, *, what: str) -> bool:
    """Write `config` as OUT/`marker` for a new output directory; for one that holds `marker`, refuse
    (PosymError) a config whose hash differs. A non-empty directory without `marker` (the lock file
    aside) is refused too. `what` names the job in the messages ("a run", "a study"). Returns True when
    the directory is new."""
    path = Path(out) / marker
    if path.is_file():
        if io.config_hash(io.read_yaml(path)) != io.config_hash(config):
            raise PosymError(
                f"{out} holds {what} with a different config (see {path}); re-run with the same "
                "config to continue it, or choose another --out"
            )
        return False
    if Path(out).exists() and any(p.name != io.LOCK for p in Path(out).iterdir()):
        raise PosymError(f"{out} exists, is not empty and holds no {marker}; choose another --out")
    io.write_yaml(path, config)
    return True


def kept_piece(path: Path, compute: Callable[[], Any]):
    """compute() (a DataFrame), written to `path` (Parquet); or the piece an interrupted run kept there.

    A long stage computed in pieces (a length, a layout) resumes after a kill at its first missing piece.
    The caller owns the directory and has refused another config or model for it, so what was kept is
    what compute() would give again; it removes the pieces once the stage's own tables are written."""
    if path.is_file():
        return io.read_parquet(path)
    frame = compute()
    io.write_parquet(path, frame)
    return frame


def run_stage(out: Path, job: str, stage: str, work: Callable[[], Any]) -> float | None:
    """Run `work` unless `stage` of `job` is done; then mark it done. Returns the wall seconds it took,
    or None when it was already done. The done-file also holds the stage's CPU seconds (this process,
    all threads, and its finished children): unlike wall time they do not grow when other programs share
    the cores."""
    if is_done(out, job, stage):
        return None
    start, cpu = time.perf_counter(), cpu_seconds()
    work()
    seconds = time.perf_counter() - start
    mark_done(out, job, stage, seconds, cpu_seconds=round(cpu_seconds() - cpu, 2))
    return seconds
