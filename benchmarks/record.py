"""What every benchmark JSON under docs/benchmarks/ records besides its figures: date, machine, load, versions;
and the process's own memory figures the benchmarks measure with.

    from record import benchmark_header, proc_status
    write_json(path, {**benchmark_header(threads, load_at_start), ...figures})
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

from posym.io import versions


def benchmark_header(threads: int | None, load_at_start: tuple[float, float, float]) -> dict:
    """Date (UTC), machine (platform, CPUs, torch threads (None: the benchmark times other processes),
    1/5/15-min load average at start and now) and versions."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch_threads": threads,
            "load_average_at_start": list(load_at_start),
            "load_average_at_end": list(os.getloadavg()),
        },
        "versions": versions(),
    }


def proc_status(key: str) -> int:
    """A memory field of /proc/self/status in bytes (VmRSS, VmHWM: the resident set and its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)
