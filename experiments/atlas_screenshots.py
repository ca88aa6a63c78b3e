"""Screenshots of a report's head atlas in headless Chromium: the atlas, the atlas coloured by role, and the panel
of each head named on the command line (and its examples from the corpus), and the scatter of heads. `make reports` runs it for the committed reports.

    python experiments/atlas_screenshots.py reports/ewt-dev/index.html reports/ewt-dev/screenshots minilm:L0H2 smollm2:L16H0

Needs Debian's chromium (/usr/bin/chromium) and the playwright Python package (in the test extra); it never
downloads a browser. Prints any console error or network request the page made (there should be none).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("heads", nargs="*", metavar="MODEL:LABEL")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    args.out.mkdir(parents=True, exist_ok=True)
    problems = []
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context = p.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True, args=FLAGS,
                                                       viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else problems.append(f"request: {r.url}"))
        page.goto(args.page.resolve().as_uri())
        page.wait_for_selector("#atlas.ready")
        page.mouse.move(5, 5)
        page.locator("#atlas").screenshot(path=str(args.out / "atlas.png"))
        for head in args.heads:
            model, label = head.rsplit(":", 1)
            page.locator(f'rect.atlas-cell[data-model="{model}"][data-label="{label}"]').click()
            page.mouse.move(5, 5)
            page.locator("#atlas").screenshot(path=str(args.out / f"atlas-panel-{model}-{label}.png"))
            units = page.locator("#atlas-panel table.atlas-units")
            if units.count():  # its examples from the corpus, on the metric colouring the grids
                units.screenshot(path=str(args.out / f"atlas-examples-{model}-{label}.png"))
        if page.locator("#atlas-scatter .atlas-scatter-plot").count():  # heads as points, by two head scores
            page.select_option('#atlas-scatter select[data-axis="x"]', "prev_token")
            page.select_option('#atlas-scatter select[data-axis="y"]', "first_token")
            page.select_option('#atlas-scatter select[data-axis="colour"]', "@depth")
            page.mouse.move(5, 5)
            page.locator("#atlas-scatter").screenshot(path=str(args.out / "atlas-scatter.png"))
        page.select_option("#atlas-metric", "@role")
        page.mouse.move(5, 5)
        page.locator("#atlas").screenshot(path=str(args.out / "atlas-roles.png"))
        context.close()
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"wrote the screenshots of {len(args.heads)} heads, the atlas and its scatter to {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
