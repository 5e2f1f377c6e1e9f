"""What every benchmark JSON under docs/benchmarks/ records besides its figures: date, machine, load, versions.

    from record import benchmark_header
    write_json(path, {**benchmark_header(threads, load_at_start), ...figures})
"""

from __future__ import annotations

import datetime
import os
import platform

from posym.io import versions


def benchmark_header(threads: int | None, load_at_start: tuple[float, float, float]) -> dict:
    """Date (UTC), machine (platform, CPUs, torch threads (None: the benchmark times other processes),
    1/5/15-min load average at start and now) and versions."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                        "cpus": os.cpu_count(), "torch_threads": threads,
                        "load_average_at_start": list(load_at_start), "load_average_at_end": list(os.getloadavg())},
            "versions": versions()}
