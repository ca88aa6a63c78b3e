"""The masking test of retrieval heads drawn: needle accuracy by depth with no head masked, the top retrieval heads
masked, and random heads of the same layers masked, each with its 95% interval over trials.

Takes the rows of `headscan.analysis.masking.masking_by_condition` and returns the Axes.

>>> import pandas as pd
>>> from matplotlib.figure import Figure
>>> rows = pd.DataFrame({"model": "m", "condition": ["none", "top", "random"] * 2, "length": 1024,
...     "depth": [0.0] * 3 + [1.0] * 3, "value": [1.0, 0.2, 0.9, 0.9, 0.1, 0.8],
...     "ci_low": [0.9, 0.1, 0.8, 0.8, 0.0, 0.7], "ci_high": [1.0, 0.3, 1.0, 1.0, 0.2, 0.9], "k": [0, 10, 10] * 2})
>>> ax = accuracy_by_depth(rows, model="m", ax=Figure().subplots())  # its own figure: pyplot's is shared
>>> [line.get_label() for line in ax.lines[:3]], ax.lines[1].get_ydata().tolist()
(['no head masked', 'top 10 retrieval heads masked', '10 random heads of their layers masked'], [0.2, 0.1])
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .style import axes_or_current

__all__ = ["accuracy_by_depth"]

_LABELS = {"none": "no head masked", "top": "top {k} retrieval heads masked",
           "random": "{k} random heads of their layers masked"}
_STYLE = {"none": ("#4d4d4d", "o", "-"), "top": ("#c0392b", "s", "-"), "random": ("#2e86c1", "^", "--")}


def accuracy_by_depth(rows: pd.DataFrame, *, model: str, length: int | None = None, ax=None,
                      title: str | None = None):
    """One line per condition (none, top, random): mean ROUGE-1 recall of the answer against the needle's depth,
    its 95% interval over trials as error bars. `length` picks one prompt length (default: the first).

    Returns the Axes; ``ax.lines`` holds the conditions' lines first, in the order none, top, random.
    """
    ax = axes_or_current(ax)
    part = rows[(rows["model"] == model) & rows["length"].notna()]
    if len(part):
        part = part[part["length"] == (length if length is not None else part["length"].iloc[0])]
    shift = {"none": -0.01, "top": 0.0, "random": 0.01}  # apart, so the error bars do not hide each other
    drawn = []
    for condition in ("none", "top", "random"):
        line = part[part["condition"] == condition].sort_values("depth")
        if line.empty:
            continue
        colour, marker, style = _STYLE[condition]
        x = line["depth"].to_numpy(float) + shift[condition]
        y = line["value"].to_numpy(float)
        ax.plot(x, y, color=colour, marker=marker, linestyle=style,
                label=_LABELS[condition].format(k=int(line["k"].iloc[0])))
        drawn.append((x, y, line, colour))
    for x, y, line, colour in drawn:  # error bars after the lines, so ax.lines starts with one line per condition
        low, high = line["ci_low"].to_numpy(float), line["ci_high"].to_numpy(float)
        known = ~(np.isnan(low) | np.isnan(high))
        ax.errorbar(x[known], y[known], yerr=[y[known] - low[known], high[known] - y[known]], fmt="none",
                    ecolor=colour, capsize=3, linewidth=1)
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("needle depth (0: opens the haystack, 1: closes it)")
    ax.set_ylabel("needle accuracy (ROUGE-1 recall)")
    ax.legend(loc="lower left", fontsize="small")
    ax.set_title(title or f"{model}: masking retrieval heads")
    return ax
