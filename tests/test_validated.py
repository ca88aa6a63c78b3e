"""Where intervals were validated (`headscan.intervals.validated`): the packaged coverage table is the committed
experiment's, condensed; a finding needs its family's measured coverage at its size; the report says why not."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from headscan.analysis.claims import UNVALIDATED, WITHIN_NULL, why_not
from headscan.intervals.validated import MIN_COVERAGE, coverage_table, measured_coverage, unvalidated
from headscan.metrics.nulls import add_findings

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "reports" / "experiments" / "interval_coverage" / "sizes" / "coverage.csv"
IMPORTANCE = ROOT / "reports" / "experiments" / "interval_coverage" / "importance" / "coverage.csv"


def test_the_packaged_table_is_the_committed_experiment_condensed():
    packaged = measured_coverage()
    both = pd.concat([pd.read_csv(EXPERIMENT), pd.read_csv(IMPORTANCE)], ignore_index=True)
    pd.testing.assert_frame_equal(packaged, coverage_table(both), check_dtype=False)
    raw = pd.read_csv(EXPERIMENT)
    raw = raw[(raw.design == "random") & (raw.method == "studentized_symmetric") & (raw.rule == "thin")]
    # by hand: prev_token at 30 documents is the lower of minilm's and smollm2's coverage
    both = raw[(raw.metric == "prev_token") & (raw.N == 30)]["coverage"]
    row = packaged[(packaged.family == "prev_token") & (packaged.N == 30)].iloc[0]
    assert len(both) == 2 and row.coverage == pytest.approx(both.min(), abs=1e-4) and row.coverage < MIN_COVERAGE
    patterns = packaged[~packaged.family.str.startswith("importance:")]
    assert (patterns[patterns.N == 100]["coverage"] >= 0.94).all()  # every pattern family validated from 100 units on
    # minilm's mean ablation (1 - cosine of its final hidden states) held 0.92 even on 100 documents
    ablation = packaged[(packaged.family == "importance:mean_ablation:hidden_change") & (packaged.N == 100)].iloc[0]
    assert ablation.coverage < MIN_COVERAGE


@pytest.mark.parametrize("table, metric, units, short", [
    ("heads", "prev_token", 318.0, False),
    ("heads", "prev_token", 100.0, False),
    ("heads", "prev_token", 99.0, True),  # judged at 30 units, where it covered 0.92
    ("heads", "first_token", 64.0, False),  # 0.94 at 30
    ("heads", "prev_token", 9.0, True),  # fewer units than any size measured
    ("heads", "my_own_pattern", 9.0, False),  # never measured: the thin rule alone
    ("value", "distance", 50.0, True),
    ("syntax", "nsubj", 12.0, False),  # syntax held 0.95 at 10
])
def test_a_row_is_unvalidated_where_its_family_fell_short_at_its_size(table, metric, units, short):
    assert unvalidated(table, np.array([metric]), np.array([units])).tolist() == [short]


def rows(units):
    """A head far beyond uniform attention on prev_token among 30 at chance, every row on `units` units."""
    value = np.r_[0.9, np.full(29, 0.1)]
    frame = pd.DataFrame({"model": "m", "layer": 0, "head": range(30), "metric": "prev_token", "value": value,
                          "ci_low": value - 0.01, "ci_high": value + 0.01, "variance_df": 60.0, "chance": 0.1,
                          "units": float(units), "thin": False})
    return frame


def test_a_finding_needs_its_interval_validated_at_its_size_and_says_why_not():
    validated, summary = add_findings({"heads": rows(318)})
    assert validated["heads"]["finding"].tolist() == [True] + [False] * 29
    assert summary["unvalidated"] == {"m": 0} and "0.93" in summary["validated"]
    small, summary = add_findings({"heads": rows(64)})
    assert not small["heads"]["finding"].any() and summary["unvalidated"] == {"m": 30}
    assert small["heads"]["q_value"].iloc[0] < 0.05  # the test itself passes: only the size withholds the claim
    reasons = why_not(small["heads"])
    assert reasons.iloc[0] == UNVALIDATED and why_not(validated["heads"]).iloc[0] == ""
    assert (reasons.iloc[1:] == WITHIN_NULL).all()  # at chance says so, whatever the size


def test_the_report_names_the_families_that_carry_no_claim_at_a_small_size():
    from headscan.analysis.runs import Comparison
    from headscan.report.sections.findings import _few_units

    [text] = _few_units(Comparison({"heads": rows(64)}, [], []))
    said = text.text
    assert "at most 64 bootstrap units" in said and "parts of 30 EWT documents" in said
    assert "prev_token (0.920)" in said and "distance (0.906)" in said and "value:first_token (0.928)" in said
    assert not re.search(r"(?<!:)first_token \(", said)  # heads' first_token held 0.94 at 30
    assert _few_units(Comparison({"heads": rows(318)}, [], [])) == []


def test_an_importance_row_matters_only_where_its_method_was_validated_at_its_size():
    from headscan.analysis.importance import matter_table

    heads = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1], "metric": "prev_token", "value": [0.5, 0.5],
                          "ci_low": [0.4, 0.4], "ci_high": [0.6, 0.6]})
    rows = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1], "label": ["L0H0", "L0H1"], "value": [0.5, 0.5],
                         "ci_low": [0.4, 0.4], "ci_high": [0.6, 0.6], "units": [316, 316],
                         "method": "mean_ablation", "target": ["hidden_change", "next_token_loss"]})
    table = matter_table(heads, rows).set_index("label")
    # minilm's hidden_change covered 0.92 at 100 documents: withheld; next_token_loss was never measured: judged
    assert not table.loc["L0H0", "matters"] and table.loc["L0H0", "unvalidated"]
    assert table.loc["L0H1", "matters"] and not table.loc["L0H1", "unvalidated"]
