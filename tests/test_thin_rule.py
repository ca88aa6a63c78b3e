"""The thin rule: at the ends of a metric's range, and what the report's sentences say of the rows it flags.

A head that puts nearly all of its attention on one kind of token in every unit has a bootstrap variance made by
the one or two units that differ slightly, so its df is low although every unit agrees: the rule must not call
that thin support. Checked on a simulated ceiling head through the real interval code, and on the committed
EWT dev row that showed it.

A row the rule flags has an interval nobody should trust, so nothing may say where it lies against chance: the
sentences say it "cannot be assessed on this corpus", never that it is not beyond chance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from headscan.analysis import syntax as syntactic
from headscan.analysis.findings import findings
from headscan.intervals import (
    bootstrap_weights,
    effective_units,
    interval,
    replicate_moments,
    support,
    thin,
    unit_moments,
    variance_df,
)
from headscan.intervals.moments import MOMENT_TERMS

EWT_DEV = Path(__file__).resolve().parents[1] / "reports" / "runs" / "ewt-dev" / "heads.parquet"


def _ceiling_head(n_units=60, seed=0):
    """Every unit's queries put all their attention on the target, but one unit's put 0.999 of it."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(10, 40, (n_units, 1)).astype(float)
    sums = counts.copy()
    sums[7] *= 0.999
    moments = unit_moments(sums, counts)
    value = moments[MOMENT_TERMS.index("s")] / moments[MOMENT_TERMS.index("c")]
    weights = bootstrap_weights(range(n_units), 200, seed=seed)
    replicated = (weights @ sums, weights @ counts, replicate_moments(weights, sums, counts))
    low, high = interval(value, *replicated[:2], moments, method="studentized_symmetric",
                         replicate_power=replicated[2], bounds=(0.0, 1.0))
    return value, low, high, effective_units(moments), variance_df(*replicated), support(moments)[0]


def test_a_head_at_the_ceiling_with_every_unit_agreeing_is_not_thin():
    value, low, high, n_eff, df, units = _ceiling_head()
    assert value[0] > 0.9999 and high[0] == 1.0
    assert df[0] < 4 and n_eff[0] > 30  # what made it thin: the df, not the units
    assert thin(n_eff, df, units).tolist() == [True]  # without the interval: the rule as it reads the df alone
    assert thin(n_eff, df, units, value=value, low=low, high=high, bounds=(0.0, 1.0)).tolist() == [False]


def test_a_thin_head_stays_thin_near_the_ceiling_when_units_disagree_or_are_few():
    value, low, high, n_eff, df, units = _ceiling_head()
    given = dict(value=value, low=low, high=high, bounds=(0.0, 1.0))
    assert thin(np.array([3.0]), df, units, **given).tolist() == [True]  # few effective units
    assert units[0] == 60
    assert thin(np.array([30.0]), df, units, sparse=True, **given).tolist() == [True]  # sparse, and 30 < 0.8 x 60
    # a wide interval that reaches 1 is not at the ceiling: 0.6 [0.45, 1.0] with df 2
    assert thin([60.0], [2.0], [60.0], value=[0.6], low=[0.45], high=[1.0], bounds=(0.0, 1.0)).tolist() == [True]
    # no range: no bound to be at (dla, distance)
    assert thin(n_eff, df, units, value=value, low=low, high=high,
                bounds=(-np.inf, np.inf)).tolist() == [True]


def test_minilm_previous_position_head_on_ewt_dev_is_not_thin():
    if not EWT_DEV.exists():
        pytest.skip("the committed EWT dev run is not in this checkout")
    rows = pd.read_parquet(EWT_DEV)
    row = rows[(rows["model"] == "minilm") & (rows["label"] == "L0H2") & (rows["metric"] == "positional_prev")].iloc[0]
    # the sweep records it with the ceiling-aware rule: near 1, every unit agreeing, few df and still trusted
    assert row["value"] > 0.9999 and row["variance_df"] < 2 and not bool(row["thin"])
    args = [np.array([row[c]], dtype=float) for c in ("n_eff", "variance_df", "units")]
    ends = {k: np.array([row[c]]) for k, c in (("value", "value"), ("low", "ci_low"), ("high", "ci_high"))}
    assert thin(*args, bounds=(0.0, 1.0), **ends).tolist() == [False]


def _heads(induction_thin=True, control=False):
    """A causal model m (and its control c): L0H0 a previous-token head, L1H0 the strongest induction head, whose
    interval (42.4% to 47.6%) is 5-6x its chance; L1H1's induction at chance. L1's induction rows are thin, as
    on natural text, when `induction_thin`."""
    rows = []
    for model in ["m", "c"] if control else ["m"]:
        for layer, head, metric, value, low, high, chance, is_thin in [
                (0, 0, "prev_token", 0.9, 0.88, 0.92, 0.1, False), (0, 1, "prev_token", 0.1, 0.08, 0.12, 0.1, False),
                (1, 0, "prev_token", 0.1, 0.08, 0.12, 0.1, False), (1, 1, "prev_token", 0.1, 0.08, 0.12, 0.1, False),
                (1, 0, "induction", 0.45, 0.424, 0.476, 0.078, induction_thin),
                (1, 1, "induction", 0.08, 0.06, 0.10, 0.078, induction_thin),
                (0, 0, "induction", 0.01, 0.0, 0.02, 0.078, False), (0, 1, "induction", 0.01, 0.0, 0.02, 0.078, False)]:
            rows.append({"model": model, "family": "causal", "layer": layer, "head": head, "label": f"L{layer}H{head}",
                         "kv_group": head, "metric": metric, "value": value, "count": 400.0, "ci_low": low,
                         "ci_high": high, "units": 300.0, "top_unit_share": 0.01, "thin": is_thin, "chance": chance})
    return pd.DataFrame(rows)


def test_a_thin_strongest_head_cannot_be_assessed_rather_than_not_beyond_chance():
    said = findings(_heads())
    on = "the tokens that follow other occurrences of its own token"
    assert (f"Whether a head of m puts its attention on {on} beyond chance cannot be assessed on this corpus: the "
            "strongest, L1H0 with 45.0% (95% interval 42.4% to 47.6%; chance 7.8%), rests on thin support.") in said
    assert not any(s.startswith(f"No head of m puts its attention on {on}") for s in said)
    # the same rows, trusted: the strongest is a finding
    assert any(s.startswith("In m, L1H0 puts 45.0% of its attention on") for s in findings(_heads(False)))


def test_thin_rows_are_counted_as_unassessed_not_as_not_beyond_chance():
    said = findings(_heads())
    assert ("2 of 8 scores of m rest on thin support (too few segments or documents, or one holding much of the "
            "sum): whether they lie beyond chance cannot be assessed on this corpus, and no finding here rests on "
            "them.") in said
    # of the 6 trusted rows, 3 prev_token and 2 induction rows hold or lie below chance; thin L1H1 is not one
    assert any(s.startswith("5 of 8 scores of m do not lie beyond chance") for s in said)


def test_a_control_on_thin_support_cannot_be_assessed():
    heads = _heads(induction_thin=False, control=True)
    heads.loc[(heads["model"] == "c") & (heads["metric"] == "induction") & (heads["layer"] == 1), "thin"] = True
    said = findings(heads, controls={"m": ["c"]})
    sentence = next(s for s in said if s.startswith("In m, L1H0 puts 45.0%"))
    assert " c cannot be assessed on this corpus: it rests on thin support: L1H0 45.0%" in sentence
    assert "does not" not in sentence


def test_syntax_rows_on_thin_support_are_not_counted_as_holding_chance():
    best = pd.DataFrame({
        "model": "m", "relation": ["obj", "det"], "direction": "dependent_to_head", "label": ["L4H3", "L0H0"],
        "layer": [4, 0], "head": [3, 0], "accuracy": [0.3, 0.9], "ci_low": [0.2, 0.1], "ci_high": [0.4, 1.0],
        "count": [1211.0, 12.0], "baseline": [0.1, 0.05], "baseline_offset": pd.array([2, 1], dtype="Int64"),
        "margin": [0.2, 0.85], "beats": True, "thin": [False, True], "chance": [0.3, 0.2],
        "unsupported": ["at chance", "thin support; at chance"]})
    assert syntactic.syntax_findings(best)["m"][-1] == (
        "2 of 2 best heads of m are not judged: 1 on thin support, which cannot be assessed on this corpus; 1 with "
        "an interval that does not lie above chance, or no chance recorded.")
