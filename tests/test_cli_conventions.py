"""Every command speaks the command line's one vocabulary (posym.cli.options; docs/cli.md), checked by
walking each command's Click parameters, so a command added later is held to it too."""

from __future__ import annotations

import re
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from posym.cli import app, main

GROUP = typer.main.get_command(app)
COMMANDS = sorted(GROUP.commands)
READS_A_MODEL = {
    "score",
    "eval",
    "dynamics",
    "geometry",
    "lengthgen",
    "discrepancy",
    "ablate",
    "finetune",
    "llm-scores",
    "llm-bench",
    "convert",
    "atlas",
    "kv-policy",
    "kv-eval",
}
"""Commands whose input is a model or run: it is the positional PATH."""
CHOICE_OPTIONS = {
    "--task",
    "--queries",
    "--query",
    "--device",
    "--preset",
    "--split",
    "--format",
    "--compare",
    "--protocol",
    "--dtype",
    "--markers",
    "--mode",
    "--exact",
    "--policy",
}
"""Options with a fixed set of values: help and completion must list them."""
INTERNAL_WORDS = ("SPEC", "seed summary", "2511 variant")


def options(name: str) -> list:
    # typer bundles its own click: tell options from arguments by kind, not by class
    return [p for p in GROUP.commands[name].params if p.param_type_name == "option"]


def option_names(param) -> list[str]:
    return [*param.opts, *param.secondary_opts]


def help_text(name: str) -> str:
    result = CliRunner().invoke(app, [name, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


def test_commands_are_known():
    # the walk below covers what the app registers; a missing command here would mean a broken import
    assert {"score", "train", "run", "report", "sweep"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(READS_A_MODEL & set(GROUP.commands)))
def test_model_or_run_is_the_positional_path(name):
    arguments = [p for p in GROUP.commands[name].params if p.param_type_name == "argument"]
    assert arguments and arguments[0].name == "path" and arguments[0].metavar == "PATH", name
    assert not {"--model", "--run", "--run-dir", "--model-dir", "--checkpoint"} & {
        n for p in options(name) for n in option_names(p)
    }


@pytest.mark.parametrize("name", COMMANDS)
def test_one_name_per_meaning(name):
    names = [n for p in options(name) for n in option_names(p)]
    # counts of prompts / sequences / questions are --n; optimizer steps are --train-steps, --step a checkpoint
    assert not [n for n in names if re.fullmatch(r"--(n-\w.*|num.*|n-prompts|count|steps)", n)], names
    step = [p for p in options(name) if "--step" in p.opts]
    if step:
        assert "Checkpoint step" in (step[0].help or "")


@pytest.mark.parametrize("name", COMMANDS)
def test_device_defaults_to_auto(name):
    for param in options(name):
        if "--device" in param.opts:
            default = param.default.value if hasattr(param.default, "value") else param.default
            # None only where a config file may set it; the help says the fallback is auto
            assert default == "auto" or (default is None and "else auto" in param.help), name


@pytest.mark.parametrize("name", COMMANDS)
def test_choices_are_declared(name):
    for param in options(name):
        if set(param.opts) & CHOICE_OPTIONS:
            shown = param.get_help_record(typer.Context(GROUP.commands[name]))[0]
            assert "|" in shown, (name, param.opts, shown)


@pytest.mark.parametrize("name", COMMANDS)
def test_list_options_take_commas_and_repeats(name):
    for param in options(name):
        if param.multiple and param.metavar != "HEADS":  # HEADS: one condition per repetition
            assert param.metavar and param.metavar.endswith("[,...]"), (name, param.opts)
        if not param.multiple:
            assert "comma-separated" not in (param.help or "").lower(), (name, param.opts)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_reads_cleanly(name):
    text = help_text(name)
    usage = text.splitlines()[0]
    assert "{" not in usage and "}" not in usage, usage
    assert "<bool>" not in text
    assert not [w for w in INTERNAL_WORDS if w in text], name


def test_version(capsys, monkeypatch):
    import posym

    monkeypatch.setattr(sys, "argv", ["posym", "--version"])
    try:
        main()
    except SystemExit as stop:
        assert stop.code in (0, None)
    assert capsys.readouterr().out.strip() == f"posym {posym.__version__}"


def test_sweep_without_ray_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an install without the [sweep] extra looks like
    monkeypatch.setattr(sys, "argv", ["posym", "sweep", str(tmp_path / "sweep.yaml")])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.count("\n") == 1 and err.startswith("posym: error: ") and "posym-rope[sweep]" in err


def test_lists_accept_commas_and_repeats():
    from posym.cli.options import Task, values
    from posym.errors import PosymError

    assert values(["17,34", "68"], int, option="--lengths") == [17, 34, 68]
    assert values(["number", "letter"], option="--task", choices=Task) == ["number", "letter"]
    with pytest.raises(PosymError, match="--task takes number, letter"):
        values(["number,word"], option="--task", choices=Task)
    with pytest.raises(PosymError, match="--lengths"):
        values(["17,x"], int, option="--lengths")


def test_documented_options_exist():
    """Every `posym COMMAND ... --option` in the README, docs, scripts and examples names a real option
    of that command, so a rename cannot leave the documentation behind."""
    from pathlib import Path

    root = Path(__file__).parents[1]
    files = [
        root / "README.md",
        *(root / "docs").glob("*.md"),
        *(root / "docs" / "commands").glob("*.md"),
        *(root / "scripts").glob("*.sh"),
        *(root / "examples").glob("*.yaml"),
    ]
    known = {name: {n for p in options(name) for n in option_names(p)} | {"--help"} for name in COMMANDS}
    wrong = []
    for path in files:
        # the generated option tables of docs/commands/ are the options themselves (scripts/build_cli_docs.py)
        text = re.sub(
            r"<!-- options:([a-z-]+):begin -->.*?<!-- options:\1:end -->",
            "",
            path.read_text(encoding="utf-8"),
            flags=re.S,
        )
        for line in text.splitlines():
            for command, rest in re.findall(r"(?:posym|\$POSYM|posym\.cli) ([a-z-]+)((?:(?!posym ).)*)", line):
                if command in known:
                    wrong += [
                        f"{path.name}: posym {command} {flag}"
                        for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)
                        if flag not in known[command]
                    ]
    assert not wrong, wrong


def test_every_help_that_names_an_embedded_model_names_both():
    """Where a user picks a model, the help names every embedded model (posym.models.EMBEDDED), not only
    the first one that was embedded."""
    from posym.models import EMBEDDED

    naming = {}
    for name in COMMANDS:
        for param in GROUP.commands[name].params:
            text = param.help or ""
            if any(model in text for model in EMBEDDED):
                naming[name] = text
                assert all(model in text for model in EMBEDDED), (name, param.name, text)
    assert set(naming) == {
        "score",
        "geometry",
        "discrepancy",
        "llm-scores",
        "llm-bench",
        "llm-study",
        "atlas",
        "attribute",
        "kv-policy",
        "kv-eval",
        "convert",
        "explore",
    }


def code_lists() -> dict:
    """Each choice enum of posym.cli.options -> the list in the code it re-spells. The code's modules import
    torch, which `posym --help` must not (test_help_imports_no_heavy_package), so the enums are written out
    and tied to the code here."""
    from posym import prompts
    from posym.cli import options as o
    from posym.commands import data as datasets
    from posym.commands import llm_study
    from posym.core import attribution, interventions, kvpolicy, lengthgen, model, scores, tasks, train

    return {
        o.Device: model.DEVICES,
        o.Task: tasks.TASKS,
        o.Split: tasks.SPLITS,
        o.Preset: tuple(train.PRESETS),
        o.Queries: scores.QUERY_MODES,
        o.Compare: scores.COMPARES,
        o.Exactness: scores.EXACTNESS,
        o.Format: datasets.FORMATS,
        o.Protocol: lengthgen.PROTOCOLS,
        o.AblationMode: interventions.ABLATION_MODES,
        o.Focus: prompts.QUERIES,
        o.StudyStage: llm_study.STAGES,
        o.Dtype: train.PRECISIONS,
        o.AttributionMethod: attribution.METHODS,
        o.AttributionMetric: attribution.METRICS,
        o.LengthFormat: prompts.FORMATS,
        o.KVPolicyName: kvpolicy.POLICIES,
        o.RandomMatch: kvpolicy.MATCHES,
    }


ORDERED = {"StudyStage"}
"""Enums whose order is the code's too: the llm-study stages, in the order the study runs them."""


def drifted(lists: dict) -> list[str]:
    """The enums whose values are not the code's list (as a set; in order for ORDERED)."""
    return sorted(
        choice.__name__
        for choice, values in lists.items()
        if (
            [c.value for c in choice] != list(values)
            if choice.__name__ in ORDERED
            else {c.value for c in choice} != set(values)
        )
    )


def test_every_choice_is_the_codes_own_list():
    import typing

    from posym.cli import options as o
    from posym.core import train
    from posym.models import DTYPES

    lists = code_lists()
    assert drifted(lists) == []
    # --dtype of the llm commands and --precision of posym train: one spelling, torch's names, which load takes
    assert set(train.PRECISIONS) <= set(DTYPES)
    assert typing.get_args(typing.get_type_hints(train.TrainConfig)["precision"])[:2] == train.PRECISIONS
    enums = {
        v for v in vars(o).values() if isinstance(v, type) and issubclass(v, o.enum.Enum) and v.__module__ == o.__name__
    }
    assert enums - set(lists) == {o.OnOff, o.OnOffBoth}  # plain switches: no list in the code to follow


def test_a_choice_that_drifts_from_the_code_is_caught():
    import enum

    from posym.cli import options as o
    from posym.commands import llm_study

    short = enum.StrEnum("StudyStage", {s: s for s in llm_study.STAGES[:-1]})
    swapped = enum.StrEnum(
        "StudyStage", {s: s for s in (llm_study.STAGES[1], llm_study.STAGES[0], *llm_study.STAGES[2:])}
    )
    extra = enum.StrEnum("Task", {t: t for t in ("number", "letter", "word")})
    assert drifted({short: llm_study.STAGES}) == drifted({swapped: llm_study.STAGES}) == ["StudyStage"]
    assert drifted({extra: ("number", "letter")}) == ["Task"]
    assert drifted({o.Queries: ("hops", "all", "last")}) == []  # order is free outside ORDERED


def test_help_imports_no_heavy_package():
    """`posym --help` reads only the CLI modules: no torch, transformers, pandas or numpy (why the choice
    enums are written out rather than imported from the code above)."""
    import subprocess

    code = (
        "import sys; import posym.cli as c; c.app; import posym.cli.training, posym.cli.analysis, "
        "posym.cli.models, posym.cli.runs; print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'transformers', 'pandas', 'numpy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_score_flags_are_its_options():
    """`posym score`'s flags are the fields of posym.score_options.ScoreOptions (posym.cli.options.flags_from),
    in field order, with the field's default and help: the options are defined once."""
    import dataclasses

    from posym.score_options import ScoreOptions

    flags = options("score")
    names = [p.name for p in flags]
    fields = dataclasses.fields(ScoreOptions)
    start = names.index(fields[0].name)
    assert names[start : start + len(fields)] == [f.name for f in fields]
    for f, param in zip(fields, flags[start:]):
        default = param.default.value if hasattr(param.default, "value") else param.default
        assert (default, param.help) == (f.default, f.metadata["help"]), f.name
