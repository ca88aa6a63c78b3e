"""Position against content: how much of a head's score survives its model's shuffled-words control.

``MODEL [shuffled words]`` is the trained model over the same corpus with each segment's words permuted
(`headscan.corpus.shuffle`; in a CoNLL-U sentence the tree is permuted with the words). Each metric's registry
entry says what a score kept there means (`headscan.metrics.Metric.shuffled`): a metric defined by positions
(``prev_token``, ``first_token``, ...) keeps its score where the head follows position, whatever the words; a
syntax row keeps its score where the head follows the words, since each word keeps its head word and relation
(and loses it where the head needs the words in their order, which carries position and syntax alike).

For each row of a trained model on such a metric, `shuffled_rows` sets its score on shuffled words beside its
score on real words:

- ``change`` = shuffled - real, with a 95% interval from the two rows' intervals taken as **independent
  samples** (each SE from its interval, `headscan.intervals.interval_se`; Welch-Satterthwaite degrees of
  freedom). They are not independent (the same documents, the same words in another order, usually move
  together), so the interval is wider than a paired one would be: a loss it shows is there.
- ``kept`` = (shuffled - its chance) / (real - its chance): the share of the head's lift over uniform attention
  that survives shuffling (chance from each row; 0 where a row records none).
- ``survives``: "kept" where ``kept`` >= `KEPT`; "lost" where ``kept`` <= `LOST` *and* the change's interval lies
  below 0; else "partly" (part of it kept, or too uncertain to say).
- ``follows``: what that says the head follows, by the metric's registry entry: "position" or "content" for a
  positional metric kept or lost, "content" or "word order" for syntax kept or lost; "both or unclear" for
  "partly".

This module draws nothing and loads no model: it reads tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from ..config import split_control
from ..intervals import interval_se
from ..metrics import describe
from ..tables import TABLES
from .claims import has_verdicts, supported
from .ranking import striking_of

__all__ = ["KEPT", "LOST", "shuffled_rows", "shuffled_sentences"]

KEPT = 0.8  # at least this share of the lift over chance survives: the score is kept
LOST = 0.2  # at most this share survives, and the loss is shown: the score is lost
# what a lost score says: a positional metric's head followed the words; a syntax head needs the words in their
# order (word order carries position and syntax alike, so a lost syntax score does not say the head is positional)
_OTHER = {"position": "content", "content": "word order"}
NAMED = 3  # heads named per group in a sentence


def _metric_column(frame: pd.DataFrame, table: str) -> pd.Series:
    if "metric" in frame.columns:
        return frame["metric"].astype(str)
    own = [name for name in ("syntax",) if table == "syntax"]
    return pd.Series(own[0] if own else table, index=frame.index)


def shuffled_rows(frame: pd.DataFrame, *, table: str = "heads") -> pd.DataFrame:
    """Each trained model's rows on a metric the shuffled-words control asks about, beside the same head's row of
    its ``[shuffled words]`` control: the module's columns (``shuffled``, ``change`` and its interval, ``kept``,
    ``survives``, ``follows``). No rows where no model has such a control.

    >>> rows = pd.DataFrame({"model": ["m", "m [shuffled words]"] * 2, "layer": 0, "head": [0, 0, 1, 1],
    ...                      "label": ["L0H0", "L0H0", "L0H1", "L0H1"], "metric": "prev_token",
    ...                      "value": [0.9, 0.86, 0.6, 0.12], "ci_low": [0.88, 0.84, 0.55, 0.10],
    ...                      "ci_high": [0.92, 0.88, 0.65, 0.14], "chance": 0.1})
    >>> out = shuffled_rows(rows)
    >>> out[["label", "kept", "survives", "follows"]].round(3).to_dict("records")
    [{'label': 'L0H0', 'kept': 0.95, 'survives': 'kept', 'follows': 'position'}, {'label': 'L0H1', 'kept': 0.04, 'survives': 'lost', 'follows': 'content'}]
    """
    metric = _metric_column(frame, table)
    meaning = metric.map({m: describe(m).shuffled for m in set(metric)})
    frame = frame[meaning != ""].assign(metric_=metric[meaning != ""], meaning_=meaning[meaning != ""])
    names = frame["model"].astype(str)
    controls = names[names.map(lambda n: split_control(n)[1] == "shuffled-words")].unique()
    keys = ["metric_", *[k for k in TABLES[table].keys if k != "metric"], "layer", "head"]
    parts = []
    for control in controls:  # a loop over the run's shuffled-words controls, one per model
        model = split_control(control)[0]
        real = frame[names == model]
        if real.empty:
            continue
        shuffled = frame[names == control][[*keys, *[c for c in ("value", "ci_low", "ci_high", "chance",
                                                                 "variance_df") if c in frame.columns]]]
        parts.append(real.merge(shuffled, on=keys, how="inner", suffixes=("", "_s")))
    columns = ["model", "metric", *[k for k in TABLES[table].keys if k != "metric"], "layer", "head", "label",
               "value", "ci_low", "ci_high", "chance", "shuffled", "shuffled_low", "shuffled_high", "shuffled_chance",
               "change", "change_low", "change_high", "kept", "survives", "follows"]
    if not parts:
        return pd.DataFrame(columns=columns)
    both = pd.concat(parts, ignore_index=True)
    out = _compare(both)
    out["metric"] = both["metric_"].to_numpy()
    extra = [c for c in ("null_kind", "finding", "thin", "q_value") if c in both.columns]
    return out.reindex(columns=columns).join(both[extra])  # NaN for what the table does not record (chance)


def _column(rows: pd.DataFrame, name: str) -> np.ndarray:
    return rows[name].to_numpy(dtype=np.float64) if name in rows.columns else np.full(len(rows), np.nan)


def _compare(both: pd.DataFrame) -> pd.DataFrame:
    """The change, its interval (independent samples), the kept share and what it says, row by row."""
    value, shuffled = _column(both, "value"), _column(both, "value_s")
    df_r, df_s = (np.where(np.isnan(d), np.inf, d) for d in (_column(both, "variance_df"), _column(both, "variance_df_s")))
    se_r = interval_se(value, _column(both, "ci_low"), _column(both, "ci_high"), df_r)
    se_s = interval_se(shuffled, _column(both, "ci_low_s"), _column(both, "ci_high_s"), df_s)
    se = np.sqrt(se_r ** 2 + se_s ** 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        df = se ** 4 / (se_r ** 4 / df_r + se_s ** 4 / df_s)  # Welch-Satterthwaite
        half = np.where(np.isposinf(df), stats.norm.ppf(0.975), stats.t.ppf(0.975, np.where(df > 0, df, np.nan))) * se
    change = shuffled - value
    chance, chance_s = (np.nan_to_num(_column(both, c), nan=0.0) for c in ("chance", "chance_s"))
    with np.errstate(invalid="ignore", divide="ignore"):
        kept = (shuffled - chance_s) / (value - chance)
    lost_shown = change + half < 0
    survives = np.select([kept >= KEPT, (kept <= LOST) & lost_shown], ["kept", "lost"], default="partly")
    survives = np.where(np.isnan(kept), "", survives)
    meaning = both["meaning_"].to_numpy(dtype=object)
    follows = np.where(survives == "kept", meaning, np.where(survives == "lost", [_OTHER[m] for m in meaning],
                                                             np.where(survives == "partly", "both or unclear", "")))
    return both.assign(shuffled=shuffled, shuffled_low=_column(both, "ci_low_s"),
                       shuffled_high=_column(both, "ci_high_s"), shuffled_chance=_column(both, "chance_s"),
                       change=change, change_low=change - half, change_high=change + half, kept=kept,
                       survives=survives, follows=follows)


def _name(row) -> str:
    where = f"{row.relation} {row.direction} " if hasattr(row, "relation") and isinstance(row.relation, str) else ""
    return f"{row.metric} {where}{row.label} ({row.value:.2f} to {row.shuffled:.2f}, {row.kept:.0%} of its lift kept)"


def _claimed(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows a sentence may speak of: findings where the table records verdicts, else rows beyond chance."""
    if has_verdicts(rows):
        return rows[rows["finding"].astype("boolean").fillna(False).to_numpy(dtype=bool)]
    return rows[supported(rows, striking=striking_of(rows)).to_numpy(dtype=bool)] if len(rows) else rows


def shuffled_sentences(heads: pd.DataFrame, syntax: pd.DataFrame | None = None) -> dict[str, str]:
    """Per trained model with a shuffled-words control, one sentence: which of its findings (rows beyond chance in
    a run without verdicts) follow position and which follow content, by `shuffled_rows`' rule, the strongest
    named in each group.

    >>> rows = pd.DataFrame({"model": ["m", "m [shuffled words]"] * 2, "layer": 0, "head": [0, 0, 1, 1],
    ...                      "label": ["L0H0", "L0H0", "L0H1", "L0H1"], "metric": "prev_token",
    ...                      "value": [0.9, 0.86, 0.6, 0.12], "ci_low": [0.88, 0.84, 0.55, 0.10],
    ...                      "ci_high": [0.92, 0.88, 0.65, 0.14], "chance": 0.1})
    >>> print(shuffled_sentences(rows)["m"])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    On shuffled words (m [shuffled words]), of m's 2 rows beyond chance that the control asks about, 1 follow
    position: prev_token L0H0 (0.90 to 0.86, 95% of its lift kept); 1 follow content: prev_token L0H1 (0.60 to
    0.12, 4% of its lift kept). A score kept ... taken as independent samples: ...
    """
    found = [shuffled_rows(heads, table="heads")]
    if syntax is not None and len(syntax):
        found.append(shuffled_rows(syntax, table="syntax"))
    rows = pd.concat([f for f in found if len(f)], ignore_index=True) if any(len(f) for f in found) else found[0]
    out = {}
    for model in dict.fromkeys(rows["model"]):
        mine = rows[rows["model"] == model]
        claimed = _claimed(mine)
        what = "findings" if has_verdicts(mine) else "rows beyond chance"
        control = f"{model} [shuffled words]"
        if claimed.empty:
            out[model] = (f"On shuffled words ({control}): none of {model}'s {what} is on a metric the control asks "
                          "about, so it says nothing of position against content here.")
            continue
        groups = []
        for follows in ("position", "content", "word order", "both or unclear"):
            part = claimed[claimed["follows"] == follows].sort_values("value", ascending=False)
            if len(part):
                more = f" and {len(part) - NAMED} more" if len(part) > NAMED else ""
                groups.append(f"{len(part)} follow {follows if follows != 'both or unclear' else 'both, or it is unclear'}: "
                              + "; ".join(_name(r) for r in part.head(NAMED).itertuples()) + more)
        out[model] = (f"On shuffled words ({control}), of {model}'s {len(claimed)} {what} that the control asks "
                      f"about, {'; '.join(groups)}. A score kept (at least {KEPT:.0%} of its lift over chance "
                      "survives) says a head on a positional metric follows position and a syntax head follows the "
                      f"words; a score lost (at most {LOST:.0%}, the change's 95% interval below 0) says a positional "
                      "metric's head followed the words and a syntax head needs them in their order. "
                      "The real and shuffled rows' intervals are taken as independent samples: they share their "
                      "documents, so the interval is wider than a paired one would be.")
    return out
