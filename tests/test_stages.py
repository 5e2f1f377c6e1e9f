"""posym.stages: the stage runner `posym run`, `posym llm-study` and `posym sweep` share (done-files, the
config a resumable directory holds, the lock and the Ctrl-C line)."""

import pytest

from posym import io, runs, stages
from posym.errors import Interrupted, PosymError


def test_a_stage_is_marked_done_only_after_it_succeeds(tmp_path):
    calls = []

    def fail():
        calls.append("fail")
        raise PosymError("boom")

    with pytest.raises(PosymError, match="^boom$"):
        stages.run_stage(tmp_path, "number", "train", fail)
    assert not stages.is_done(tmp_path, "number", "train")
    assert stages.run_stage(tmp_path, "number", "train", lambda: calls.append("ok")) >= 0
    assert stages.is_done(tmp_path, "number", "train")
    assert stages.run_stage(tmp_path, "number", "train", lambda: calls.append("again")) is None  # done: skipped
    assert calls == ["fail", "ok"]
    done = io.read_json_object(runs.done_path(tmp_path, "number", "train"))
    assert {"seconds", "cpu_seconds", "finished"} <= set(done) and done["stage"] == "train"
    assert not list((tmp_path / "stages").glob(".*"))  # atomic: no temporary leftovers


def test_claim_writes_the_config_once_and_refuses_another(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert stages.claim(out, "job.yaml", {"seed": 0}, what="a job") is True
    assert io.read_yaml(out / "job.yaml") == {"seed": 0}
    assert stages.claim(out, "job.yaml", {"seed": 0}, what="a job") is False  # the same config continues
    with pytest.raises(PosymError, match="holds a job with a different config"):
        stages.claim(out, "job.yaml", {"seed": 1}, what="a job")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(PosymError, match="is not empty and holds no job.yaml"):
        stages.claim(foreign, "job.yaml", {"seed": 0}, what="a job")
    assert not (foreign / "job.yaml").exists()


def test_resumable_holds_the_lock_and_says_what_was_kept(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(Interrupted, match="kept 2 stages"):
        with stages.resumable(out, lambda: "kept 2 stages"):
            assert (out / io.LOCK).exists()
            raise KeyboardInterrupt
    with stages.resumable(out, lambda: "kept nothing"):  # the lock was released on the way out
        pass
