"""Every number of the README's performance and results sentences, checked against the file they cite.

A paragraph that cites a recorded run, `(docs/benchmarks/NAME.json)` or a file under docs/results/,
must quote only numbers found in that file (a table inherits the citation of the paragraph above
it). A number matches when some number of the file rounds to it at the precision it is written with
(`5.4` matches 5.3820, `2.8e-16` matches 2.7756e-16, `1,024` matches 1024), also after converting
bytes to MiB or seconds to milliseconds. A paragraph that quotes a timing, a rate or a speed ratio
(`12 s`, `3 min`, `10 steps/s`, `140x faster`) without citing a file is listed as unbacked. Code
blocks, inline code and the generated option tables of docs/commands/ (between `<!-- options:COMMAND:begin -->`
and its end marker) are not read: their numbers are arguments and defaults, not results.

    python scripts/readme_numbers.py [FILE.md ...]   # default: default_files(); exit 1 if any is unbacked
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"docs/(?:benchmarks|results)/[\w./-]+\.(?:json|csv|md|txt)")
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?(?![\d])", re.I)
OPTIONS_BEGIN, OPTIONS_END = re.compile(r"<!-- options:[a-z-]+:begin -->"), re.compile(r"<!-- options:[a-z-]+:end -->")
CLAIM = re.compile(
    r"\d[\d,.]*\s*(?:s|ms|min|steps/s|sequences/s|/s)(?![\w])"
    r"|\d[\d,.]*x\s+(?:faster|slower|one forward|the forward|posym)\b"
)


def paragraphs(markdown: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph or table outside code fences (as written)."""
    out, current, start, fenced, generated = [], [], 0, False, False
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            line = ""
        if OPTIONS_BEGIN.search(line) or OPTIONS_END.search(line):
            generated = bool(OPTIONS_BEGIN.search(line))
            line = ""
        if fenced or generated or not line.strip() or line.lstrip().startswith("<!--") or line.startswith("#"):
            if current:
                out.append((start, "\n".join(current)))
            current = []
            continue
        if not current:
            start = number
        current.append(line)
    if current:
        out.append((start, "\n".join(current)))
    return out


def file_numbers(path: Path) -> list[float]:
    """Every number in a cited file (JSON leaves and numbers inside its strings; text files as text)."""
    text = path.read_text()
    values: list[float] = []
    if path.suffix == ".json":

        def walk(node):
            if isinstance(node, bool):
                return
            if isinstance(node, (int, float)):
                values.append(float(node))
            elif isinstance(node, dict):
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)
            elif isinstance(node, str):
                values.extend(_parse(m) for m in NUMBER.findall(node))

        walk(json.loads(text))
    else:
        values = [_parse(m) for m in NUMBER.findall(text)]
    return values + [v / 2**20 for v in values] + [v * 1e3 for v in values]


def _parse(token: str) -> float:
    return float(token.replace(",", ""))


def _half_unit(token: str) -> float:
    """Half a unit of the last written digit of a number."""
    mantissa, _, exponent = token.lower().replace(",", "").partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals)


def matches(token: str, values: list[float]) -> bool:
    target, tolerance = _parse(token), _half_unit(token) * (1 + 1e-9)
    return any(
        math.isclose(abs(v), abs(target), abs_tol=tolerance) or abs(abs(v) - abs(target)) <= tolerance for v in values
    )


def check(markdown_path: Path, root: Path = ROOT) -> list[str]:
    """Problems of one Markdown file: numbers missing from the cited file, and uncited claims."""
    problems, inherited = [], None
    name = markdown_path.name
    for line, raw in paragraphs(markdown_path.read_text()):
        cited = CITATION.findall(raw)
        text = re.sub(
            r"`[^`]*`|arXiv \d+\.\d+|docs/(?:benchmarks|results)/[\w./-]+", "", re.sub(r"\]\([^)]*\)", "]", raw)
        )  # code, links, paper ids, paths of results (docs/results/llm-study-qwen2.5-coder-0.5b/): no results
        if not cited and text.lstrip().startswith("|") and inherited:
            cited = inherited
        inherited = cited or None
        if not cited:
            for claim in CLAIM.findall(text):
                problems.append(
                    f"{name}:{line}: '{' '.join(claim.split())}' is quoted without a docs/benchmarks or docs/results file"
                )
            continue
        missing = [c for c in cited if not (root / c).is_file()]
        if missing:
            problems.append(f"{name}:{line}: cites {', '.join(missing)}, which does not exist")
            continue
        values = [v for c in cited for v in file_numbers(root / c)]
        for token in NUMBER.findall(text.replace("\\|", "|")):
            if not matches(token.lstrip("+-"), values):
                problems.append(f"{name}:{line}: {token} is not in {', '.join(cited)}")
    return problems


def default_files(root: Path = ROOT) -> list[Path]:
    """The pages whose numbers are checked by default: README.md, docs/results.md and the command pages."""
    return [root / "README.md", root / "docs" / "results.md", *sorted((root / "docs" / "commands").glob("*.md"))]


def main(argv: list[str]) -> int:
    problems = [p for f in (argv or default_files()) for p in check(Path(f))]
    print("\n".join(problems) or "every quoted number is backed by the file it cites")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
