"""The report's figures: their size on the page, their PNG bytes and their file names.

Every figure is drawn by `headscan.plots` and sized so that, shown at `DISPLAY` CSS pixels per PNG pixel, it fits the
page's text column (`PAGE_WIDTH`) without being shrunk: wide content wraps onto more rows instead, so tick labels
stay at their drawn size (8 pt, about 10 CSS pixels). The sections (`headscan.report.sections`) share these.
"""

from __future__ import annotations

import io
import re

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..analysis.ranking import why_structural
from ..analysis.runs import Comparison
from ..tables.folders import fitting

__all__ = ["Pngs", "DPI", "DISPLAY", "PAGE_WIDTH", "MAX_WIDTH", "ANNOTATE_TOP", "palette_png", "name_part",
           "structural", "model_shape", "wrap", "fmt_cell", "heatmap_rows"]

ANNOTATE_TOP = 3  # heads annotated in each heatmap
DPI = 130
DISPLAY = 0.7  # on the page, a figure's PNG pixels are shown at this scale (about 91 CSS pixels per inch)
PAGE_WIDTH = 1100  # CSS pixels of the page's text column
MAX_WIDTH = PAGE_WIDTH / DISPLAY / DPI  # inches: the widest figure shown without shrinking (about 12.1)


class Pngs(dict):
    """Figure file name -> PNG bytes, names kept distinct."""

    def add(self, name: str, fig: Figure) -> str:
        base = name = fitting(name)  # names made of run and model names can pass the file system's 255 bytes
        n = 2
        while name in self:
            name = base.removesuffix(".png") + f"-{n}.png"
            n += 1
        self[name] = palette_png(fig)
        return name


def palette_png(fig: Figure) -> bytes:
    """`fig` as a PNG of at most 256 colours: a third of the bytes of matplotlib's RGBA PNG, and the same to the
    eye (a colormap has 256 colours; anti-aliased edges take the nearest). No "Software" entry and no date, so
    the same figure gives the same bytes."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    buf.seek(0)
    with Image.open(buf) as image:
        rgba = image.convert("RGBA")
    flat = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba).convert("RGB")
    palette = flat.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def name_part(name: str) -> str:
    """A run or model name as part of a file or folder name (a figure's, a report's).

    >>> name_part("run:meta-llama/Llama-3.2-1B")
    'run-meta-llama-Llama-3.2-1B'
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


def _rows(comparison: Comparison, model: str, metric: str) -> pd.DataFrame:
    heads = comparison.heads
    return heads[(heads["model"] == model) & (heads["metric"] == metric)]


def structural(comparison: Comparison, model: str, metric: str) -> str | None:
    """Why `model`'s `metric` is 0 or undefined for every head by construction, or None."""
    m = comparison.model(model)
    return why_structural(_rows(comparison, model, metric), metric, family=m.family, provenance=m.provenance)


def model_shape(comparison: Comparison, model: str) -> tuple[int, int]:
    part = comparison.heads[comparison.heads["model"] == model]
    return int(part["layer"].max()) + 1, int(part["head"].max()) + 1


def wrap(widths: list[float], limit: float = MAX_WIDTH) -> list[list[int]]:
    """Indices of panels of the given widths, in rows no wider than `limit` (each row at least one panel)."""
    rows, row, used = [], [], 0.0
    for i, width in enumerate(widths):
        if row and used + width > limit:
            rows.append(row)
            row, used = [], 0.0
        row.append(i)
        used += width
    return rows + [row] if row else rows


def fmt_cell(value: float) -> str:
    """A number in a table cell: three decimals, "–" for NaN."""
    return "–" if pd.isna(value) else f"{value:.3f}"


def heatmap_rows(drawable: list, pngs: Pngs, name: str, draw) -> list[str]:
    """Layer x head heatmaps of (model name, rows), side by side at one height, wrapped to fit the page;
    `draw(rows, model, ax, cbar)` draws one."""
    widths = [min(max(2.6, 0.3 * (int(rows["head"].max()) + 1) + 1.1), 7.0) for _, rows in drawable]
    files = []
    for row in wrap([w + 0.3 for w in widths], MAX_WIDTH - 1.0):
        fig = Figure(figsize=(sum(widths[i] for i in row) + 1.0, 4.2), layout="constrained")
        axes = fig.subplots(1, len(row), squeeze=False, width_ratios=[widths[i] for i in row])[0]
        for k, (ax, i) in enumerate(zip(axes, row)):
            model, rows = drawable[i]
            draw(rows, model, ax, k == len(row) - 1)
            n_layers = int(rows["layer"].max()) + 1
            if n_layers > 16:
                ax.set_yticks(np.arange(0, n_layers, 2) + 0.5, [str(i) for i in range(0, n_layers, 2)])
        suffix = "" if len(row) == len(drawable) else "_" + "_".join(name_part(drawable[i][0]) for i in row)
        files.append(pngs.add(f"{name}{suffix}.png", fig))
    return files
