"""``headscan show``: a line under each table says what its columns hold; the syntax table's difference from the
baseline is accuracy minus baseline, with its paired interval; heads on thin support rank after supported ones."""

from pathlib import Path

import pandas as pd
import pytest

from headscan import load
from headscan.analysis import ranking
from headscan.analysis.show import SELF_EVIDENT, top_heads_text
from headscan.tables import RunProvenance, SweepTables

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "reports" / "runs"


def _columns_of(printed: str) -> tuple[str, list[str]]:
    """The header line of the first table `printed` holds, and the names its footer line describes."""
    lines = printed.splitlines()
    header = next(line for line in lines if line.split()[:1] == ["model"])
    footer = next(line for line in lines if line.startswith("columns | "))
    return header, [part.split(": ", 1)[0] for part in footer.split(" | ")[1:]]


@pytest.mark.parametrize("run, metric", [("ewt-dev", "prev_token"), ("ewt-dev", "entropy"), ("ewt-dev", "syntax"),
                                         ("ewt-dev", "offsets"), ("ewt-dev", "first_token_by_position"),
                                         ("ewt-dev", "copying"), ("patch-smollm2-ioi", "patching"),
                                         ("retrieval-smollm2", "retrieval_ungated")])
def test_every_column_that_is_not_self_evident_is_described_under_its_table(run, metric):
    printed = top_heads_text(load(RUNS / run), metric, 3)
    header, described = _columns_of(printed)
    left = " " + header + " "
    for name in sorted(described, key=len, reverse=True):  # "ci_low" before "low"
        assert f" {name} " in left, (name, header)
        left = left.replace(f" {name} ", " ", 1)
    assert set(left.split()) <= set(SELF_EVIDENT), (left, printed)


def test_the_syntax_difference_is_accuracy_minus_baseline_within_its_paired_interval():
    """The committed ewt-dev run printed "punct dependent_to_head L2H1 0.283, baseline 0.203, margin 0.059": the
    margin was the low end of the paired difference's interval. Then, the run re-swept with held-out (cross-fitted)
    estimates, it printed their difference, 0.064, beside the in-sample accuracy 0.283 and the held-out baseline.
    Now every printed row's comparison is one estimate's: accuracy_held_out - baseline_held_out = vs_baseline
    (by hand, from the printed numbers and from syntax.parquet's own row), inside [vs_low, vs_high], beats exactly
    where vs_low > 0; the head's own accuracy and interval are its in-sample ones."""
    run = load(RUNS / "ewt-dev")
    printed = top_heads_text(run, "syntax", 3).splitlines()
    header = printed[0].split()
    assert header[4:14] == ["accuracy", "ci_low", "ci_high", "dependents", "accuracy_held_out", "baseline_held_out",
                            "baseline_offset", "vs_baseline", "vs_low", "vs_high"]
    syntax = run["syntax"]
    # the trained models' rows: the run's controls ("minilm [random init 2]", ...) print their rows too, 6 each
    rows = [line.split() for line in printed[1:] if line.split()[:1] in (["minilm"], ["smollm2"])]
    controls = [fields for fields in rows if fields[1].startswith("[")]
    rows = [fields for fields in rows if not fields[1].startswith("[")]
    assert len(rows) == 12 and len(controls) == 12 * 6  # each model's five random-init copies and shuffled words
    for fields in rows:
        cell = dict(zip(header, fields))
        accuracy, held, baseline = (float(cell[c]) for c in ("accuracy", "accuracy_held_out", "baseline_held_out"))
        difference, low, high = float(cell["vs_baseline"]), float(cell["vs_low"]), float(cell["vs_high"])
        assert abs(difference - (held - baseline)) <= 0.0015  # three decimals each
        assert low <= difference <= high and cell["beats"] == str(low > 0)
        # syntax.parquet's row of the head named: a causal model is judged on the dependents it can see
        causal = (syntax.loc[syntax["model"] == cell["model"], "family"] == "causal").all()
        row = syntax[(syntax["model"] == cell["model"]) & (syntax["label"] == cell["label"])
                     & (syntax["relation"] == cell["relation"])
                     & (syntax["direction"] == cell["direction"] + ("_visible" if causal else ""))].iloc[0]
        assert abs(row["value"] - accuracy) <= 5e-4 and abs(row["baseline"] - baseline) <= 5e-4
        assert abs(row["best_held_out"] - held) <= 5e-4
        assert abs((row["best_held_out"] - row["baseline"]) - difference) <= 5e-4
        assert abs(row["best_vs_baseline_low"] - low) <= 5e-4 and abs(row["best_vs_baseline_high"] - high) <= 5e-4
        if row["best_even"] and row["best_odd"]:  # both halves chose the head named: held out is its own accuracy
            assert cell["accuracy_held_out"] == cell["accuracy"]
    # minilm's punct head: the halves chose L2H8 and L2H1, so its held-out accuracy is not its in-sample one, and
    # the in-sample accuracy minus the held-out baseline is not the difference printed beside them
    punct = next(dict(zip(header, f)) for f in rows if f[:3] == ["minilm", "punct", "dependent_to_head"])
    assert punct["label"] == "L2H1" and punct["accuracy"] != punct["accuracy_held_out"]
    assert abs(float(punct["accuracy"]) - float(punct["baseline_held_out"]) - float(punct["vs_baseline"])) > 0.01


def _heads(values, thin):
    return pd.DataFrame({"model": "m", "family": "causal", "layer": 0, "head": range(len(values)),
                         "label": [f"L0H{h}" for h in range(len(values))], "kv_group": range(len(values)),
                         "metric": "entropy", "value": values, "sum": [50 * v for v in values], "count": 50.0, "ci_low": [v * 0.9 for v in values],
                         "ci_high": [v * 1.1 for v in values], "chance": 3.0, "units": 80.0,
                         "top_unit_share": 0.01, "thin": pd.array(thin, dtype="boolean")})


def test_a_head_on_thin_support_never_ranks_first_in_show_or_the_report():
    """The demo's smollm2 L18H8: entropy 0.009, thin, ranked first. A plain loop gives the expected order:
    the supported heads by value (lowest entropy first), then the thin ones by value."""
    values = [0.009, 1.5, 0.4, 0.01, 2.0]
    thin = [True, False, False, True, False]
    heads = _heads(values, thin)
    supported = sorted((v, h) for h, (v, t) in enumerate(zip(values, thin)) if not t)
    thin_ones = sorted((v, h) for h, (v, t) in enumerate(zip(values, thin)) if t)
    expected = [f"L0H{h}" for _, h in supported + thin_ones]
    top = ranking.top_heads(heads, "entropy", 5, thin_last=True)
    assert top["label"].tolist() == expected and top["rank"].tolist() == [1, 2, 3, 4, 5]
    assert top["thin"].tolist() == [False, False, False, True, True]
    # the three most striking on value alone: L0H0 and L0H3 are thin
    passed = ranking.thin_passed(heads, "entropy", 3)["m"]
    assert passed["label"].tolist() == ["L0H0", "L0H3"] and passed["rank"].tolist() == [1, 2]
    printed = top_heads_text(SweepTables({"heads": heads}, RunProvenance()), "entropy", 3).splitlines()
    assert [line.split()[1] for line in printed[1:4]] == expected[:3]
    assert printed[4] == ("m: L0H0 (0.009, 1st on its value alone), L0H3 (0.010, 2nd on its value alone) rest on "
                          "thin support, so they rank after every supported head.")


def test_the_reports_top_heads_table_ranks_thin_heads_last_and_says_which(tmp_path):
    from headscan.analysis.runs import compare_runs
    from headscan.report.sections.top_heads import _top_table
    from headscan.tables import ModelProvenance, write

    heads = _heads([0.009, 1.5, 0.4, 0.01, 2.0], [True, False, False, True, False])
    run = SweepTables({"heads": heads}, RunProvenance(models=(ModelProvenance("m", family="causal"),)))
    table = _top_table(compare_runs([load(write(run, tmp_path / "run"))]), "entropy", 3)
    assert table.frame["head"].tolist() == ["L0H2", "L0H1", "L0H4"]
    assert "L0H0 (0.009, 1st on its value alone), L0H3 (0.010, 2nd on its value alone) rest on thin support" \
        in table.note
