"""The head atlas: every head of every model on one interactive map, the first thing in a report's index.html.

Per model a layer x head grid, coloured by any metric of heads.parquet (or retrieval.parquet, where a retrieval run
joins the report) or by role, models of different depth
side by side at the same height (so rows line up by relative depth). Hovering a head shows its value and 95%
interval; clicking it opens a panel with all its scores, intervals and ranks, its offset profile, its roles,
its rows in any other table, the units of the corpus where it scores highest and lowest on the metric shown
(examples.parquet, `headscan.report.atlas_units`), and its attention on the example sentences. A search box finds
a head by label. Under the grids, a scatter of every head with any two per-head quantities as axes and a third as
colour, one plot per model; a point opens its head.

A checkpoint series (two steps or more, as `report_steps` finds them for the section "Heads over training") is one
grid with a slider over its steps, the last step first; an open panel follows the slider to the same head, and the
search looks only at the checkpoint shown. Where a run has similarity.parquet, each model's head map
(`headscan.analysis.families.head_map`, as the section "Head families" draws it) is under its grid, its points
coloured as their cells, and the grid can be coloured by head family: the section's clusters, largest first, a head
alike no other light grey; the panel and the tooltip name the head's cluster by the section's number, and its
members.

This module computes what the atlas shows (`head_roles`, `head_ranks`, `atlas_data`) and wraps it, with the
page's script and style (``headscan/data/atlas.js``, `headscan.report.document.page_script`, and ``atlas.css``),
into one HTML fragment (`atlas_html`): inline JavaScript and CSS, the data as embedded JSON, no network, so the
page works from ``file://``. Roles and ranks are computed here, not in the browser, so tests check them number by
number.

This module draws no PNG (see `headscan.plots`), lays out no section (see `headscan.report`) and loads no
model (see `headscan.report.examples`).

Roles come from `headscan.analysis.roles`, the same rules findings use.
"""

from __future__ import annotations

import base64
import html
import json
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import seaborn as sns

from .. import tables
from ..analysis import families
from ..analysis.claims import why_not
from ..analysis.importance import effects
from ..analysis.ranking import fmt_bucket, striking_of, striking_order, why_structural
from ..analysis.roles import ROLES, Role, head_roles, role_rules  # noqa: F401  (Role, role_rules: re-exported)
from ..analysis.series import checkpoint_steps
from ..analysis.syntax import direction_text, offset_text, relation_order
from ..metrics import METRICS
from .atlas_units import unit_examples
from .document import page_script

if TYPE_CHECKING:
    from ..analysis.runs import Comparison
    from .examples import Examples

__all__ = ["Role", "ROLES", "role_rules", "head_roles", "head_ranks", "atlas_data", "atlas_html", "ATLAS_ID"]

ATLAS_ID = "atlas"  # the id of the atlas's section on the page
_STOPS = 32  # colour-map stops handed to the page, which interpolates between them
_UNDEFINED = "#d9d9d9"  # as in the heatmaps (headscan.plots.style.UNDEFINED_COLOUR)
_ALONE = "#ececec"  # colour by head family: a head alike no other (a cluster of one)
# colour by head family: one colour per cluster, largest first (tab20 without its greys: dark ones, then light ones)
_TAB20 = sns.color_palette("tab20", 20).as_hex()
_FAMILY_COLOURS = [c for c in _TAB20[0::2] + _TAB20[1::2] if c not in ("#7f7f7f", "#c7c7c7")]


def families_shown(comparison: Comparison) -> bool:
    """Whether any run holds a similarity table with values: the atlas's head maps and the section "Head families"
    (`headscan.report.sections.families`) are drawn only then."""
    return "similarity" in comparison.frames and comparison["similarity"]["value"].notna().any()


def report_steps(comparison: Comparison) -> pd.DataFrame:
    """``model, series, step`` of the report's checkpoints, for series of two steps or more: the atlas's sliders and
    the section "Heads over training" (`headscan.report.sections.training`) show these."""
    steps = checkpoint_steps([m.provenance for m in comparison.models], [m.name for m in comparison.models])
    sizes = steps.groupby("series")["step"].transform("nunique") if len(steps) else steps["step"]
    return steps[sizes >= 2].reset_index(drop=True)


def head_ranks(heads: pd.DataFrame) -> pd.DataFrame:
    """Each head's rank in each metric within its model, from the metric's striking end (`striking_order`).

    Rank 1 is the highest value, or the lowest where the registry marks low as striking; ties go to the
    lower layer, then head. Undefined heads, and every head of a metric on which they all score the same,
    get no rank (NaN).

    >>> heads = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1, 2], "metric": "entropy",
    ...                       "value": [2.0, 0.5, float("nan")]})
    >>> head_ranks(heads)[["head", "rank", "of"]].to_dict("records")
    [{'head': 0, 'rank': 2.0, 'of': 2}, {'head': 1, 'rank': 1.0, 'of': 2}, {'head': 2, 'rank': nan, 'of': 2}]
    """
    parts = []
    for (_, metric), part in heads.groupby(["model", "metric"], sort=False, observed=True):
        part = part[["model", "layer", "head", "metric", "value"]].copy()
        defined = part["value"].dropna()
        high = striking_order(str(metric)) == "highest"
        order = part.sort_values(["value", "layer", "head"], ascending=[not high, True, True], na_position="last")
        rank = pd.Series(np.arange(1, len(order) + 1, dtype=float), index=order.index)
        varied = len(defined) > 0 and defined.max() > defined.min()
        part["rank"] = rank.where(part["value"].notna() & varied)
        part["of"] = len(defined)
        parts.append(part)
    columns = ["model", "layer", "head", "metric", "value", "rank", "of"]
    return pd.concat(parts)[columns] if parts else pd.DataFrame(columns=columns)


# --- the data the page reads ------------------------------------------------------------------------------


def _num(value, digits: int = 5):
    """A float for JSON: rounded, None for NaN."""
    if value is None or pd.isna(value):
        return None
    return float(f"{float(value):.{digits}g}")


def _stops(cmap: str) -> list[str]:
    return sns.color_palette(cmap, _STOPS).as_hex()


def _grid(part: pd.DataFrame, column: str, n_layers: int, n_heads: int) -> list:
    """A column of one model's rows of one metric as a flat list, layer by layer, head by head."""
    grid = np.full(n_layers * n_heads, np.nan)
    grid[(part["layer"] * n_heads + part["head"]).to_numpy(int)] = part[column].to_numpy(float)
    return [_num(v) for v in grid]


IMPORTANCE = "importance"  # the atlas's name for each head's effect (`headscan.analysis.importance.effects`)


def _with_importance(comparison: Comparison) -> tuple[pd.DataFrame, list[str]]:
    """Every per-head score (the heads rows, and retrieval's where a retrieval run joined) plus, where a run has
    importance.parquet, each head's effect as one more metric (`IMPORTANCE`): exact mean ablation where the
    sweep ran it, else AtP's estimate; and the metrics to offer."""
    heads, metrics = comparison.scores, list(comparison.score_metrics)
    if "importance" not in comparison.frames:
        return heads, metrics
    rows = effects(comparison["importance"])
    if rows.empty:
        return heads, metrics
    rows = rows.drop(columns=["target", "method", "exact", "thin"]).assign(metric=IMPORTANCE)
    return pd.concat([heads, rows], ignore_index=True), metrics + [IMPORTANCE]


def _importance_note(comparison: Comparison, name: str) -> str | None:
    """What the atlas's importance row of model `name` is, in words."""
    if "importance" not in comparison.frames:
        return None
    rows = effects(comparison["importance"])
    rows = rows[rows["model"] == name]
    if rows.empty:
        return None
    exact = int(rows["exact"].sum())
    how = ("exact mean ablation" if exact == len(rows) else "AtP's first-order estimate of mean ablation"
           + (f" (exact for the {exact} heads ablated)" if exact else ""))
    return (f"importance: the change of {rows['target'].iloc[0]} when the head's output is replaced by its mean, "
            f"ablated minus clean, by {how}; 0 is a head that changes nothing.")


def _model_metrics(comparison: Comparison, m, rows: pd.DataFrame, ranks: pd.DataFrame, n_layers: int,
                   n_heads: int, metrics: list[str]) -> dict:
    out = {}
    for metric in metrics:
        part = rows[rows["metric"] == metric]
        if part.empty:
            continue
        thin = tables.thin_rows(part) if {"units", "top_unit_share"} <= set(part.columns) else part["value"] < -1
        rank = ranks[ranks["metric"] == metric]
        defined = part[part["value"].notna()]
        reasons = why_not(defined, striking=striking_of(defined)) if len(defined) else pd.Series(dtype=object)
        out[metric] = {
            "value": _grid(part, "value", n_layers, n_heads),
            "low": _grid(part, "ci_low", n_layers, n_heads),
            "high": _grid(part, "ci_high", n_layers, n_heads),
            "chance": _grid(part.assign(chance=part.get("chance", np.nan)), "chance", n_layers, n_heads),
            # why a head's row cannot carry a claim, by index; heads absent here may carry one
            "unsupported": {str(int(layer * n_heads + head)): reason for layer, head, reason in
                            zip(defined["layer"], defined["head"], reasons) if reason},
            "rank": _grid(rank, "rank", n_layers, n_heads),
            "of": int(rank["of"].max()) if len(rank) else 0,
            "thin": sorted(int(i) for i in (part.loc[thin, "layer"] * n_heads + part.loc[thin, "head"])),
            "why": why_structural(part, metric, family=m.family, provenance=m.provenance)
            or ("undefined for every head; no query of the corpus counts for it" if part["value"].isna().all()
                else None),
        }
    return out


def _offsets(comparison: Comparison, name: str, n_layers: int, n_heads: int) -> dict | None:
    if "offsets" not in comparison.frames:
        return None
    part = comparison.offsets[comparison.offsets["model"] == name]
    if part.empty:
        return None
    span = sorted(part["offset"].unique().tolist())
    index = {d: i for i, d in enumerate(span)}
    out = {"d": [int(d) for d in span]}
    for column, key in (("value", "value"), ("ci_low", "low"), ("ci_high", "high")):
        grid = np.full((n_layers * n_heads, len(span)), np.nan)
        grid[(part["layer"] * n_heads + part["head"]).to_numpy(int), part["offset"].map(index).to_numpy(int)] = \
            part[column].to_numpy(float)
        out[key] = [[_num(v, 4) for v in row] for row in grid]
    return out


def _other_keys(table: str, frame: pd.DataFrame, part: pd.DataFrame) -> tuple[list[str], list[list[str]], pd.DataFrame]:
    """A table's rows of one model as the panel lists them: key column names, each row's key cells, the rows.

    syntax: the relations and order of the report's section (`headscan.analysis.syntax.relation_order`), the
    direction in words, and the fixed-offset baseline beside each row; positions: each bucket as the query
    positions it covers; any other table: its own key columns (and weights' embedding)."""
    if table == "syntax":
        order = {r: i for i, r in enumerate(relation_order(frame))}
        part = part[part["relation"].isin(order)]
        part = part.assign(_r=part["relation"].map(order)).sort_values(["_r", "direction"], kind="stable")
        cells = [[str(r), direction_text(str(d)), "\u2013" if pd.isna(b) else f"{b:.3f} ({offset_text(o)})"]
                 for r, d, b, o in zip(part["relation"], part["direction"], part["baseline"], part["baseline_offset"])]
        return ["relation", "direction", "baseline (d)"], cells, part
    keys = list(tables.TABLES[table].keys)
    if table == "weights" and "embedding" in part.columns and part["embedding"].notna().any():
        keys.append("embedding")
    columns = [part[k].map(fmt_bucket) if k == "bucket" else part[k].astype(object).where(part[k].notna(), "all")
               .astype(str) for k in keys]  # an undefined key (patching's position) covers every one
    names = ["positions" if k == "bucket" else k for k in keys]
    return names, [list(cells) for cells in zip(*columns)] if len(part) else [], part


NEAREST = 5  # heads listed per head from similarity.parquet and similarity_across.parquet


def _nearest(part: pd.DataFrame) -> pd.DataFrame:
    """Each head's `NEAREST` other heads of smallest divergence (itself left out), nearest first."""
    other = part["other_model"] if "other_model" in part else part["model"]
    part = part[(part["other_label"] != part["label"]) | (other != part["model"])]
    return part.sort_values("value", kind="stable").groupby(["layer", "head"], sort=False).head(NEAREST)


def _mirrored(across: pd.DataFrame) -> pd.DataFrame:
    """similarity_across rows seen from the other model: each pair's two heads swapped (the divergence is
    symmetric), so the second model of a run lists its nearest heads of the first too."""
    swap = {"model": "other_model", "layer": "other_layer", "head": "other_head", "label": "other_label"}
    return across.rename(columns={**swap, **{v: k for k, v in swap.items()}})[list(across.columns)]


def _other_rows(comparison: Comparison, name: str, n_heads: int) -> list[dict]:
    """Rows of tables other than heads and offsets (syntax accuracies, say), per head, for the panel.

    Column by column, as the tables are: row i is head ``at[i]``, its key cells ``cells[key[i]]`` (each distinct
    combination written once) and ``value[i]`` [``low[i]``, ``high[i]``] (no ``low`` and ``high`` where the
    table has no interval). Rows of dicts repeated every name and key cell, most of the atlas's size. syntax has
    ``best[i]``, accuracy minus the baseline, which orders the rows the panel shows before it folds the rest."""
    out = []
    for table, frame in comparison.frames.items():
        # colours of the grid; one row per trial; one row per unit, which says nothing without its text (the
        # examples, a tenth of a head's rows, are read in examples.parquet, not carried in the page); a row per
        # pair of heads (composition: its own section lists the pairs that matter)
        if table in ("heads", "offsets", "retrieval", "retrieval_trials", "examples", "composition") or \
                not tables.TABLES[table].per_head:  # rows about a whole model (the masking test) fill no head's panel
            continue
        part = frame[(frame["model"] == name) & frame["value"].notna()]
        if table == "similarity_across":  # a run writes each pair of models once, under its first model
            listed = set(part["other_model"])
            back = frame[(frame["other_model"] == name) & ~frame["model"].isin(listed) & frame["value"].notna()]
            part = pd.concat([part, _mirrored(back)])
        if table in ("similarity", "similarity_across"):  # heads^2 rows: each head's nearest heads only
            part = _nearest(part)
        if table == "patching":  # a head at each position alone is the section's, not the panel's
            part = part[part["position"].isna()]
        keys, cells, part = _other_keys(table, frame, part)
        distinct: dict[tuple, int] = {}
        key = [distinct.setdefault(tuple(c), len(distinct)) for c in cells]
        low = part["ci_low"] if "ci_low" in part else pd.Series(np.nan, index=part.index)
        high = part["ci_high"] if "ci_high" in part else pd.Series(np.nan, index=part.index)
        rows = {"table": table, "keys": keys, "cells": [list(c) for c in distinct],
                "at": (part["layer"].to_numpy(int) * n_heads + part["head"].to_numpy(int)).tolist(), "key": key,
                "value": [_num(v) for v in part["value"]]}
        if low.notna().any() or high.notna().any():  # similarity's tables have no interval: no lists of nulls
            rows.update(low=[_num(v) for v in low], high=[_num(v) for v in high])
        if table == "syntax" and "baseline" in part:  # the panel shows a head's best relations first
            rows.update(best=[_num(v) for v in part["value"] - part["baseline"]], best_is="accuracy above the baseline")
        out.append(rows)
    return out


def _patterns(examples: Examples | None, name: str) -> list[dict]:
    """Every head's attention on each example sentence, as bytes (0-255 for 0-1) in base64: compact JSON."""
    out = []
    for every in (examples.every_head if examples is not None else ()):
        if every.model != name:
            continue
        scaled = np.clip(np.rint(np.nan_to_num(every.patterns) * 255), 0, 255).astype(np.uint8)
        title = "the repeated sequence" if every.text == examples.repeated_text else "the example sentence"
        out.append({"title": title, "text": every.text, "tokens": list(every.tokens),
                    "bytes": base64.b64encode(scaled.tobytes()).decode("ascii")})
    return out


def _series(comparison: Comparison) -> list[dict]:
    """Each checkpoint series of the report (`report_steps`, as the section "Heads over training" finds
    them): its name, steps and models (indices into the atlas's models), by step."""
    steps = report_steps(comparison)
    index = {m.name: i for i, m in enumerate(comparison.models)}
    return [{"name": str(name), "steps": [int(s) for s in part["step"]], "models": [index[m] for m in part["model"]]}
            for name, part in steps.sort_values("step", kind="stable").groupby("series", sort=False)]


def _head_map(comparison: Comparison, name: str, n_heads: int) -> dict | None:
    """Model `name`'s head map as the section "Head families" draws it (`headscan.analysis.families.head_map`):
    each head's MDS coordinates (3 significant digits: what a small map shows), its cluster's number (None for a
    head alike no other) and the clusters' numbers, largest first (the order of their colours)."""
    similarity = comparison["similarity"]
    if not (similarity["model"] == name).any():
        return None
    mapped = families.head_map(similarity, name)
    at = (mapped["layer"] * n_heads + mapped["head"]).to_numpy(int)
    size = at.max() + 1 if len(at) else 0
    x, y, cluster = [None] * size, [None] * size, [None] * size
    for i, a, b, c, n in zip(at, mapped["x"], mapped["y"], mapped["cluster"], mapped["cluster_size"]):
        x[i], y[i], cluster[i] = _num(a, 3), _num(b, 3), int(c) if n > 1 else None
    sizes = mapped[mapped["cluster_size"] > 1].drop_duplicates("cluster")
    order = sizes.sort_values(["cluster_size", "cluster"], ascending=[False, True], kind="stable")["cluster"]
    return {"x": x, "y": y, "cluster": cluster, "order": [int(c) for c in order]}


def atlas_data(comparison: Comparison, examples: Examples | None = None) -> dict:
    """Everything the atlas shows, as JSON-ready values: metrics, colour scales, roles and, per model, every
    head's scores, intervals, ranks, thin-support marks, roles, offset profile and example attention.

    Per-head lists run layer by layer, head by head (index ``layer * heads + head``); NaN is None.
    """
    roles = head_roles(comparison.heads, comparison.frames.get("weights"))
    heads, shown = _with_importance(comparison)
    ranks = head_ranks(heads)
    metrics = []
    for metric in shown:
        entry = METRICS.get(metric)
        rows = heads[(heads["metric"] == metric) & heads["value"].notna()]
        values = rows["value"]
        # a metric this headscan does not register (dla, in logits) is drawn as a share only when it looks like one
        bounded = entry.bounded if entry is not None else bool(values.between(0.0, 1.0).all())
        top = 1.0 if bounded else (float(values.max()) if len(values) and values.max() > 0 else 1.0)
        chance = rows["chance"] if "chance" in rows else pd.Series(np.nan, index=rows.index)
        lift = (values - chance).abs().max()
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.log2((values / chance).where((chance > 0) & (values > 0))).abs().max()
        metrics.append({"name": metric, "unit": entry.unit if entry else "value", "bounded": bounded,
                        "striking": striking_order(metric), "max": _num(top), "ranked": entry is not None,
                        "lift": _num(lift if pd.notna(lift) and lift > 0 else None),
                        "ratio": _num(ratio if bounded and pd.notna(ratio) and ratio > 0 else None)})
    models = []
    maps = families_shown(comparison)
    for m in comparison.models:
        rows = heads[heads["model"] == m.name]
        n_layers, n_heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
        mine = roles[roles["model"] == m.name]
        role_grid = [[] for _ in range(n_layers * n_heads)]
        for r in mine.itertuples():
            role_grid[r.layer * n_heads + r.head] = r.roles
        models.append({
            "name": m.name, "family": m.family, "layers": n_layers, "heads": n_heads,
            "metrics": _model_metrics(comparison, m, rows, ranks[ranks["model"] == m.name], n_layers, n_heads, shown),
            "importance": _importance_note(comparison, m.name),
            "roles": role_grid,
            "offsets": _offsets(comparison, m.name, n_layers, n_heads),
            "examples": _patterns(examples, m.name),
            # a control's examples stay in examples.parquet: ten of them would double the page of a controls run
            "corpus_examples": unit_examples(comparison["examples"], m.name, n_heads)
            if "examples" in comparison.frames and m.provenance.control is None else None,
            "other": _other_rows(comparison, m.name, n_heads),
            "map": _head_map(comparison, m.name, n_heads) if maps else None,
        })
    return {
        "metrics": metrics,
        "scales": {"share": _stops("rocket_r"), "unbounded": _stops("mako_r"), "signed": _stops("vlag"),
                   "undefined": _UNDEFINED, "families": _FAMILY_COLOURS, "alone": _ALONE},
        "cut": families.CLUSTER_CUT,
        "series": _series(comparison),
        "controls": comparison.control_map(),
        "roles": [{"name": r.name, "rule": r.rule(comparison.tested).replace("`", ""), "colour": r.colour, "meaning": r.meaning}
                  for r in ROLES],
        "models": models,
        "initial": "prev_token" if "prev_token" in comparison.metrics else comparison.metrics[0],
    }


def _resource(name: str) -> str:
    return resources.files("headscan").joinpath(f"data/{name}").read_text(encoding="utf-8")


# Characters that may start markup inside a <script> element, as JSON escapes: "<!--<script>" in the data (web
# text, a user's --example) would otherwise put the parser in its escaped state, where "</script>" stops closing.
_SCRIPT_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def script_json(value) -> str:
    """`value` as JSON that is inert inside an HTML ``<script>`` element: ``<``, ``>`` and ``&`` as ``\\u`` escapes,
    and every non-ASCII character too (U+2028 and U+2029 included, which older JavaScript took for line ends).
    ``JSON.parse`` gives back the same strings.

    >>> print(script_json({"text": "<!--<script>&</script>\u2028"}))
    {"text":"\\u003c!--\\u003cscript\\u003e\\u0026\\u003c/script\\u003e\\u2028"}
    >>> json.loads(script_json(["a<b>&c"])) == ["a<b>&c"]
    True
    """
    return json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=True).translate(_SCRIPT_ESCAPES)


def atlas_html(comparison: Comparison, examples: Examples | None = None) -> str:
    """The atlas as one HTML fragment: its controls, a placeholder the script fills, the data as JSON, the
    style and the script, all inline. It works from ``file://`` and loads nothing."""
    data = script_json(atlas_data(comparison, examples))
    _, shown = _with_importance(comparison)
    options = "".join(f'<option value="{html.escape(m)}">{html.escape(m)}</option>' for m in shown)
    if families_shown(comparison):
        options += '<option value="@cluster">head family (cluster)</option>'
    return (
        f'<section id="{ATLAS_ID}" class="atlas" aria-label="head atlas">'
        '<div class="atlas-controls">'
        f'<label>Colour by <select id="atlas-metric">{options}<option value="@role">role</option></select></label>'
        '<label>as <select id="atlas-scale"><option value="value">value</option>'
        '<option value="lift">lift over chance (value \u2212 chance)</option>'
        '<option value="ratio">value / chance (shares)</option></select></label>'
        '<label>Find a head <input id="atlas-search" type="search" placeholder="L4H11 or model L4H11" '
        'autocomplete="off" spellcheck="false"></label><span id="atlas-found" class="atlas-found" aria-live="polite">'
        '</span></div>'
        '<div id="atlas-legend" class="atlas-legend"></div>'
        '<div class="atlas-body"><div id="atlas-grids" class="atlas-grids"></div>'
        '<aside id="atlas-panel" class="atlas-panel" hidden></aside></div>'
        '<div id="atlas-scatter" class="atlas-scatter"></div>'
        '<div id="atlas-tip" class="atlas-tip" hidden></div>'
        '<noscript><p class="note">The atlas needs JavaScript; every number in it is also in the tables '
        'below.</p></noscript>'
        f'<script type="application/json" id="atlas-data">{data}</script>'
        f"<style>{_resource('atlas.css')}</style>"
        f"<script>{page_script()}</script>"
        "</section>"
    )

