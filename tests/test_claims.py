"""Claims gated by the numbers, on tables fabricated with known answers: findings, top-head lists, roles, syntax
findings and reach lines need an interval that is not thin and lies beyond chance on the metric's striking side;
controls stand beside their trained model; the report shows chance.

Expected sentences and cells are written out by hand from the fixture's values below.
"""

import numpy as np
import pandas as pd
import pytest

from headscan.analysis import claims, findings, positions, ranking, roles, syntax
from headscan.analysis.runs import compare_runs
from headscan.report import atlas
from headscan.report import build as report
from headscan.report.document import Panels, to_html, to_markdown
from headscan.tables import RunProvenance, SweepTables, load, write


def row(model, layer, head, metric, value, low, high, chance, *, family="causal", units=400.0, share=0.01):
    return dict(model=model, family=family, layer=layer, head=head, label=f"L{layer}H{head}", kv_group=head,
                metric=metric, value=value, sum=value * 100, count=100.0, ci_low=low, ci_high=high, units=units,
                top_unit_share=share, chance=chance)


# --- the gate ------------------------------------------------------------------------------------------------


def test_a_head_above_chance_on_thin_support_is_not_a_finding():
    heads = pd.DataFrame([row("m", 0, 0, "prev_token", 0.9, 0.85, 0.95, 0.1, units=5.0),  # thin
                          row("m", 0, 1, "prev_token", 0.6, 0.55, 0.65, 0.1)])
    said = findings.findings(heads)
    assert "In m, L0H1 puts 60.0% of its attention on the previous token (95% interval 55.0% to 65.0%; " \
           "chance 10.0%)." in said
    assert not any("L0H0 puts" in s for s in said)
    top = ranking.top_heads(heads, metric="prev_token")
    assert top[["label", "unsupported"]].values.tolist() == [["L0H0", "thin support"], ["L0H1", ""]]


def test_a_head_at_chance_with_a_narrow_interval_is_not_a_finding_and_the_report_says_why():
    # minilm's EWT induction heads: 0.140 [0.135, 0.145] against chance 0.137
    heads = pd.DataFrame([row("minilm", 0, h, "induction", v, v - 0.005, v + 0.005, 0.137, family="bidirectional")
                          for h, v in enumerate([0.140, 0.112, 0.125])])
    said = findings.findings(heads)
    assert said[0] == ("No head of minilm puts its attention on the tokens that follow other occurrences of its own "
                       "token beyond chance: the strongest, L0H0 with 14.0% (95% interval 13.5% to 14.5%; chance "
                       "13.7%), is at chance.")
    assert not any("induction heads" in s for s in said)
    assert roles.head_roles(heads)["roles"].tolist() == [[], [], []]


def test_a_low_striking_metric_is_gated_on_the_low_side():
    rows = pd.DataFrame([row("m", 0, 0, "entropy", 0.5, 0.4, 0.6, 2.0),  # focused: below uniform's log n
                         row("m", 0, 1, "entropy", 2.0, 1.9, 2.1, 2.0),  # uniform
                         row("m", 0, 2, "entropy", 2.5, 2.4, 2.6, 2.0)])  # above chance: not striking
    top = ranking.top_heads(rows, metric="entropy")
    assert top[["label", "unsupported"]].values.tolist() == [["L0H0", ""], ["L0H1", "at chance"],
                                                             ["L0H2", "above chance"]]
    assert claims.supported(rows, striking="high").tolist() == [False, False, True]  # the other side, for contrast


def test_rows_without_an_interval_or_a_chance_level_carry_no_claim():
    rows = pd.DataFrame([row("m", 0, 0, "prev_token", 0.9, np.nan, np.nan, 0.1),
                         row("m", 0, 1, "prev_token", 0.9, 0.85, 0.95, np.nan)])
    assert claims.why_not(rows).tolist() == ["no interval", "no chance level"]
    assert findings.findings(rows.drop(columns="chance"))[0].startswith("m's tables record no chance level")


# --- roles -----------------------------------------------------------------------------------------------------


def induction_heads():
    """Three heads of a causal model with the same induction attention (0.8 beyond chance 0.02): L0H0 with a
    positive direct logit attribution beyond chance, L0H1 with a positive OV copying score only, L0H2 with
    neither (its dla is at chance and its copying score negative)."""
    heads = [row("m", 0, h, "induction", 0.8, 0.75, 0.85, 0.02) for h in range(3)]
    heads += [row("m", 0, 0, "dla", 0.4, 0.3, 0.5, 0.01), row("m", 0, 1, "dla", -0.1, -0.2, 0.0, 0.0),
              row("m", 0, 2, "dla", 0.02, -0.01, 0.05, 0.01)]
    weights = pd.DataFrame([dict(model="m", layer=0, head=h, label=f"L0H{h}", metric="copying", value=v, chance=0.0)
                            for h, v in enumerate([-0.3, 0.45, -0.2])])
    return pd.DataFrame(heads), weights


def test_induction_needs_copying_evidence_and_prefix_matching_does_not():
    heads, weights = induction_heads()
    found = roles.head_roles(heads, weights)
    assert found["roles"].tolist() == [["induction"], ["induction"], ["prefix-matching"]]
    assert found["evidence"].tolist() == ["dla +0.40 [+0.30, +0.50]", "copying +0.45", ""]
    # without the weights table, L0H1 has no evidence left
    assert roles.head_roles(heads)["roles"].tolist() == [["induction"], ["prefix-matching"], ["prefix-matching"]]
    said = findings.findings(heads, weights=weights)
    assert "2 of 3 heads in m are induction heads (`induction` \u2265 0.4 beyond chance, with copying evidence)." in said
    assert any(s.startswith("1 of 3 heads in m are prefix-matching heads") for s in said)


def test_one_threshold_per_role_for_atlas_and_findings():
    assert atlas.ROLES is roles.ROLES and atlas.head_roles is roles.head_roles
    heads = pd.DataFrame([row("m", 0, 0, "duplicate_token", 0.45, 0.42, 0.48, 0.05),
                          row("m", 0, 1, "duplicate_token", 0.39, 0.36, 0.42, 0.05)])
    assert roles.role_for("duplicate_token").threshold == 0.4
    said = findings.findings(heads)
    assert "In m, L0H0 puts 45.0% of its attention on other occurrences of its own token (95% interval 42.0% to " \
           "48.0%; chance 5.0%): a duplicate-token head." in said
    assert roles.head_roles(heads)["roles"].tolist() == [["duplicate"], []]


def test_the_role_rules_state_the_gate_and_the_evidence():
    rules = roles.role_rules()
    assert "induction: `induction` \u2265 0.4 beyond chance, with copying evidence;" in rules[0]
    assert "prefix-matching: `induction` \u2265 0.4 beyond chance, without copying evidence;" in rules[1]
    assert rules[-1].startswith("Copying evidence: `dla`")


# --- syntax and positions --------------------------------------------------------------------------------------


def test_a_syntax_head_that_beats_the_baseline_but_not_chance_is_not_a_finding():
    rows = pd.DataFrame([
        dict(row("m", 0, 0, "x", 0.30, 0.25, 0.35, 0.28), relation="det", direction="dependent_to_head",
             baseline=0.2, baseline_offset=1),
        dict(row("m", 0, 1, "x", 0.70, 0.65, 0.75, 0.10), relation="nsubj", direction="dependent_to_head",
             baseline=0.3, baseline_offset=-1),
    ]).drop(columns="metric")
    best = syntax.best_heads(rows, relations=["det", "nsubj"])
    assert best[["relation", "beats", "unsupported"]].values.tolist() == [["det", True, "at chance"],
                                                                          ["nsubj", True, ""]]
    said = syntax.syntax_findings(best)["m"]
    assert said[0] == ("m L0H1 picks the head of 70.0% [65.0, 75.0] of `nsubj` dependents (chance 10.0%), against "
                       "30.0% for the best fixed offset (-1).")
    assert "1 with an interval that does not lie above chance" in said[-1]


def positions_rows():
    """A causal model at buckets 1 and 64: L0H0 a sink (first-token share 0.9, distance past it ~0), L0H1 spread
    evenly (distance at its chance), L0H2 looking far back (distance 60 against chance 48)."""
    out = []
    for bucket, first_chance, distance_chance in ((1, 0.5, 0.0), (64, 0.0125, 48.0)):
        for head, (sink, distance) in enumerate([(0.9, 0.01), (first_chance, distance_chance), (0.05, 60.0)]):
            width = 0.02 if bucket == 64 else 0.0
            out.append(dict(row("m", 0, head, "first_token_by_position", sink, sink - 0.01, sink + 0.01, first_chance),
                            bucket=bucket))
            out.append(dict(row("m", 0, head, "distance_by_position", distance, distance * (1 - width),
                                distance * (1 + width), distance_chance), bucket=bucket))
    return pd.DataFrame(out)


def test_reach_is_distance_past_the_first_token_over_uniform_attention_and_sinks_stay_out():
    reach = positions.reach(positions_rows())
    assert reach["label"].tolist() == ["L0H0", "L0H1", "L0H2"]
    np.testing.assert_allclose(reach["value"], [0.01 / 48, 1.0, 60 / 48])
    assert reach["far"].tolist() == ["below chance", "at chance", ""]  # only L0H2 looks further than uniform
    sinks = positions.sink_heads(positions_rows(), n=3)
    assert sinks["label"].tolist() == ["L0H0", "L0H2"]  # L0H1 is at chance
    assert sinks["chance"].tolist() == [0.0125, 0.0125] and sinks["early_chance"].tolist() == [0.5, 0.5]


def test_no_statement_from_a_thin_bucket():
    rows = positions_rows()
    rows.loc[rows["bucket"] == 64, "units"] = 4.0  # the long bucket rests on 4 segments
    assert positions.reach(rows)["bucket"].unique().tolist() == [1] or positions.reach(rows).empty
    assert (positions.sink_heads(rows)["bucket"] != 64).all()


# --- the report: chance shown, controls beside their trained model ---------------------------------------------


def fabricated_run(with_control=True):
    """minilm-like bidirectional model and its random-init control: L0H0 a previous-token head in the trained
    model only; L0H1 a sink in both."""
    heads, weights = [], []
    models = [("net", None)] + ([("net [random init]", "random-init")] if with_control else [])
    for name, _control in models:
        for layer in range(2):
            for head in range(2):
                prev = 0.95 if (name, layer, head) == ("net", 0, 0) else 0.11
                first = 0.8 if (layer, head) == (0, 1) else 0.1
                for metric, value, chance in (("prev_token", prev, 0.1), ("first_token", first, 0.1),
                                              ("entropy", 1.0 + head, 2.3), ("induction", 0.12, 0.12)):
                    heads.append(row(name, layer, head, metric, value, value - 0.01, value + 0.01, chance,
                                     family="bidirectional"))
                weights.append(dict(model=name, family="bidirectional", layer=layer, head=head,
                                    label=f"L{layer}H{head}", kv_group=head, metric="copying", value=np.nan,
                                    sum=np.nan, count=np.nan, ci_low=np.nan, ci_high=np.nan, units=np.nan,
                                    top_unit_share=np.nan, chance=0.0, embedding="tied"))
    infos = [{"name": name, "family": "bidirectional", "n_layers": 2, "n_heads": 2, "control": control,
              "control_of": "net" if control else None,
              "weights": "not scored: the checkpoint (BertModel) holds no trained LM head"} for name, control in models]
    provenance = RunProvenance.from_json({"headscan_version": "0.4.0", "models": infos,
                                          "corpus": {"source": "builtin", "kind": "text"}})
    return SweepTables({"heads": pd.DataFrame(heads), "weights": pd.DataFrame(weights)}, provenance)


@pytest.fixture(scope="module")
def control_run(tmp_path_factory):
    return write(fabricated_run(), tmp_path_factory.mktemp("runs") / "net")


def test_provenance_records_the_control_and_round_trips(control_run):
    models = load(control_run).provenance.models
    assert [(m.name, m.control, m.control_of) for m in models] == [("net", None, None),
                                                                   ("net [random init]", "random-init", "net")]


def test_findings_say_whether_the_control_shows_it(control_run):
    comparison = compare_runs([load(control_run)])
    assert comparison.control_map() == {"net": ["net [random init]"]}
    said = findings.findings_by_model(comparison.heads, controls=comparison.control_map())["net"]
    assert said[0] == ("In net, L0H0 puts 95.0% of its attention on the previous token (95% interval 94.0% to 96.0%; "
                       "chance 10.0%). net [random init] does not: it is at chance: L0H0 11.0% (95% interval 10.0% "
                       "to 12.0%; chance 10.0%).")
    sink = next(s for s in said if "on the first token" in s)
    assert sink.endswith("net [random init] also shows it: L0H1 80.0% (95% interval 79.0% to 81.0%; chance 10.0%).")


def test_the_report_shows_chance_and_the_control_beside_the_trained_model(control_run):
    comparison = compare_runs([load(control_run)])
    document = report.build_report(comparison)
    tables = [t for b in document.blocks if isinstance(b, Panels) for title, t in b.items if title == "Top prev_token"]
    frame = tables[0].frame
    assert {"chance", "no claim"} <= set(frame.columns)
    prev = frame[(frame["model"] == "net") & (frame["head"] == "L0H0")].iloc[0]
    assert (prev["value"], prev["chance"], prev["random init"], prev["no claim"]) == ("0.950", "0.100", "0.110", "")
    at_chance = frame[(frame["model"] == "net") & (frame["no claim"] == "at chance")]
    assert len(at_chance)  # the induction rows, at chance, are listed and marked
    html = to_html(document)
    assert "Chance: " in html and "no claim" in html
    markdown = to_markdown(document)
    assert "no copying score: the checkpoint (BertModel) holds no trained LM head" in markdown
    data = atlas.atlas_data(comparison)
    assert [m["name"] for m in data["models"]] == ["net", "net [random init]"]  # side by side
    scores = data["models"][0]["metrics"]["induction"]
    assert scores["chance"][0] == pytest.approx(0.12) and scores["unsupported"]["0"] == "at chance"
    assert data["controls"] == {"net": ["net [random init]"]}
    assert data["metrics"][0]["lift"] == pytest.approx(0.85)  # prev_token: 0.95 - 0.1


def test_top_heads_of_two_interleaved_models_keep_each_models_ranking():
    """Each model's block, highest first: a sort by model alone that is not stable would reorder the blocks' rows."""
    rng = np.random.default_rng(1)
    values = rng.permutation(120) / 200 + 0.3
    rows = pd.DataFrame([row(("b", "a")[i % 2], i // 10, i % 10, "prev_token", v, v - 0.01, v + 0.01, 0.1)
                         for i, v in enumerate(values)])
    top = ranking.top_heads(rows, metric="prev_token", n=40)
    assert top["model"].tolist() == ["b"] * 40 + ["a"] * 40
    for model in ("a", "b"):
        assert top[top["model"] == model]["value"].tolist() == sorted(rows[rows["model"] == model]["value"],
                                                                     reverse=True)[:40]
