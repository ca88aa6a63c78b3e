"""What a patching run says, in a few lines: per model, how well it does the task, the heads that carry the
logit difference (exact denoising, with 95% intervals over pairs), AtP's agreement with them, and the paths
that carry it with their false-discovery q-values (`headscan.scan.patching` makes the tables)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import intervals

__all__ = ["patching_summary", "top_patched", "path_tests", "kv_sharers", "grouped_query_note", "positive_total",
           "Q_LEVEL"]

Q_LEVEL = 0.05  # the false-discovery rate at which a path is said to carry part of the difference


def top_patched(frame: pd.DataFrame, method: str = "denoise", k: int = 5) -> pd.DataFrame:
    """The `k` heads of each model with the largest fraction restored (or destroyed) by `method`, every
    position at once."""
    rows = frame[(frame["method"] == method) & (frame["target"] == "fraction") & frame["position"].isna()]
    return (rows.sort_values(["model", "value", "layer", "head"], ascending=[True, False, True, True], kind="stable")
            .groupby("model", sort=False).head(k))


def positive_total(frame: pd.DataFrame, model: str, method: str = "denoise", k: int | None = None) -> float:
    """The sum of `model`'s positive fractions under `method` (of its top `k` only, if given): more than 1 where
    heads overlap, which is why fractions are not shares of one whole.

    >>> rows = pd.DataFrame({"model": "m", "method": "denoise", "target": "fraction", "position": pd.NA,
    ...                      "layer": [0, 0, 1], "head": [0, 1, 0], "value": [0.9, -0.1, 0.8]})
    >>> round(positive_total(rows, "m"), 2), round(positive_total(rows, "m", k=1), 2)
    (1.7, 0.9)
    """
    rows = top_patched(frame[frame["model"] == model], method, len(frame) if k is None else k)
    return float(rows["value"].clip(lower=0).sum())


def path_tests(paths: pd.DataFrame) -> pd.DataFrame:
    """`paths` with ``p_value`` and ``q_value`` filled in: the table's own where it has them; for a run written
    before they were recorded, from its interval (`headscan.intervals.interval_se`, the SE a symmetric t-type
    interval implies, on the row's ``variance_df``) and Benjamini-Hochberg over the model's paths of each target.

    >>> rows = pd.DataFrame({"model": "m", "target": "fraction", "value": [0.3, 0.0], "ci_low": [0.2, -0.1],
    ...                      "ci_high": [0.4, 0.1], "variance_df": [30.0, 30.0]})
    >>> tested = path_tests(rows)
    >>> bool(tested["q_value"].iloc[0] < 0.001), bool(tested["q_value"].iloc[1] > 0.4)
    (True, True)
    """
    paths = paths.copy()
    if "p_value" not in paths or paths["p_value"].isna().all():
        se = intervals.interval_se(paths["value"], paths["ci_low"], paths["ci_high"], paths["variance_df"])
        paths["p_value"] = intervals.t_p_value(paths["value"], se, paths["variance_df"], 0.0)
        paths["q_value"] = np.nan
    if paths["q_value"].isna().all():
        for _, rows in paths.groupby(["model", "target"], sort=False):
            paths.loc[rows.index, "q_value"] = intervals.q_values(rows["p_value"].to_numpy())
    return paths


def kv_sharers(patching: pd.DataFrame, model: str, layer: int, group: int) -> list[str]:
    """The labels of `model`'s query heads of `layer` that read key/value group `group`, in head order."""
    rows = patching[(patching["model"] == model) & (patching["layer"] == layer) & (patching["kv_group"] == group)]
    return [f"L{layer}H{head}" for head in sorted(set(rows["head"].astype(int)))]


def grouped_query_note(patching: pd.DataFrame, path) -> str | None:
    """A sentence for a key or value path into a receiver whose key/value group several query heads share
    (grouped-query attention); None for a query path or a group of one head.

    >>> rows = pd.DataFrame({"model": "m", "layer": 1, "head": [0, 1, 2, 3], "kv_group": [0, 0, 0, 1]})
    >>> path = pd.Series({"model": "m", "layer": 1, "head": 0, "label": "L1H0", "kv_group": 0, "path": "v"})
    >>> grouped_query_note(rows, path)
    'the value projection of L1H0 belongs to key/value group 0, shared by L1H0-H2: patching it changes what all 3 of them read'
    """
    if path["path"] not in ("k", "v"):
        return None
    sharers = kv_sharers(patching, path["model"], int(path["layer"]), int(path["kv_group"]))
    if len(sharers) < 2:
        return None
    heads = [int(label.split("H")[1]) for label in sharers]
    named = (f"L{int(path['layer'])}H{heads[0]}-H{heads[-1]}" if heads == list(range(heads[0], heads[-1] + 1))
             else ", ".join(sharers))
    what = {"k": "key", "v": "value"}[path["path"]]
    return (f"the {what} projection of {path['label']} belongs to key/value group {int(path['kv_group'])}, shared by "
            f"{named}: patching it changes what all {len(sharers)} of them read")


def _interval(row) -> str:
    return f"{row.value:.2f} [{row.ci_low:.2f}, {row.ci_high:.2f}]"


def patching_summary(result) -> str:
    """Lines for the terminal: per model, its pairs, top heads and AtP's recall, then its top paths."""
    frame = result["patching"]
    lines = []
    for described in result.provenance.models:
        about = described.extra.get("patching", {})
        name = described.name
        top = top_patched(frame[frame["model"] == name])
        lines.append(f"{name}: {about.get('clean_right', '?')} of {about.get('pairs', '?')} clean prompts right "
                     f"(mean LD clean {about.get('mean_logit_difference', {}).get('clean', float('nan')):.2f}, "
                     f"corrupted {about.get('mean_logit_difference', {}).get('corrupted', float('nan')):.2f})")
        lines.append("  fraction of the logit difference restored (denoising; ranked on the pairs it is estimated on; "
                     "fractions overlap and do not add): "
                     + ", ".join(f"{r.label} {_interval(r)}" for r in top.itertuples()))
        for key, name in (("denoise", "AtP"), ("atp_star_denoise", "AtP*")):
            recall = (about.get("atp_recall") or {}).get(key)
            if recall:
                lines.append(f"  {name} (a screen): Spearman {recall['spearman']:.2f} with exact denoising; recall "
                             f"of its top 10 {recall['top_10']}, top 20 {recall['top_20']}")
    if "paths" in result.frames:
        paths = path_tests(result["paths"])
        paths = paths[paths["target"] == "fraction"].sort_values("value", ascending=False, kind="stable").head(5)
        lines.append("paths (fraction restored through the receiver's q, k or v; BH q over the paths tested): " + ", ".join(
            f"{r.model} {r.sender_label}>{r.label}:{r.path} {_interval(r)} q {r.q_value:.2g}" for r in paths.itertuples()))
    return "\n".join(lines)
