"""posym.io: a later write of the same path removes what killed writers left, and only that; a write
interrupted at any point leaves no temporary."""

import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading

import pytest

from posym import io


def _temporary_of(path, pid):
    return path.parent / f".{path.name}.tmp-{io._HOST}-{pid}-abc123"


def test_a_write_removes_temporaries_of_dead_writers_only(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_pid = int(dead.stdout)
    target = tmp_path / "table.parquet"
    killed_file = _temporary_of(target, dead_pid)
    killed_file.write_text("half")
    killed_dir = _temporary_of(tmp_path / "step-00000008", dead_pid)
    killed_dir.mkdir()
    (killed_dir / "model.safetensors").write_text("half")
    live = _temporary_of(target, os.getppid())  # a writer that still runs keeps its temporary
    live.write_text("being written")
    other_host = target.parent / f".{target.name}.tmp-elsewhere-{dead_pid}-abc123"  # pid means nothing here
    other_host.write_text("being written on another machine")
    other_name = _temporary_of(tmp_path / "table.parquet.bak", dead_pid)
    other_name.write_text("not this path's")

    io.write_text(target, "whole")
    assert target.read_text() == "whole"
    assert not killed_file.exists()
    assert live.exists() and other_host.exists() and other_name.exists() and killed_dir.exists()
    with io.atomic_path(tmp_path / "step-00000008", is_dir=True) as tmp:
        (tmp / "model.safetensors").write_text("whole")
    assert not killed_dir.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "step-00000008",
        "table.parquet",
    ]


def test_ctrl_c_while_the_temporary_is_created_leaves_none(tmp_path, monkeypatch):
    """A SIGINT that arrives while atomic_path creates its temporary (between mkstemp and the cleanup's
    `try`) is held back and raised once the temporary is named, so the cleanup removes it. Before, a
    Ctrl-C in that window (the guard test of Ctrl-C during `posym score` hit it under load) left the
    temporary behind."""
    real = tempfile.mkstemp
    main = threading.main_thread().ident

    def mkstemp_then_ctrl_c(*args, **kwargs):
        made = real(*args, **kwargs)
        signal.pthread_kill(main, signal.SIGINT)  # Python raises it at the next bytecode it runs, if not held
        return made

    monkeypatch.setattr(io.tempfile, "mkstemp", mkstemp_then_ctrl_c)
    before = signal.signal(
        signal.SIGINT, signal.default_int_handler
    )  # a test run started in the background inherits SIGINT ignored
    try:
        with pytest.raises(KeyboardInterrupt):
            with io.atomic_path(tmp_path / "out.txt") as tmp:
                tmp.write_text("never")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back
    finally:
        signal.signal(signal.SIGINT, before)
    assert list(tmp_path.iterdir()) == []


def test_an_error_after_the_temporary_exists_removes_it(tmp_path, monkeypatch):
    def chmod_fails(path, mode):
        raise KeyboardInterrupt

    monkeypatch.setattr(io.os, "chmod", chmod_fails)
    for is_dir in (False, True):
        with pytest.raises(KeyboardInterrupt):
            with io.atomic_path(tmp_path / f"out-{is_dir}", is_dir=is_dir):
                pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("umask, mode", [(0o002, 0o664), (0o022, 0o644), (0o077, 0o600)])
def test_the_lock_file_honours_the_umask(tmp_path, umask, mode):
    # the lock was created 0644 whatever the umask: a group-shared run directory (umask 002) got one file
    # its group could not write, unlike every other file posym writes
    old = os.umask(umask)
    try:
        with io.locked(tmp_path) as lock:
            assert stat.S_IMODE(lock.stat().st_mode) == mode
    finally:
        os.umask(old)
