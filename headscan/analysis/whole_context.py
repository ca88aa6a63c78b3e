"""Which heads need the whole context: retrieval heads, streaming heads, and the key/value budget they imply.

Reads the tables of a sweep (``streaming``, ``induction`` in heads.parquet; ``copying`` in weights.parquet) and
of ``headscan retrieval`` (retrieval.parquet, retrieval_trials.parquet):

- `retrieval_shares`: how many heads are retrieval heads by Wu et al.'s (2024) rule (score above 0.1), beside
  how many clear 0.1 with their whole 95% interval, and the trials behind them;
- `retrieval_head_tests`: which heads are retrieval heads when needles, not trials, are the unit: each head's
  mean over needles, a one-sided t-test over the needles that it lies above 0.1, Benjamini-Hochberg over every
  head of the model (`RETRIEVAL_RULE`);
- `kv_budget`: with the key/value heads sorted by the attention mass a sink-and-window cache would take from
  their query heads, the share of the mass kept as k of them keep the whole context, and the cache memory;
- `relations`: each head's retrieval, streaming, induction and copying scores side by side, and their rank
  correlations;
- `retrieval_summary`: what ``headscan retrieval`` prints.

Under grouped-query attention a key/value head can be streamed only if every query head reading it can: the
budget curve groups query heads by the key/value head they read, and a group's loss is the sum of its query
heads' streaming scores (which makes the greedy order the best one for the mass kept).

This module draws nothing and loads no model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..intervals.discoveries import q_values
from ..intervals.pvalues import t_p_value
from ..tables import SweepTables, thin_rows
from .masking import masking_lines

__all__ = ["RETRIEVAL_THRESHOLD", "WU_SHARES", "RETRIEVAL_RULE", "retrieval_shares", "retrieval_head_tests", "kv_budget", "relations", "retrieval_summary"]

RETRIEVAL_THRESHOLD = 0.1  # Wu et al. (2024): "as long as the head performs copy-paste in 10% of the times"
# Wu et al.'s Figure 3: share of heads with a retrieval score above 0.1, per model (their Section 3.1: 3% to 6%).
WU_SHARES = {"Llama-2-7B-80K": 0.032, "Yi-6B-200K": 0.057, "Qwen1.5-14B": 0.038, "Mistral-7B-v0.2": 0.042,
             "Llama-2-13B-64K": 0.021, "Yi-34B-200K": 0.035, "Qwen1.5-14B-Chat": 0.043, "Mixtral-8x7B-v0.1": 0.062}


def retrieval_shares(retrieval: pd.DataFrame, trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per model and metric (``retrieval``, ``retrieval_ungated``): how many heads score 0, up to 0.1, above 0.1
    and above 0.5 (Wu et al.'s Figure 3 bins), how many clear 0.1 with their 95% interval's low end, and the
    trials each mean rests on.

    >>> rows = pd.DataFrame({"model": "m", "metric": "retrieval", "value": [0.0, 0.05, 0.3, 0.9],
    ...                      "ci_low": [0.0, 0.0, 0.05, 0.7], "count": 20.0})
    >>> retrieval_shares(rows)[["heads", "zero", "above", "above_half", "above_interval", "share_above"]].iloc[0].tolist()
    [4.0, 1.0, 2.0, 1.0, 1.0, 0.5]
    """
    out = []
    for (model, metric), part in retrieval.groupby(["model", "metric"], sort=False):
        values = part["value"]
        defined = values.notna()
        row = {"model": model, "metric": metric, "heads": int(len(part)), "trials": int(part["count"].max())
               if defined.any() else 0, "zero": int((values == 0).sum()),
               "low": int(((values > 0) & (values <= RETRIEVAL_THRESHOLD)).sum()),
               "above": int((values > RETRIEVAL_THRESHOLD).sum()), "above_half": int((values > 0.5).sum()),
               "above_interval": int((part["ci_low"] > RETRIEVAL_THRESHOLD).sum())}
        row["share_above"] = row["above"] / row["heads"] if defined.any() else float("nan")
        row["share_above_interval"] = row["above_interval"] / row["heads"] if defined.any() else float("nan")
        if trials is not None:
            mine = trials[trials["model"] == model].drop_duplicates("trial")
            row["trials_total"] = int(len(mine))
            row["trials_passed"] = int((mine["passed"] & mine["span_found"]).sum())
        out.append(row)
    return pd.DataFrame(out)


RETRIEVAL_RULE = ("a head is a retrieval head when its mean over needles of its mean score over each needle's trials "
                  "lies above 0.1 by a one-sided t-test over the needles (df: needles - 1), at a false-discovery rate "
                  "of 5% by Benjamini-Hochberg over every head of the model; its interval resamples needles")


def retrieval_head_tests(trials: pd.DataFrame, model: str, *, gated: bool = True, threshold: float = RETRIEVAL_THRESHOLD,
                         replicates: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per head of `model`, from retrieval_trials.parquet: ``value``, the mean over needles of the head's mean over
    that needle's trials (those that passed the gate and found the answer span; `gated` False: every trial that
    found it), ``ci_low`` and ``ci_high``, its 95% percentile interval over `replicates` resamples of the needles,
    ``p_value``, one-sided that it lies above `threshold` (Student's t over the needles' means), ``q_value`` by
    Benjamini-Hochberg over all the model's heads, and ``needles``. The trials of a needle share its words, so
    the needle is the unit (`RETRIEVAL_RULE`); with one needle no test is made (NaN).

    >>> trials = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1] * 6, "label": ["L0H0", "L0H1"] * 6,
    ...     "needle": np.repeat([0, 1, 2], 4), "value": [0.9, 0.0, 0.8, 0.1] * 3, "passed": True, "span_found": True})
    >>> tests = retrieval_head_tests(trials, "m")
    >>> tests["label"].tolist(), tests["value"].round(2).tolist(), tests["needles"].tolist(), bool(tests["q_value"][0] < 0.05)
    (['L0H0', 'L0H1'], [0.85, 0.05], [3, 3], True)
    """
    part = trials[(trials["model"] == model) & trials["span_found"].astype(bool)]
    if gated:
        part = part[part["passed"].astype(bool)]
    wide = part.groupby(["layer", "head", "label", "needle"], sort=True)["value"].mean().unstack("needle")
    means = wide.to_numpy(np.float64)  # (head, needle): each needle's mean over its trials
    n = np.isfinite(means).sum(1)
    value = np.nanmean(means, 1) if means.size else np.zeros(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.nanstd(means, 1, ddof=1) / np.sqrt(n) if means.shape[1] > 1 else np.full(len(means), np.nan)
    p = t_p_value(value, se, (n - 1).astype(np.float64), threshold) if len(means) else np.zeros(0)
    p = np.where(n > 1, p, np.nan)
    rng = np.random.default_rng(seed)
    if means.shape[1] > 1:  # needles resampled with replacement; the same resample for every head
        picks = rng.integers(0, means.shape[1], (replicates, means.shape[1]))
        replicate = np.nanmean(means[:, picks], 2)  # (head, replicate)
        low, high = np.nanpercentile(replicate, [2.5, 97.5], axis=1)
    else:
        low = high = np.full(len(means), np.nan)
    index = wide.index.to_frame(index=False)
    return pd.DataFrame({"layer": index["layer"], "head": index["head"], "label": index["label"], "value": value,
                         "ci_low": low, "ci_high": high, "p_value": p, "q_value": q_values(p), "needles": n})


def kv_budget(heads: pd.DataFrame, *, sink: int, recent: int, length: int) -> pd.DataFrame:
    """The key/value budget curve of each model from its ``streaming`` rows.

    Key/value heads (layer, kv_group) are sorted by the mass a sink-and-window cache would take from their query
    heads (the sum of their streaming scores), largest first; keeping the first k whole keeps the share
    ``1 - (lost by the others) / (query heads)`` of the attention mass, averaged over query heads. ``kept_low``
    and ``kept_high`` put every streamed head at its interval's high and low end (a conservative band: the ends
    of separate intervals). ``memory`` is the cache's share of a full cache at `length` tokens when the others
    keep ``sink + recent``.

    >>> rows = pd.DataFrame({"model": "m", "metric": "streaming", "layer": 0, "head": [0, 1, 2, 3],
    ...                      "kv_group": [0, 0, 1, 1], "value": [0.4, 0.2, 0.0, 0.1], "ci_low": 0.0, "ci_high": 0.5})
    >>> kv_budget(rows, sink=4, recent=4, length=16)[["k", "kept", "memory"]].to_dict("list")
    {'k': [0, 1, 2], 'kept': [0.825, 0.975, 1.0], 'memory': [0.5, 0.75, 1.0]}
    """
    rows = heads[heads["metric"] == "streaming"]
    out = []
    for model, part in rows.groupby("model", sort=False):
        if part["value"].isna().all():
            continue
        part = part.assign(value=part["value"].fillna(0.0), ci_low=part["ci_low"].fillna(part["value"]),
                           ci_high=part["ci_high"].fillna(part["value"]))
        groups = part.groupby(["layer", "kv_group"], sort=True)[["value", "ci_low", "ci_high"]].sum()
        groups = groups.sort_values("value", ascending=False, kind="stable")
        n_heads, n_groups = len(part), len(groups)
        kept_cache = min(length, sink + recent) / length
        for k in range(n_groups + 1):
            streamed = groups.iloc[k:]
            out.append({"model": model, "k": k, "full_share": k / n_groups,
                        "kept": 1 - streamed["value"].sum() / n_heads,
                        "kept_low": 1 - streamed["ci_high"].sum() / n_heads,
                        "kept_high": 1 - streamed["ci_low"].sum() / n_heads,
                        "memory": (k + (n_groups - k) * kept_cache) / n_groups,
                        "added": None if k == 0 else f"L{groups.index[k - 1][0]} kv{groups.index[k - 1][1]}"})
    return pd.DataFrame(out, columns=["model", "k", "full_share", "kept", "kept_low", "kept_high", "memory", "added"])


def relations(heads: pd.DataFrame, retrieval: pd.DataFrame | None = None,
              weights: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each head's ``retrieval`` (gated, where any trial passed, else ungated), ``streaming``, ``induction`` and
    ``copying`` side by side (one row per head), and per model the Spearman rank correlation of retrieval and
    of streaming with the others (with the heads they rest on).

    >>> heads = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1, 2], "label": ["L0H0", "L0H1", "L0H2"],
    ...                       "metric": ["streaming"] * 3, "value": [0.1, 0.2, 0.3]})
    >>> retrieval = heads.assign(metric="retrieval", value=[0.0, 0.5, 0.9])
    >>> relations(heads, retrieval)[1][["model", "score", "other", "spearman", "heads"]].to_dict("records")
    [{'model': 'm', 'score': 'retrieval', 'other': 'streaming', 'spearman': 1.0, 'heads': 3}]
    """
    keys = ["model", "layer", "head", "label"]
    parts = [heads[heads["metric"].isin(["streaming", "induction"])]]
    if retrieval is not None and len(retrieval):
        gated = retrieval[retrieval["metric"] == "retrieval"]
        usable = gated.groupby("model")["value"].transform(lambda v: v.notna().any())
        chosen = pd.concat([gated[usable], retrieval[(retrieval["metric"] == "retrieval_ungated")
                                                     & ~retrieval["model"].isin(gated.loc[usable, "model"])]])
        parts.append(chosen.assign(metric="retrieval"))
    if weights is not None and len(weights):
        parts.append(weights[weights["metric"] == "copying"])
    long = pd.concat([p[[*keys, "metric", "value"]] for p in parts], ignore_index=True)
    wide = long.pivot_table(index=keys, columns="metric", values="value", aggfunc="first").reset_index()
    wide.columns.name = None
    found = []
    for model, part in wide.groupby("model", sort=False):
        for score in ("retrieval", "streaming"):
            for other in ("streaming", "induction", "copying"):
                if other == score or score not in part or other not in part or (score, other) == ("streaming", "retrieval"):
                    continue
                both = part[[score, other]].dropna()
                if len(both) >= 3 and both[score].nunique() > 1 and both[other].nunique() > 1:
                    rho = float(both[score].rank().corr(both[other].rank()))
                    found.append({"model": model, "score": score, "other": other, "spearman": rho, "heads": len(both)})
    return wide, pd.DataFrame(found, columns=["model", "score", "other", "spearman", "heads"])


def retrieval_summary(run: SweepTables, n: int = 5) -> str:
    """What ``headscan retrieval`` prints: per model, the trials that passed the gate, the share of heads above
    Wu et al.'s 0.1 (and with the whole interval above it), and the top heads with their intervals."""
    retrieval, trials = run["retrieval"], run["retrieval_trials"]
    shares = retrieval_shares(retrieval, trials)
    lines = []
    for model in dict.fromkeys(retrieval["model"]):
        gated = shares[(shares["model"] == model) & (shares["metric"] == "retrieval")].iloc[0]
        lines.append(f"{model}: {gated['trials_passed']} of {gated['trials_total']} trials passed the answer gate")
        metric = "retrieval" if gated["trials_passed"] else "retrieval_ungated"
        if metric != "retrieval":
            lines.append("  no trial passed the gate: the ungated score (every trial) instead, not Wu et al.'s")
        row = shares[(shares["model"] == model) & (shares["metric"] == metric)].iloc[0]
        lines.append(f"  {metric} above {RETRIEVAL_THRESHOLD}: {row['above']} of {row['heads']} heads "
                     f"({row['share_above']:.1%}); the whole 95% interval above it: {row['above_interval']} "
                     f"(Wu et al.: 3-6% of heads above {RETRIEVAL_THRESHOLD})")
        part = retrieval[(retrieval["model"] == model) & (retrieval["metric"] == metric)]
        part = part.assign(thin=thin_rows(part)).sort_values(["value", "layer", "head"],
                                                                 ascending=[False, True, True]).head(n)
        for row in part.itertuples():
            lines.append(f"  {row.label:>8} {row.value:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}] over "
                         f"{int(row.count)} trials" + (" (thin support)" if row.thin else ""))
    if "retrieval_masking" in run.frames:  # the masking test: accuracy per condition over every trial, paired drops
        lines += ["needle accuracy (ROUGE-1 recall) with heads masked, 95% intervals over needles:",
                  *(f"  {line}" for line in masking_lines(run["retrieval_masking"]))]
    return "\n".join(lines)
