"""Stages of long jobs that survive being killed: done-files and worker processes tied to their parent.

`posym run` (each stage of each task) and `posym sweep` (each trial) skip work whose done-file
exists, so re-running the same command continues it; their worker processes call
`die_with_parent` so a killed run leaves no orphan still writing into its output directory.
"""

from __future__ import annotations

import ctypes
import signal
import time
from pathlib import Path
from typing import Any

from posym import io


def done_path(out: Path, job: str, stage: str) -> Path:
    """Where the done-file of `stage` of `job` (a task name or "theory") lives."""
    return Path(out) / io.STAGES / f"{job}-{stage}{io.DONE}"


def is_done(out: Path, job: str, stage: str) -> bool:
    """Whether `stage` of `job` finished (its done-file exists)."""
    return done_path(out, job, stage).is_file()


def mark_done(out: Path, job: str, stage: str, seconds: float, **info: Any) -> Path:
    """Write the done-file of a stage (atomically, after its outputs)."""
    return io.write_json(done_path(out, job, stage), {"job": job, "stage": stage, "seconds": round(seconds, 2),
                                                      "finished": time.time(), **info})


def die_with_parent() -> None:
    """Have Linux end this worker process when its parent dies (`posym run`'s pool initializer; a
    `posym sweep` trial in its Ray worker), so a killed run leaves no orphan still writing into the
    output directory a re-run is about to use."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux/glibc: workers end when they next read their queue
        pass
