"""Which heads feed which, from composition.parquet (`headscan.models.composition`): each model's strongest pairs
per mode, how many pass the rotation null, and the links a circuit reading asks for first: previous-token
heads whose output the keys of induction (or prefix-matching) heads read (K-composition, Olsson et al. 2022).

>>> rows = pd.DataFrame({"model": "m", "mode": "K", "layer": 1, "head": [0, 0, 1], "label": ["L1H0", "L1H0", "L1H1"],
...                      "source_layer": 0, "source_head": [0, 1, 0], "source_label": ["L0H0", "L0H1", "L0H0"],
...                      "value": [0.40, 0.20, 0.18], "chance": 0.17, "null_high": 0.22,
...                      "beyond": [True, False, False]})
>>> roles = pd.DataFrame({"model": "m", "layer": [0, 1, 1], "head": [0, 0, 1],
...                       "roles": [["previous-token"], ["induction"], []]})
>>> composition_links(rows, roles)[["sender", "receiver", "value", "rank", "of", "beyond"]].to_dict("records")
[{'sender': 'L0H0', 'receiver': 'L1H0', 'value': 0.4, 'rank': 1, 'of': 3, 'beyond': True}]
"""

from __future__ import annotations

import pandas as pd

__all__ = ["SENDER_ROLES", "RECEIVER_ROLES", "composition_summary", "composition_links", "top_pairs"]

SENDER_ROLES = ("previous-token",)
RECEIVER_ROLES = ("induction", "prefix-matching")


def composition_summary(composition: pd.DataFrame) -> pd.DataFrame:
    """Per model and mode: pairs scored, the null's mean, 99th percentile and that percentile's bootstrap standard
    error (NaN in a table written before it was recorded), and pairs beyond it."""
    groups = composition.groupby(["model", "mode"], sort=False)
    se = groups["null_se"].first() if "null_se" in composition else groups["chance"].first() * float("nan")
    return pd.DataFrame({"pairs": groups.size(), "null_mean": groups["chance"].first(),
                         "null_high": groups["null_high"].first(), "null_se": se,
                         "beyond": groups["beyond"].sum().astype(int)}).reset_index()


def top_pairs(composition: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """Each model's `n` largest pairs per mode, largest first (ties to the earlier sender, then receiver)."""
    ordered = composition.sort_values(["model", "mode", "value", "source_layer", "source_head", "layer", "head"],
                                      ascending=[True, True, False, True, True, True, True], kind="stable")
    return ordered.groupby(["model", "mode"], sort=False).head(n).reset_index(drop=True)


def composition_links(composition: pd.DataFrame, roles: pd.DataFrame, *, mode: str = "K") -> pd.DataFrame:
    """Every pair of a head holding a `SENDER_ROLES` role and a later head holding a `RECEIVER_ROLES` role
    (`headscan.analysis.roles.head_roles`), with its `mode` score, its rank among the model's `mode` pairs (1: the
    largest) and whether it passes the null; largest first."""
    columns = ["model", "sender", "receiver", "value", "rank", "of", "chance", "null_high", "beyond"]
    part = composition[composition["mode"] == mode].copy()
    if part.empty or roles.empty:
        return pd.DataFrame(columns=columns)
    part["rank"] = part.groupby("model")["value"].rank(ascending=False, method="min").astype(int)
    part["of"] = part.groupby("model")["value"].transform("size")
    held = {(m, lay, h): set(r) for m, lay, h, r in zip(roles["model"], roles["layer"], roles["head"], roles["roles"])}
    sends = [bool(held.get((m, lay, h), set()) & set(SENDER_ROLES))
             for m, lay, h in zip(part["model"], part["source_layer"], part["source_head"])]
    receives = [bool(held.get((m, lay, h), set()) & set(RECEIVER_ROLES))
                for m, lay, h in zip(part["model"], part["layer"], part["head"])]
    linked = part[pd.Series(sends, index=part.index) & pd.Series(receives, index=part.index)]
    linked = linked.rename(columns={"source_label": "sender", "label": "receiver"})
    return linked.sort_values(["model", "value"], ascending=[True, False], kind="stable")[columns].reset_index(drop=True)
