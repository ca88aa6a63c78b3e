"""Findings against what heads that learned nothing score (`headscan.metrics.nulls`), checked from outside.

- every p-value, q-value, null range and verdict equals a plain loop: the control heads of the row's layer, the
  t-test beyond their range by the row's SE, Student's prediction test on their mean and SD (its tail by
  Simpson's rule on the density), the larger of the two, then Benjamini-Hochberg's step-up by hand;
- a random-init control is held out of its own null, a thin row is tested but never a finding, syntax must
  also beat its offset baseline, and without controls only metrics that are means of attention are tested;
- over many synthetic runs, held-out untrained controls carry at most 5% of the trained model's findings;
- a sweep with three random-init controls finds the planted heads of a tiny checkpoint and no control head,
  writes the columns, records the rule in run.json, and the report says only what the rows found.
"""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import headscan
from headscan.cli import cli
from headscan.config import SweepConfig, control_number, split_control
from headscan.errors import ConfigError
from headscan.metrics import METRICS
from headscan.metrics.nulls import FINDING_COLUMNS, add_findings, control_pool
from headscan.scan.controls import swept_names

Z975 = 1.959963984540054

CALIBRATION = Path(__file__).resolve().parents[1] / "headscan" / "data" / "interval_calibration.csv"


def student_tail(t: float, df: float) -> float:
    """P(T_df > t), by Simpson's rule on Student's density (independent of headscan's incomplete beta)."""
    if math.isinf(df):
        return 0.5 * math.erfc(t / math.sqrt(2))
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    density = lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2)  # noqa: E731
    lo, hi, n = min(t, 0.0), max(t, 0.0), 20000
    h = (hi - lo) / n
    area = h / 3 * sum((1 if i in (0, n) else 4 if i % 2 else 2) * density(lo + i * h) for i in range(n + 1))
    return 0.5 - area if t >= 0 else 0.5 + area


def bh_by_hand(p: list[float]) -> list[float]:
    """Benjamini-Hochberg q-values: min over j >= i of m p_(j) / j, NaN kept out of m."""
    finite = [(value, i) for i, value in enumerate(p) if not math.isnan(value)]
    finite.sort()
    m = len(finite)
    out = [math.nan] * len(p)
    running = 1.0
    for rank in range(m, 0, -1):
        value, i = finite[rank - 1]
        running = min(running, m * value / rank, 1.0)
        out[i] = running
    return out


def run_frame(seed: int, *, n_layers=3, n_heads=8, controls=3, planted=((0, 1, "prev_token"), (2, 5, "entropy"))):
    """A heads table of model "m" and its random-init controls: untrained heads drawn around a per-layer level,
    trained ones from the same distribution except the `planted` (layer, head, metric) heads."""
    rng = np.random.default_rng(seed)
    models = ["m"] + [f"m [random init{'' if k == 0 else f' {k + 1}'}]" for k in range(controls)]
    rows = []
    for metric, level, spread in (("prev_token", 0.07, 0.004), ("entropy", 3.0, 0.05)):
        for model in models:
            for layer in range(n_layers):
                for head in range(n_heads):
                    value = level + layer * spread + rng.normal(0, spread)
                    if model == "m" and (layer, head, metric) in planted:
                        value = 0.9 if metric == "prev_token" else 1.0
                    se = spread / 6
                    rows.append({"model": model, "layer": layer, "head": head, "metric": metric, "value": value,
                                 "ci_low": value - Z975 * se, "ci_high": value + Z975 * se, "variance_df": np.inf,
                                 "chance": 0.069 if metric == "prev_token" else 3.1, "thin": False,
                                 "units": 318.0})
    return pd.DataFrame(rows)


def expected_by_loop(frame: pd.DataFrame, model: str, pool: list[str]) -> pd.DataFrame:
    """Each row of `model`: its null range and p-value, computed one row at a time."""
    out = []
    for _, row in frame[frame["model"] == model].iterrows():
        metric = METRICS[row["metric"]]
        # the interval widened by its family's calibrated factor: from 100 units on, the packaged factor at 100
        table = pd.read_csv(CALIBRATION)
        factor = table[(table["family"] == row["metric"]) & (table["N"] == 100)]["factor"].iloc[0]
        se = (row["ci_high"] - row["ci_low"]) / 2 / Z975 * factor
        at_layer = frame[frame["model"].isin(pool) & (frame["metric"] == row["metric"]) & (frame["layer"] == row["layer"])]
        sample, seeds = at_layer["value"].tolist(), at_layer["model"].nunique()
        uniform = metric.null == "uniform" and "[random init" not in model  # an untrained model: its fellows alone
        if not sample:
            low = high = row["chance"] if uniform else math.nan
            kind = "uniform" if uniform else "none"
            prediction = math.nan
        else:
            low, high = min(sample), max(sample)
            if uniform:
                low, high = min(low, row["chance"]), max(high, row["chance"])
            kind = "controls"
            m = len(sample)
            mean = sum(sample) / m
            sd = math.sqrt(sum((v - mean) ** 2 for v in sample) / (m - 1))
            units = seeds if seeds > 1 else m  # the seed is the unit; one seed alone: its heads
            scale = math.sqrt(sd * sd * (1 + 1 / units) + se * se)
            beyond = row["value"] - mean if metric.striking == "high" else mean - row["value"]
            prediction = student_tail(beyond / scale, units - 1)
        if kind == "none":
            p = math.nan
        else:
            end = high if metric.striking == "high" else low
            beyond = row["value"] - end if metric.striking == "high" else end - row["value"]
            p = student_tail(beyond / se, math.inf)
            p = p if math.isnan(prediction) else max(p, prediction)
        out.append({"layer": row["layer"], "head": row["head"], "metric": row["metric"], "null_kind": kind,
                    "null_low": low, "null_high": high, "p_value": p})
    expected = pd.DataFrame(out)
    expected["q_value"] = bh_by_hand(expected["p_value"].tolist())
    expected["finding"] = expected["q_value"] <= 0.05
    return expected


@pytest.mark.parametrize("model", ["m", "m [random init]", "m [random init 3]"])
def test_every_verdict_equals_a_plain_loop(model):
    frame = run_frame(seed=1)
    out, summary = add_findings({"heads": frame})
    got = out["heads"][out["heads"]["model"] == model].reset_index(drop=True)
    pool = [c for c in ("m [random init]", "m [random init 2]", "m [random init 3]") if c != model]
    expected = expected_by_loop(frame, model, pool)
    assert got["null_kind"].tolist() == expected["null_kind"].tolist()
    for column in ("null_low", "null_high", "p_value", "q_value"):
        np.testing.assert_allclose(got[column].to_numpy(float), expected[column].to_numpy(float), rtol=1e-6,
                                   atol=1e-12, err_msg=column)
    assert got["finding"].tolist() == expected["finding"].tolist()
    assert summary["findings"][model] == int(expected["finding"].sum())
    assert summary["family"][model] == int(expected["p_value"].notna().sum())


def test_the_planted_heads_are_the_findings_and_no_control_head_is():
    out, summary = add_findings({"heads": run_frame(seed=2)})
    found = out["heads"][out["heads"]["finding"]]
    assert sorted(zip(found["model"], found["layer"], found["head"], found["metric"])) == [
        ("m", 0, 1, "prev_token"), ("m", 2, 5, "entropy")]
    assert summary["controls"]["m [random init 2]"] == ["m [random init]", "m [random init 3]"]


def test_held_out_controls_carry_at_most_five_percent_of_the_trained_findings():
    """40 synthetic runs, 5 controls each, 24 heads x 2 metrics, 6 planted heads: the controls' findings, each
    control tested against the other four, against the trained model's."""
    planted = ((0, 1, "prev_token"), (1, 2, "prev_token"), (2, 3, "prev_token"), (0, 4, "entropy"),
               (1, 5, "entropy"), (2, 6, "entropy"))
    trained = untrained = 0
    for seed in range(40):
        _, summary = add_findings({"heads": run_frame(seed, controls=5, planted=planted)})
        trained += summary["findings"]["m"]
        untrained += sum(n for model, n in summary["findings"].items() if model != "m")
    assert trained >= 40 * 6  # every planted head found, each run
    assert untrained / 5 <= 0.05 * trained  # each control (of 5) carries at most 5% of the trained model's
    assert untrained <= 10  # and in all (6 seen in 200 held-out controls when written)


def test_one_control_alone_is_not_tested_and_the_trained_model_is():
    frame = run_frame(seed=3, controls=1)
    out, summary = add_findings({"heads": frame})
    control = out["heads"][out["heads"]["model"] == "m [random init]"]
    # no other control to hold it against, and uniform attention is no null for an untrained network
    assert (control["null_kind"] == "none").all() and control["p_value"].isna().all()
    assert not control["finding"].any() and summary["family"]["m [random init]"] == 0
    assert summary["family"]["m"] == len(frame[frame["model"] == "m"])


def test_without_controls_only_means_of_attention_are_tested_against_chance():
    frame = run_frame(seed=4, controls=0)
    out, summary = add_findings({"heads": frame})
    rows = out["heads"]
    uniform = rows[rows["metric"] == "prev_token"]
    assert (uniform["null_kind"] == "uniform").all()
    np.testing.assert_array_equal(uniform["null_low"], uniform["chance"])
    entropy = rows[rows["metric"] == "entropy"]
    assert (entropy["null_kind"] == "none").all() and entropy["p_value"].isna().all()
    assert not entropy["finding"].any()
    assert summary["family"]["m"] == len(uniform)  # untested rows do not count in the family


def test_a_thin_row_stays_in_the_family_but_is_never_a_finding():
    frame = run_frame(seed=5)
    planted = (frame["model"] == "m") & (frame["layer"] == 0) & (frame["head"] == 1) & (frame["metric"] == "prev_token")
    out, summary = add_findings({"heads": frame.assign(thin=planted)})
    row = out["heads"][planted.to_numpy()].iloc[0]
    assert row["q_value"] < 1e-3 and not row["finding"]
    assert summary["family"]["m"] == int(out["heads"].query("model == 'm'")["p_value"].notna().sum())


def test_syntax_must_also_beat_its_offset_baseline():
    rows = []
    for model, value in (("m", 0.9), ("m [random init]", 0.10), ("m [random init 2]", 0.12), ("m [random init 3]", 0.11)):
        for head, delta in ((0, 0.5), (1, 0.001)):
            v = value if model == "m" else value + head * 0.005
            rows.append({"model": model, "layer": 0, "head": head, "relation": "amod", "direction": "dependent_to_head",
                         "value": v, "ci_low": v - 0.01, "ci_high": v + 0.01, "variance_df": 80.0, "chance": 0.1,
                         "thin": False, "vs_baseline": delta, "vs_baseline_low": delta - 0.02,
                         "vs_baseline_high": delta + 0.02, "units": 318.0})
    out, _ = add_findings({"syntax": pd.DataFrame(rows)})
    trained = out["syntax"][out["syntax"]["model"] == "m"]
    assert trained["null_kind"].tolist() == ["controls+baseline"] * 2
    assert trained["finding"].tolist() == [True, False]  # both beyond the controls; only head 0 beats its baseline
    # a paired difference's coverage was never measured: its SE takes the widest factor at 100 units and more
    table = pd.read_csv(CALIBRATION)
    widest = table[table["N"] == 100]["factor"].max()
    baseline_p = 0.5 * math.erfc(0.001 / (0.02 / Z975 * widest) / math.sqrt(2))
    assert trained["p_value"].iloc[1] == pytest.approx(baseline_p, rel=1e-9)


def test_control_names_seeds_and_pools():
    assert swept_names(["m"], SweepConfig(control=("random-init",), control_seeds=2)) == [
        "m", "m [random init]", "m [random init 2]"]
    assert split_control("a [random init 12]") == ("a", "random-init") and control_number("a [random init 12]") == 12
    assert split_control("a [random init 1]") == ("a [random init 1]", None)  # the first has no number
    assert control_pool(["g", "g [shuffled words]"]) == {"g": [], "g [shuffled words]": []}
    with pytest.raises(ConfigError, match="control_seeds 3 counts random-init controls"):
        SweepConfig(control_seeds=3)
    with pytest.raises(ConfigError, match="fdr must be a rate between 0 and 1"):
        SweepConfig(fdr=1.5)


def test_a_sweep_with_three_controls_finds_the_planted_heads_and_no_control_head(tmp_path, ewt_dev):
    from headscan.testing.planted import build_planted_checkpoint

    folder, planted = build_planted_checkpoint(tmp_path / "ck", "gpt2", n_layers=2)
    corpus = tmp_path / "dev.conllu"  # 120 sentences of EWT dev, in their documents
    blocks = ewt_dev.read_text(encoding="utf-8").split("\n\n")[:120]
    corpus.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["sweep", "-m", str(folder), "-c", str(corpus), "--out", str(tmp_path / "out"),
                                      "--control", "random-init", "--control-seeds", "3", "--bootstrap-unit",
                                      "segment", "--bootstrap", "50", "-q"])
    assert result.exit_code == 0, result.output
    run = headscan.load(tmp_path / "out")
    for table in ("heads", "value", "syntax"):
        assert set(FINDING_COLUMNS) <= set(run[table].columns), table
        assert str(run[table]["finding"].dtype) == "boolean"
    heads = run["heads"]
    found = heads[heads["finding"].fillna(False)]
    trained = found[found["model"] == str(folder)]
    for metric in ("prev_token", "first_token"):
        layer, head = planted[metric]
        assert ((trained["metric"] == metric) & (trained["layer"] == layer) & (trained["head"] == head)).any(), metric
    for table in ("heads", "value", "syntax"):
        rows = run[table]
        assert not rows[rows["model"] != str(folder)]["finding"].fillna(False).any(), table
    summary = run.provenance.extra["findings"]
    assert summary["rule"] == "Benjamini-Hochberg" and summary["q"] == 0.05
    assert summary["findings"][str(folder)] == sum(int(run[t][run[t]["model"] == str(folder)]["finding"].sum())
                                                   for t in ("heads", "value", "syntax"))
    # the report's findings name only rows that are findings, with their null
    from headscan.analysis.claims import run_gate_text
    from headscan.analysis.findings import findings_by_model

    gate = run_gate_text([("out", run)])  # the rule the report states above its findings: this sweep's own
    assert "Benjamini-Hochberg at q = 0.05" in gate and f"{str(folder)} {summary['findings'][str(folder)]:,} of" in gate
    sentences = findings_by_model(heads)[str(folder)]
    claims = [s for s in sentences if " puts " in s and s.startswith("In ")]
    assert claims and all("null: " in s for s in claims)
    for sentence in claims:
        label = sentence.split(", ", 1)[1].split(" ", 1)[0]
        rows = trained[trained["label"] == label]
        assert len(rows), sentence


# --- simultaneous intervals over the heads ----------------------------------------------------------------------


def test_the_joint_interval_is_the_max_t_quantile_computed_by_hand():
    from headscan.intervals import joint_interval

    rng = np.random.default_rng(7)
    n_rep, layers, heads, columns = 400, 2, 3, 2
    value = rng.uniform(0.2, 0.8, (layers, heads, columns))
    se = rng.uniform(0.01, 0.05, (layers, heads, columns))
    counts = rng.uniform(5, 10, (n_rep, layers, heads, columns))
    ratios = value + se * rng.standard_normal((n_rep, layers, heads, columns))
    se[1, 2, 1] = np.nan  # an undefined head drops out of its column's maximum
    low, high = joint_interval(value, ratios * counts, counts, se)
    for column in range(columns):
        largest = []
        for b in range(n_rep):
            deviations = [abs(ratios[b, layer, h, column] - value[layer, h, column]) / se[layer, h, column]
                          for layer in range(layers) for h in range(heads) if not math.isnan(se[layer, h, column])]
            largest.append(max(deviations))
        factor = float(np.quantile(largest, 0.95))
        for layer in range(layers):
            for h in range(heads):
                if math.isnan(se[layer, h, column]):
                    assert math.isnan(low[layer, h, column]) and math.isnan(high[layer, h, column])
                    continue
                assert low[layer, h, column] == pytest.approx(value[layer, h, column] - factor * se[layer, h, column], rel=1e-12)
                assert high[layer, h, column] == pytest.approx(value[layer, h, column] + factor * se[layer, h, column], rel=1e-12)
        assert 2.2 < factor < 3.2  # about the 95% point of the largest of 6 independent |z|: 2.63


def test_a_sweep_records_joint_intervals_that_hold_each_row_s_own(tiny_gpt2):
    run = headscan.sweep(str(tiny_gpt2), ["the cat sat on the mat and the dog ran far away"] * 3
                         + ["a bird flew over the house while it rained"] * 3, bootstrap=50, bootstrap_unit="segment")
    for table in ("heads", "value"):
        rows = run[table][run[table]["ci_low"].notna()]
        assert len(rows) and rows["joint_low"].notna().all(), table
        assert (rows["joint_low"] <= rows["ci_low"] + 1e-12).all() and (rows["joint_high"] >= rows["ci_high"] - 1e-12).all()


def test_the_verdict_columns_of_a_sweep_in_memory_have_the_tables_dtypes(tiny_gpt2):
    """What headscan.sweep returns without --out is what a reader of the files gets: float64 nulls (NaN where
    no null applies, never None in an object column), a boolean finding."""
    import headscan

    heads = headscan.sweep(str(tiny_gpt2), "builtin", limit=6, device="cpu", bootstrap=20).heads
    assert heads["null_low"].dtype == "float64" and heads["null_high"].dtype == "float64"
    assert str(heads["finding"].dtype) == "boolean" and (heads["null_kind"] == "none").any()
