"""posym run: the whole pipeline end to end on a tiny configuration, done-files and resuming."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from cli_runner import run_posym
from tiny_runs import PIPELINE as TINY

from posym import runs, stages
from posym.commands import run as pipeline


def _stamps(out: Path) -> dict:
    """Done-file contents (each holds its finish time) and checkpoint weight mtimes."""
    files = {p.name: p.read_text() for p in (out / "stages").glob("*.done.json")}
    files.update({str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.glob("*/checkpoints/*/model.safetensors")})
    return files


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.fixture(scope="module")
def finished(tiny_config, tmp_path_factory):
    """One end-to-end `posym run` (both tasks, 2 worker processes) and its captured output."""
    out = tmp_path_factory.mktemp("run") / "main"
    mp = pytest.MonkeyPatch()
    import io
    from contextlib import redirect_stdout

    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = run_posym(mp, "run", "--config", tiny_config, "--out", out, "--workers", 2)
    mp.undo()
    return code, buffer.getvalue(), out


def test_run_end_to_end(finished):
    code, printed, out = finished
    assert code == 0
    for job in ("number", "letter"):
        for stage in pipeline.TASK_STAGES:
            done = json.loads(runs.done_path(out, job, stage).read_text())
            assert done["job"] == job and done["stage"] == stage and done["seconds"] > 0 and done["cpu_seconds"] > 0
        assert (out / job / "analysis" / "dynamics.parquet").is_file()
        assert (out / job / "analysis" / "frequency.parquet").is_file()
        assert (out / job / "lengthgen" / "lengthgen.json").is_file()
        assert (out / job / "discrepancy" / "discrepancy.json").is_file()
        assert "step 12" in (out / job / "train.log").read_text()
    assert stages.is_done(out, "theory", "theory") and (out / "theory" / "fig5a.png").is_file()
    html = (out / "report" / "report.html").read_text()
    for stem in (
        "fig2a_accuracy",
        "fig2b_scores",
        "fig6_entropy",
        "fig7_purity",
        "fig4b_qk_plane",
        "fig8_frequency",
        "fig5b",
        "fig_discrepancy",
    ):
        for task in ("number", "letter"):
            assert f"figures/{task}-{stem}.png" in html
            assert (out / "report" / "figures" / f"{task}-{stem}.svg").is_file()
    assert "theory-fig5a" in html and "Table 3 (real models): absent" in html
    # the summary table names both tasks and the report path
    assert "number" in printed and "letter" in printed and "report: " in printed
    assert str(out / "report" / "report.html") in printed
    result = json.loads((out / "pipeline.json").read_text())
    assert [s["task"] for s in result["summary"]] == ["number", "letter"]
    assert result["summary"][0]["step"] == 12 and set(result["summary"][0]["acc_hops"]) == {"1", "2", "3", "4"}
    stored = yaml.safe_load((out / "pipeline.yaml").read_text())
    assert stored["train"] == TINY["train"] and stored["lengthgen"]["n"] == 16


def test_rerun_recomputes_only_missing_stages(finished, tiny_config, monkeypatch, capsys):
    _, _, out = finished
    before = _stamps(out)
    # drop one stage's done-file (as if killed during it): only that stage runs again
    runs.done_path(out, "letter", "lengthgen").unlink()
    # and the train stage of number (killed after its last checkpoint): train resumes, nothing to redo
    runs.done_path(out, "number", "train").unlink()
    assert run_posym(monkeypatch, "run", "--config", tiny_config, "--out", out, "--workers", 2) == 0
    after = _stamps(out)
    changed = {k for k in before if before[k] != after[k]}
    # every other stage was skipped (done-files and checkpoints untouched); train resumed from its
    # last checkpoint (step 12 = max_steps), so no checkpoint was rewritten
    assert changed == {"letter-lengthgen.done.json", "number-train.done.json"}
    assert len(before) == len(after) == 11 + 2 * 6  # 11 done-files; checkpoints 0, 1, 2, 4, 6, 12 per task


def test_other_config_on_same_out_is_refused(finished, tiny_config, monkeypatch, capsys):
    _, _, out = finished
    assert run_posym(monkeypatch, "run", "--config", tiny_config, "--out", out, "--task", "number") == 2
    err = capsys.readouterr().err
    assert err.startswith("posym: error: ") and "different config" in err and err.count("\n") == 1


def test_bad_pipeline_configs(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.yaml"
    for text, message in [
        ("dynamics_promts: 3\n", "unknown key 'dynamics_promts'"),
        ("train: {max_stepz: 3}\n", "unknown key 'max_stepz'"),
        ("tasks: [number, number]\n", "without repeats"),
        ("lengthgen: {protocol: nope}\n", "protocol must be one of"),
        ("train: 5\n", "train must be a mapping"),
    ]:
        bad.write_text(text)
        assert run_posym(monkeypatch, "run", "--config", bad, "--out", tmp_path / "o") == 2
        assert message in capsys.readouterr().err
    assert run_posym(monkeypatch, "run", "--out", tmp_path / "o", "--bench", tmp_path) == 2
    assert "is not a posym run, theory or llm-bench directory" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # validated before anything is written
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert run_posym(monkeypatch, "run", "--out", tmp_path / "full", "--preset", "quick") == 2
    assert "holds no pipeline.yaml" in capsys.readouterr().err


def test_resolve_pipeline_layers(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("seed: 3\npreset: paper\ntasks: [number]\ntrain: {max_steps: 7}\n")
    assert pipeline.resolve_pipeline(path).preset == "paper"
    assert pipeline.resolve_pipeline().preset == "quick"  # no file, no flags: the defaults
    config = pipeline.resolve_pipeline(path, {"preset": "seed", "tasks": ["letter"], "device": "cpu"})  # flags win
    assert (config.preset, config.tasks, config.seed, config.device) == ("seed", ["letter"], 3, "cpu")
    cfg = pipeline.train_config(config, "letter")
    assert (cfg.preset, cfg.max_steps, cfg.seed, cfg.device, cfg.model.n_head) == ("seed", 7, 3, "cpu", 8)


def _workers(pid: int) -> list[int]:
    """Live pool workers (spawned `spawn_main` processes) whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_text(errors="ignore")
        except (OSError, IndexError, ValueError):  # the process ended while we looked
            continue
        if parent == pid and "spawn_main" in cmdline and "tracker_fd" in cmdline:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text(errors="ignore")  # empty for a zombie
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_killed_run_leaves_no_worker(tiny_config, tmp_path):
    """SIGKILL of `posym run` takes its worker processes with it (no orphan keeps writing)."""
    import os
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "posym.cli",
            "run",
            "--config",
            str(tiny_config),
            "--out",
            str(tmp_path / "o"),
            "--workers",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started = tmp_path / "o" / "number" / "config.yaml"  # written once a worker is inside its first job
    deadline = time.time() + 120  # generous: under load (a busy CI machine) spawning takes long
    workers = []
    while time.time() < deadline and not (started.is_file() and len(workers) == 2):
        time.sleep(0.2)  # the second worker may still be spawning when the first one writes
        workers = _workers(proc.pid)
    assert started.is_file() and len(workers) == 2, "the workers did not start"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    assert not [p for p in workers if _alive(p)]


def test_explore_reads_the_run_output(finished, tmp_path, monkeypatch, capsys):
    """`posym explore` on a `posym run` output: one head set per task and query mode at the last step,
    the dynamics tables' numbers, and attention rows over the task's token names from the checkpoint;
    the report links its own tables-only explorer."""
    import base64

    import numpy as np
    import pandas as pd
    from browser import page_blocks, page_data

    from posym.explorer import unblock

    _, _, out = finished
    assert '<a href="explorer.html">' in (out / "report" / "report.html").read_text()
    assert "--no-details" in page_data(out / "report" / "explorer.html")["sets"][0]["note"]
    code = run_posym(
        monkeypatch, "explore", out, "--out", tmp_path / "e.html", "--detail-prompts", 2, "--device", "cpu"
    )
    assert code == 0 and "explorer: " in capsys.readouterr().out
    sets, blocks = page_data(tmp_path / "e.html")["sets"], page_blocks(tmp_path / "e.html")
    assert len(sets) == 2 * 4  # number and letter x hops, inner, last, target
    for s in sets:
        task, mode = s["name"].split(" ")[0], s["name"].split(", ")[-1].split(" ")[0]
        table = pd.read_parquet(out / task / "analysis" / "dynamics.parquet")
        rows = table[(table.step == table.step.max()) & (table.query_mode == mode)].sort_values(["layer", "head"])
        codes = np.frombuffer(base64.b64decode(s["maps"]["s_sym"]), dtype="<i2")
        assert np.abs(codes * 1e-4 - rows.s_sym.to_numpy()).max() <= 5e-5 + 1e-12
        prompts = [p for b in s["pages"] for p in unblock(blocks[b])["prompts"]]
        details = {int(k): unblock(blocks[b])["queries"] for k, b in s["details"].items()}
        assert s["note"] == "" and sorted(details) == [0, 1] and all(p["tokens"] for p in prompts[:2])
        for k in (0, 1):  # each mode's own queries (a hop chain's last, target, inner or every pointer)
            assert [d and d["query"] for d in details[k]] == prompts[k]["queries"]
            assert mode in ("hops", "inner") or len(prompts[k]["queries"]) == 1
        assert s["margins"] and s["planes"]
