"""Build the API reference of posym from its docstrings, offline, with pdoc (the dev extra installs it).

Every module of the package gets a page under OUT (default docs/api/, which is not committed: build it
where you read it); tests/test_api_docs.py builds it into a temporary directory on every test run, so a
docstring that breaks the build fails the suite.

    python scripts/build_api_docs.py [--out docs/api]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def build(out: Path) -> list[Path]:
    """Write the HTML reference of every posym module to `out`; returns the pages written."""
    import pkgutil

    import pdoc
    import pdoc.render

    import posym

    for name in posym.__all__:  # resolve the lazy entry points, so that pdoc finds them in the module
        getattr(posym, name)
    # the root's children by name: pdoc follows only __all__ of a package that defines one (the root does),
    # and every submodule of one that does not (core, commands, cli)
    modules = ["posym", *(f"posym.{m.name}" for m in pkgutil.iter_modules(posym.__path__) if m.name != "__main__")]
    pdoc.render.configure(
        docformat="google",
        footer_text="posym API reference (generated from the docstrings)",
        search=True,
        show_source=True,
    )
    pdoc.pdoc(*modules, output_directory=out)
    return sorted(out.rglob("*.html"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "api")
    args = parser.parse_args()
    pages = build(args.out)
    print(f"{len(pages)} pages in {args.out} (open {args.out / 'posym.html'})")


if __name__ == "__main__":
    main()
