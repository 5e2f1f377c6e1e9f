"""Screenshots of a posym report in headless Chromium, at a desktop and a narrow width.

    apt-get install -y chromium          # Debian's package; any chromium/chrome binary on PATH works
    python scripts/screenshot_report.py runs/main/report/report.html --out /tmp/report-shots

For each width (default 1400 and 800 px) Chromium renders the whole page in one tall window; the
blank bottom is cropped and the page is cut into numbered tiles (WIDTH-01.png, WIDTH-02.png, ...)
that an image viewer shows at full resolution. Prints one line per file written.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
PAGE_HEIGHT = 16000
"""Height of the window Chromium renders into (px); taller pages are cut off at the bottom."""


def browser() -> str | None:
    """The first Chromium-like binary on PATH, or None."""
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def render(html: Path, width: int, png: Path, *, binary: str, height: int = PAGE_HEIGHT, fragment: str = "") -> None:
    """Render `html` (+ `fragment`, e.g. an explorer permalink "#head=3.1") in a width x height headless
    window to `png` (scrollbars hidden)."""
    with tempfile.TemporaryDirectory() as profile:  # a throwaway profile: no state carries between shots
        subprocess.run(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "--virtual-time-budget=10000",  # the explorer draws its head page once its blocks are decoded
                f"--screenshot={png}",
                html.resolve().as_uri() + fragment,
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def tiles(png: Path, out_dir: Path, width: int, *, tile_height: int = 2000) -> list[Path]:
    """Crop the blank bottom of `png` and cut it into tiles; return their paths."""
    from PIL import Image, ImageChops

    page = Image.open(png).convert("RGB")
    box = ImageChops.difference(page, Image.new("RGB", page.size, "white")).getbbox()
    page = page.crop((0, 0, page.width, min(page.height, (box[3] if box else 1) + 20)))
    paths = []
    for k, top in enumerate(range(0, page.height, tile_height), start=1):
        path = out_dir / f"{width}-{k:02d}.png"
        page.crop((0, top, page.width, min(page.height, top + tile_height))).save(path)
        paths.append(path)
    return paths


def screenshots(html: Path, out_dir: Path, widths=(1400, 800), fragment: str = "") -> list[Path]:
    """Tiles of `html` at every width in `out_dir`; a RuntimeError when no browser is installed."""
    binary = browser()
    if binary is None:
        raise RuntimeError("no chromium on PATH: apt-get install -y chromium")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for width in widths:
        full = out_dir / f"{width}-full.png"
        render(html, width, full, binary=binary, fragment=fragment)
        paths += tiles(full, out_dir, width)
        full.unlink()
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "html",
        type=Path,
        help="report.html written by posym report or posym run (or any page, e.g. posym explore's explorer.html)",
    )
    parser.add_argument(
        "--fragment", default="", help="URL fragment to open, e.g. '#head=3.1&prompt=0' (an explorer permalink)"
    )
    parser.add_argument("--out", type=Path, default=Path("report-screenshots"), help="directory for the tiles")
    parser.add_argument("--widths", default="1400,800", help="comma-separated window widths in px")
    args = parser.parse_args()
    if not args.html.is_file():
        sys.exit(f"screenshot_report: {args.html} does not exist")
    for path in screenshots(args.html, args.out, tuple(int(w) for w in args.widths.split(",")), args.fragment):
        print(path)


if __name__ == "__main__":
    main()
