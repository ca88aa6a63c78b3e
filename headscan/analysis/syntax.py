"""Syntactic heads in a report: per relation and direction, each model's best head against the fixed-offset baseline.

The ``syntax`` table (`headscan.tables.TABLES`, filled by the sweep on CoNLL-U corpora with
`headscan.metrics.syntax`) scores every head on every dependency relation in both directions, with the best
fixed-offset baseline of that relation and direction beside each row. `best_heads` picks, per model, relation
and direction, the head with the highest accuracy and says whether it beats the baseline *beyond its
interval*: the paired difference with the baseline on the same dependents (``vs_baseline``) has its 95%
interval above 0 (tables without it: the lower end of the head's own interval lies above the baseline).

A causal model's query cannot see a word to its right, so its plain accuracy counts dependents whose head it
could never pick. For a causal model `best_heads` reads the rows over the dependents whose head the attending
word can see (directions ending in ``_visible``, where the table has them), under the plain direction's name
with ``visible`` true; a bidirectional model sees every word, and its plain rows are read (its sweep writes no
``_visible`` rows, which would repeat them; a table written before that has them, and they are left unread).
`relation_order` chooses which relations a report shows, `syntax_findings` states the ones that beat it, and `syntax_display` is the
sortable table's cells.

The winner's curse: a head chosen as the best of a model's heads, against an offset chosen as the best of six,
on the same words, looks a little better than it is. So the table's comparison is cross-fitted
(`headscan.scan.passes.baseline.cross_fit`): the units are split in two by the parity of their index, and each
half is scored with the head and the offset chosen on the other. `best_heads` names the head most accurate on the
whole corpus, and judges it by the cross-fitted comparison (``best_vs_baseline``: on each half the head and offset
the other half chose) where the table records it (``held_out``), with the in-sample one, head and offset chosen
on the whole corpus, beside it (``vs_baseline_in_sample``); ``halves`` names the heads the halves chose. The
head's own accuracy and interval are in sample; ``accuracy_held_out`` is the cross-fitted one.

This module draws nothing (see `headscan.plots.syntax.syntax_best_heads`), lays out nothing (see
`headscan.report.table_sections.syntax_section`) and imports no torch: it never imports `headscan.metrics`.

>>> rows = pd.DataFrame({"model": "m", "layer": [0, 1], "head": 0, "label": ["L0H0", "L1H0"], "relation": "det",
...                      "direction": "dependent_to_head", "value": [0.4, 0.9], "ci_low": [0.3, 0.85],
...                      "ci_high": [0.5, 0.95], "count": 100.0, "baseline": 0.5, "baseline_offset": 1})
>>> best_heads(rows)[["relation", "label", "accuracy", "margin", "beats"]].to_dict("records")
[{'relation': 'det', 'label': 'L1H0', 'accuracy': 0.9, 'margin': 0.35, 'beats': True}]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import tables
from .claims import why_not
from .formats import code, pct

__all__ = ["DIRECTIONS", "VISIBLE", "FREQUENT", "MIN_SHARE", "BEST_COLUMNS", "relation_order", "best_heads", "syntax_findings",
           "syntax_display", "direction_text", "offset_text"]

# `headscan.corpus.words.DIRECTIONS`, restated here so that the report never imports torch (a test checks they agree).
DIRECTIONS = ("dependent_to_head", "head_to_dependent")
# `headscan.metrics.syntax.VISIBLE`: each direction's rows over the dependents whose head the query can see.
VISIBLE = {direction: f"{direction}_visible" for direction in DIRECTIONS}
# Relations a report always shows when the data has them, besides ``all``.
FREQUENT = ("nsubj", "obj", "det", "amod", "advmod", "case", "nmod", "aux", "mark", "compound", "conj", "punct")
MIN_SHARE = 0.01  # any other relation is shown when it has at least this share of all dependents

BEST_COLUMNS = ["model", "relation", "direction", "visible", "label", "layer", "head", "accuracy", "ci_low", "ci_high",
                "joint_low", "joint_high", "count", "baseline", "baseline_offset", "vs_baseline", "vs_baseline_low", "vs_baseline_high", "margin",
                "beats", "thin", "chance", "unsupported", "held_out", "accuracy_held_out", "halves",
                "baseline_in_sample", "vs_baseline_in_sample", "vs_baseline_in_sample_low", "vs_baseline_in_sample_high"]

_DIRECTION_TEXT = {"dependent_to_head": "dependent \u2192 head", "head_to_dependent": "head \u2192 dependent",
                   "dependent_to_head_visible": "dependent \u2192 head (seen)",
                   "head_to_dependent_visible": "head \u2192 dependent (seen)"}


def direction_text(direction: str) -> str:
    """A direction as the report shows it.

    >>> direction_text("dependent_to_head")
    'dependent → head'
    """
    return _DIRECTION_TEXT.get(direction, direction)


def offset_text(offset) -> str:
    """A baseline offset with its sign ("-1", "+2", "0"); "–" where none was recorded.

    >>> offset_text(-1), offset_text(2), offset_text(0), offset_text(pd.NA)
    ('-1', '+2', '0', '–')
    """
    if offset is None or pd.isna(offset):
        return "\u2013"
    return f"{int(offset):+d}" if int(offset) else "0"


def judged_rows(syntax: pd.DataFrame) -> pd.DataFrame:
    """The rows a report judges, each under its plain direction's name with ``visible`` (bool) beside it: a causal
    model's ``_visible`` rows where its table has them, else (a bidirectional model, whose sweep writes none; a
    causal model's table written before they were scored) the plain rows; an older bidirectional table's
    ``_visible`` rows are left out.

    >>> rows = pd.DataFrame({"model": ["c", "c", "b", "b"], "family": ["causal", "causal", "bidirectional",
    ...     "bidirectional"], "direction": ["dependent_to_head", "dependent_to_head_visible"] * 2})
    >>> judged_rows(rows)[["model", "direction", "visible"]].to_dict("records")
    [{'model': 'c', 'direction': 'dependent_to_head', 'visible': True}, {'model': 'b', 'direction': 'dependent_to_head', 'visible': False}]
    """
    plain_of = {v: d for d, v in VISIBLE.items()}
    is_visible = syntax["direction"].isin(list(plain_of))
    causal = (syntax["family"] == "causal").fillna(False) if "family" in syntax else pd.Series(False, syntax.index)
    has_visible = is_visible.groupby(syntax["model"]).transform("any")
    keep = (is_visible & causal & has_visible) | (~is_visible & ~(causal & has_visible))
    rows = syntax[keep.astype(bool)]
    visible = rows["direction"].isin(list(plain_of))
    return rows.assign(direction=rows["direction"].map(lambda d: plain_of.get(d, d)), visible=visible.astype(bool))


def _dependents(syntax: pd.DataFrame) -> pd.Series:
    """Dependents per relation: the most any model has (a model's count is the same for all its heads and both
    directions; models differ only where their tokenisers cut different words off at max_len)."""
    plain = ~syntax["direction"].isin(list(VISIBLE.values())) if "direction" in syntax else True
    rows = syntax[(syntax["count"] > 0) & plain]
    return rows.groupby("relation", sort=False)["count"].max()


def relation_order(syntax: pd.DataFrame, *, relations=None, min_share: float = MIN_SHARE) -> list[str]:
    """The relations a report shows, in order: ``all`` first, then the others by number of dependents, most first
    (ties by name).

    Shown: every relation of `FREQUENT` the data has dependents for, and any other with at least `min_share`
    of ``all``'s dependents. `relations` replaces that choice (its order is kept; those without dependents
    are left out).

    >>> rows = pd.DataFrame({"relation": ["all", "det", "nsubj", "goeswith", "acl"], "count": [1000.0, 90, 120, 3, 40]})
    >>> relation_order(rows)
    ['all', 'nsubj', 'det', 'acl']
    """
    counts = _dependents(syntax)
    if relations is not None:
        return [r for r in relations if r in counts.index]
    total = counts.get("all", counts.drop("all", errors="ignore").sum())
    shown = [r for r in counts.index if r != "all" and (r in FREQUENT or counts[r] >= min_share * total)]
    shown.sort(key=lambda r: (-counts[r], r))
    return (["all"] if "all" in counts.index else []) + shown


def best_heads(syntax: pd.DataFrame, *, relations=None, min_share: float = MIN_SHARE) -> pd.DataFrame:
    """Per model, relation and direction, the head with the highest accuracy, against the fixed-offset baseline.

    Parameters
    ----------
    syntax : DataFrame
        Rows of ``syntax.parquet`` (columns ``model, layer, head, label, relation, direction, value, ci_low,
        ci_high, count, baseline, baseline_offset``; ``family``, ``vs_baseline``, ``vs_baseline_low``,
        ``vs_baseline_high``, ``units`` and ``top_unit_share`` where recorded), one run's or several runs'
        (`headscan.analysis.runs.Comparison`) with the models named apart. A causal model is judged on its
        visible-head rows (`judged_rows`).
    relations : sequence of str, optional
        The relations to show, in this order; by default `relation_order`'s choice.
    min_share : float, default `MIN_SHARE`
        See `relation_order`.

    Returns
    -------
    DataFrame
        Columns `BEST_COLUMNS`: ``visible`` whether the row counts only the dependents whose head the query
        can see, ``accuracy`` is the head's value (share of dependents), ``count`` the number
        of dependents, ``baseline`` the fixed-offset baseline's accuracy (cross-fitted where the table records
        it: each half of the units scored with the offset best on the other) and ``baseline_offset`` the offset
        best on the whole corpus (NaN / <NA> where the table did not record them: tables added up by
        `headscan.tables.merge_tables`), ``vs_baseline`` with its interval the paired difference with the
        baseline on the same dependents, cross-fitted for the choice of head and of offset where the table
        records it (``held_out`` True), else the named head's in-sample one, ``margin`` that interval's lower end
        (where not recorded: ``ci_low - baseline``) and ``beats = margin > 0`` (False where NaN),
        ``thin`` the head's value rests on thin support (`headscan.tables.thin_rows`), ``chance`` a uniformly
        random choice among the candidate words, ``unsupported`` why the row cannot carry a claim
        (`headscan.analysis.claims.why_not`: thin, or its interval not above chance), "" where it can,
        ``accuracy_held_out`` the cross-fitted accuracy of the best head (NaN where not recorded), ``halves`` the
        heads the two halves chose ("L2H1", or "L2H1 / L2H8" for the even then the odd units' choice; "" where not
        recorded), and ``baseline_in_sample``, ``vs_baseline_in_sample`` (``_low``, ``_high``) the named head's
        comparison with the offset chosen on the whole corpus, in sample. One row per
        (model, relation, direction) with a defined value, relation by relation in the shown order, then
        direction, then model in the table's order.

    Notes
    -----
    Heads with an undefined value (no dependent counted) are never chosen. Ties of accuracy go to the head
    whose interval starts higher, then to the lower layer, then head: of two equally accurate heads the one
    more surely above the baseline is shown, and the choice does not depend on the table's row order.
    """
    order = relation_order(syntax, relations=relations, min_share=min_share)
    models = {name: i for i, name in enumerate(dict.fromkeys(syntax["model"]))}
    syntax = judged_rows(syntax)
    rows = syntax[syntax["relation"].isin(order) & syntax["value"].notna()]
    rows = rows.assign(thin=tables.thin_rows(rows),
                       ci_low_key=rows["ci_low"].fillna(-np.inf))  # a missing interval ranks last among ties
    rows = rows.sort_values(["value", "ci_low_key", "layer", "head"], ascending=[False, False, True, True],
                            kind="stable")
    best = rows.groupby(["model", "relation", "direction"], sort=False, observed=True).head(1)
    rank = {r: i for i, r in enumerate(order)}
    way = {d: i for i, d in enumerate(DIRECTIONS)}
    best = best.assign(_r=best["relation"].map(rank), _d=best["direction"].map(lambda d: way.get(d, len(way))),
                       _m=best["model"].map(models))
    best = best.sort_values(["_r", "_d", "_m"], kind="stable")
    paired, in_sample, margin, held_out = _comparison(best)
    out = pd.DataFrame({
        "model": best["model"].astype(str), "relation": best["relation"].astype(str),
        "direction": best["direction"].astype(str), "visible": best["visible"].astype(bool),
        "label": best["label"].astype(str),
        "layer": best["layer"].astype(int), "head": best["head"].astype(int),
        "accuracy": best["value"].astype(float), "ci_low": best["ci_low"].astype(float),
        "ci_high": best["ci_high"].astype(float),
        # the interval over every head of the relation at once: the best head was picked from them
        **{c: best[c].astype(float) if c in best.columns else pd.Series(np.nan, index=best.index, dtype=float)
           for c in ("joint_low", "joint_high")},
        "count": best["count"].astype(float),
        "baseline": best["baseline"].astype(float), "baseline_offset": best["baseline_offset"].astype("Int64"),
        **paired, "margin": margin, "beats": (margin > 0).fillna(False).astype(bool), "thin": best["thin"].astype(bool),
        "chance": best["chance"].astype(float) if "chance" in best.columns else np.nan,
        "unsupported": why_not(best) if len(best) else pd.Series(dtype=object),
        "held_out": held_out.astype(bool), "accuracy_held_out": _floats(best, "best_held_out"),
        "halves": _halves(syntax, best), **in_sample,
    })
    return out[BEST_COLUMNS].reset_index(drop=True)


def _floats(frame: pd.DataFrame, name: str) -> pd.Series:
    """`frame`'s column as floats, NaN where the table does not record it."""
    return frame[name].astype(float) if name in frame.columns else pd.Series(np.nan, index=frame.index, dtype=float)


def _comparison(best: pd.DataFrame):
    """The best rows' comparison with the baseline: the paired difference and interval the verdict rests on, the
    in-sample one, the margin and whether the first is held out.

    The cross-fitted comparison of the best head (head and offset chosen on the other half of the units) where
    recorded; a table written before headscan cross-fitted holds only the named head's own, chosen in sample."""
    held_out = _floats(best, "best_vs_baseline").notna()
    row = {c: _floats(best, c) for c in ("vs_baseline", "vs_baseline_low", "vs_baseline_high")}
    recorded = _floats(best, "vs_baseline_in_sample").notna()
    paired = {c: _floats(best, f"best_{c}").where(held_out, row[c].where(~recorded)) for c in row}
    in_sample = {f"{c}_in_sample{end}": _floats(best, f"{c}_in_sample{end}").where(recorded, _floats(best, f"{c}{end}"))
                 for c, end in (("baseline", ""), ("vs_baseline", ""), ("vs_baseline", "_low"), ("vs_baseline", "_high"))}
    # the paired interval's low end where recorded; an older table's best guess, the head's own interval's
    margin = paired["vs_baseline_low"].where(paired["vs_baseline_low"].notna() | recorded,
                                             (best["ci_low"] - best["baseline"]).astype(float))
    return paired, in_sample, margin, held_out


def _halves(syntax: pd.DataFrame, best: pd.DataFrame) -> pd.Series:
    """Per best row, the heads the cross-fit's halves chose ("L2H1" where both chose it, "L2H1 / L2H8" for the
    even units' then the odd units' choice); "" where the table does not record them."""
    if not {"best_even", "best_odd"} <= set(syntax.columns) or best.empty:
        return pd.Series("", index=best.index, dtype=object)
    keys = ["model", "relation", "direction"]
    picked = {}
    for flag in ("best_even", "best_odd"):
        rows = syntax[syntax[flag].fillna(False).astype(bool)]
        picked[flag] = best[keys].merge(rows[[*keys, "label"]].drop_duplicates(keys), on=keys, how="left")["label"]
    even, odd = (picked[f].fillna("").astype(str).to_numpy() for f in ("best_even", "best_odd"))
    text = [e if e == o else (f"{e} / {o}" if e and o else "") for e, o in zip(even, odd)]
    return pd.Series(text, index=best.index, dtype=object)


def _claimable(rows: pd.DataFrame) -> pd.Series:
    """Rows that may carry a claim: `best_heads`' ``unsupported`` empty (tables written before headscan gave
    best_heads that column are judged on support and interval alone)."""
    if "unsupported" in rows.columns:
        return rows["unsupported"].fillna("") == ""
    return rows["ci_low"].notna() & ~rows["thin"]


def _sentence(row) -> str:
    chance = "" if pd.isna(getattr(row, "chance", np.nan)) else f" (chance {pct(row.chance)})"
    offset = f"the best fixed offset ({offset_text(row.baseline_offset)})"
    low, high = getattr(row, "vs_baseline_low", np.nan), getattr(row, "vs_baseline_high", np.nan)
    paired = ("" if pd.isna(low) or pd.isna(high) else
              f", {100 * row.vs_baseline:+.1f} points [{100 * low:+.1f}, {100 * high:+.1f}] on the same words")
    if paired and bool(getattr(row, "held_out", False)):  # say what was held out, and what in sample says
        halves = getattr(row, "halves", "") or ""
        chose = f"; the halves chose {halves.replace(' / ', ' and ')}" if " / " in halves else ""
        in_sample = getattr(row, "vs_baseline_in_sample", np.nan)
        said = "" if pd.isna(in_sample) else f", {100 * in_sample:+.1f} in sample"
        paired += (f" held out (head and offset chosen on one half of the units, scored on the other"
                   f"{chose}{said})")
    visible = bool(getattr(row, "visible", False))
    joint_low, joint_high = getattr(row, "joint_low", np.nan), getattr(row, "joint_high", np.nan)
    if not (pd.isna(joint_low) or pd.isna(joint_high)):  # picked as the best of its relation's heads: say what holds
        chance += f" ({100 * joint_low:.1f} to {100 * joint_high:.1f} over all heads at once)"
    accuracy = f"{pct(row.accuracy)} [{100 * row.ci_low:.1f}, {100 * row.ci_high:.1f}]"
    held = getattr(row, "accuracy_held_out", np.nan)
    if not pd.isna(held) and bool(getattr(row, "held_out", False)):
        accuracy += f" ({pct(held)} held out)"
    if row.direction == "head_to_dependent":
        seen = " its head can see" if visible else ""
        return (f"In {row.model} {row.label}, the word attending most to each {code(row.relation)} dependent{seen} is "
                f"its head for {accuracy} of them{chance}, against {pct(row.baseline)} for {offset}{paired}.")
    seen = " whose head it can see" if visible else ""
    return (f"{row.model} {row.label} picks the head of {accuracy} of {code(row.relation)} dependents{seen}{chance}, "
            f"against {pct(row.baseline)} for {offset}{paired}.")


def syntax_findings(best: pd.DataFrame) -> dict[str, list[str]]:
    """Sentences from `best_heads`, keyed by model (in the table's order).

    A sentence for each row whose best head beats the baseline beyond its interval (``beats``) and may carry a
    claim (``unsupported`` empty: not thin, its interval above chance), most dependents first; then one
    sentence naming the relations where no head does in either direction, and one for rows left unsaid
    because of thin support, a missing interval, chance or baseline, or an interval that holds chance. A head
    whose accuracy is above the baseline but whose interval reaches down to it gets no sentence.

    >>> best = pd.DataFrame({"model": "m", "relation": ["det", "amod"], "direction": "dependent_to_head",
    ...     "label": ["L3H5", "L0H1"], "layer": [3, 0], "head": [5, 1], "accuracy": [0.612, 0.70],
    ...     "ci_low": [0.590, 0.66], "ci_high": [0.634, 0.74], "count": [500.0, 300.0], "baseline": [0.481, 0.68],
    ...     "baseline_offset": [-1, 1], "margin": [0.109, -0.02], "beats": [True, False], "thin": False,
    ...     "chance": [0.1, 0.12], "unsupported": ""})
    >>> for sentence in syntax_findings(best)["m"]:
    ...     print(sentence)
    m L3H5 picks the head of 61.2% [59.0, 63.4] of `det` dependents (chance 10.0%), against 48.1% for the best fixed offset (-1).
    No head of m beats the best fixed offset beyond its 95% interval on `amod`, in either direction.
    """
    out: dict[str, list[str]] = {}
    for model in dict.fromkeys(best["model"]):
        rows = best[best["model"] == model]
        claimable = _claimable(rows)
        said = rows[rows["beats"] & claimable]
        sentences = [_sentence(row) for row in said.sort_values("count", ascending=False, kind="stable").itertuples()]
        judged = rows[rows["baseline"].notna() & claimable]
        beaten = set(rows.loc[rows["beats"], "relation"])
        unsure = set(rows.loc[~rows.index.isin(judged.index), "relation"])
        never = [r for r in dict.fromkeys(rows["relation"]) if r not in beaten | unsure]
        if never:
            sentences.append(f"No head of {model} beats the best fixed offset beyond its 95% interval on "
                             f"{', '.join(code(r) for r in never)}, in either direction.")
        unjudged = rows[~rows.index.isin(judged.index)]
        if len(unjudged):
            why = []
            if rows["ci_low"].isna().any():
                why.append("no interval (a sweep without bootstrap, or tables added up by merge_tables)")
            if rows["baseline"].isna().any():
                why.append("no baseline recorded")
            if rows["thin"].any():
                why.append(f"{int(rows['thin'].sum())} on thin support, which cannot be assessed on this corpus")
            # a thin row's interval is not trusted: it is counted above, not as one that holds chance
            near = (rows["unsupported"].fillna("").str.contains("chance") & ~rows["thin"].astype(bool)
                    if "unsupported" in rows else rows["thin"] & False)
            if near.any():
                why.append(f"{int(near.sum())} with an interval that does not lie above chance, or no chance recorded")
            sentences.append(f"{len(unjudged)} of {len(rows)} best heads of {model} are not judged: "
                             f"{'; '.join(why)}.")
        out[model] = sentences
    return out


def _fmt(value: float) -> str:
    return "\u2013" if pd.isna(value) else f"{value:.3f}"


def _signed(value: float) -> str:
    return "\u2013" if pd.isna(value) else f"{value:+.3f}"


def _column(frame: pd.DataFrame, name: str, missing=np.nan) -> pd.Series:
    """`frame`'s column, or `missing` on every row where it has none (a table written before headscan kept it)."""
    return frame[name] if name in frame.columns else pd.Series(missing, index=frame.index, dtype=object)


def syntax_display(best: pd.DataFrame, *, with_model: bool = True) -> pd.DataFrame:
    """`best_heads` as display strings, one row per (model, relation, direction), for a sortable table.

    Columns ``model`` (unless not `with_model`), ``relation, direction, head, accuracy, 95% low, 95% high,
    dependents``, then the comparison with the baseline, then ``chance, no claim``. head adds the heads the
    cross-fit's two halves chose where they differ; accuracy and its interval are the named head's, in sample;
    dependents ends in "seen" where only those whose head the query can see count. The comparison's columns are
    each one estimate's, so that accuracy minus baseline is the difference beside them: where any row is held out
    (the table records the cross-fit), ``held-out accuracy, held-out baseline, held-out vs baseline, margin,
    beats`` (head and offset chosen on the other half of the units), then ``in-sample baseline, offset, in-sample
    vs baseline`` (offset d chosen on every unit; accuracy minus in-sample baseline); else ``baseline, offset, vs
    baseline, margin, beats``, in sample. margin (signed) is the low end of the verdict's difference's interval,
    beats "yes" (‡ where on thin support, which no finding rests on) or "", no claim why a row carries none (the
    word the head lists and ``headscan show`` use). "–" where a row has no such number.
    """
    held = bool(_column(best, "held_out", False).fillna(False).astype(bool).any())
    verdict = {
        "margin": best["margin"].map(_signed),
        "beats": [("yes" if beats else "") + ("\u2021" if thin else "")
                  for beats, thin in zip(best["beats"], best["thin"])],
    }
    offset = best["baseline_offset"].map(offset_text)
    if held:
        compared = {"held-out accuracy": _column(best, "accuracy_held_out").map(_fmt),
                    "held-out baseline": best["baseline"].map(_fmt),
                    "held-out vs baseline": _column(best, "vs_baseline").map(_signed), **verdict,
                    "in-sample baseline": _column(best, "baseline_in_sample").map(_fmt), "offset": offset,
                    "in-sample vs baseline": _column(best, "vs_baseline_in_sample").map(_signed)}
    else:
        compared = {"baseline": best["baseline"].map(_fmt), "offset": offset,
                    "vs baseline": _column(best, "vs_baseline").map(_signed), **verdict}
    frame = pd.DataFrame({
        "model": best["model"],
        "relation": best["relation"],
        "direction": best["direction"].map(lambda d: direction_text(d).replace(" ", "\u00a0")),  # one line
        "head": [label + (f" ({halves})" if " / " in halves else "") for label, halves in
                 zip(best["label"], _column(best, "halves", "").fillna(""))],
        "accuracy": best["accuracy"].map(_fmt),
        "95% low": best["ci_low"].map(_fmt),
        "95% high": best["ci_high"].map(_fmt),
        "dependents": [f"{int(n):,}" + (" seen" if seen else "") for n, seen in
                       zip(best["count"], best["visible"] if "visible" in best else [False] * len(best))],
        **compared,
        "chance": (best["chance"] if "chance" in best else pd.Series(np.nan, index=best.index)).map(_fmt),
        "no claim": (best["unsupported"] if "unsupported" in best else pd.Series("", index=best.index)).fillna(""),
    })
    return (frame if with_model else frame.drop(columns="model")).reset_index(drop=True)
