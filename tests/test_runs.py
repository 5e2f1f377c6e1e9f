"""posym.runs: the layouts on disk, named once (issue 54)."""

from __future__ import annotations

import ast
import doctest
import re
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from test_architecture import PACKAGE, copy_package

from posym import runs
from posym.runs import (
    FIGURES,
    FILES,
    OUTPUTS,
    STUDY_FILES,
    STUDY_STAGES,
    RunDir,
    StudyDir,
    figure_file,
    kind_of,
    kv_eval_prompts,
    output_file,
)

ROOT = Path(__file__).resolve().parents[1]


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
    with pytest.raises(ValueError, match=r"posym names no files of 'report' \(dynamics, geometry"):
        output_file("x", "report", "report")
    with pytest.raises(ValueError, match=r"atlas writes no 'agreement' \(atlas, atlas_kv, retrieval"):
        output_file("x", "atlas", "agreement")
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


def test_every_named_file_and_figure_resolves():
    for command, names in FILES.items():
        assert len(set(names.values())) == len(names), command  # no file named twice in one directory
        for key, name in names.items():
            assert output_file("out", command, key) == Path("out", name)
    for command, stems in FIGURES.items():
        assert len(set(stems.values())) == len(stems), command
        for key, stem in stems.items():
            assert figure_file("out", command, key) == Path("out", stem) and "." not in stem
    analyses = {"dynamics": "analysis", "geometry": "analysis", "lengthgen": "lengthgen", "discrepancy": "discrepancy"}
    for command, folder in analyses.items():
        for key, stem in FIGURES[command].items():
            assert RunDir("run").analysis_figure(command, key) == Path("run", folder, stem)
    assert kv_eval_prompts("out", "vartrack") == Path("out/prompts_vartrack.parquet")


def test_an_unknown_figure_is_a_programming_error():
    with pytest.raises(ValueError, match=r"atlas draws no 'map' \(maps, scatter\)"):
        figure_file("x", "atlas", "map")
    with pytest.raises(ValueError, match=r"posym names no figures of 'attribute' \(dynamics, geometry"):
        figure_file("x", "attribute", "effects")
    with pytest.raises(ValueError, match=r"'theory' is not an analysis of a run"):
        RunDir("run").analysis_figure("theory", "discrepancy")


# OUTPUTS as it was before FILES and FIGURES named the atlas', attribute's, sweep's, kv-policy's, ablate's
# and finetune's files and every command's figures (issue 54): what posym.io.check_output accepted then.
_ANALYSIS_BEFORE = (
    *FILES["dynamics"].values(),
    *("fig2a_accuracy.*", "fig2b_scores.*", "fig6_entropy.*", "fig7_purity.*", "fig7_roles.*"),
    *FILES["geometry"].values(),
    *("fig8_frequency.*", "fig4b_qk_plane.*"),
)
OUTPUTS_BEFORE = {
    "dynamics": _ANALYSIS_BEFORE,
    "geometry": _ANALYSIS_BEFORE,
    "theory": (*FILES["theory"].values(), "fig5a.*"),
    "lengthgen": (*FILES["lengthgen"].values(), "fig5b.*", "head_retention.*"),
    "discrepancy": (*FILES["discrepancy"].values(), "fig_discrepancy.*"),
    "report": ("report.html", "figures", "explorer.html"),
    "sweep": ("trials", "trials.parquet", "aggregate.parquet", "aggregate.*", "sweep.json", "stages"),
    "ablate": ("ablation.parquet", "ablation.json", "ablation.png", "ablation.svg"),
    "finetune": ("finetune.parquet", "finetune.json", "finetune.png", "finetune.svg", "models"),
    "attribute": ("effects.parquet", "heads.parquet", "summary.json"),
    "llm-scores": (*FILES["llm-scores"].values(), "heads.png", "heads.svg", "planes.png", "planes.svg"),
    "atlas": (
        *("atlas.parquet", "atlas_kv.parquet", "retrieval.parquet", "needles.parquet"),
        *("causal*.parquet", "agreement_*.parquet", "compare.parquet", "compare_confusion.parquet"),
        *("full_attention_heads.tsv", "full_attention_mask.tsv", "maps.png", "maps.svg", "scatter.png"),
        *("scatter.svg", "atlas.yaml", "summary.json", "report.md"),
    ),
    "llm-bench": (*FILES["llm-bench"].values(), "bench.png", "bench.svg"),
    "kv-policy": ("full_attention_heads.tsv", "config.json"),
}
SCRIPT_EXTRAS = {"causal.json", "causal.md", "timing.json"}
"""What scripts/atlas_causal.py (and the atlas' timing record) add to a committed atlas: never posym atlas's own."""


def test_outputs_accept_what_they_accepted_before():
    """OUTPUTS, now built from FILES and FIGURES, owns the same entries as before; the atlas' two globs
    became its explicit names (and scripts/atlas_causal.py's causal_partial.parquet, which causal*.parquet
    held), and kv-eval (guarded by its marker) gained an entry."""
    assert set(OUTPUTS) == set(OUTPUTS_BEFORE) | {"kv-eval"}
    for command, before in OUTPUTS_BEFORE.items():
        if command != "atlas":
            assert set(OUTPUTS[command]) == set(before), command
    globs = {p for p in OUTPUTS_BEFORE["atlas"] if "*" in p}
    assert set(OUTPUTS_BEFORE["atlas"]) - globs <= set(OUTPUTS["atlas"])
    assert all(any(fnmatchcase(p, old) for old in OUTPUTS_BEFORE["atlas"]) for p in OUTPUTS["atlas"])  # no more
    for atlas in ("atlas-smollm2", "atlas-gemma3", "atlas-qwen2.5-coder-0.5b"):
        written = {p.name for p in (ROOT / "docs" / "results" / atlas).iterdir()} - SCRIPT_EXTRAS
        assert written and all(any(fnmatchcase(n, p) for p in OUTPUTS["atlas"]) for n in written), atlas
    kv_eval = {p.name for p in (ROOT / "docs" / "results" / "kv-eval-smollm2").iterdir()}
    assert all(any(fnmatchcase(n, p) for p in OUTPUTS["kv-eval"]) for n in kv_eval)


OUTPUT_NAME = re.compile(r"^[\w{}-][\w.{}-]*\.(parquet|json|tsv|yaml|md|png|svg)$")
"""A bare file name with an output's suffix (an f-string's placeholders as {}): prose and messages have spaces."""
SPELLED_ELSEWHERE = {
    "commands/convert.py": {"conversion.json"},  # posym convert's record
    "commands/run.py": {"pipeline.json"},  # posym run's record beside pipeline.yaml
    "commands/score.py": {"{}.json"},  # the JSON sidecar beside a score's Parquet file
    "commands/train.py": {"trainer_state.json"},  # inside a checkpoint
}
"""Names these modules still spell themselves (not yet in posym.runs)."""


def spelled_names(package: Path) -> list[str]:
    """Output names the commands (and posym.conditions) spell instead of asking posym.runs: string literals
    that are a bare output file name, and figure stems written as DIR / "stem" in a save_figure call (an
    llm-study's own figures under StudyDir.figures excepted)."""
    found = []
    for path in sorted([*(package / "commands").rglob("*.py"), package / "conditions.py"]):
        where = path.relative_to(package).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        for node in ast.walk(tree):
            text = _literal(node) if id(node) not in parts else None
            if text and OUTPUT_NAME.match(text) and text not in SPELLED_ELSEWHERE.get(where, ()):
                found.append(f"{where}:{node.lineno}: {text}")
            called = getattr(node, "func", None)
            if getattr(called, "id", getattr(called, "attr", None)) == "save_figure" and len(node.args) > 1:
                stem = node.args[1]
                spelled = _literal(stem) or isinstance(stem, ast.BinOp) and _literal(stem.right)
                if spelled and not ast.unparse(stem).startswith("study.figures /"):
                    found.append(f"{where}:{node.lineno}: figure {spelled}")
    return sorted(found)


def _literal(node) -> str | None:
    """A string constant's text, an f-string's with {} for each placeholder, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def test_commands_ask_runs_for_their_output_names():
    assert spelled_names(PACKAGE) == []


def test_a_spelled_output_name_is_found(tmp_path):
    copy = copy_package(tmp_path)
    (copy / "commands" / "bad.py").write_text(
        '"""Writes effects.parquet and a figure."""\n'
        "def f(out, task, fig):\n"
        '    write(out / "effects.parquet")\n'
        '    write(out / f"prompts_{task}.parquet")\n'
        '    save_figure(fig, out / "maps")\n'
        '    raise ValueError(f"{out} holds no summary.json")\n'
    )
    (copy / "conditions.py").write_text('def g(out, name):\n    return out / f"{name}.json"\n')
    assert spelled_names(copy) == [
        "commands/bad.py:3: effects.parquet",
        "commands/bad.py:4: prompts_{}.parquet",
        "commands/bad.py:5: figure maps",
        "conditions.py:2: {}.json",
    ]
