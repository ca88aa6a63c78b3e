"""What ``headscan show`` prints: a run's most striking heads on one metric, as a table, table by table.

Heads tables (`headscan.analysis.ranking.top_heads`), with a model whose metric is 0 or undefined by
construction said in one line; profiles (offsets, positions) each head at its peak; the scores the metric
registry does not hold (``copying``, ``dla``); head importance; syntactic heads against the fixed-offset
baseline. Under each table one line says what its columns hold, every one but the self-evident (`footer`): the
table registry's description where it has one (`headscan.tables.column_notes`), else this module's.

This module draws nothing and loads no model.
"""

from __future__ import annotations

import difflib
import os

import pandas as pd

from ..errors import MetricError, TablesError
from ..metrics import METRICS, describe
from ..tables import TABLES, SweepTables, load
from ..tables.schema import column_notes
from .claims import why_not
from .importance import effects
from .patching import top_patched
from .ranking import controls_note, structural_reason, thin_note, thin_passed, top_heads, unit_note, why_structural
from .syntax import best_heads, offset_text, relation_order

__all__ = ["show", "SHOWN", "SELF_EVIDENT", "SHOW_NOTES", "top_heads_text", "show_metrics", "footer", "length_notes"]


# The columns `headscan show` prints; ``unsupported`` (why a row carries no claim) under the reports' own word.
SHOWN = ["model", "label", "layer", "head", "value", "ci_low", "ci_high", "chance", "count", "units", "unsupported"]

NO_CLAIM = {"unsupported": "no claim"}

# Columns whose name says what they hold: the footer under a table names every other one.
SELF_EVIDENT = ("model", "label", "layer", "head", "relation", "direction", "target", "method")
# What the columns `headscan show` prints hold where the table registry has no description of them (its own
# names, or a table's key and extra columns), or where show prints them otherwise than the table holds them.
SHOW_NOTES = {
    "no claim": "why the row may carry no claim, empty where it may (thin support; at chance: its interval holds "
                "chance; too few units to assess; beyond uniform attention only; ...)",
    "offset": "d, the key at query + d (-1: the previous token)",
    "bucket": "the query positions [b, 2b)",
    "embedding": "which embedding the copying score reads",
    "fraction restored": "the share of the clean-minus-corrupted logit difference that the head's clean output, "
                         "patched into the corrupted run, restores (exact denoising; 1 is all of it)",
    "pairs": "prompt pairs it rests on",
    "accuracy": "share of the relation's dependents whose most-attended word is the right one (a causal model: "
                "only the dependents whose target word the query can see)",
    "dependents": "dependents the accuracy counts",
    "baseline": "the best fixed offset's accuracy on the same dependents",
    "baseline_offset": "that offset: always the word d away",
    "vs_baseline": "accuracy minus baseline, on the same dependents",
    "vs_low": "low end of vs_baseline's 95% interval, paired over the same units (where the table did not record "
              "it: ci_low minus baseline)",
    "vs_high": "its high end (where not recorded: ci_high minus baseline)",
    "beats": "vs_low above 0: the head beats the best fixed offset",
    "importance value": "the target's change when the head's output is replaced by its mean (ablated minus "
                        "clean); 0 is no effect",
}

# Scores a sweep may write that the metric registry does not hold: metric -> the table it is in.
_UNREGISTERED = {"copying": ("weights", "copying"), "dla": ("heads", "dla"), "dla_positive": ("heads", "dla_positive"),
                 "patching": ("patching", "denoise")}

# What to run for a table a run lacks, said when `headscan show` is asked for one of its metrics.
_HOW_TO_GET = {
    "heads": "sweep a corpus with headscan sweep to get one (this is not a sweep's output)",
    "syntax": "sweep a CoNLL-U treebank (headscan sweep --corpus FILE.conllu) to get one",
    "importance": "sweep with headscan sweep --importance atp (or ablate) to get one",
    "value": "sweep with headscan sweep --values to get one",
    "retrieval": "run headscan retrieval to get one",
    "patching": "run headscan patch over prompt pairs to get one",
}


def top_heads_text(run: SweepTables, metric: str | None = None, n: int = 10) -> str:
    """What ``headscan show`` prints: the `n` most striking heads of each model on `metric`, as a table, with a
    model whose `metric` is 0 or undefined by construction said in one line instead of n rows of zeros.

    >>> heads = pd.DataFrame({"model": ["gpt", "gpt"], "family": "causal", "layer": 0, "head": [0, 1],
    ...     "label": ["L0H0", "L0H1"], "metric": "next_token", "value": 0.0, "ci_low": 0.0, "ci_high": 0.0,
    ...     "count": 5.0, "units": 5.0, "top_unit_share": 0.2})
    >>> print(top_heads_text(SweepTables({"heads": heads}), "next_token"))
    gpt: next_token: a causal model's queries cannot see later tokens, so it is 0 for every head

    A model whose `metric` is undefined for every head in this run (streaming on segments shorter than the sink
    and window, dla without values, retrieval when no answer passed the gate) gets one line saying why, too.
    ``copying`` (weights.parquet), which the metric registry does not hold, prints its highest heads; a profile
    (offsets, positions) each head at its peak (`_profile_text`); ``importance`` (importance.parquet) the heads
    whose removal changes the target most, either way (`headscan.analysis.importance.effects`). ``syntax``, for
    a run with a syntax table, prints each model's best head per relation and direction against the fixed-offset
    baseline (`headscan.analysis.syntax.best_heads`), for the `n` relations with most dependents.

    Raises
    ------
    MetricError
        `metric` is none of `show_metrics` ("did you mean").
    TablesError
        The run has no table of `metric` (the message says how to get one), or `n` is below 1.
    """
    if metric is None:  # a sweep's previous-token heads, a retrieval run's retrieval heads, a patching run's
        metric = "prev_token" if "heads" in run.frames else "patching" if "patching" in run.frames else "retrieval"
    if n < 1:
        raise TablesError(f"top must be at least 1, got {n}")
    # a user's metric (--metric-module) that this process has not loaded: run.json says which table holds it
    custom = run.provenance.extra.get("custom_metrics", {}).get(metric) if metric not in METRICS else None
    table = custom.get("table", "heads") if custom else _table_of(metric)  # else "did you mean", among show's metrics
    if table not in run.frames:
        how = _HOW_TO_GET.get(table, "sweep a corpus with headscan sweep to get one")
        raise TablesError(f"this run has no {table}.parquet, so no {metric!r}; {how}")
    if metric == "syntax":
        return _syntax_text(run["syntax"], n)
    if metric == "importance":
        return _importance_text(run["importance"], n)
    if metric == "patching":  # the heads that restore the most of the logit difference, exact denoising
        top = top_patched(run["patching"], "denoise", n)
        table = top[["model", "label", "layer", "head", "value", "ci_low", "ci_high", "count"]].rename(
            columns={"value": "fraction restored", "count": "pairs"})
        return table.to_string(index=False) + "\n" + footer(table.columns)
    if metric not in METRICS and not custom:
        return _unregistered_text(run, metric, n)
    if list(TABLES[table].keys) != ["metric"]:
        return _profile_text(run[table], metric, n)
    heads = run[table]
    said, shown = [], []
    for model in dict.fromkeys(heads["model"]):
        rows = heads[(heads["model"] == model) & (heads["metric"] == metric)]
        family = str(heads.loc[heads["model"] == model, "family"].iloc[0])
        provenance = run.provenance.model(model)
        reason = why_structural(rows, metric, family=family, provenance=provenance if provenance.family else None)
        if reason is None and rows["value"].isna().all():
            reason = _why_undefined_here(run, model, metric)
        if reason is not None:
            said.append(f"{model}: {metric}: {reason}")
        else:
            shown.append(model)
    kept = heads[heads["model"].isin(shown)]
    top = top_heads(kept, metric, n, keep_flat=True, thin_last=True)  # checks `n` even if none is shown
    passed = [thin_note(model, metric, rows) for model, rows in thin_passed(kept, metric, n).items()]
    table = top[SHOWN].rename(columns=NO_CLAIM)
    entry = describe(metric)
    parts = [table.to_string(index=False), *passed,
             footer(table.columns, {"value": f"{metric} in {entry.unit}, {column_notes()['value']}"})] if shown else []
    return "\n".join(parts + said)


def show(run: str | os.PathLike | SweepTables, metric: str | None = None, top: int = 10) -> str:
    """What ``headscan show RUN --metric METRIC --top TOP`` prints: `run` (a run's folder, or its tables) read with
    `headscan.load`, its `top` heads per model on `metric` (`top_heads_text`, which says what `metric` may be and
    what is refused), then one line per control model and one on the unit its intervals resampled.

    >>> heads = pd.DataFrame({"model": "gpt", "family": "causal", "layer": 0, "head": [0, 1], "label": ["L0H0", "L0H1"],
    ...     "metric": "next_token", "value": 0.0, "ci_low": 0.0, "ci_high": 0.0, "count": 5.0, "units": 5.0,
    ...     "top_unit_share": 0.2})
    >>> print(show(SweepTables({"heads": heads}), "next_token"))
    gpt: next_token: a causal model's queries cannot see later tokens, so it is 0 for every head
    intervals resample segments
    """
    tables = run if isinstance(run, SweepTables) else load(run)
    return "\n".join([top_heads_text(tables, metric, top), *controls_note(tables.provenance),
                      unit_note(tables.provenance)])


def footer(columns, notes: dict[str, str] | None = None) -> str:
    """One line under a printed table: what each of its `columns` holds, every one but `SELF_EVIDENT`, from
    `notes`, else `SHOW_NOTES`, else the table registry (`headscan.tables.column_notes`).

    >>> footer(["model", "label", "units", "no claim"])
    'columns | units: bootstrap units (segments or documents) with count > 0: how many the value rests on | no claim: why the row may carry no claim, empty where it may (thin support; at chance: its interval holds chance; too few units to assess; beyond uniform attention only; ...)'

    Raises
    ------
    KeyError
        A column that nothing describes: give it a line in `SHOW_NOTES` (the tests ask this of every table shown).
    """
    known = column_notes() | SHOW_NOTES | (notes or {})
    return " | ".join(["columns", *(f"{c}: {known[c]}" for c in columns if c not in SELF_EVIDENT)])


def show_metrics() -> list[str]:
    """Every metric `top_heads_text` (``headscan show --metric``) takes: the registry's, then the scores a sweep
    writes that the registry does not hold (``copying``)."""
    return [*METRICS, *(name for name in _UNREGISTERED if name not in METRICS)]


def _table_of(metric: str) -> str:
    """The table `metric` lives in; an unknown name gets "did you mean", among `show_metrics`."""
    if metric in METRICS:
        return METRICS[metric].table
    if metric in _UNREGISTERED:
        return _UNREGISTERED[metric][0]
    close = difflib.get_close_matches(metric, show_metrics(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise MetricError(f"unknown metric {metric!r}.{hint} Available: {', '.join(show_metrics())}")


def _why_undefined_here(run: SweepTables, model: str, metric: str) -> str:
    """Why `model`'s `metric` is undefined (NaN, or no row) for every head of this run, where the registry gives no
    structural reason: not scored (what the sweep recorded), or no query of the corpus counts for it."""
    config = run.provenance.config
    recorded = run.provenance.model(model).extra.get("dla")
    if (metric.startswith("dla") or metric == "attended_logit") and recorded and not recorded.startswith("captured"):
        return f"undefined for every head: dla {recorded}" + ("; headscan sweep --values scores it"
                                                                  if "values=False" in recorded else "")
    noted = run.provenance.model(model).extra.get("values")  # output norms come with the values' capture
    if metric == "output_norm" and noted and not noted.startswith("captured"):
        return f"undefined for every head: values {noted}"
    if metric == "streaming" and {"sink", "recent"} <= set(config):
        return (f"undefined for every head: no query lies at or past position sink + recent ({config['sink']} + "
                f"{config['recent']}); give headscan sweep longer segments, or a smaller --sink and --recent")
    if metric == "retrieval":
        return "undefined for every head: no trial's answer passed the gate (retrieval_ungated scores every trial)"
    return "undefined for every head: no query of the corpus counts for it"


def _profile_text(frame: pd.DataFrame, metric: str, n: int) -> str:
    """`top_heads_text` for a profile (offsets, positions): each head at the point of its axis where it is most
    striking, then the `n` most striking heads per model. Points where every head of a model scores the same (a
    causal model's first_token at position 0) rank nothing and are left out.

    >>> offsets = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 0, 1, 1], "label": ["L0H0", "L0H0", "L0H1",
    ...     "L0H1"], "offset": [-1, 0, -1, 0], "value": [0.9, 0.1, 0.2, 0.7], "ci_low": float("nan"),
    ...     "ci_high": float("nan"), "count": 8, "units": 4})
    >>> print(_profile_text(offsets, "offsets", 5))
    offsets: each head at the offset where it is highest
    model label  layer  head  offset  value  ci_low  ci_high  count  units    no claim
        m  L0H0      0     0      -1    0.9     NaN      NaN      8      4 no interval
        m  L0H1      0     1       0    0.7     NaN      NaN      8      4 no interval
    columns | offset: d, the key at query + d (-1: the previous token) | value: offsets in share of attention at that offset, sum / count; NaN where count == 0 | ci_low: lower end of the 95% bootstrap interval; NaN where undefined | ci_high: upper end | count: number of queries that count for this metric; <NA> in weights.parquet, which sums nothing | units: bootstrap units (segments or documents) with count > 0: how many the value rests on | no claim: why the row may carry no claim, empty where it may (thin support; at chance: its interval holds chance; too few units to assess; beyond uniform attention only; ...)

    For offsets that is the offset each head attends to most (-1: a previous-token head), the heads that put the
    most attention there first.
    """
    rows = frame[frame["metric"] == metric] if "metric" in frame.columns else frame
    axis = [c for c in TABLES[_table_of(metric)].keys if c != "metric"]
    rows = rows[rows["value"].notna()]
    if len(rows):
        at_point = rows.groupby(["model", *axis], sort=False, observed=True)["value"]
        rows = rows[(at_point.transform("nunique") > 1) | (at_point.transform("size") == 1)]
    high = describe(metric).ranks_high()
    rows = rows.sort_values(["value", "layer", "head", *axis], ascending=[not high, True, True, *[True] * len(axis)],
                            kind="stable")
    peaks = rows.drop_duplicates(["model", "layer", "head"])
    models = {name: i for i, name in enumerate(dict.fromkeys(frame["model"]))}
    top = peaks.groupby("model", sort=False).head(n).sort_values("model", key=lambda c: c.map(models), kind="stable")
    columns = [c for c in ["model", "label", "layer", "head", *axis, "value", "ci_low", "ci_high", "chance", "count",
                           "units"] if c in top.columns]
    head = f"{metric}: each head at the {', '.join(axis)} where it is {'highest' if high else 'lowest'}"
    if top.empty:
        return f"{head}: no head differs from the others of its model at any point"
    top = top.assign(unsupported=why_not(top, striking=describe(metric).striking))
    table = top[[*columns, "unsupported"]].rename(columns=NO_CLAIM)
    value = {"value": f"{metric} in {describe(metric).unit} at that {', '.join(axis)}, {column_notes()['value']}"}
    return head + "\n" + table.to_string(index=False) + "\n" + footer(table.columns, value)


def _unregistered_text(run: SweepTables, metric: str, n: int) -> str:
    """`top_heads_text` for ``copying`` (weights.parquet) and ``dla`` / ``dla_positive`` (heads.parquet): the
    highest first, ties to the lower layer, then head."""
    if n < 1:
        raise TablesError(f"top must be at least 1, got {n}")
    table = _UNREGISTERED[metric][0]
    frame = run[table]
    rows = frame[(frame["metric"] == metric) & frame["value"].notna()]
    rows = rows.sort_values(["value", "layer", "head"], ascending=[False, True, True], kind="stable")
    models = {name: i for i, name in enumerate(dict.fromkeys(frame["model"]))}
    rows = rows.groupby("model", sort=False).head(n).sort_values("model", key=lambda c: c.map(models), kind="stable")
    columns = ["model", "label", "layer", "head", "value"] + (["embedding"] if table == "weights" else
                                                               ["ci_low", "ci_high", "count"])
    said = [f"{model}: {metric}: {_why_undefined(run, model, metric)}" for model in models
            if not (rows["model"] == model).any()]
    value = {"value": f"{metric}: " + ("the copying score read off the weights" if metric == "copying" else
                                       f"{describe(metric).unit}, {column_notes()['value']}")}
    shown = [rows[columns].to_string(index=False), footer(columns, value)] if len(rows) else []
    return "\n".join(shown + said)


def _why_undefined(run: SweepTables, model: str, metric: str) -> str:
    """Why `model` has no value of an unregistered score: the registry's structural reason, else what the
    sweep recorded of it (the provenance's ``weights`` or ``dla``: "not scored: ...")."""
    provenance = run.provenance.model(model)
    frame = run[_UNREGISTERED[metric][0]]
    family = str(frame.loc[frame["model"] == model, "family"].iloc[0])
    reason = structural_reason(metric, family, provenance if provenance.family else None)
    recorded = provenance.extra.get("weights" if metric == "copying" else "dla")
    return reason or recorded or "undefined (NaN) for every head"


def _importance_text(importance: pd.DataFrame, n: int) -> str:
    """`top_heads_text` for ``importance``: each model's `n` heads of largest |effect| (exact mean ablation where
    the sweep ran it, else AtP's estimate)."""
    if n < 1:
        raise TablesError(f"top must be at least 1, got {n}")
    rows = effects(importance)
    if rows.empty:
        return "importance: no head has a value (hidden_change has no AtP rows; sweep with --importance ablate)"
    models = {name: i for i, name in enumerate(dict.fromkeys(importance["model"]))}
    rows = rows.reindex(rows["value"].abs().sort_values(ascending=False, kind="stable").index)
    rows = rows.groupby("model", sort=False).head(n).sort_values("model", key=lambda c: c.map(models), kind="stable")
    rows = rows.assign(units=rows["units"].astype("Int64"))
    columns = ["model", "label", "layer", "head", "target", "method", "value", "ci_low", "ci_high", "units", "thin"]
    return (rows[columns].to_string(index=False, float_format=lambda v: f"{v:+.4g}") + "\n"
            + footer(columns, {"value": SHOW_NOTES["importance value"]}))


def _syntax_text(syntax: pd.DataFrame, n: int) -> str:
    """`top_heads_text` for ``syntax``: the best heads of the `n` relations with most dependents (``all`` first),
    each against the best fixed offset on the same dependents: the difference, vs_baseline, with its paired 95%
    interval [vs_low, vs_high] (`headscan.analysis.syntax.best_heads`' margin is vs_low).

    The three printed numbers of the comparison are one estimate's and add up: where the table records the
    cross-fitted one (head and offset chosen on one half of the units, scored on the other), vs_baseline is
    accuracy_held_out - baseline_held_out, printed beside the head's own in-sample accuracy and interval; where it
    records none (a table written before headscan cross-fitted), vs_baseline is accuracy - baseline, in sample.
    A row of a cross-fitted table without a held-out estimate (a half of the units holds none of its
    dependents) says its in-sample comparison in a line under the table."""
    if n < 1:
        raise TablesError(f"top must be at least 1, got {n}")
    best = best_heads(syntax, relations=relation_order(syntax)[:n])
    if best.empty:
        return "syntax: no scored dependent (the sweep scores relations on CoNLL-U treebanks only)"
    models = {name: i for i, name in enumerate(dict.fromkeys(syntax["model"]))}
    best = best.sort_values("model", key=lambda names: names.map(models), kind="stable")  # model by model
    held = best["held_out"] & best["accuracy_held_out"].notna()
    # a table that did not record the paired difference: the difference itself is still accuracy - baseline, and
    # its interval the head's own interval's ends minus the baseline (best_heads' margin does the same)
    difference = best["vs_baseline"].fillna(best["accuracy"] - best["baseline"])
    high = best["vs_baseline_high"].fillna(best["ci_high"] - best["baseline"])
    head = {"model": best["model"], "relation": best["relation"], "direction": best["direction"],
            "label": best["label"], "accuracy": best["accuracy"], "ci_low": best["ci_low"], "ci_high": best["ci_high"],
            "dependents": best["count"].astype(int)}
    offset = best["baseline_offset"].map(offset_text)
    compared = {"vs_baseline": difference, "vs_low": best["margin"], "vs_high": high, "beats": best["beats"],
                "no claim": best["unsupported"]}
    if not held.any():  # in sample: accuracy - baseline
        table = pd.DataFrame({**head, "baseline": best["baseline"], "baseline_offset": offset, **compared})
        return (table.to_string(index=False, float_format=lambda v: f"{v:.3f}") + "\n"
                + footer(table.columns, {"ci_low": "low end of the accuracy's 95% interval", "ci_high": "its high end"}))
    compared |= {c: compared[c].where(held) for c in ("vs_baseline", "vs_low", "vs_high")}
    table = pd.DataFrame({**head, "accuracy_held_out": best["accuracy_held_out"].where(held),
                          "baseline_held_out": best["baseline"].where(held), "baseline_offset": offset, **compared})
    lines = [table.to_string(index=False, float_format=lambda v: f"{v:.3f}"), *_in_sample_lines(best[~held])]
    return "\n".join(lines + [footer(table.columns, HELD_OUT_NOTES)])


# What the columns of `headscan show --metric syntax` hold where the table records held-out (cross-fitted) estimates
HELD_OUT_NOTES = {
    "accuracy": SHOW_NOTES["accuracy"] + ", in sample: the head named is the most accurate on all the dependents, "
                "scored on the same",
    "ci_low": "low end of the in-sample accuracy's 95% interval", "ci_high": "its high end",
    "accuracy_held_out": "held out: on each half of the units (documents or segments, by the parity of their index) "
                         "the accuracy of the head most accurate on the other half, the two halves added up (the "
                         "halves may choose another head than the one named)",
    "baseline_held_out": "held out: on each half the accuracy of the fixed offset best on the other half, on the "
                         "same dependents, the two halves added up",
    "baseline_offset": "the offset best on all the dependents (the held-out baseline uses each other half's best): "
                       "always the word d away",
    "vs_baseline": "accuracy_held_out minus baseline_held_out, on the same dependents",
    "vs_low": "low end of vs_baseline's 95% interval, paired over the same units, the halves' choices held fixed",
    "vs_high": "its high end",
    "beats": "vs_low above 0: the head chosen on one half beats the offset chosen on it, on the other half",
}


def _in_sample_lines(rows: pd.DataFrame) -> list[str]:
    """A line per `best_heads` row of a cross-fitted table that has no held-out estimate: its in-sample
    comparison, head and offset chosen on every dependent, which carries no verdict (``beats`` False)."""
    lines = []
    for row in rows.itertuples():
        said = ("no in-sample comparison either" if pd.isna(row.vs_baseline_in_sample) else
                f"in sample {row.accuracy:.3f} - {row.baseline_in_sample:.3f} = {row.vs_baseline_in_sample:+.3f} "
                f"[{row.vs_baseline_in_sample_low:+.3f}, {row.vs_baseline_in_sample_high:+.3f}]")
        lines.append(f"{row.model} {row.relation} {row.direction} {row.label}: no held-out estimate (a half of the "
                     f"units holds none of its dependents); {said}, which carries no verdict")
    return lines


def length_notes(provenance, long: str) -> list[str]:
    """What a sweep says of its models' lengths: each model's max_len note, and how many segments were longer
    than --max-len and what became of them (split into windows with ``--long split``, else cut)."""
    lines = []
    for model in provenance.models:
        if model.max_len_note:
            lines.append(model.max_len_note)
        if model.n_truncated:
            lines.append(f"{model.name}: {model.n_truncated:,} of {model.n_segments:,} segments were longer than "
                         f"--max-len {model.max_len} and were " + (
                             "split into windows" if long == "split" else
                             f"cut ({model.n_tokens_lost:,} tokens lost; --long split keeps them)"))
    return lines
