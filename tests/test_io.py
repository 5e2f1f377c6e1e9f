"""posym.io: a later write of the same path removes what killed writers left, and only that."""

import os
import subprocess
import sys

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
