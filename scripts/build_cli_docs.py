"""The option tables of docs/commands/*.md, generated from the command line itself.

Each command page holds, for every command it documents, a block between two markers

    <!-- options:COMMAND:begin -->
    ...generated table...
    <!-- options:COMMAND:end -->

which this script fills with one Markdown row per argument and option of `posym COMMAND` (name,
type or choices, default, help), read from the Click command that Typer builds from the app
(`typer.main.get_command(posym.cli.app)`, the same object `posym COMMAND --help` prints). Every
command of the app must be on exactly one page (PAGES), so a new command cannot go undocumented.

    python scripts/build_cli_docs.py            # rewrite the blocks in place
    python scripts/build_cli_docs.py --check    # exit 1, naming each stale block, if a page differs

For example the `--n` option of `posym score` becomes the row

    | `--n` | integer (>= 1) | 100 | How many test prompts (with --task or a run's own task). |
"""

from __future__ import annotations

import argparse
import enum
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {
    "training": ("data", "train", "eval", "validate"),
    "analysis": ("score", "dynamics", "geometry", "theory", "lengthgen", "discrepancy"),
    "models": ("llm-scores", "llm-bench", "llm-study", "atlas", "attribute", "kv-policy", "kv-eval", "convert"),
    "runs": ("run", "report", "explore", "sweep", "ablate", "finetune"),
}
"""docs/commands/<page>.md -> the commands it documents, in the order of `posym --help`."""
BLOCK = re.compile(r"(<!-- options:(?P<name>[a-z-]+):begin -->\n)(?P<body>.*?)(<!-- options:(?P=name):end -->)", re.S)


def commands():
    """The Click group of the `posym` app: {name: command}."""
    sys.path.insert(0, str(ROOT / "src"))
    import typer.main

    from posym.cli import app

    return typer.main.get_command(app).commands


def _cell(text) -> str:
    """One table cell: whitespace collapsed, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _kind(param, ctx) -> str:
    """The type column: on/off or flag, the choices, the metavar, or the type `--help` shows, with its range."""
    if param.param_type_name == "option" and param.secondary_opts:
        return "on/off"
    if getattr(param, "is_flag", False):
        return "flag"
    descriptor = param.type_descriptor
    if descriptor.is_choice:
        kind = " \\| ".join(f"`{getattr(c, 'value', c)}`" for c in descriptor.choices)
    elif param.metavar and param.param_type_name == "option":
        kind = "`" + param.metavar.replace("|", "\\|") + "`"
    else:
        kind = param.bare_type() if descriptor.is_ranged else param.display_type(ctx).strip("<>")
    bounds = ([f">= {param.min}"] if param.min is not None else []) + (
        [f"<= {param.max}"] if param.max is not None else []
    )
    return kind + (f" ({', '.join(bounds)})" if bounds else "") + (", repeatable" if param.multiple else "")


def _default(param) -> str:
    """The default column: 'required', the value as the command line spells it, or empty for none."""
    if param.required:
        return "required"
    value = param.default
    if param.param_type_name == "option" and param.secondary_opts:
        return f"`{param.opts[0] if value else param.secondary_opts[0]}`"
    if getattr(param, "is_flag", False):
        return ""
    if value is None or value == [] or value == ():
        return ""
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v.value if isinstance(v, enum.Enum) else v) for v in value)
    elif isinstance(value, enum.Enum):
        value = value.value
    return f"`{value}`"


def table(command) -> str:
    """The Markdown table of one command's arguments and options (in `--help` order)."""
    import typer._click.core  # typer bundles its own click: its Context, not the click package's

    ctx = typer._click.core.Context(command)
    rows = ["| option | type | default | help |", "| --- | --- | --- | --- |"]
    for param in command.params:
        if param.param_type_name == "argument":
            name = f"`{param.metavar or param.name.upper()}` (argument)"
        else:
            name = " / ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts))
        rows.append(f"| {name} | {_kind(param, ctx)} | {_default(param)} | {_cell(getattr(param, 'help', '') or '')} |")
    return "\n".join(rows) + "\n"


def render(text: str, found: dict) -> str:
    """A page's text with every options block refilled; a block of an unknown command is an error."""

    def fill(match):
        name = match.group("name")
        if name not in found:
            raise SystemExit(f"an options block names {name!r}, which is not a posym command")
        return match.group(1) + table(found[name]) + match.group(4)

    return BLOCK.sub(fill, text)


def problems(root: Path = ROOT) -> list[str]:
    """What is wrong with the pages under root/docs/commands: a command on no page or on two, a page
    without the block of one of its commands, a missing page."""
    found, out = commands(), []
    listed = [c for names in PAGES.values() for c in names]
    out += [f"posym {c} is on no page of PAGES" for c in sorted(set(found) - set(listed))]
    out += [f"posym {c} is on more than one page" for c in sorted({c for c in listed if listed.count(c) > 1})]
    for page, names in PAGES.items():
        path = root / "docs" / "commands" / f"{page}.md"
        if not path.is_file():
            out.append(f"{path.relative_to(root)} is missing")
            continue
        blocks = [m.group("name") for m in BLOCK.finditer(path.read_text())]
        out += [f"{path.relative_to(root)} has no options block for posym {c}" for c in names if c not in blocks]
    return out


def build(root: Path = ROOT, *, check: bool = False) -> list[str]:
    """Refill (or, with check, compare) every page; returns the stale pages and the problems."""
    found, stale = commands(), problems(root)
    for page in PAGES:
        path = root / "docs" / "commands" / f"{page}.md"
        if not path.is_file():
            continue
        text = path.read_text()
        new = render(text, found)
        if new != text:
            if check:
                stale.append(f"{path.relative_to(root)} is stale: run python scripts/build_cli_docs.py")
            else:
                path.write_text(new)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale instead of rewriting it")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root holding docs/commands/")
    args = parser.parse_args(argv)
    found = build(args.root, check=args.check)
    print("\n".join(found) or ("every options table is current" if args.check else "options tables written"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
