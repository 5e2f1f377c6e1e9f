"""posym.parallel: forked_map keeps order and results, runs in other processes with one thread each,
inherits the model's hooks, hands errors back, and is a plain loop where forking is wrong."""

from __future__ import annotations

import os

import pytest
import torch
from tiny_models import tiny_model

from posym import parallel
from posym.core.interventions import ablated


def test_forked_map_keeps_order_and_runs_in_one_thread_workers():
    seen = []
    out = parallel.forked_map(
        lambda x: (x * x, os.getpid(), torch.get_num_threads()), range(7), workers=2, progress=lambda k: seen.append(k)
    )
    assert [r[0] for r in out] == [x * x for x in range(7)] and seen == [1] * 7
    pids = {r[1] for r in out}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2  # forked workers did the work
    assert {r[2] for r in out} == {1}
    assert parallel._JOB is None  # cleared for the next call


def test_forked_map_is_a_plain_loop_for_one_worker_or_one_item():
    assert parallel.forked_map(lambda x: os.getpid(), [0, 1], workers=1) == [os.getpid()] * 2
    assert parallel.forked_map(lambda x: os.getpid(), [0], workers=4) == [os.getpid()]
    assert parallel.forked_map(lambda x: x, [], workers=2) == []


def test_forked_map_hands_a_worker_error_back():
    def fail(x):
        if x == 3:
            raise ValueError("item 3")
        return x

    with pytest.raises(ValueError, match="item 3"):
        parallel.forked_map(fail, range(5), workers=2)
    assert parallel.forked_map(lambda x: x + 1, [1, 2], workers=2) == [2, 3]  # usable again


def test_workers_inherit_the_models_hooks():
    """An ablation entered before the call applies in the workers: their logits equal the parent's
    ablated logits, not the clean ones."""
    model = tiny_model("llama")
    prompts = [torch.tensor([[3, 5, 7, 9, 11, 2]]), torch.tensor([[4, 6, 8, 10, 12, 1]])]

    def logits(ids):
        with torch.no_grad():
            return model(input_ids=ids).logits[0, -1]

    clean = [logits(p) for p in prompts]
    with ablated(model, [(1, 0), (1, 3)], "zero"):
        here = [logits(p) for p in prompts]
        there = parallel.forked_map(logits, prompts, workers=2)
    for a, b, c in zip(here, there, clean):
        assert torch.allclose(a, b, atol=1e-9, rtol=0) and not torch.allclose(a, c)


def test_cpu_workers(monkeypatch):
    assert parallel.cpu_workers(3) == 3
    assert parallel.cpu_workers(0) == len(os.sched_getaffinity(0))
    model = tiny_model("llama", dtype=torch.float32)
    assert parallel.cpu_workers(4, model) == 4
    monkeypatch.setattr(parallel.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert parallel.cpu_workers(4) == 1  # no fork: a plain loop


def test_cpu_seconds_count_the_workers():
    def spin(_):
        end = os.times().user + 0.3
        while os.times().user < end:
            pass

    before = parallel.cpu_seconds()
    parallel.forked_map(spin, range(2), workers=2)
    assert parallel.cpu_seconds() - before >= 0.5  # two workers' 0.3 s each, though this process only waited


def test_a_worker_terminated_before_its_initializer_dies_quietly(monkeypatch, capfd):
    """Workers fork with the stop signals blocked: one that pool.terminate() hits before its initializer
    ran (here: held back 2 s) must not run the parent's raising handler (posym.io.handle_signals, which
    every in-process CLI call installs): that printed a Signalled traceback, and an exception escaping
    right after fork() runs the parent's own code on in the child (under xdist: a crashed worker)."""
    import multiprocessing
    import signal
    import time

    from posym import io
    from posym.errors import STOP_SIGNALS

    started = multiprocessing.get_context("fork").Value("i", 0)
    original = parallel._start_worker

    def held_back():
        with started.get_lock():
            started.value += 1
            late = started.value > 1
        if late:
            time.sleep(2)  # still here when the first worker's failure terminates the pool
        original()

    def fail(x):
        if x == 3:
            raise ValueError("item 3")
        return x

    saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        for s in saved:
            signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
        io.handle_signals()
        monkeypatch.setattr(parallel, "_start_worker", held_back)
        with pytest.raises(ValueError, match="item 3"):
            parallel.forked_map(fail, range(5), workers=2)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    err = capfd.readouterr().err
    assert "Signalled" not in err and "Traceback" not in err, err
