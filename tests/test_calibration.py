"""Calibrated intervals (`headscan.intervals.calibration`) and the verdicts that read them (`headscan.metrics.nulls`):
a head far from its null is a finding at any size measured; a row on fewer units than any size measured is too few
to assess, never within its null; a family never measured takes the widest factor; a run without random-init
controls makes no finding; each table is its own false-discovery family."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from headscan.analysis.claims import NO_EMPIRICAL, TOO_FEW, WITHIN_NULL, why_not
from headscan.intervals import calibration
from headscan.intervals.calibration import calibrate, calibrated_interval, calibration_table
from headscan.metrics.nulls import add_findings

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "reports" / "experiments" / "interval_calibration"

# A table of factors to test the rules on, apart from whatever the packaged one holds.
TABLE = pd.DataFrame({"family": ["prev_token", "prev_token", "prev_token", "entropy", "entropy", "entropy"],
                      "N": [10, 30, 100] * 2, "factor": [2.0, 1.4, 1.0, 3.0, 1.5, 1.1]})


@pytest.fixture
def factors(monkeypatch):
    monkeypatch.setattr(calibration, "calibration_table", lambda: TABLE)
    return TABLE


SPARSE = ("induction", "duplicate_token", "value:induction", "value:duplicate_token")


def test_the_packaged_factors_are_the_committed_experiments():
    """EWT's fit (test, checked on dev) and, for the families EWT leaves unmeasured, the fit on repeated random
    tokens (one draw, checked on another): the packaged table is the two committed tables side by side."""
    packaged = calibration_table()
    ewt = pd.read_csv(COMMITTED / "calibration.csv")
    sparse = pd.read_csv(COMMITTED / "sparse" / "calibration.csv")
    assert set(sparse["family"]) == set(SPARSE) and not set(ewt["family"]) & set(SPARSE)
    both = pd.concat([ewt, sparse]).sort_values(["family", "N"], kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(packaged, both, check_dtype=False)
    assert (packaged["factor"] >= 1).all() and set(packaged["N"]) == {10, 30, 100}
    # every family the report claims on was measured at every size
    for family in ("prev_token", "next_token", "self", "first_token", "entropy", "syntax", "value:prev_token",
                   "sink_ratio", "value:sink_ratio", "output_norm", "attended_logit", *SPARSE):
        assert set(packaged[packaged["family"] == family]["N"]) == {10, 30, 100}, family


@pytest.mark.parametrize("run", ["ewt-dev", "ewt-long", "repeat-random"])
def test_every_committed_finding_rests_on_a_measured_family(run):
    """No committed report claims on a family whose coverage was never measured: every finding's factor is its own
    family's (``cal_basis`` measured), not the widest family's stand-in."""
    folder = ROOT / "reports" / "runs" / run
    for table in ("heads", "value", "syntax"):
        path = folder / f"{table}.parquet"
        if not path.is_file():
            continue
        frame = pd.read_parquet(path, columns=["metric", "finding", "cal_basis"] if table != "syntax" else
                                ["finding", "cal_basis"])
        found = frame[frame["finding"].fillna(False).astype(bool)]
        unmeasured = found[found["cal_basis"] != "measured"]
        assert len(found) and not len(unmeasured), (table, unmeasured.get("metric", unmeasured["cal_basis"]).unique())


def test_induction_and_duplicate_tokens_cover_on_a_draw_they_were_not_fitted_on():
    """On EWT the thin rule trusts almost no induction or duplicate-token row (5 at 10 documents), so they are
    measured on repeated random tokens: fitted on one draw of 318 sequences, checked on another, both models."""
    check = pd.read_csv(COMMITTED / "sparse" / "check.csv")
    held_out = check[check["corpus"] == "repeat2"]
    assert set(held_out["model"]) == {"minilm", "smollm2"} and set(held_out["family"]) == set(SPARSE)
    assert set(held_out["N"]) == {10, 30, 100} and (held_out["trusted"] >= 50).all()
    assert (held_out["calibrated"] >= 0.93).all(), held_out[held_out["calibrated"] < 0.93]


def test_the_held_out_split_covers_with_the_calibrated_interval():
    """On EWT dev, which the factors never saw, every family covers at least 0.93 at 10, 30 and 100 documents."""
    check = pd.read_csv(COMMITTED / "check.csv")
    held_out = check[check["corpus"] == "dev"]
    assert len(held_out) and set(held_out["N"]) == {10, 30, 100}
    claimed = held_out[held_out["trusted"] >= 50]
    assert (claimed["calibrated"] >= 0.93).all(), claimed[claimed["calibrated"] < 0.93]
    assert (claimed["calibrated"] >= claimed["default"]).all()


@pytest.mark.parametrize("units, expected", [
    (10, 2.0), (30, 1.4), (100, 1.0), (1000, 1.0),
    (np.sqrt(10 * 30), 1.7),  # halfway between 10 and 30 in log units
    (np.sqrt(30 * 100), 1.2),
])
def test_a_factor_is_interpolated_in_log_units(factors, units, expected):
    factor, basis = calibrate("heads", ["prev_token"], [units])
    assert factor[0] == pytest.approx(expected) and basis[0] == "measured"


def test_a_family_never_measured_takes_the_widest_and_too_few_units_takes_none(factors):
    factor, basis = calibrate("heads", ["induction", "prev_token", "prev_token"], [30.0, 9.0, np.nan])
    assert factor[0] == pytest.approx(1.5) and basis[0] == "widest measured"  # entropy's 1.5 at 30
    assert np.isnan(factor[1]) and basis[1] == "too few units"
    assert factor[2] == pytest.approx(2.0)  # units not recorded: the smallest size's, the most cautious
    factor, basis = calibrate("value", ["prev_token"], [30.0])  # value:prev_token was not measured here
    assert factor[0] == pytest.approx(1.5) and basis[0] == "widest measured"


def test_the_calibrated_interval_widens_the_wider_half_and_stays_in_range():
    # a share at 0.99 whose interval was clipped at 1: the wider half (0.02) is the one widened
    low, high = calibrated_interval([0.99], [0.97], [1.0], [2.0], bounds=(0.0, 1.0))
    assert low[0] == pytest.approx(0.95) and high[0] == 1.0


@pytest.mark.parametrize("units", [10, 30, 100, 318])
def test_a_zero_width_interval_takes_the_rule_of_three(units):
    """Every one of n units agrees (a share at 1): units unlike them make up at most x of the population with 95%
    confidence, where (1 - x)^n = 0.05 (the binomial by hand); the floor is -ln(0.05) / n of the range, a little
    above that, and a factor alone would leave the interval at width 0."""
    exact = 1 - 0.05 ** (1 / units)
    floor = calibration.zero_width_floor([1.0], [1.0], [float(units)], bounds=(0.0, 1.0))[0]
    assert exact <= floor <= 1.2 * exact
    low, high = calibrated_interval([1.0], [1.0], [1.0], [3.0], bounds=(0.0, 1.0), units=[float(units)])
    assert low[0] == pytest.approx(1 - floor) and high[0] == 1.0
    # an interval with width keeps its factor; an unbounded metric has no range to take a share of
    assert calibration.zero_width_floor([0.5], [0.6], [10.0], bounds=(0.0, 1.0))[0] == 0.0
    assert calibration.zero_width_floor([2.0], [2.0], [10.0], bounds=(0.0, np.inf))[0] == 0.0


def test_a_zero_width_row_far_beyond_its_null_is_a_finding_with_a_p_value_from_its_floor(factors):
    """A head at 1.0 on all of 30 units, zero width: still a finding (its floor, 0.10 wide, stays far above the
    controls' 0.1), and its p-value is at least the normal's beyond the null at the floor's SE, never 0."""
    from scipy import stats

    frame = rows(30, values=(1.0,))
    frame.loc[0, ["ci_low", "ci_high", "variance_df"]] = [1.0, 1.0, np.nan]
    out, _ = add_findings({"heads": frame})
    row = out["heads"].iloc[0]
    floor = -np.log(0.05) / 30
    assert row["finding"] and row["cal_low"] == pytest.approx(1 - floor)
    by_hand = stats.norm.sf((1.0 - row["null_high"]) / (floor / stats.norm.ppf(0.975)))
    assert row["p_value"] > 0 and row["p_value"] >= by_hand * (1 - 1e-9)


def rows(units, values=(0.9,), controls=True, metric="prev_token"):
    """Heads far beyond uniform attention (chance 0.1) among 30 at chance; with `controls`, five random-init
    controls whose heads score about 0.1 at the same layer. Every row rests on `units` units."""
    value = np.r_[values, np.full(30 - len(values), 0.1)]
    frame = pd.DataFrame({"model": "m", "layer": 0, "head": range(30), "metric": metric, "value": value,
                          "ci_low": value - 0.01, "ci_high": value + 0.01, "variance_df": 60.0, "chance": 0.1,
                          "units": float(units), "thin": False})
    if not controls:
        return frame
    rng = np.random.default_rng(0)
    untrained = [frame.assign(model=f"m [random init{'' if k == 1 else f' {k}'}]",
                              value=0.1 + rng.normal(0, 0.003, 30)) for k in range(1, 6)]
    untrained = [u.assign(ci_low=u["value"] - 0.01, ci_high=u["value"] + 0.01) for u in untrained]
    return pd.concat([frame, *untrained], ignore_index=True)


def test_a_head_far_beyond_its_null_is_a_finding_at_every_size_measured(factors):
    for units in (10, 13, 30, 64, 318):
        out, summary = add_findings({"heads": rows(units)})
        trained = out["heads"][out["heads"]["model"] == "m"]
        assert trained["finding"].tolist() == [True] + [False] * 29, units
        assert trained["verdict"].iloc[0] == "finding" and (trained["verdict"].iloc[1:] == "within its null").all()
        untrained = out["heads"][out["heads"]["model"] != "m"]
        assert not untrained["finding"].fillna(False).any()  # held-out untrained controls make none


def test_the_test_reads_the_calibrated_interval(factors):
    """The same head on 318 units (factor 1) and on 10 (factor 2): its p-value is at least the t-test's by the
    calibrated SE beyond its null's end (a hand computation), which is larger on 10 units."""
    from scipy import stats

    half = 0.01
    se = half / stats.t.ppf(0.975, 60)
    big, _ = add_findings({"heads": rows(318, values=(0.125,))})
    small, _ = add_findings({"heads": rows(10, values=(0.125,))})
    row_big, row_small = big["heads"].iloc[0], small["heads"].iloc[0]
    assert row_big["cal_factor"] == pytest.approx(1.0) and row_small["cal_factor"] == pytest.approx(2.0)
    assert row_small["cal_high"] - row_small["value"] == pytest.approx(2 * half)
    for row, factor in ((row_big, 1.0), (row_small, 2.0)):
        by_hand = stats.t.sf((row["value"] - row["null_high"]) / (factor * se), 60)
        assert row["p_value"] >= by_hand * (1 - 1e-9)
    assert row_small["p_value"] > row_big["p_value"]


def test_too_few_units_is_no_verdict_either_way(factors):
    out, summary = add_findings({"heads": rows(8)})
    trained = out["heads"][out["heads"]["model"] == "m"]
    assert trained["finding"].isna().all() and (trained["verdict"] == TOO_FEW).all()
    assert trained["p_value"].isna().all()  # not tested, so not in the family either
    reasons = why_not(trained)
    assert (reasons == TOO_FEW).all() and not reasons.str.contains(WITHIN_NULL).any()
    assert summary["by_table"]["m"]["heads"]["too_few_units"] == 30


def test_a_run_without_controls_makes_no_finding_and_says_why(factors):
    out, summary = add_findings({"heads": rows(318, controls=False)})
    heads = out["heads"]
    assert heads["finding"].iloc[0] is pd.NA and heads["verdict"].iloc[0] == NO_EMPIRICAL
    assert heads["q_value"].iloc[0] < 1e-6  # tested against uniform attention: far beyond it
    assert (heads["finding"].iloc[1:] == False).all()  # noqa: E712  at chance: no finding against any null
    assert summary["findings"] == {"m": 0}


def test_each_table_is_its_own_false_discovery_family(factors):
    """q-values within heads and within value, each equal to a plain Benjamini-Hochberg over that table alone."""
    heads = rows(318, values=(0.9, 0.13, 0.125))
    value = rows(318, values=(0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9))
    out, summary = add_findings({"heads": heads, "value": value})

    def plain_bh(p):
        p = np.asarray(p, float)
        m = np.isfinite(p).sum()
        order = np.argsort(p)
        q = np.empty(len(p))
        running = 1.0
        for rank in range(len(p), 0, -1):  # step-up, from the largest p down
            i = order[rank - 1]
            running = min(running, p[i] * m / rank)
            q[i] = running
        return q

    for name in ("heads", "value"):
        mine = out[name][out[name]["model"] == "m"]
        np.testing.assert_allclose(mine["q_value"], plain_bh(mine["p_value"]), rtol=1e-12)
    assert set(summary["by_table"]["m"]) == {"heads", "value"}
    assert summary["family"]["m"] == 60


def test_the_report_says_a_run_is_too_small_to_assess(factors):
    from headscan.analysis.runs import Comparison
    from headscan.report.sections.findings import _few_units

    [text] = _few_units(Comparison({"heads": rows(8, controls=False)}, [], []))
    assert "too small to assess" in text.text and "fewer than the 10" in text.text
    [text] = _few_units(Comparison({"heads": rows(30, controls=False)}, [], []))
    assert "entropy x1.50" in text.text and "prev_token x1.40" in text.text
    assert _few_units(Comparison({"heads": rows(318)}, [], [])) == []


def test_an_importance_row_matters_on_its_calibrated_interval(factors):
    from headscan.analysis.importance import matter_table

    heads = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1, 2], "metric": "prev_token", "value": 0.5,
                          "ci_low": 0.4, "ci_high": 0.6})
    rows_ = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1, 2], "label": ["L0H0", "L0H1", "L0H2"],
                          "value": [0.5, 0.5, 0.5], "ci_low": [0.2, 0.2, 0.2], "ci_high": [0.8, 0.8, 0.8],
                          "units": [318, 10, 8], "method": "mean_ablation", "target": "next_token_loss"})
    table = matter_table(heads, rows_).set_index("label")
    # never measured: the widest factor, 1.1 at 100+ (clear of 0), 3.0 at 10 (-0.4 to 1.4: not clear), none at 8
    assert table.loc["L0H0", "matters"] and table.loc["L0H0", "cal_low"] == pytest.approx(0.5 - 1.1 * 0.3)
    assert not table.loc["L0H1", "matters"] and table.loc["L0H1", "cal_low"] == pytest.approx(0.5 - 3.0 * 0.3)
    assert not table.loc["L0H2", "matters"] and table.loc["L0H2", "too_few_units"]
