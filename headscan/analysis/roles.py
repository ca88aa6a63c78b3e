"""Roles: what a head is called from its numbers, one threshold per role, used by the atlas and findings alike.

A head holds a role when one of the role's metrics reaches the role's threshold *and* that row may carry a
claim (`headscan.analysis.claims`: not thin, its interval beyond chance on the high side). Two roles read
the same metric, ``induction``: a head that attends to the token after an earlier occurrence of its own token
is *prefix-matching*, and an *induction* head only with evidence that it also copies that token
(Olsson et al. 2022): a positive direct logit attribution to the next token (``dla``, the low end of its
interval above 0 and above its chance; on repeat-random's second copy the next token is the induction
target) or a positive OV copying score (weights.parquet, read off the weights; its sign is stated).

This module draws nothing, lays out nothing and loads no model.

>>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": 0, "head": [0, 1], "label": ["L0H0", "L0H1"],
...                       "metric": "prev_token", "value": [0.93, 0.2], "ci_low": [0.92, 0.1],
...                       "ci_high": [0.94, 0.3], "chance": 0.1})
>>> head_roles(heads)[["label", "roles", "role"]].to_dict("records")
[{'label': 'L0H0', 'roles': ['previous-token'], 'role': 'previous-token'}, {'label': 'L0H1', 'roles': [], 'role': ''}]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import tables
from .claims import supported

__all__ = ["Role", "ROLES", "COPYING_EVIDENCE", "role_rules", "role_for", "copying_evidence", "head_roles"]

# What counts as evidence that a head copies what it attends to, in words (the rules state it once).
COPYING_EVIDENCE = ("copying evidence: `dla` (direct logit attribution to the next token) with its 95% interval above "
                    "0 and above its chance, or an OV copying score (`copying`, weights.parquet) above 0")


@dataclass(frozen=True)
class Role:
    """A role a head is given from its numbers: any of `metrics` at least `threshold`, on a row that may carry a
    claim."""

    name: str  # the badge
    metrics: tuple[str, ...]
    threshold: float
    colour: str  # its colour when the atlas is coloured by role
    meaning: str  # what the role is, for the page
    beyond_chance: bool = True  # the claim gate; False: support alone (a role that says "near chance")
    copying: bool | None = None  # True: needs copying evidence; False: holds only without it; None: either

    def rule(self, tested: bool = False) -> str:
        """The role's rule in a few words; `tested`: the tables record the sweep's verdicts (a finding is beyond
        its null, `headscan.metrics.nulls`), else the gate is chance."""
        names = " or ".join(f"`{m}`" for m in self.metrics)
        bar = "a finding beyond its null" if tested else "beyond chance"
        gate = bar if self.beyond_chance else "on support that is not thin (no chance gate)"
        evidence = {True: ", with copying evidence", False: ", without copying evidence", None: ""}[self.copying]
        return f"{names} \u2265 {self.threshold:g} {gate}{evidence}"


# In order of precedence: colouring by role shows a head's first role in this order, badges show them all.
ROLES = (
    Role("induction", ("induction",), 0.4, "#d55e00",
         "attends to the token after an earlier occurrence of its own token and copies it (Olsson et al. 2022)",
         copying=True),
    Role("prefix-matching", ("induction",), 0.4, "#e69f00",
         "attends to the token after an earlier occurrence of its own token; attention alone, no evidence that it "
         "copies it", copying=False),
    Role("duplicate", ("duplicate_token",), 0.4, "#cc78bc", "attends to other occurrences of its own token"),
    Role("previous-token", ("prev_token",), 0.5, "#0173b2",
         "puts at least half of its attention on the previous token"),
    Role("next-token", ("next_token",), 0.5, "#029e73", "puts at least half of its attention on the next token"),
    Role("self", ("self",), 0.5, "#ece133", "puts at least half of its attention on its own token"),
    Role("positional", ("positional_prev", "positional_next"), 0.9, "#56b4e9",
         "looks most at the previous (or next) token for at least 90% of queries: Voita et al.'s (2019) rule"),
    Role("sink", ("first_token", "sep"), 0.5, "#949494",
         "puts at least half of its attention on the first token or on [SEP]: an attention sink"),
    Role("broad", ("entropy_norm",), 0.8, "#ca9161",
         "spreads its attention: entropy near that of uniform attention, which is its chance, so only support is "
         "asked of it", beyond_chance=False),
)


def role_rules(tested: bool = False) -> list[str]:
    """One line per role: its name, its rule and what it means, as the page states them; then what counts as
    copying evidence."""
    return [f"{role.name}: {role.rule(tested)}; {role.meaning}." for role in ROLES] + [COPYING_EVIDENCE[:1].upper()
                                                                                  + COPYING_EVIDENCE[1:] + "."]


def role_for(metric: str) -> Role | None:
    """The first role that reads `metric` (its threshold is the one findings use for that metric), or None.

    >>> role_for("prev_token").threshold, role_for("induction").name, role_for("distance")
    (0.5, 'induction', None)
    """
    return next((role for role in ROLES if metric in role.metrics), None)


def _keys() -> list[str]:
    return ["model", "layer", "head"]


def copying_evidence(heads: pd.DataFrame, weights: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per head with any row: whether it has copying evidence, and which, in words.

    Returns
    -------
    DataFrame
        Columns ``model, layer, head, copies, evidence``: ``copies`` True where `dla` (heads) has its interval
        above 0 and above its chance on a row that may carry a claim, or `copying` (weights) is above 0;
        ``evidence`` says which, with the number ("dla +0.37 [0.30, 0.44]", "copying +0.62"), "" where none.
    """
    keys = _keys()
    out = heads[keys].drop_duplicates().reset_index(drop=True)
    said = {key: [] for key in map(tuple, out[keys].itertuples(index=False, name=None))}
    dla = heads[(heads["metric"] == "dla") & heads["value"].notna()]
    if len(dla):
        good = dla[supported(dla) & (dla["ci_low"] > 0)]
        for row in good.itertuples():
            said[(row.model, row.layer, row.head)].append(
                f"dla {row.value:+.2f} [{row.ci_low:+.2f}, {row.ci_high:+.2f}]")
    if weights is not None and len(weights):
        copying = weights[(weights["metric"] == "copying") & (weights["value"] > 0)]
        for row in copying.itertuples():
            key = (row.model, row.layer, row.head)
            if key in said:
                said[key].append(f"copying {row.value:+.2f}")
    out["evidence"] = ["; ".join(said[key]) for key in map(tuple, out[keys].itertuples(index=False, name=None))]
    out["copies"] = out["evidence"] != ""
    return out[[*keys, "copies", "evidence"]]


def head_roles(heads: pd.DataFrame, weights: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each head's roles (`ROLES`) from its numbers: a role's metric at its threshold on a row that may carry a
    claim (`headscan.analysis.claims`; for ``broad``, support alone), and copying evidence where the role asks
    for it (`copying_evidence`, from `heads`' ``dla`` and `weights`' ``copying``).

    Returns
    -------
    DataFrame
        Columns ``model, layer, head, label, roles, role, evidence``: ``roles`` every role that holds, in
        `ROLES` order, ``role`` the first of them ("" when none does), ``evidence`` the copying evidence.
    """
    keys = ["model", "layer", "head", "label"]
    out = heads[keys].drop_duplicates(["model", "layer", "head"]).reset_index(drop=True)
    rows = heads[heads["metric"].isin({m for role in ROLES for m in role.metrics}) & heads["value"].notna()]
    gated = rows.assign(claim=supported(rows) if len(rows) else pd.Series(dtype=bool),
                        solid=~tables.thin_rows(rows) if len(rows) else pd.Series(dtype=bool))
    evidence = copying_evidence(heads, weights).set_index(_keys())
    held: dict[tuple, list[str]] = {key: [] for key in map(tuple, out[_keys()].itertuples(index=False, name=None))}
    for role in ROLES:
        mine = gated[gated["metric"].isin(role.metrics) & (gated["value"] >= role.threshold)]
        mine = mine[mine["claim"] if role.beyond_chance else mine["solid"]]
        for key in dict.fromkeys(map(tuple, mine[_keys()].itertuples(index=False, name=None))):
            copies = bool(evidence["copies"].get(key, False))
            if role.copying is None or role.copying == copies:
                held[key].append(role.name)
    out["roles"] = [held[key] for key in map(tuple, out[_keys()].itertuples(index=False, name=None))]
    out["role"] = [names[0] if names else "" for names in out["roles"]]
    out["evidence"] = [str(evidence["evidence"].get(key, "")) for key in
                       map(tuple, out[_keys()].itertuples(index=False, name=None))]
    models = {name: i for i, name in enumerate(dict.fromkeys(heads["model"]))}
    out = out.sort_values(["model", "layer", "head"], key=lambda c: c.map(models) if c.name == "model" else c,
                          kind="stable").reset_index(drop=True)
    return out.assign(layer=out["layer"].astype(np.int64), head=out["head"].astype(np.int64))
