"""Each head's own examples from the corpus, as the atlas's panel shows them: the units (documents or segments) of
examples.parquet where the head scores highest and lowest on each metric, with their value, support and text.

The page gets per model one list of distinct texts (a unit kept by many heads is written once) and, per metric,
per head (index ``layer * heads + head``), its kept units as ``[end, rank, text index, value, count]``: end 0 is
the top, 1 the bottom. Values are rounded to 4 significant digits, what a panel shows. The text and the value
are what the sweep kept; the head's attention on the example is not (the sweep keeps no attention pattern),
which the panel says.

This module loads no model and draws nothing.

>>> rows = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 0, 1], "metric": "prev_token",
...                      "end": ["top", "bottom", "top"], "rank": 1, "value": [0.9, 0.1, 0.5],
...                      "count": [10, 12, 8], "unit": [3, 7, 3], "text": ["the cat", "a dog", "the cat"]})
>>> unit_examples(rows, "m", n_heads=2)
{'texts': ['the cat', 'a dog'], 'metrics': {'prev_token': [[[0, 1, 0, 0.9, 10], [1, 1, 1, 0.1, 12]], [[0, 1, 0, 0.5, 8]]]}}
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["unit_examples", "DIGITS"]

DIGITS = 4  # significant digits of an example's value in the page


def _rounded(value) -> float | None:
    return None if pd.isna(value) else float(f"{float(value):.{DIGITS}g}")


def unit_examples(examples: pd.DataFrame, model: str, n_heads: int) -> dict | None:
    """Model `model`'s rows of examples.parquet as the page reads them (see the module's docstring); None where
    the model has none."""
    part = examples[examples["model"] == model]
    if part.empty:
        return None
    part = part.sort_values(["metric", "layer", "head", "end", "rank"], kind="stable",
                            key=lambda c: c.map({"top": 0, "bottom": 1}) if c.name == "end" else c)
    texts: dict[str, int] = {}
    text_index = [texts.setdefault(str(t), len(texts)) for t in part["text"]]
    at = (part["layer"].to_numpy(int) * n_heads + part["head"].to_numpy(int))
    n_cells = int(at.max()) + 1
    end = (part["end"] == "bottom").to_numpy(int)
    counts = part["count"].to_numpy(float) if "count" in part else np.full(len(part), np.nan)
    metrics: dict[str, list] = {}
    for metric, rows in zip(part["metric"], zip(at, end, part["rank"], text_index, part["value"], counts)):
        heads = metrics.setdefault(str(metric), [[] for _ in range(n_cells)])
        cell, side, rank, text, value, count = rows
        heads[cell].append([int(side), int(rank), int(text), _rounded(value),
                            None if np.isnan(count) else int(count)])
    return {"texts": list(texts), "metrics": metrics}
