"""How big a report is and how fast it opens: the committed EWT report, and a model of 32 layers x 32 heads.

A 32 x 32-head model (GPT-2 shaped, random weights, 64 wide, built here in a temporary folder) is swept over the
built-in sample with the default tables and rendered as a report; each report's bytes are split into atlas data,
embedded figures and the rest, and each is opened in headless Chromium (Debian's, driven by playwright), timing
from navigation to the atlas drawn (``#atlas.ready``), median of 3 loads.

    python benchmarks/report_size.py [--report reports/ewt-dev/index.html] [--layers 32 --heads 32]

Targets: the committed EWT report at most 4 MB (each head's corpus examples take about 1 MB of it); the 32 x 32
report under 8 MB, open in under 3 s.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "experiments"))
from atlas_screenshots import FLAGS  # noqa: E402  the same headless Chromium the screenshots use


def parts(page: Path) -> dict[str, int]:
    """The page's bytes: atlas JSON, base64 figures, everything else."""
    text = page.read_text(encoding="utf-8")
    atlas = re.search(r'<script type="application/json" id="atlas-data">(.*?)</script>', text, re.S)
    atlas_bytes = len(atlas.group(1).encode()) if atlas else 0
    figures = sum(len(x) for x in re.findall(r"data:image/[^\"]+", text))
    total = page.stat().st_size
    return {"total": total, "atlas": atlas_bytes, "figures": figures, "rest": total - atlas_bytes - figures}


def open_seconds(page: Path, loads: int = 3) -> float:
    """Median seconds from navigation to the atlas drawn, in headless Chromium."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    times = []
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context = p.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True, args=FLAGS,
                                                       viewport={"width": 1400, "height": 1000})
        tab = context.new_page()
        for _ in range(loads):
            started = time.perf_counter()
            tab.goto(page.resolve().as_uri())
            tab.wait_for_selector("#atlas.ready", timeout=60_000)
            times.append(time.perf_counter() - started)
        context.close()
    return statistics.median(times)


def synthetic_report(folder: Path, layers: int, heads: int) -> Path:
    """Sweep and report a random GPT-2 of `layers` x `heads` as a user would, through the CLI (the report loads the
    model for every head's attention on the example sentence)."""
    from headscan.testing import build_tiny_checkpoint

    checkpoint = build_tiny_checkpoint(folder / "model", "gpt2", n_layers=layers, n_heads=heads, d_model=2 * heads,
                                       seed=0)
    headscan = [sys.executable, "-m", "headscan"]
    subprocess.run([*headscan, "sweep", "-m", str(checkpoint), "--corpus", "builtin", "--out", str(folder / "run"),
                    "--device", "cpu", "-q"], check=True)
    subprocess.run([*headscan, "report", str(folder / "run"), "--out", str(folder / "report"), "-q"], check=True)
    return folder / "report" / "index.html"


def show(name: str, page: Path) -> None:
    sizes = parts(page)
    seconds = open_seconds(page)
    mb = {k: v / 1e6 for k, v in sizes.items()}
    print(f"{name}: {mb['total']:.2f} MB (atlas {mb['atlas']:.2f}, figures {mb['figures']:.2f}, "
          f"rest {mb['rest']:.2f}); opens in {seconds:.2f} s (median of 3, headless Chromium)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=Path("reports/ewt-dev/index.html"))
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=32)
    args = parser.parse_args(argv)
    if args.report.is_file():
        show(str(args.report), args.report)
    with tempfile.TemporaryDirectory() as folder:
        show(f"{args.layers} x {args.heads} heads", synthetic_report(Path(folder), args.layers, args.heads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
