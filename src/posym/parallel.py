"""Independent pieces of CPU work split over forked processes, one torch thread each.

On a small CPU a 135M-parameter model's forward does not use every core fully from one process
(SmolLM2, 896-token prompts, 2 cores: two forked 1-thread processes finish the same forwards 1.08x
faster than one 2-thread process, docs/benchmarks/forked_map.json; more cores, more workers).
`forked_map` runs `fn` over items in
`workers` processes forked from this one: they share the loaded model's weights copy-on-write and the
forward hooks registered on it (an ablation entered before the call applies in every worker), return
their results through a pipe (so results must pickle; `fn` need not), and ignore Ctrl-C, which stays
the parent's to handle (it terminates them). Where forking is wrong (a model on a GPU, a platform
without fork) or pointless (one worker, one item), it is a plain loop in this process.

Results are those of the same work run alone, up to the floating-point order of one thread against
several (SmolLM2's logits came out identical in the benchmark; a greedy answer could flip only on a
near tie).

>>> forked_map(lambda x: x * x, [1, 2, 3], workers=2)
[1, 4, 9]
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from typing import Callable

from posym.errors import STOP_SIGNALS

_JOB: tuple[Callable, list] | None = None
"""The function and items of the running `forked_map`, inherited by its forked workers."""


def cpu_workers(requested: int = 0, model=None) -> int:
    """Processes `forked_map` should use: `requested` when > 0, else one per CPU this process may run
    on; 1 when the model is not on the CPU or the platform cannot fork."""
    if model is not None and next(model.parameters()).device.type != "cpu":
        return 1
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if requested > 0:
        return requested
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def nested() -> bool:
    """Whether this is a `forked_map` worker (or a `forked_map` runs here): another one would not nest."""
    return _JOB is not None


@contextlib.contextmanager
def torch_threads(count: int):
    """torch's intra-op threads set to `count` for the body, then back to what they were."""
    import torch

    before = torch.get_num_threads()
    if before != count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the `forked_map` workers), in seconds."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def forked_map(fn: Callable, items, *, workers: int, progress: Callable | None = None) -> list:
    """[fn(item) for item in items], in order, over `workers` forked 1-thread processes (a plain loop
    for workers <= 1 or a single item). progress(1) is called in this process as each item finishes."""
    global _JOB
    items = list(items)
    workers = min(workers, len(items))
    if workers <= 1:
        out = []
        for item in items:
            out.append(fn(item))
            if progress:
                progress(1)
        return out
    if _JOB is not None:
        raise RuntimeError("forked_map does not nest")
    _JOB = (fn, items)
    # Fork with the stop signals blocked: a child signalled before its initializer ran would otherwise run the
    # parent's handler (posym.io.handle_signals raises), and an exception escaping right after fork() runs
    # the parent's code on in the child (under pytest-xdist: a second "worker" reporting an interrupt).
    # Blocked, such a signal waits until _start_worker has set the child's own dispositions.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_start_worker)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # the parent's pending signals arrive now
    try:
        out = []
        for result in pool.imap(_run, range(len(items))):  # chunks of one item: the slowest one is last alone
            out.append(result)
            if progress:
                progress(1)
        pool.close()
        return out
    finally:
        pool.terminate()
        pool.join()
        _JOB = None


_SIGNALS = set(STOP_SIGNALS)
"""The signals forked workers are created with blocked (forked_map) and then handle themselves."""


def worker_signals() -> None:
    """A worker process's stop signals: Ctrl-C (sent to the whole process group) is the parent's, which
    stops its workers itself and says what was kept; the others kill the worker at once, never running the
    parent's handler (`posym.io.handle_signals`) that the fork copied."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in _SIGNALS - {signal.SIGINT}:
        signal.signal(signum, signal.SIG_DFL)


def _start_worker() -> None:
    import torch

    torch.set_num_threads(1)
    worker_signals()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)  # forked blocked (forked_map): a pending one lands here


def _run(index: int):
    fn, items = _JOB
    return fn(items[index])
