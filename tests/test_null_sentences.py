"""Every claim names its null or says it describes: the per-metric null table, the shuffled-words comparison, the
sentences of tables the sweep does not test (positions, retrieval, copying, dla), and a report's findings counted
from its rows. Hand-made tables, hand computations."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from headscan.analysis.claims import control_range, recount, run_gate_text, untested_text
from headscan.analysis.shuffled import KEPT, LOST, shuffled_rows, shuffled_sentences
from headscan.metrics import METRICS
from headscan.metrics.null_policy import null_policy

# --- which control is each metric's null ----------------------------------------------------------------------


def test_the_null_table_says_what_the_sweep_tests_each_metric_against():
    policy = null_policy().set_index("metric")
    assert list(policy.index) == list(METRICS)
    # written out by hand from docs/controls.md's rules, not from the registry's fields
    expected = {
        "prev_token": ("random-init controls' heads of the same layer, and uniform chance", "uniform chance"),
        "entropy_norm": ("random-init controls' heads of the same layer", "none: not tested"),
        "dla": ("random-init controls' heads of the same layer", "none: not tested"),
        "syntax": ("random-init controls' heads of the same layer, and the best fixed offset on the same words",
                   "the best fixed offset on the same words"),
        "retrieval": ("none: Wu et al.'s threshold", "none: Wu et al.'s threshold"),
        "first_token_by_position": ("none: described", "none: described"),
    }
    for metric, (with_controls, without) in expected.items():
        assert policy.loc[metric, "with random-init controls"].startswith(with_controls), metric
        assert policy.loc[metric, "without them"].startswith(without), metric
        assert policy.loc[metric, "why"], metric
    # uniform attention alone never makes a finding: the table says so wherever it is the only yardstick
    assert "never a finding" in policy.loc["first_token", "without them"]
    shuffled = policy["shuffled words"]
    assert set(shuffled[shuffled != "–"].index) == {"prev_token", "next_token", "self", "first_token",
                                                    "positional_prev", "positional_next", "syntax"}
    assert shuffled["prev_token"].startswith("kept: follows position")
    assert shuffled["syntax"].startswith("kept: follows the words")


def test_the_report_definitions_end_with_the_null_table_of_the_metrics_it_shows():
    from headscan.report.document import Table
    from headscan.report.sections.provenance import nulls_part

    blocks = nulls_part(["prev_token", "entropy"])
    table = next(b for b in blocks if isinstance(b, Table))
    assert table.frame["metric"].tolist() == ["prev_token", "entropy"]
    assert table.frame.loc[1, "without them"] == "none: not tested"
    assert nulls_part([]) == []


# --- position against content: the shuffled-words control ---------------------------------------------------


def _pair(model, label, layer, head, metric, real, shuffled, df=(40.0, 30.0), chance=(0.1, 0.1), **extra):
    """Two rows of one head: the model's (value, low, high) and its shuffled-words control's."""
    rows = []
    for name, (value, low, high), d, c in zip((model, f"{model} [shuffled words]"), (real, shuffled), df, chance):
        rows.append(dict(model=name, layer=layer, head=head, label=label, metric=metric, value=value, ci_low=low,
                         ci_high=high, variance_df=d, chance=c, **extra))
    return rows


def test_how_much_survives_shuffling_by_hand():
    rows = pd.DataFrame(_pair("m", "L0H0", 0, 0, "prev_token", (0.90, 0.86, 0.92), (0.88, 0.85, 0.90))
                        + _pair("m", "L0H1", 0, 1, "prev_token", (0.60, 0.55, 0.65), (0.12, 0.10, 0.15))
                        + _pair("m", "L1H0", 1, 0, "prev_token", (0.50, 0.30, 0.70), (0.30, 0.10, 0.50))
                        + _pair("m", "L1H1", 1, 1, "entropy", (1.0, 0.9, 1.1), (1.0, 0.9, 1.1)))  # not asked
    out = shuffled_rows(rows).set_index("label")
    assert list(out.index) == ["L0H0", "L0H1", "L1H0"]
    # L0H0 by hand: SEs from the wider half-widths over Student's quantile, Welch-Satterthwaite df
    se_r = 0.04 / stats.t.ppf(0.975, 40.0)
    se_s = 0.03 / stats.t.ppf(0.975, 30.0)
    df = (se_r ** 2 + se_s ** 2) ** 2 / (se_r ** 4 / 40.0 + se_s ** 4 / 30.0)
    half = stats.t.ppf(0.975, df) * math.sqrt(se_r ** 2 + se_s ** 2)
    row = out.loc["L0H0"]
    assert row["change"] == pytest.approx(-0.02)
    assert row["change_low"] == pytest.approx(-0.02 - half) and row["change_high"] == pytest.approx(-0.02 + half)
    assert row["kept"] == pytest.approx((0.88 - 0.1) / (0.90 - 0.1))
    assert (row["survives"], row["follows"]) == ("kept", "position")
    # L0H1 keeps 0.02 / 0.5 = 4% of its lift, and its loss's interval lies below 0: it followed the words
    assert out.loc["L0H1", "kept"] == pytest.approx(0.04) and out.loc["L0H1", "kept"] <= LOST
    assert (out.loc["L0H1", "survives"], out.loc["L0H1", "follows"]) == ("lost", "content")
    # L1H0 keeps half: partly, whatever its interval
    assert LOST < out.loc["L1H0", "kept"] < KEPT and out.loc["L1H0", "follows"] == "both or unclear"


def test_a_syntax_head_that_keeps_its_score_on_shuffled_words_follows_the_words():
    extra = dict(relation="nsubj", direction="dependent_to_head")
    rows = pd.DataFrame(_pair("m", "L2H3", 2, 3, "syntax", (0.7, 0.65, 0.75), (0.68, 0.63, 0.73), **extra)
                        + _pair("m", "L0H1", 0, 1, "syntax", (0.6, 0.55, 0.65), (0.1, 0.08, 0.12), **extra)
                        ).drop(columns="metric")
    out = shuffled_rows(rows, table="syntax").set_index("label")
    assert out.loc["L2H3", "follows"] == "content" and out.loc["L0H1", "follows"] == "word order"
    assert out.loc["L2H3", "relation"] == "nsubj"


def test_the_shuffled_sentence_names_findings_only_and_says_the_samples_are_taken_as_independent():
    rows = pd.DataFrame(_pair("m", "L0H0", 0, 0, "prev_token", (0.90, 0.86, 0.92), (0.88, 0.85, 0.90))
                        + _pair("m", "L0H1", 0, 1, "prev_token", (0.60, 0.55, 0.65), (0.12, 0.10, 0.15)))
    rows = rows.assign(null_kind="controls", finding=pd.array([True, pd.NA, False, pd.NA], dtype="boolean"))
    said = shuffled_sentences(rows)["m"]
    assert "of m's 1 findings that the control asks about, 1 follow position: prev_token L0H0" in said
    assert "L0H1" not in said and "independent samples" in said
    # no shuffled-words control, no sentence
    assert shuffled_sentences(rows[rows["model"] == "m"]) == {}


# --- tables the sweep does not test: the sentence names the controls or says it describes -------------------


def test_a_row_of_an_untested_table_is_held_against_its_controls_where_the_run_has_them():
    frame = pd.DataFrame({"model": ["m", "m [random init]", "m [random init 2]", "m [random init]"],
                          "metric": "first_token_by_position", "bucket": 16, "layer": [1, 1, 1, 0],
                          "head": [0, 0, 1, 0], "value": [0.6, 0.05, 0.2, 0.9],
                          "ci_low": [0.55, 0.04, 0.1, 0.8], "ci_high": [0.65, 0.06, 0.3, 1.0]})
    trained = frame[frame["model"] == "m"]
    ranges = control_range(trained, frame, keys=("metric", "bucket"))
    assert ranges.iloc[0].to_dict() == {"null_low": 0.05, "null_high": 0.2, "controls": 2}  # layer 0 left out
    said = untested_text("first_token_by_position", trained.iloc[0].combine_first(ranges.iloc[0]))
    assert said.startswith("beyond its 2 random-init controls' heads of this layer (0.05 to 0.2)")
    assert untested_text("x", why="why").startswith("describes; not tested: no null for x")


def _positions(models):
    """A long-context positions table: head L1H1 of each model puts 0.4 on the first token at bucket 16, the
    other heads 0.1; enough units that nothing is thin."""
    rows = []
    for model, sink in models.items():
        for layer in (0, 1):
            for head in (0, 1):
                for bucket in (1, 2, 4, 8, 16):
                    value = sink if (layer, head, bucket) == (1, 1, 16) else 0.1
                    for metric, v, c in (("first_token_by_position", value, 1 / (bucket + 1)),
                                         ("distance_by_position", bucket / 2, bucket / 2)):
                        rows.append(dict(model=model, family="causal", layer=layer, head=head,
                                         label=f"L{layer}H{head}", metric=metric, bucket=bucket, value=v,
                                         sum=v * 100, count=100.0, ci_low=v - 0.01, ci_high=v + 0.01, units=100.0,
                                         top_unit_share=0.01, chance=c))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("controls", [False, True])
def test_the_sink_sentence_names_the_controls_or_says_it_describes(controls):
    from headscan.analysis import positions
    from headscan.report.sections.context import _sink_sentences

    table = _positions({"gpt": 0.4, **({"gpt [random init]": 0.3} if controls else {})})
    said = _sink_sentences("gpt", table, positions.sink_heads(table, n=1))[0]
    assert "beyond chance: L1H1 0.40" in said
    if controls:  # 0.4 [0.39, 0.41] against the control's layer-1 heads, 0.1 to 0.3
        assert "against the random-init controls: L1H1 beyond its 1 random-init controls' heads of this layer " \
               "(0.1 to 0.3)" in said
    else:
        assert "describes; not tested: no null for first_token_by_position" in said


def test_dla_and_copying_name_their_null_or_say_they_describe():
    from headscan.analysis.runs import compare_runs
    from headscan.report.document import Bullets
    from headscan.report.figures import Pngs
    from headscan.report.sections.movement import movement_section
    from headscan.tables import SweepTables

    heads = pd.DataFrame([dict(model="g", family="causal", layer=0, head=h, label=f"L0H{h}", kv_group=h,
                               metric="dla", value=v, sum=v * 100, count=100.0, ci_low=v - 0.1, ci_high=v + 0.1,
                               units=100.0, top_unit_share=0.01, thin=False, chance=0.0, null_kind="controls",
                               null_low=-0.2, null_high=0.3, p_value=p, q_value=p, verdict=verdict,
                               finding=finding)
                          for h, v, p, verdict, finding in ((0, 1.5, 1e-6, "finding", True),
                                                            (1, 0.2, 0.6, "within its null", False))])
    heads = heads.astype({"finding": "boolean"})
    items = [i for b in movement_section(compare_runs([SweepTables({"heads": heads})]), {}, Pngs())
             if isinstance(b, Bullets) for i in b.items]
    said = next(i for i in items if i.startswith("g: L0H0 adds"))
    assert "null: random-init heads of this layer -0.2 to 0.3; q 1e-06" in said and said.endswith("a finding.")
    # without a verdict the largest head is no finding and the sentence says it was not tested
    bare = heads.drop(columns=["null_kind", "null_low", "null_high", "p_value", "q_value", "verdict", "finding"])
    items = [i for b in movement_section(compare_runs([SweepTables({"heads": bare})]), {}, Pngs())
             if isinstance(b, Bullets) for i in b.items]
    said = next(i for i in items if i.startswith("g: L0H0 adds"))
    assert not said.endswith("a finding.") and "describes; not tested: no null for dla" in said


# --- a report's findings are its rows with finding true -------------------------------------------------------


def _tested_run():
    """Heads of a model and two random-init controls, tested by the sweep's own rule (add_findings)."""
    from headscan.metrics.nulls import add_findings

    rng = np.random.default_rng(3)
    rows = []
    for model, shift in (("m", 0.0), ("m [random init]", None), ("m [random init 2]", None)):
        for head in range(12):
            value = (0.9 if head < 4 and shift is not None else 0.1 + 0.01 * rng.standard_normal())
            rows.append(dict(model=model, family="causal", layer=0, head=head, label=f"L0H{head}",
                             metric="prev_token", value=value, ci_low=value - 0.01, ci_high=value + 0.01,
                             variance_df=50.0, chance=0.05, thin=False, units=200.0, top_unit_share=0.01,
                             count=2000.0))
    out, summary = add_findings({"heads": pd.DataFrame(rows)})
    return out["heads"], summary


def test_the_gate_counts_the_rows_with_finding_true_and_a_drifted_count_shows():
    from headscan.tables import SweepTables

    heads, summary = _tested_run()
    run = SweepTables({"heads": heads})
    run.provenance.extra["findings"] = summary
    trained = heads[heads["model"] == "m"]
    found = int(trained["finding"].fillna(False).sum())
    tested = int(trained["p_value"].notna().sum())
    assert found == 4 and tested == 12
    text = run_gate_text([("r", run)])
    assert f"m {found} of {tested} tested rows" in text and f"heads {found} of {tested}" in text
    assert "Benjamini-Hochberg at q = 0.05" in text and "over each model's heads and syntax rows" in text
    # the rows are tested again (one fewer finding): the report says what the rows hold, not the stale summary
    again = heads.copy()
    again.loc[trained.index[0], "finding"] = False
    run = SweepTables({"heads": again})
    run.provenance.extra["findings"] = summary
    assert f"m {found - 1} of {tested} tested rows" in run_gate_text([("r", run)])
    assert recount(summary, {"heads": again})["findings"]["m"] == found - 1


def test_every_findings_sentence_about_a_head_is_a_finding_and_names_its_null():
    from headscan.analysis.findings import findings_by_model

    heads, _ = _tested_run()
    sentences = findings_by_model(heads)["m"]
    claims = [s for s in sentences if s.startswith("In m, ") and " puts " in s]
    assert claims
    found = set(heads[(heads["model"] == "m") & heads["finding"].fillna(False)]["label"])
    for sentence in claims:
        assert sentence.split(", ", 1)[1].split(" ", 1)[0] in found, sentence
        assert "null: random-init heads of this layer" in sentence and "q " in sentence, sentence


def test_the_gate_says_a_shuffled_words_controls_findings_are_real_and_what_they_mean():
    from headscan.analysis.claims import gate_text

    summary = {"rule": "Benjamini-Hochberg", "q": 0.05, "family": {"m": 10, "m [shuffled words]": 10},
               "findings": {"m": 4, "m [shuffled words]": 3},
               "controls": {"m": ["m [random init]"], "m [shuffled words]": ["m [random init]"]}}
    text = gate_text(summary)
    trained, shuffled = text.split("Findings: ")[1].split("; m [shuffled")
    assert "needs no word order" in shuffled and "not false findings" in shuffled
    assert "word order" not in trained


def test_a_head_beyond_its_null_lost_only_to_the_correction_is_not_said_to_lie_within_it():
    from headscan.analysis.findings import findings_by_model
    from headscan.metrics.nulls import add_findings

    rng = np.random.default_rng(1)
    rows = []
    controls = ["m [random init]"] + [f"m [random init {seed}]" for seed in range(2, 6)]
    for model in ("m", *controls):
        for head in range(60):
            value = 0.10 + 0.001 * rng.standard_normal()
            half = 0.01
            if model == "m" and head == 0:  # well above the controls: p about 0.01, q far above 0.05 over 60 heads
                value, half = 0.1735, 0.0392
            rows.append(dict(model=model, family="causal", layer=0, head=head, label=f"L0H{head}", metric="self",
                             value=value, ci_low=value - half, ci_high=value + half, variance_df=1e6, chance=0.1,
                             thin=False, units=200.0, top_unit_share=0.01, count=2000.0))
    out, _ = add_findings({"heads": pd.DataFrame(rows)})
    heads = out["heads"]
    best = heads[(heads["model"] == "m") & (heads["label"] == "L0H0")].iloc[0]
    assert best["p_value"] <= 0.05 < best["q_value"] and not best["finding"]  # the case this test is about
    sentences = findings_by_model(heads, controls={"m": controls})["m"]
    said = [s for s in sentences if "L0H0" in s and "itself" in s]
    assert len(said) == 1
    assert said[0].startswith("No head of m is a finding for attention on itself")
    assert "lies beyond its null by its own test" in said[0] and "within its null" not in said[0]
    assert f"p {best['p_value']:.2g}" in said[0]
