"""Heads over training: the checkpoints of a series side by side, and the step at which each head forms.

A sweep over a checkpoint series (``--checkpoints FOLDER``, ``ID@step3000`` revisions, or several runs of one
architecture at different steps) keeps the tables' rows as they are: each checkpoint is a model of its own,
named by its spec (``run/step-1000``, ``EleutherAI/pythia-70m@step3000``), and its training step is in the
model's provenance (``step``). `checkpoint_steps` reads the steps into a small table, ``model, series, step``;
`with_steps` joins it onto any table's rows, so ``heads.merge(...)`` style pandas analysis needs one call.
Keeping ``model`` one name per checkpoint (rather than adding a ``step`` key column to every table) leaves every
table's schema, and every table written before, as it was: a model name still identifies one set of weights.

`formation` marks when each head first holds its role's number (`headscan.analysis.roles`): the first step at
which the low end of the metric's 95% interval is at least the role's threshold and the row may carry a claim
(`headscan.analysis.claims`: not thin, the interval's low end above chance), *and* that stays so at each of the
next `hold` checkpoints (fewer at the end of the series). The interval's low end, not the value, must reach
the threshold, so a head "forms" only when the whole interval says it holds the role.

`half_rise` orders heads without the roles' thresholds: the first step at which the low end of a head's interval
is past half of its own rise, from its first checkpoint's value to its final one. A weak head that ends at 0.3
and a strong one that ends at 0.9 are then compared on the same footing: when each has done half its moving.

This module draws nothing and loads no model.

>>> models = [ModelProvenance("run/step-0", id="run/step-0", step=0), ModelProvenance("run/step-5", id="run/step-5",
...           step=5), ModelProvenance("gpt2")]
>>> checkpoint_steps(models).to_dict("records")
[{'model': 'run/step-0', 'series': 'run', 'step': 0}, {'model': 'run/step-5', 'series': 'run', 'step': 5}]
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePath

import numpy as np
import pandas as pd

from ..tables import ModelProvenance
from .claims import supported
from .roles import role_for

__all__ = ["HOLD", "formation_rule", "series_name", "checkpoint_steps", "with_steps", "formation", "half_rise_rule",
           "half_rise"]

HOLD = 2  # further checkpoints a head must keep its role for to count as formed at a step


def formation_rule(hold: int = HOLD) -> str:
    """The rule `formation` applies, in one sentence, as reports state it."""
    return (f"A head forms at the first step where its metric's 95% interval has its low end at or above the role's "
            f"threshold and above chance (the value of uniform attention over the keys each query sees), on support "
            f"that is not thin, and stays so at each of the next {hold} checkpoints (those there are, at the end "
            f"of the series). For `induction` the attention score alone is read (prefix matching): copying "
            f"evidence is not asked for.")


def series_name(model: ModelProvenance) -> str:
    """The series a checkpoint belongs to: the Hugging Face id of a named revision, the folder holding a local
    checkpoint folder (``runs/tiny`` for ``runs/tiny/step-100``), else the model's name.

    >>> series_name(ModelProvenance("tiny/step-100", id="runs/tiny/step-100", source="local", step=100))
    'runs/tiny'
    """
    where = model.id or model.name
    if model.source == "huggingface":
        return where
    parent = PurePath(where).parent
    return where if parent == PurePath(".") or parent == PurePath(parent.anchor) else str(parent)


def _short(series: list[str], taken: tuple[str, ...] = ()) -> dict[str, str]:
    """Each series by its shortest trailing run of path parts that no other series ends with (``tiny`` alone;
    ``a/tiny`` and ``b/tiny`` for two runs that share the leaf folder ``tiny``) and that is none of the names
    already `taken` (Hugging Face ids, kept whole).

    >>> _short(["/home/me/runs/a/tiny", "/home/me/runs/b/tiny", "/data/small"])
    {'/home/me/runs/a/tiny': 'a/tiny', '/home/me/runs/b/tiny': 'b/tiny', '/data/small': 'small'}
    """
    parts = {name: PurePath(name).parts for name in series}
    short = {}
    for name, own in parts.items():
        for n in range(1, len(own) + 1):
            tail = own[-n:]
            if str(PurePath(*tail)) not in taken and not any(other[-n:] == tail for key, other in parts.items()
                                                             if key != name):
                short[name] = str(PurePath(*tail))
                break
        else:
            short[name] = name  # one series' path ends another's whole path: keep it whole
    return short


def checkpoint_steps(models: Iterable[ModelProvenance], names: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per model whose provenance records a step: ``model`` (its name in the tables, or in `names`,
    e.g. a report's ``run:model``), ``series`` and ``step``; in the order given. A series is named by the end of
    its `series_name` that tells it from the others (``tiny``, or ``a/tiny`` and ``b/tiny`` for two runs in
    folders of one name; a Hugging Face id whole). Controls of a checkpoint (``--control``) are left out: they
    are not points of its training."""
    models = list(models)
    names = [m.name for m in models] if names is None else list(names)
    kept = [(name, series_name(m), int(m.step), m.source == "huggingface") for m, name in zip(models, names)
            if m.step is not None and m.control is None]
    hub_ids = tuple(dict.fromkeys(series for _, series, _, hub in kept if hub))  # kept whole, never a local's name
    short = _short(list(dict.fromkeys(series for _, series, _, hub in kept if not hub)), hub_ids)
    rows = [{"model": name, "series": series if hub else short[series], "step": step}
            for name, series, step, hub in kept]
    return pd.DataFrame(rows, columns=["model", "series", "step"]).astype({"step": np.int64})


def with_steps(rows: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """`rows` of the checkpoints in `steps` (`checkpoint_steps`), with their ``series`` and ``step`` columns,
    sorted by series, step, then the rows' own order; rows of models without a step are left out."""
    joined = rows.merge(steps, on="model", how="inner", sort=False)
    return joined.sort_values(["series", "step"], kind="stable").reset_index(drop=True)


def formation(rows: pd.DataFrame, *, metrics: Iterable[str] | None = None, hold: int = HOLD) -> pd.DataFrame:
    """The step at which each head of each series forms, per metric with a role (`formation_rule`).

    Parameters
    ----------
    rows : DataFrame
        Heads-table rows with ``series`` and ``step`` (`with_steps`).
    metrics : iterable of str, optional
        The metrics to read; default every metric of `rows` that a role reads with the claim gate (high values
        striking).
    hold : int, default `HOLD`
        Further checkpoints the head must keep the role for.

    Returns
    -------
    DataFrame
        One row per (series, layer, head, metric): ``label``, ``role``, ``threshold``, ``step`` (the step it
        forms at; NaN when it never does) and the formed row's ``value``, ``ci_low``, ``ci_high`` and ``chance``
        (NaN when never).

    >>> rows = pd.DataFrame({"series": "s", "layer": 0, "head": 0, "label": "L0H0", "metric": "prev_token",
    ...                      "step": [0, 10, 20, 30, 40], "value": [0.1, 0.7, 0.4, 0.8, 0.9],
    ...                      "ci_low": [0.05, 0.6, 0.3, 0.7, 0.85], "ci_high": [0.2, 0.8, 0.5, 0.9, 0.95],
    ...                      "chance": 0.1})
    >>> formation(rows)[["label", "role", "step", "ci_low"]].to_dict("records")  # 10 is a flicker: 20 falls back
    [{'label': 'L0H0', 'role': 'previous-token', 'step': 30.0, 'ci_low': 0.7}]
    """
    if hold < 0:
        raise ValueError(f"hold={hold} must be 0 or more")
    wanted = [m for m in (metrics if metrics is not None else dict.fromkeys(rows["metric"]))
              if role_for(m) is not None and role_for(m).beyond_chance]
    keys = ["series", "layer", "head", "metric"]
    part = rows[rows["metric"].isin(wanted)].sort_values([*keys, "step"], kind="stable")
    threshold = part["metric"].map(lambda m: role_for(m).threshold)
    # the rule as `formation_rule` states it: not thin, the interval's low end above uniform attention's chance;
    # not the sweep's verdict against its random-init controls, which a series swept without them never has
    stated = part.drop(columns=[c for c in ("null_kind", "finding", "verdict") if c in part.columns])
    passes = (supported(stated) & (part["ci_low"].astype(float) >= threshold)) if len(part) else \
        pd.Series(dtype=bool)
    part = part.assign(passes=passes.astype(bool), threshold=threshold)
    out = []
    for key, head in part.groupby(keys, sort=False):
        ok = head["passes"].to_numpy()
        # holds[i]: the role holds at checkpoint i and at each of the next `hold` (as many as there are)
        holds = np.array([ok[i:i + hold + 1].all() for i in range(len(ok))], dtype=bool)
        first = head.iloc[int(np.argmax(holds))] if holds.any() else None
        out.append({**dict(zip(keys, key)), "label": head["label"].iloc[0], "role": role_for(key[3]).name,
                    "threshold": float(head["threshold"].iloc[0]),
                    **{column: float(first[column]) if first is not None else np.nan
                       for column in ("step", "value", "ci_low", "ci_high", "chance")}})
    columns = [*keys, "label", "role", "threshold", "step", "value", "ci_low", "ci_high", "chance"]
    return pd.DataFrame(out, columns=columns)


def half_rise_rule() -> str:
    """The rule `half_rise` applies, in one sentence, as reports state it."""
    return ("A head's half rise is the first step at which its metric's 95% interval has its low end above half-way "
            "between its value at the first checkpoint and its value at the last (checkpoints with a value), "
            "counted only for a head that rises: its last interval's low end above its first interval's high end. "
            "No role threshold enters.")


def half_rise(rows: pd.DataFrame, *, metrics: Iterable[str] | None = None) -> pd.DataFrame:
    """The step at which each head of each series has done half of its own rise, per metric (`half_rise_rule`).

    Parameters
    ----------
    rows : DataFrame
        Rows with ``series, layer, head, label, metric, step, value, ci_low, ci_high`` (`with_steps`).
    metrics : iterable of str, optional
        The metrics to read; default every metric of `rows`. A rise is read upwards: for a metric that falls as
        a head forms, the answer is NaN.

    Returns
    -------
    DataFrame
        One row per (series, layer, head, metric), in that order: ``label``, ``start`` and ``final`` (the value
        at the first and last checkpoints whose value is not NaN), ``level`` (half-way between them), ``step``
        (the first step whose ``ci_low`` is above ``level``; NaN when the head does not rise, its final
        ``ci_low`` not above its first ``ci_high``) and that step's ``value``, ``ci_low`` and ``ci_high``.

    >>> rows = pd.DataFrame({"series": "s", "layer": 0, "head": 0, "label": "L0H0", "metric": "prev_token",
    ...                      "step": [0, 10, 20, 30], "value": [0.1, 0.2, 0.28, 0.3],
    ...                      "ci_low": [0.08, 0.15, 0.26, 0.28], "ci_high": [0.12, 0.25, 0.3, 0.32]})
    >>> half_rise(rows)[["label", "start", "final", "level", "step"]].round(3).to_dict("records")  # 0.15 < 0.2
    [{'label': 'L0H0', 'start': 0.1, 'final': 0.3, 'level': 0.2, 'step': 20.0}]
    """
    keys = ["series", "layer", "head", "metric"]
    part = rows if metrics is None else rows[rows["metric"].isin(list(metrics))]
    part = part.sort_values([*keys, "step"], kind="stable")
    heads = part.drop_duplicates(keys)[[*keys, "label"]]
    known = part[part["value"].notna()]
    ends = known.drop_duplicates(keys, keep="first")[[*keys, "value", "ci_high"]].rename(
        columns={"value": "start", "ci_high": "start_high"}).merge(
        known.drop_duplicates(keys, keep="last")[[*keys, "value", "ci_low"]].rename(
            columns={"value": "final", "ci_low": "final_low"}), on=keys)
    ends = ends.assign(level=(ends["start"] + ends["final"]) / 2, rises=ends["final_low"] > ends["start_high"])
    heads = heads.merge(ends[[*keys, "start", "final", "level", "rises"]], on=keys, how="left", sort=False)
    marked = part.merge(heads[[*keys, "level", "rises"]], on=keys, how="left", sort=False)
    past = marked[(marked["ci_low"] > marked["level"]) & marked["rises"].fillna(False).astype(bool)]
    first = past.drop_duplicates(keys, keep="first")[[*keys, "step", "value", "ci_low", "ci_high"]]
    out = heads.drop(columns="rises").merge(first, on=keys, how="left", sort=False)
    out = out.astype({column: float for column in ("start", "final", "level", "step", "value", "ci_low", "ci_high")})
    return out.reset_index(drop=True)[[*keys, "label", "start", "final", "level", "step", "value", "ci_low",
                                       "ci_high"]]
