"""posym.runs: the layouts on disk, named once (issue 54)."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from posym import runs
from posym.runs import FILES, OUTPUTS, STUDY_FILES, STUDY_STAGES, RunDir, StudyDir, kind_of, output_file


def test_docstring_examples_run():
    assert doctest.testmod(runs).failed == 0


def test_a_study_file_is_its_folder_and_name():
    study = StudyDir("out")
    assert study.file("lengths", "heads") == Path("out/lengths/heads.parquet")
    assert study.file("screen", "choice") == Path("out/screen/screen.json")
    assert study.file("bench", "table") == Path("out/bench/table.md")
    assert study.file("confirm", "record") == Path("out/confirm/confirm.json")
    assert (study.marker.name, study.manifest.name, study.report.name, study.explorer.name) == (
        "study.yaml",
        "manifest.json",
        "report.html",
        "explorer.html",
    )


def test_an_unknown_study_name_is_a_programming_error():
    with pytest.raises(ValueError, match=r"lengths/ holds no 'head' \(accuracy"):
        StudyDir("out").file("lengths", "head")
    with pytest.raises(ValueError, match=r"has no folder 'length' \(scores, profile"):
        StudyDir("out").file("length", "heads")
    with pytest.raises(ValueError, match=r"has no folder 'figures'"):
        StudyDir("out").folder("figures")


def test_every_stage_has_a_folder_and_no_file_is_named_twice_in_one():
    assert set(STUDY_STAGES) <= set(STUDY_FILES) and STUDY_FILES["bench"] is FILES["llm-bench"]
    for names in STUDY_FILES.values():
        assert len(set(names.values())) == len(names)


def test_outputs_list_what_the_layouts_name():
    """What a command may write (OUTPUTS, io.check_output's guard) holds every file FILES names for it."""
    for command, names in FILES.items():
        assert set(names.values()) <= set(OUTPUTS[command]), command
    assert {runs.REPORT, runs.EXPLORER} <= set(OUTPUTS["report"])


def test_an_output_file_is_its_directory_and_name():
    assert output_file("x", "llm-scores", "excluded") == Path("x/scores_excluded.parquet")
    assert output_file("x", "theory", "discrepancy") == Path("x/discrepancy.parquet")
    run = RunDir(Path("runs/number"))
    assert run.analysis_file("geometry", "frequency") == Path("runs/number/analysis/frequency.parquet")
    assert run.analysis_file("lengthgen", "head_groups") == Path("runs/number/lengthgen/head_groups.parquet")
    with pytest.raises(ValueError, match=r"lengthgen writes no 'groups' \(lengthgen, head_retention"):
        output_file("x", "lengthgen", "groups")
    with pytest.raises(ValueError, match=r"posym names no files of 'atlas'"):
        output_file("x", "atlas", "atlas")
    with pytest.raises(ValueError, match=r"'theory' is not an analysis of a run"):
        run.analysis_file("theory", "record")


@pytest.mark.parametrize(
    "kind, files",
    [
        ("llm-scores", [FILES["llm-scores"][n] for n in ("summary", "heads", "scores")]),
        ("bench", [FILES["llm-bench"][n] for n in ("table", "summary")]),
        ("study", ["scores/heads.parquet"]),
    ],
)
def test_kind_of_reads_the_layouts(tmp_path, kind, files):
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert kind_of(tmp_path) == kind
    (tmp_path / files[-1]).unlink()  # one file short: not that kind any more
    assert kind_of(tmp_path) != kind
