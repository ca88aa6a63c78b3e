"""p-values against a null (headscan.intervals.pvalues), BH/BY q-values and the discovery columns
(headscan.intervals.discoveries).

Checked against independent answers: plain loops of the step-up procedure, scipy where it has the same thing,
and simulated heads whose truth is known (planted real heads among null heads; null rows' p-values uniform).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from headscan.errors import ConfigError
from headscan.intervals.discoveries import add_discoveries, q_values
from headscan.intervals.pvalues import (
    _student_quantile,
    _student_sf,
    bootstrap_t_p_value,
    interval_se,
    rank_p_value,
    t_p_value,
)

CALIBRATION = Path(__file__).resolve().parents[1] / "benchmarks" / "discoveries_calibration.py"


@pytest.fixture(scope="module")
def calibration(load_script):
    return load_script(CALIBRATION, "discoveries_calibration")


def _step_up_loop(p, alpha, factor=1.0):
    """The BH step-up procedure as Benjamini & Hochberg state it: reject the k smallest p-values, k the largest i
    with p_(i) <= i alpha / (c m); NaN is no test."""
    tests = [(value, i) for i, value in enumerate(p) if not np.isnan(value)]
    tests.sort()
    m = len(tests)
    k = 0
    for i, (value, _) in enumerate(tests, start=1):
        if value <= i * alpha / (factor * m):
            k = i
    rejected = [False] * len(p)
    for _, index in tests[:k]:
        rejected[index] = True
    # ties with the k-th p-value are rejected too (they are <= it)
    for index, value in enumerate(p):
        if k and not np.isnan(value) and value <= tests[k - 1][0]:
            rejected[index] = True
    return rejected


def _q_loop(p, factor=1.0):
    """q_i = min over the sorted p_(j) >= p_i of min(1, c m p_(j) / j), one by one."""
    finite = sorted(value for value in p if not np.isnan(value))
    m = len(finite)
    out = []
    for value in p:
        if np.isnan(value):
            out.append(np.nan)
            continue
        out.append(min(min(1.0, factor * m * finite[j] / (j + 1)) for j in range(m) if finite[j] >= value))
    return out


def _some_p_values(seed):
    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.uniform(0, 1, 60), rng.uniform(0, 0.002, 15), [0.01, 0.01, 0.01, 0.0, 1.0]])
    p[rng.choice(len(p), 6, replace=False)] = np.nan
    return rng.permutation(p)


@pytest.mark.parametrize("seed", range(5))
def test_q_values_equal_a_plain_loop_and_scipy(seed):
    p = _some_p_values(seed)
    harmonic = sum(1.0 / i for i in range(1, int(np.isfinite(p).sum()) + 1))
    for method, factor in (("bh", 1.0), ("by", harmonic)):
        q = q_values(p, method=method)
        np.testing.assert_allclose(q, _q_loop(p, factor), rtol=1e-12, equal_nan=True)
        finite = ~np.isnan(p)
        np.testing.assert_allclose(q[finite], stats.false_discovery_control(p[finite], method=method), rtol=1e-12)
        for alpha in (0.01, 0.05, 0.2):
            assert (q <= alpha).tolist() == _step_up_loop(p, alpha, factor), (method, alpha)


def test_q_values_of_ties_are_equal_and_nan_is_no_test():
    q = q_values(np.array([0.02, 0.02, np.nan, 0.02, 0.9]))
    assert q[0] == q[1] == q[3] == pytest.approx(0.02 * 4 / 3)  # the last of the ties: rank 3 of m = 4
    assert np.isnan(q[2])
    assert np.isnan(q_values(np.array([np.nan, np.nan]))).all()
    with pytest.raises(ConfigError, match="unknown false-discovery method 'holm'; available: bh, by"):
        q_values([0.1], method="holm")


def test_student_tail_equals_scipy_and_mpmath():
    t = np.array([-40.0, -3.0, -0.2, 0.0, 1e-4, 0.7, 2.5, 8.0, 30.0, np.inf, np.nan])
    dfs = (0.21, 0.5, 1.0, 1.9, 4.0, 17.3, 150.0, 1e4, 1e6)
    for df in dfs:
        np.testing.assert_allclose(_student_sf(t, df), stats.t.sf(t, df), rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(_student_sf(t, np.inf), stats.norm.sf(t), rtol=1e-13, atol=1e-300)
    assert np.isnan(_student_sf(t, 0.0)).all() and np.isnan(_student_sf(t, np.nan)).all()
    # 40 digits by mpmath: P(T > t) = I_{df / (df + t^2)}(df / 2, 1 / 2) / 2 for t >= 0
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    for df in (*dfs, np.inf):
        for x in t[np.isfinite(t)]:
            if df == np.inf:
                exact = mpmath.ncdf(-x)
            else:
                tail = mpmath.betainc(df / 2, 0.5, 0, mpmath.mpf(df) / (df + mpmath.mpf(x) ** 2), regularized=True) / 2
                exact = tail if x >= 0 else 1 - tail
            assert _student_sf(np.array(x), df) == pytest.approx(float(exact), rel=1e-12, abs=1e-300), (x, df)


def test_student_quantile_equals_scipy_and_inverts_the_tail():
    df = np.array([0.21, 0.5, 1.0, 3.0, 12.0, 97.4, 1e4, np.inf, 0.0, -1.0, np.nan])
    for probability in (0.6, 0.975, 0.995):
        q = _student_quantile(probability, df)
        np.testing.assert_allclose(q[:8], stats.t.ppf(probability, df[:8]), rtol=1e-12)
        np.testing.assert_allclose(_student_sf(q[:8], df[:8]), 1 - probability, rtol=1e-10)
        assert np.isnan(q[8:]).all()


def test_a_t_test_at_the_interval_end_gives_its_tail():
    # a symmetric t interval value +- t_{df} se whose low end is the null: p = 0.025 exactly
    value, se, df = 0.4, 0.03, 12.0
    low = value - stats.t.ppf(0.975, df) * se
    assert interval_se(value, low, value + (value - low), df) == pytest.approx(se, rel=1e-9)
    assert t_p_value(value, se, df, low).item() == pytest.approx(0.025, rel=1e-9)
    # a range null is tested at its striking end; the low side mirrors it
    assert t_p_value(value, se, df, 0.0, low).item() == pytest.approx(0.025, rel=1e-9)
    assert t_p_value(low, se, df, value, side="low").item() == pytest.approx(0.025, rel=1e-9)
    assert np.isnan(t_p_value([0.4], [np.nan], [12.0], 0.1)).all()
    assert np.isnan(t_p_value([0.4], [0.1], [np.nan], 0.1)).all()
    with pytest.raises(ConfigError, match="striking side must be 'high' or 'low', got 'up'"):
        t_p_value([0.4], [0.1], [10.0], 0.1, side="up")


def test_rank_p_values_equal_a_plain_count():
    rng = np.random.default_rng(3)
    value = rng.normal(size=50)
    null = rng.normal(size=(50, 30))
    null[rng.uniform(size=null.shape) < 0.2] = np.nan
    null[7, 3] = value[7]  # a tie counts against the row
    sides = np.where(np.arange(50) % 2 == 0, "high", "low")
    expected = []
    for v, sample, side in zip(value, null, sides):
        sample = sample[~np.isnan(sample)]
        as_striking = sum(x >= v for x in sample) if side == "high" else sum(x <= v for x in sample)
        expected.append((1 + as_striking) / (1 + len(sample)))
    np.testing.assert_allclose(rank_p_value(value, null, side=sides), expected, rtol=1e-15)


def test_rank_p_values_of_null_rows_are_uniform():
    # each row's value and its own control sample come from one distribution: P(p <= k / (m + 1)) = k / (m + 1)
    rng = np.random.default_rng(11)
    value, controls = rng.gamma(2.0, size=4000), rng.gamma(2.0, size=(4000, 99))
    p = rank_p_value(value, controls)
    assert stats.kstest(p, "uniform").pvalue > 0.01
    for k in (5, 10, 50):  # binomial SE of a share near k / 100 over 4000 rows: under 0.008
        assert abs(np.mean(p <= k / 100) - k / 100) < 3 * np.sqrt(k / 100 * (1 - k / 100) / 4000)


def test_t_p_values_of_null_rows_are_uniform(calibration):
    # 30 units of symmetric ratios (the first row of the module's table): Student's t on the bootstrap's df holds
    p = calibration.cell(0.5, 30, corpora=10, replicates=200)
    assert stats.kstest(p["t"], "uniform").pvalue > 0.01
    assert abs(np.mean(p["t"] <= 0.05) - 0.05) < 3 * np.sqrt(0.05 * 0.95 / 2000)
    assert stats.kstest(p["bootstrap-t"], "uniform").pvalue > 0.01


def test_bootstrap_t_is_calibrated_where_student_t_is_not(calibration):
    # 30 units near a ceiling, tested on the high side: the t statistic's upper tail is long
    p = calibration.cell(0.9, 30, corpora=10, replicates=1000)
    se = 3 * np.sqrt(0.01 * 0.99 / 2000)
    assert np.mean(p["t"] <= 0.01) > 0.01 + se  # what the module docstring says Student's t gets wrong
    assert np.mean(p["bootstrap-t"] <= 0.01) < np.mean(p["t"] <= 0.01)
    assert stats.kstest(p["bootstrap-t"], "uniform").pvalue > stats.kstest(p["t"], "uniform").pvalue


def test_bootstrap_t_p_value_equals_a_plain_loop(calibration):
    value, se, _, (sums, counts, power), moments = calibration.null_heads(4, 0.3, 25, heads=6, replicates=99)
    null = np.array([0.25, 0.3, 0.35, 0.28, 0.31, 0.2])
    sides = np.array(["high", "low", "high", "low", "high", "high"])
    got = bootstrap_t_p_value(value, sums, counts, power, moments, null, side=sides)
    for h in range(6):
        t_stars = []
        for b in range(99):
            ratio = sums[b, h] / counts[b, h]
            variance = (power[0, b, h] - 2 * ratio * power[1, b, h] + ratio ** 2 * power[2, b, h]) / counts[b, h] ** 2
            t_stars.append((ratio - value[h]) / np.sqrt(variance))
        t = (value[h] - null[h]) / se[h]
        beyond = sum(x >= t for x in t_stars) if sides[h] == "high" else sum(x <= t for x in t_stars)
        assert got[h] == pytest.approx((1 + beyond) / 100, abs=1e-12), h


def _planted_table(seed, calibration, real=5, null=200, effect=0.65, chance=0.5):
    """`null` heads whose true share is `chance` and `real` heads whose true share is `effect`, 40 units each.

    Shares around 0.5, where the units' ratios are symmetric and the t-based p-values exact (see the module's
    table): around 0.1 they are conservative, and the test would pass with any correction."""
    n = null + real
    shares = np.where(np.arange(n) < real, effect, chance)
    # 50 replicates for the df: above that, numpy hands the products to threaded BLAS, slow on a busy machine
    value, se, df, *_ = calibration.null_heads(seed, shares, 40, heads=n, replicates=50)
    return pd.DataFrame({"model": "m", "layer": np.arange(n) // 41, "head": np.arange(n) % 41, "metric": "prev_token",
                         "value": value, "se": se, "variance_df": df, "chance": chance, "real": np.arange(n) < real})


def test_bh_finds_planted_heads_and_holds_the_false_discovery_rate(calibration):
    # effect: a true share of 0.65 against chance 0.50, on 40 units of about 50 queries: about 9 SEs
    proportions, found, uncorrected = [], [], []
    for seed in range(500):
        table = add_discoveries(_planted_table(seed, calibration), {"prev_token": "uniform"}, q=0.05)
        called = table["finding"]
        found.append(int((called & table["real"]).sum()))
        proportions.append((called & ~table["real"]).sum() / max(int(called.sum()), 1))
        naive = table["p_value"] <= 0.05
        uncorrected.append((naive & ~table["real"]).sum() / max(int(naive.sum()), 1))
    assert min(found) == 5  # every seed finds all 5
    proportions = np.array(proportions)
    # BH's false-discovery rate is q m0 / m = 0.0488 for exact p-values; allow three Monte Carlo SEs (0.004 each).
    # Measured: 0.044; BY instead of BH makes it 0.007, no correction (p <= 0.05) 0.65.
    assert proportions.mean() <= 0.05 + 3 * proportions.std(ddof=1) / np.sqrt(len(proportions))
    assert proportions.mean() > 0.03
    assert np.mean(uncorrected) > 0.5


def test_add_discoveries_columns_families_and_verdicts():
    rows = pd.DataFrame({"model": ["a"] * 4 + ["b"] * 4, "layer": [0, 0, 1, 1] * 2, "head": [0, 1] * 4,
                         "metric": ["prev_token", "prev_token", "entropy", "copying"] * 2,
                         "value": [0.5, 0.5, 0.5, 0.3, 0.5, 0.16, np.nan, 0.3],
                         "ci_low": [0.4, 0.4, 0.4, 0.2, 0.4, 0.06, np.nan, 0.2],
                         "ci_high": [0.6, 0.6, 0.6, 0.4, 0.6, 0.26, np.nan, 0.4], "variance_df": np.inf,
                         "chance": [0.1, 0.1, 2.0, 0.0] * 2,
                         "thin": pd.array([False, True, False, False, False, False, False, pd.NA], dtype="boolean")})
    out = add_discoveries(rows, {"prev_token": "uniform", "entropy": (1.5, 2.0)}, striking={"entropy": "low"},
                          by="model")
    assert list(out.columns[-6:]) == ["null_kind", "null_low", "null_high", "p_value", "q_value", "finding"]
    assert out["null_kind"].tolist()[:3] == ["uniform", "uniform", "range"] and pd.isna(out["null_kind"][3])
    # copying has no null: no test; entropy of b is NaN: no test; neither counts in its family
    assert out["p_value"].isna().tolist() == [False, False, False, True, False, False, True, True]
    assert out.attrs["discoveries"]["sizes"] == [3, 2]
    # the SE from the interval: 0.1 / 1.96; entropy is tested below the range's low end, 1.5
    assert out["p_value"][0] == pytest.approx(stats.norm.sf(0.4 / (0.1 / stats.norm.ppf(0.975))), rel=1e-6)
    assert out["p_value"][2] == pytest.approx(stats.norm.sf(1.0 / (0.1 / stats.norm.ppf(0.975))), rel=1e-6)
    # b's prev_token L0H1 (0.16, interval from 0.06) is not beyond chance 0.1; L0H1 of a is thin: no finding
    assert out["finding"].tolist() == [True, False, True, False, True, False, False, False]
    assert out["q_value"][5] == pytest.approx(min(1.0, 2 * out["p_value"][5] / 2))
    assert "one family per model (3, 2 rows)" in out.attrs["discoveries"]["family"]
    # Benjamini-Yekutieli: the same tests, q-values larger by the harmonic sum of each family's size
    by = add_discoveries(rows, {"prev_token": "uniform", "entropy": (1.5, 2.0)}, striking={"entropy": "low"},
                         by="model", method="by")
    assert "Benjamini-Yekutieli" in by.attrs["discoveries"]["rule"]
    assert (by["q_value"].dropna() >= out["q_value"].dropna() - 1e-15).all()


def test_add_discoveries_controls_at_the_nearest_depth_equal_a_plain_loop():
    rng = np.random.default_rng(5)
    # a 4-layer model against a 7-layer control: depths 0, 1/3, 2/3, 1 and 0, 1/6, ..., 1
    rows = pd.DataFrame({"model": "m", "layer": np.repeat(np.arange(4), 3), "head": np.tile(np.arange(3), 4),
                         "metric": "dla", "value": rng.normal(size=12)})
    controls = pd.DataFrame({"model": np.repeat(["c0", "c1"], 35), "layer": np.tile(np.repeat(np.arange(7), 5), 2),
                             "value": rng.normal(size=70) + np.tile(np.repeat(np.arange(7), 5), 2) / 3})
    out = add_discoveries(rows, {"dla": controls})
    for _, row in out.iterrows():
        depth = row["layer"] / 3
        nearest = min(range(7), key=lambda layer: abs(layer / 6 - depth))
        sample = controls[controls["layer"] == nearest]["value"].tolist()
        assert row["p_value"] == pytest.approx((1 + sum(x >= row["value"] for x in sample)) / (1 + len(sample)))
        assert (row["null_low"], row["null_high"]) == (min(sample), max(sample))
        assert row["null_kind"] == "controls"


def test_a_t_test_against_the_control_range_goes_below_the_rank_resolution():
    # 12 control values at one depth: no rank p-value is below 1/13; by the row's own SE a head far beyond all of
    # them gets a p-value a family of hundreds can call
    rows = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1], "metric": "dla", "value": [0.9, 0.1],
                         "se": [0.05, 0.05], "variance_df": 40.0})
    controls = pd.DataFrame({"model": "c", "layer": 0, "value": np.linspace(-0.2, 0.2, 12)})
    ranked = add_discoveries(rows, {"dla": controls})
    assert ranked["p_value"].tolist() == [1 / 13, 4 / 13]
    tested = add_discoveries(rows, {"dla": controls}, control_test="t")
    np.testing.assert_allclose(tested["p_value"], stats.t.sf((np.array([0.9, 0.1]) - 0.2) / 0.05, 40.0), rtol=1e-9)
    assert tested["null_kind"].tolist() == ["controls"] * 2 and tested["null_high"].tolist() == [0.2, 0.2]
    with pytest.raises(ConfigError, match="control_test must be 'rank' or 't', got 'z'"):
        add_discoveries(rows, {"dla": controls}, control_test="z")


def test_add_discoveries_refuses_what_it_cannot_test():
    rows = pd.DataFrame({"model": "m", "layer": 0, "head": [0], "metric": ["prev_token"], "value": [0.5]})
    for q in (5, 1, 1.0, 0):  # a rate of 1 would call every tested row a finding
        with pytest.raises(ConfigError, match="q must be between 0 and 1"):
            add_discoveries(rows, {"prev_token": (0.0, 0.1)}, q=q)
    with pytest.raises(ConfigError, match="no chance column; sweep again"):
        add_discoveries(rows, {"prev_token": "uniform"})
    with pytest.raises(ConfigError, match="must be 'uniform', a \\(low, high\\) pair or a DataFrame"):
        add_discoveries(rows, {"prev_token": 0.1})
    with pytest.raises(ConfigError, match="no rows of the metrics the nulls name \\(induction\\)"):
        add_discoveries(rows, {"induction": "uniform"})
    # no SE and no interval: no test, and nothing is a finding
    out = add_discoveries(rows, {"prev_token": (0.0, 0.1)})
    assert out["p_value"].isna().all() and not out["finding"].any()
