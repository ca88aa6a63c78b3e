"""Reports: the numbers they pick, the example attention handed in, and the folder `write_report` writes.

Expected numbers and sentences are written out by hand from the fixture's known values below, never built
with the report's own helpers.
"""

import dataclasses
import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

import headscan.models
from headscan.analysis import findings, ranking
from headscan.analysis import runs as runs_module
from headscan.cli import cli
from headscan.corpus import Corpus, Segment, encode
from headscan.errors import ConfigError, HeadscanError, ModelNotFoundError, TablesError
from headscan.plots import heatmaps as figures
from headscan.report import build as report
from headscan.report import document
from headscan.report import examples as examples_module
from headscan.report.document import Document, Heading
from headscan.tables import (
    TABLES,
    CorpusProvenance,
    ModelProvenance,
    RunProvenance,
    SweepTables,
    load,
    register_table,
    write,
)

METRICS = ["prev_token", "next_token", "self", "first_token", "sep", "entropy", "entropy_norm", "distance",
           "positional_prev", "positional_next", "induction", "duplicate_token"]
PNG = b"\x89PNG\r\n\x1a\n"
NEXT_IN_CAUSAL = "a causal model's queries cannot see later tokens, so it is 0 for every head"
NO_SEP = "the model has no [SEP] token, so it is undefined for every head"


def value(model, family, metric, layer, head):
    """Known values. Previous-token heads: L1H2 (0.999) then L0H1 (0.8) in both models; next-token head: bert's
    L1H3 (0.9); the most focused head (lowest entropy): L1H1 (0.2 nats), the broadest L1H2 (gpt) or L1H3 (bert)."""
    if metric == "prev_token":
        return {(1, 2): 0.999, (0, 1): 0.8}.get((layer, head), 0.1 + 0.05 * head)
    if metric in ("next_token", "positional_next"):
        return 0.0 if family == "causal" else (0.9 if (layer, head) == (1, 3) else 0.05 * head)
    if metric == "sep":
        return np.nan if family == "causal" else 0.2 + 0.1 * layer
    if metric == "entropy":
        return 0.2 if (layer, head) == (1, 1) else 1.0 + 0.5 * layer + 0.1 * head
    if metric == "distance":
        return 1.0 + 2 * head
    return ((layer * 5 + head * 3 + len(metric)) % 10) / 10


def make_tables(models, *, shift=0.0):
    heads, offsets, infos = [], [], []
    for model, family, n_layers, n_heads in models:
        for layer in range(n_layers):
            for head in range(n_heads):
                common = dict(model=model, family=family, layer=layer, head=head, label=f"L{layer}H{head}",
                              kv_group=head)
                for metric in METRICS:
                    v = value(model, family, metric, layer, head)
                    if metric == "self":
                        v = min(1.0, v + shift)
                    width = 0.4 if (metric, layer, head) == ("prev_token", 1, 0) else 0.02
                    # bert's strongest previous-token head rests on 5 segments: thin support
                    units = 5.0 if (model, metric, layer, head) == ("bert", "prev_token", 1, 2) else 400.0
                    heads.append(dict(common, metric=metric, value=v, sum=v * 10, count=10.0,
                                      ci_low=v - width / 2, ci_high=v + width / 2, units=units,
                                      top_unit_share=0.01, chance=np.nan if np.isnan(v) else CHANCE.get(metric, 0.05)))
                for offset in range(-8, 9):
                    v = 0.5 ** abs(offset + 1 - head)
                    offsets.append(dict(common, offset=offset, value=v, sum=v, count=1.0, ci_low=v, ci_high=v))
        specials = {"bos": 0, "cls": None, "sep": None} if family == "causal" else {"bos": None, "cls": 1, "sep": 2}
        infos.append({"name": model, "source": "alias", "id": f"/weights/{model}", "revision": "sha256:" + "0f" * 32,
                      "family": family, "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": 1, "d_model": 48,
                      "n_params": 1234567, "tokenizer": f"{model.upper()}Tokenizer", "vocab_size": 999,
                      "max_context": 64, "special_token_ids": specials, "n_segments": 4, "n_tokens": 321,
                      "seconds": 0.5})
    provenance = {
        "headscan_version": "0.1.0", "command": "headscan sweep --model gpt --model bert",
        "started": "2026-01-02T03:04:05Z", "finished": "2026-01-02T03:05:06Z",
        "corpus": {"source": "builtin", "kind": "text", "sha256": "ab" * 32, "n_segments": 4},
        "config": {"max_len": 128, "bootstrap": 200, "seed": 0},
        "versions": {"python": "3.11.7", "torch": "2.5.0"}, "models": infos,
    }
    frames = {"heads": pd.DataFrame(heads), "offsets": pd.DataFrame(offsets)}
    return SweepTables(frames, RunProvenance.from_json(provenance))


# Uniform attention's value: low enough that every head but the flat ones lies beyond it on shares, high enough
# that every entropy lies below it.
CHANCE = {"entropy": 3.0, "entropy_norm": 1.0, "distance": 2.0}
GPT = ("gpt", "causal", 2, 3)
BERT = ("bert", "bidirectional", 2, 4)
# Heatmaps the report draws: every metric of every model, except those 0 or undefined by construction.
STRUCTURAL = {("next_token", "gpt"), ("positional_next", "gpt"), ("sep", "gpt")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return write(make_tables([GPT, BERT]), root / "runA"), write(make_tables([GPT], shift=0.05), root / "runB")


@pytest.fixture(scope="module")
def one_report(runs, tmp_path_factory):
    return report.write_report([runs[0]], tmp_path_factory.mktemp("r") / "one")


@pytest.fixture(scope="module")
def two_reports(runs, tmp_path_factory):
    return report.write_report(list(runs), tmp_path_factory.mktemp("r") / "two", top=3)


def provenance_of(run):
    return {m.name: m for m in load(run).provenance.models}


# --- the numbers ------------------------------------------------------------------------------------------


def test_top_heads_are_ranked_per_model_with_intervals(runs):
    heads = load(runs[0]).heads
    top = ranking.top_heads(heads, metric="prev_token", n=2)
    assert top[["model", "rank", "label"]].values.tolist() == [
        ["gpt", 1, "L1H2"], ["gpt", 2, "L0H1"], ["bert", 1, "L1H2"], ["bert", 2, "L0H1"]]
    np.testing.assert_allclose(top["value"], [0.999, 0.8, 0.999, 0.8])
    np.testing.assert_allclose(top["ci_low"], [0.989, 0.79, 0.989, 0.79])
    assert not top["wide"].any() and top["thin"].tolist() == [False, False, True, False]
    wide = ranking.top_heads(heads, metric="prev_token", n=6, model="gpt")
    assert wide.set_index("label")["wide"].to_dict()["L1H0"] and wide["wide"].sum() == 1


@pytest.mark.parametrize("metric, labels, values", [
    ("prev_token", ["L1H2", "L0H1", "L0H2"], [0.999, 0.8, 0.2]),  # high is striking
    ("entropy", ["L1H1", "L0H0", "L0H1"], [0.2, 1.0, 1.1]),  # low is striking: the most focused heads
    ("distance", ["L0H2", "L1H2", "L0H1"], [5.0, 5.0, 3.0]),  # ties go to the lower layer
])
def test_top_heads_take_the_striking_end_from_the_registry(runs, metric, labels, values):
    top = ranking.top_heads(load(runs[0]).heads, metric=metric, n=3, model="gpt")
    assert top["label"].tolist() == labels
    np.testing.assert_allclose(top["value"], values)


def test_top_heads_skip_undefined_and_constant_metrics(runs):
    heads = load(runs[0]).heads
    assert ranking.top_heads(heads, metric="sep")["model"].unique().tolist() == ["bert"]
    assert ranking.top_heads(heads, metric="next_token")["model"].unique().tolist() == ["bert"]


def test_ci_is_wide_is_absolute_for_0_1_metrics_and_relative_otherwise():
    rows = pd.DataFrame({"metric": ["self", "self", "distance", "distance", "entropy", "entropy"],
                         "value": [0.5, 0.5, 10.0, 2.0, 0.002, 0.5],
                         "ci_low": [0.4, 0.46, 9.5, 1.5, 0.001, 0.3], "ci_high": [0.65, 0.54, 10.5, 2.5, 0.004, 0.7]})
    assert ranking.ci_is_wide(rows).tolist() == [True, False, False, True, False, True]


@pytest.mark.parametrize("metric, family, values, specials, expected", [
    ("next_token", "causal", [0.0, 0.0], None, NEXT_IN_CAUSAL),
    ("positional_next", "causal", [0.0, 0.0], None, NEXT_IN_CAUSAL),
    ("next_token", "bidirectional", [0.0, 0.0], None, None),  # merely 0: no reason to give
    ("next_token", "causal", [0.0, 0.3], None, None),  # not what a causal model must give: no excuse
    ("sep", "causal", [np.nan, np.nan], {"bos": 0, "sep": None}, NO_SEP),
    ("sep", "bidirectional", [np.nan, np.nan], {"cls": 1, "sep": None}, NO_SEP),
    ("sep", "bidirectional", [np.nan, np.nan], {"cls": 1, "sep": 2}, None),
    ("sep", "causal", [np.nan, np.nan], None, None),  # special tokens not recorded: no claim about [SEP]
    ("prev_token", "causal", [0.0, 0.0], None, None),
    ("retired_metric", "causal", [0.0, 0.0], None, None),  # not in the registry
])
def test_why_structural_needs_the_registry_s_condition_and_agreeing_values(metric, family, values, specials,
                                                                            expected):
    provenance = ModelProvenance("m", special_token_ids=specials) if specials is not None else None
    rows = pd.DataFrame({"value": values})
    assert ranking.why_structural(rows, metric, family=family, provenance=provenance) == expected


def test_findings_state_the_numbers(runs):
    sentences = findings.findings(load(runs[0]).heads, provenance=provenance_of(runs[0]))
    assert sentences[0] == ("In gpt, L1H2 puts 99.9% of its attention on the previous token (95% interval 98.9% to "
                            "100.9%; chance 5.0%).")
    assert "2 of 6 heads in gpt are previous-token heads (`prev_token` \u2265 0.5 beyond chance)." in sentences
    assert ("In bert, L1H3 puts 90.0% of its attention on the next token (95% interval 89.0% to 91.0%; chance "
            "5.0%).") in sentences
    # bert's L1H2 (0.999) rests on thin support: the findings name its L0H1 instead, and say why
    assert ("In bert, L0H1 puts 80.0% of its attention on the previous token (95% interval 79.0% to 81.0%; chance "
            "5.0%).") in sentences
    assert "1 of 8 heads in bert are previous-token heads (`prev_token` \u2265 0.5 beyond chance)." in sentences
    assert ("1 of 96 scores of bert rest on thin support (too few segments or documents, or one holding much of "
            "the sum): whether they lie beyond chance cannot be assessed on this corpus, and no finding here rests "
            "on them.") in sentences
    assert not any("L1H2 puts" in s for s in sentences[[i for i, s in enumerate(sentences)
                                                         if s.startswith("In bert, L0H1 puts 80.0%")][0]:])
    assert f"gpt's `next_token`: {NEXT_IN_CAUSAL}." in sentences
    assert "gpt's `sep`: the model has no [SEP] token, so it is undefined for every head." in sentences
    # gpt: layer 0 has 1.0, 1.1, 1.2 nats (mean 1.10); layer 1 has 1.5, 0.2, 1.7 (mean 1.13).
    assert ("In gpt, attention is most focused in layer 0 (mean entropy 1.10 nats; uniform attention over the same "
            "keys 3.00) and broadest in layer 1 (1.13 nats; uniform attention over the same keys 3.00).") in sentences
    assert not any(s.startswith("bert's `next_token`") or s.startswith("bert's `sep`") for s in sentences)


def test_findings_without_provenance_make_no_claim_about_sep(runs):
    sentences = findings.findings(load(runs[0]).heads)
    assert "gpt's `sep` is undefined for every head: no query of the corpus counts for it." in sentences
    assert not any("[SEP]" in s for s in sentences)


def test_findings_flag_a_causal_model_that_looks_ahead():
    heads = make_tables([GPT]).heads
    heads.loc[(heads.metric == "next_token") & (heads.label == "L1H1"), "value"] = 0.3
    assert ("Check the sweep: L1H1 of gpt scores 0.3 on `next_token`, yet a causal model's queries cannot see "
            "later tokens, so it is 0 for every head.") in findings.findings(heads)


def test_merge_runs_tells_the_same_model_apart(runs):
    comparison = runs_module.compare_runs([load(r) for r in runs], ["runA", "runB"])
    assert [m.name for m in comparison.models] == ["runA:gpt", "bert", "runB:gpt"]
    for table in ("heads", "offsets"):
        assert list(dict.fromkeys(comparison[table]["model"])) == ["runA:gpt", "bert", "runB:gpt"]
    assert comparison.models[2].provenance.tokenizer == "GPTTokenizer"
    assert any(s.startswith("runA:gpt and runB:gpt agree within 0.050 on every 0-1 score of every head (the "
                            "largest gap: `self` of ") for s in findings.findings(comparison.heads))


def test_run_names_are_folder_names_made_distinct():
    assert runs_module.run_names(["x/out", "y/out", "z/gpt2", "w/out"]) == ["out", "out-2", "gpt2", "out-3"]


def test_example_heads_pick_prev_everywhere_and_next_where_a_model_can_look_ahead(runs):
    picks = examples_module.example_heads(load(runs[0]).heads)
    # bert's strongest previous-token head L1H2 rests on thin support: its L0H1 is shown
    assert picks[["model", "metric", "label", "layer", "head"]].values.tolist() == [
        ["gpt", "prev_token", "L1H2", 1, 2], ["bert", "prev_token", "L0H1", 0, 1],
        ["bert", "next_token", "L1H3", 1, 3]]


@pytest.mark.parametrize("units, label", [
    ([400.0, 400.0, 400.0], "L0H2"),  # the strongest
    ([5.0, 400.0, 400.0], "L0H1"),  # the strongest rests on thin support: the next
    ([5.0, 5.0, 5.0], "L0H2"),  # every head does (a tiny corpus): the strongest still
])
def test_example_heads_leave_out_thin_support_unless_every_head_has_it(units, label):
    heads = pd.DataFrame({"model": "m", "family": "causal", "layer": 0, "head": [2, 1, 0],
                          "label": ["L0H2", "L0H1", "L0H0"], "metric": "prev_token", "value": [0.9, 0.5, 0.1],
                          "count": 10.0, "ci_low": np.nan, "ci_high": np.nan, "units": units,
                          "top_unit_share": 0.01})  # no interval: no head may carry a claim, so support decides
    assert examples_module.example_heads(heads)["label"].tolist() == [label]


def test_model_shapes_come_from_provenance(runs):
    comparison = runs_module.compare_runs([load(r) for r in runs], ["runA", "runB"])
    shapes = runs_module.model_shapes(comparison)
    assert shapes.columns.tolist() == ["run", "model", "family", "layers", "heads", "kv heads", "width",
                                       "parameters", "tokenizer", "vocabulary", "context"]
    assert shapes.iloc[1].tolist() == ["runA", "bert", "bidirectional", "2", "4", "1", "48", "1,234,567",
                                       "BERTTokenizer", "999", "64"]


def test_model_shapes_fall_back_to_the_tables_without_provenance():
    run = make_tables([BERT])
    run.provenance = RunProvenance()
    shapes = runs_module.model_shapes(runs_module.compare_runs([run]))
    assert shapes.iloc[0].tolist() == ["bert", "bidirectional", "2", "4", "4", "–", "–", "–", "–", "–"]
    assert runs_module.run_summary(run) is None


# --- the report folder ------------------------------------------------------------------------------------


def expected_figures(*, differences=()):
    """One heatmap per metric (every model side by side), the offset profiles, the scatter and entropy by depth."""
    return ({f"heatmap_{metric}.png" for metric in METRICS} | {f"difference_{pair}.png" for pair in differences}
            | {"offset_profiles.png", "prev_next_scatter.png", "entropy_by_depth.png"})


def test_report_writes_html_markdown_and_every_figure_as_png(one_report):
    assert sorted(p.name for p in one_report.iterdir()) == ["figures", "index.html", "report.md"]
    files = {p.name: p for p in (one_report / "figures").iterdir()}
    assert set(files) == expected_figures()
    for path in files.values():
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 1000
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
        with Image.open(io.BytesIO(data)) as image:
            assert image.size[0] > 100 and image.size[1] > 100
            assert "Software" not in image.info  # no tool stamp (nor date) in the file
    md = (one_report / "report.md").read_text()
    for name in files:
        assert f"](figures/{name})" in md


def test_html_is_self_contained(one_report):
    page = (one_report / "index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "http://" not in page and "https://" not in page
    assert "<script src" not in page and '<link rel="style' not in page
    assert page.count('src="data:image/png;base64,') == len(expected_figures())
    assert '<nav class="toc">' in page and 'href="#top-heads"' in page and 'id="top-heads"' in page
    # the atlas comes first, before the findings; its script, style and data are inline
    assert page.index('id="atlas"') < page.index('id="findings"') < page.index('id="top-heads"')
    assert '<script type="application/json" id="atlas-data">' in page and '<table class="sortable">' in page


def test_report_content(one_report):
    page, md = (one_report / "index.html").read_text(), (one_report / "report.md").read_text()
    assert ('<dt id="metric-prev_token"><code>prev_token</code> <span class="muted">(share of attention, 0 to 1; '
            'heads table)</span></dt><dd><p>Mean of A[q, q-1] over real queries q whose previous position q-1 is a '
            'real token.</p><p>Chance: 1/n, n the keys that count and that the query sees: uniform attention&#x27;s '
            'weight on q-1.</p></dd>') in page
    assert "**`entropy`** (nats; heads table; low is striking)" in md
    assert "over real queries q \\>= 1" in md and "over real queries q &gt;= 1" in page  # escaped in each
    for text in (page, md):
        assert "L2H0" in text and "0-indexed" in text  # the labelling note
        assert "2026-01-02T03:04:05Z" in text and "sha256:0f0f0f0f0f0f0f0f" in text and "torch 2.5.0" in text
        assert "1,234,567" in text and "GPTTokenizer" in text
        assert "L1H2 puts 99.9% of its attention on the previous token" in text
        assert "without loading the models" in text
        assert any(f"previous-token: {code} ≥ 0.5" in text for code in ("`prev_token`", "<code>prev_token</code>"))
    # a top head: value and interval ends in cells of their own, so they sort; a wide interval is marked
    assert "| gpt | 1 | L1H2 | 0.999 | 0.989 | 1.009 | 0.050 |  |  |" in md
    # listed, but its interval holds chance: not a finding, and the table says why
    assert "| gpt | 6 | L1H0 | 0.100 | -0.100 | 0.300 | 0.050 | at chance | † |" in md
    assert ('<td>gpt</td><td class="num">1</td><td>L1H2</td><td class="num">0.999</td><td class="num">0.989</td>'
            '<td class="num">1.009</td>') in page
    assert "The interactive head atlas is in `index.html` beside this file" in md


def test_markdown_tables_and_headings(one_report):
    md = (one_report / "report.md").read_text()
    assert md.startswith("# headscan report: runA\n")
    assert "**Contents**" in md and "1. [Head atlas](#head-atlas)" in md and "2. [Findings](#findings)" in md
    # entropy's top heads are its most focused: lowest first, said in the heading
    assert ("### Top entropy (lowest first)\n\n| model | rank | head | value | 95% low | 95% high | chance |\n"
            "| --- | ---: | --- | ---: | ---: | ---: | ---: |\n| gpt | 1 | L1H1 | 0.200 | 0.190 | 0.210 | 3.000 |\n"
            "| gpt | 2 | L0H0 | 1.00 | 0.99 | 1.01 | 3.00 |\n") in md
    # a metric 0 or undefined by construction says why under its table
    assert ("### Top next_token\n\n| model | rank | head | value | 95% low | 95% high | chance | no claim |\n"
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |\n| bert | 1 | L1H3 | 0.900 | 0.890 | 0.910 | 0.050 |  |\n"
            ) in md
    assert (f"| bert | 8 | L1H0 | 0.000 | -0.010 | 0.010 | 0.050 | below chance |\n\n*gpt: 0.000 for every head; "
            f"{NEXT_IN_CAUSAL}.*") in md
    assert f"*gpt: undefined for every head; {NO_SEP}.*" in md
    # a value resting on thin support is marked, ranks after every supported head (bert has 8), and the mark explained
    assert "| bert | 1 | L0H1 | 0.800 | 0.790 | 0.810 | 0.050 |  |  |" in md
    assert "| bert | 8 | L1H2 | 0.999 | 0.989 | 1.009 | 0.050 | thin support | ‡ |" in md
    assert "bert: L1H2 (0.999, 1st on its value alone) rests on thin support, so it ranks after every supported head." in md
    assert "‡ marks a value resting on thin support: its sum rests on fewer than 5 effective segments" in md


def test_structural_metrics_are_said_not_drawn(one_report):
    md = (one_report / "report.md").read_text()
    section = md[md.index("### next_token"):md.index("### self")]
    assert "heatmap_next_token.png" in section and f"- gpt: {NEXT_IN_CAUSAL}." in section
    assert f"- gpt: {NO_SEP}." in md[md.index("### sep"):md.index("### entropy")]


def test_units_and_striking_ends_come_from_the_registry(one_report):
    md = (one_report / "report.md").read_text()
    assert ("*`entropy` by layer and head; colour: nats, 0 to 1.80, one scale for every model; annotated: each "
            "model's 3 lowest heads.*") in md
    assert ("*`positional_prev` by layer and head; colour: share of queries, 0 to 1, one scale for every model; "
            "annotated: each model's 3 highest heads.*") in md
    assert "colour: fraction of the largest possible entropy, 0 to 1" in md
    assert "share of attention" not in md[md.index("### entropy_norm"):md.index("### distance")]


def test_report_over_two_runs_compares_them(two_reports):
    page = (two_reports / "index.html").read_text()
    assert "runA:gpt" in page and "runB:gpt" in page and "headscan report: runA vs runB" in page
    assert "agree within 0.050" in page
    assert "<td>runB:gpt</td><td class=\"num\">1</td>" in page  # top heads of every model, one table per metric
    names = {p.name for p in (two_reports / "figures").iterdir()}
    assert names == expected_figures(differences=["runB-gpt_runA-gpt"])
    md = (two_reports / "report.md").read_text()
    section = md[md.index("## Differences between runs"):md.index("## Heatmaps")]
    # runB's self is 0.05 higher for every head, with intervals 0.02 wide: all six heads apart
    assert "6 of 54 0-1 head scores have 95% intervals that do not overlap" in section
    assert ("| metric | head | runA:gpt | runA:gpt low | runA:gpt high | runB:gpt | runB:gpt low | runB:gpt high | "
            "difference |") in section
    assert "| self | L0H1 | 0.700 | 0.690 | 0.710 | 0.750 | 0.740 | 0.760 | +0.050 |" in section


def test_regenerating_gives_identical_bytes(runs, two_reports, tmp_path):
    again = report.write_report(list(runs), tmp_path / "again", top=3)
    assert (again / "index.html").read_bytes() == (two_reports / "index.html").read_bytes()
    assert (again / "report.md").read_bytes() == (two_reports / "report.md").read_bytes()
    for path in (two_reports / "figures").iterdir():
        assert (again / "figures" / path.name).read_bytes() == path.read_bytes()


def test_a_table_the_report_does_not_know_gets_its_top_rows(tmp_path):
    register_table("toyrel", {"metric": "string", "relation": "string"},
                   "one row per (model, layer, head, metric, relation)")
    try:
        run = make_tables([GPT])
        rows = [dict(model="gpt", family="causal", layer=layer, head=head, label=f"L{layer}H{head}", kv_group=head,
                     metric="toy_score", relation=relation, value=v, sum=v, count=1.0, ci_low=np.nan, ci_high=np.nan)
                for layer, head, relation, v in [(0, 0, "nsubj", 0.1), (1, 2, "obj", 0.7), (0, 1, "nsubj", 0.4)]]
        run.frames["toyrel"] = pd.DataFrame(rows)
        out = report.write_report([write(run, tmp_path / "run")], tmp_path / "r", top=2)
        md = (out / "report.md").read_text()
    finally:
        TABLES.pop("toyrel")
    assert "## Other tables" in md and "### toyrel (toyrel.parquet)" in md
    assert "\nOne row per (model, layer, head, metric, relation).\n" in md  # the registry's description, capitalised
    assert ("| model | metric | head | relation | value | 95% interval | chance |\n"
            "| --- | --- | --- | --- | ---: | --- | --- |\n"
            "| gpt | toy\\_score | L1H2 | obj | 0.7 |  |  |\n| gpt | toy\\_score | L0H1 | nsubj | 0.4 |  |  |\n") in md


def fake_every_layer(model, text):
    """Distinct patterns per layer and head: head h of layer L puts all attention h + 2L tokens back."""
    tokens = text.split()
    n = len(tokens)
    pattern = np.zeros((2, model.n_heads, n, n))  # (layer, head, q_pos, k_pos)
    for layer in range(2):
        for head in range(model.n_heads):
            pattern[layer, head, np.arange(n), np.maximum(np.arange(n) - head - 2 * layer, 0)] = 1.0
    return tuple(tokens), pattern


def back(n, k):
    """The (n, n) pattern of a head that puts all attention k tokens back (the first tokens on token 0)."""
    return np.eye(n)[np.maximum(np.arange(n) - k, 0)]


def test_example_attention_is_drawn_for_the_chosen_heads(runs, tmp_path, monkeypatch):
    calls, drawn = [], []
    shapes = {"gpt": 3, "bert": 4}

    def fake_load(spec, **kwargs):
        calls.append(("load", spec))
        return type("Model", (), {"name": spec, "n_heads": shapes[spec], "n_layers": 2})()

    def recording(model, text):
        calls.append(("every layer", model.name, text))
        return fake_every_layer(model, text)

    original = figures.attention_matrix

    def spy(tokens, pattern, **kwargs):
        drawn.append((kwargs["title"].split(":")[0], np.asarray(pattern)))
        return original(tokens, pattern, **kwargs)

    monkeypatch.setattr(headscan.models, "load_model", fake_load)
    monkeypatch.setattr(examples_module, "every_layer", recording)
    monkeypatch.setattr(figures, "attention_matrix", spy)
    text = "one two three four five six"
    examples = examples_module.compute_examples([load(runs[0])], text)
    # each model loaded once and run once on the sentence and once on the repeated sequence: some head scores
    # at least 0.5 on induction (gpt's and bert's L0H0, 0.9)
    repeated = examples_module.REPEATED_EXAMPLE
    assert calls == [("load", "gpt"), ("every layer", "gpt", text), ("every layer", "gpt", repeated),
                     ("load", "bert"), ("every layer", "bert", text), ("every layer", "bert", repeated)]
    # gpt: its strongest previous-token head L1H2; bert: L0H1 (its L1H2 rests on thin support), and its
    # strongest next-token head L1H3
    assert [(e.model, e.label, e.metric) for e in examples.drawn] == [
        ("gpt", "L1H2", "prev_token"), ("bert", "L0H1", "prev_token"), ("bert", "L1H3", "next_token")]
    for example, k in zip(examples.drawn, [4, 1, 5]):  # h + 2L tokens back
        np.testing.assert_array_equal(example.pattern, back(6, k))
    assert [e.patterns.shape for e in examples.every_head] == [(2, 3, 6, 6), (2, 3, 21, 21), (2, 4, 6, 6),
                                                               (2, 4, 21, 21)]
    assert examples.repeated_text == repeated and [e.label for e in examples.induction] == ["L0H0", "L0H0"]

    out = report.write_report([runs[0]], tmp_path / "r", examples=examples)
    assert [name for name, _ in drawn] == ["gpt L1H2", "bert L0H1", "bert L1H3", "gpt L0H0", "bert L0H0"]
    np.testing.assert_array_equal(drawn[0][1], back(6, 4))
    assert (out / "figures" / "looking_both_ways.png").read_bytes().startswith(PNG)
    page = (out / "index.html").read_text()
    assert "could not be drawn" not in page and "not drawn" not in page
    assert ("gpt L1H2 (prev_token 0.999 [0.989, 1.009] over the corpus, chance 0.050); bert L0H1 (prev_token 0.800 "
            "[0.790, 0.810] over the corpus, chance 0.050); bert L1H3 (next_token 0.900 [0.890, 0.910] over the "
            "corpus, chance 0.050).") in page
    assert '"title":"the example sentence","text":"one two three four five six"' in page  # in the atlas's data


def test_an_example_head_without_a_finding_is_drawn_and_captioned_as_none(runs, tmp_path, monkeypatch):
    # every next-token head of bert below its chance level: the highest is still drawn, to show the metric, but
    # neither the caption nor the panel may call it the model's next-token head
    run = load(runs[0])
    next_rows = (run.heads["model"] == "bert") & (run.heads["metric"] == "next_token")
    run.heads.loc[next_rows, "chance"] = 0.95
    monkeypatch.setattr(headscan.models, "load_model",
                        lambda spec, **kwargs: type("Model", (), {"n_heads": {"gpt": 3, "bert": 4}[spec],
                                                                  "n_layers": 2})())
    monkeypatch.setattr(examples_module, "every_layer", fake_every_layer)
    titles = []
    original = figures.attention_matrix
    monkeypatch.setattr(figures, "attention_matrix",
                        lambda tokens, pattern, **kwargs: titles.append(kwargs["title"]) or original(tokens, pattern,
                                                                                                   **kwargs))
    examples = examples_module.compute_examples([run], "one two three")
    assert [(e.label, e.metric, e.unsupported) for e in examples.drawn] == [
        ("L1H2", "prev_token", ""), ("L0H1", "prev_token", ""), ("L1H3", "next_token", "below chance")]
    page = (report.write_report([run], tmp_path / "r", examples=examples) / "index.html").read_text()
    assert ("bert L1H3 (next_token 0.900 [0.890, 0.910] over the corpus, chance 0.950: below chance, so no finding; "
            "shown to illustrate the metric).") in page
    assert titles[2] == "bert L1H3: next_token 0.900\n(bidirectional; below chance: no finding)"
    assert titles[1] == "bert L0H1: prev_token 0.800\n(bidirectional)"


def test_a_repeated_token_run_gets_the_induction_example(runs, tmp_path, monkeypatch):
    run = load(runs[0])
    run.provenance = dataclasses.replace(run.provenance, corpus=CorpusProvenance("repeat-random:n=50", "repeat-random"))
    shapes = {"gpt": 3, "bert": 4}
    monkeypatch.setattr(headscan.models, "load_model",
                        lambda spec, **kwargs: type("Model", (), {"n_heads": shapes[spec], "n_layers": 2})())
    monkeypatch.setattr(examples_module, "every_layer", fake_every_layer)
    examples = examples_module.compute_examples([run], "one two three")
    assert examples.repeated_text == examples_module.REPEATED_EXAMPLE
    # the strongest induction head of each model: ((5 layer + 3 head + 9) % 10) / 10 is 0.9 at L0H0 in both
    assert [(e.model, e.label, e.metric, e.value) for e in examples.induction] == [
        ("gpt", "L0H0", "induction", 0.9), ("bert", "L0H0", "induction", 0.9)]
    assert [e.text for e in examples.every_head] == ["one two three", examples_module.REPEATED_EXAMPLE] * 2
    out = report.write_report([run], tmp_path / "r", examples=examples)
    md = (out / "report.md").read_text()
    assert "## Induction heads" in md and "figures/induction_example.png" in md


def test_unavailable_model_is_explained_and_the_rest_still_rendered(runs, tmp_path, monkeypatch):
    def missing(spec, **kwargs):
        raise ModelNotFoundError(f"model {spec!r} not found; install it")

    monkeypatch.setattr(headscan.models, "load_model", missing)
    examples = examples_module.compute_examples([load(runs[0])])
    assert examples.failed == ("gpt (`gpt`): ModelNotFoundError: model 'gpt' not found; install it",
                               "bert (`bert`): ModelNotFoundError: model 'bert' not found; install it")
    out = report.write_report([runs[0]], tmp_path / "r", examples=examples)
    page = (out / "index.html").read_text()
    assert "could not be drawn for 2 of 2 models" in page
    assert "ModelNotFoundError: model &#x27;gpt&#x27; not found; install it" in page
    assert {p.name for p in (out / "figures").iterdir()} == expected_figures()


def stub_build(calls=None):
    """A stand-in for build_report, for tests of what surrounds it: a one-heading document, drawn in no time."""

    def build(comparison, *, top, examples, title, progress=None):
        if calls is not None:
            calls.append((comparison, top, examples))
        return Document(title, [Heading(1, title)], {"one.png": PNG + b"\0" * 24})

    return build


def test_a_failed_report_leaves_the_old_one_whole(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "build_report", stub_build())
    out = report.write_report([runs[0]], tmp_path / "r")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert set(map(str, before)) == {"index.html", "report.md", "figures/one.png"}

    def broken(doc, **kwargs):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(document, "to_html", broken)  # fails after the figures and report.md are written
    with pytest.raises(RuntimeError, match="rendering failed"):
        report.write_report([runs[0]], out, overwrite=True)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no temporary folders left behind


def test_report_refuses_to_replace_a_folder_that_is_not_a_report(runs, tmp_path):
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "main.py").write_text("precious")
    with pytest.raises(TablesError) as error:
        report.write_report([runs[0]], tmp_path / "project", overwrite=True)
    assert str(error.value) == (f"{tmp_path / 'project'}: holds main.py, which a headscan report does not write, and "
                                "replacing the folder would delete it; move it out, or choose another --out")
    assert (tmp_path / "project" / "main.py").read_text() == "precious"


def test_default_folder_is_named_after_the_runs(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(report, "build_report", stub_build())
    out = report.write_report(list(runs), top=1)
    assert out == Path(runs[0]).parent / "runA-runB-report"  # beside the first run, not in the folder one is in
    assert (out / "index.html").is_file() and not any(tmp_path.iterdir())


def test_errors_name_the_problem(runs, tmp_path):
    with pytest.raises(ConfigError, match="^report needs at least one sweep output folder"):
        report.write_report([])
    with pytest.raises(TablesError, match="no such folder"):
        report.write_report([tmp_path / "missing"])
    with pytest.raises(ConfigError, match=r"^top must be at least 1, not 0; pass how many heads to list per metric, "
                                          r"e\.g\. 10$"):
        report.write_report([runs[0]], tmp_path / "r", top=0)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"^out .*file: exists and is not a folder; choose another$"):
        report.write_report([runs[0]], tmp_path / "file")
    with pytest.raises(ConfigError, match=r"^run .*runA is given twice \(as .*runA\); a report compares different "
                                          r"runs, so pass each once$"):
        report.write_report([runs[0], runs[1], runs[0]], tmp_path / "r")
    with pytest.raises(ConfigError, match="is given twice"):  # the same run's tables, handed in twice
        report.write_report([load(runs[0]), load(runs[0])], tmp_path / "r")
    with pytest.raises(ConfigError, match="^example is empty; pass a sentence, or leave the option out"):
        examples_module.compute_examples([load(runs[0])], " ")


@pytest.mark.parametrize("arguments, message", [
    (["--top", "0"], "Error: --top must be at least 1, not 0; pass how many heads to list per metric, e.g. 10"),
    (["--example", ""], "Error: --example is empty; pass a sentence, or leave the option out for the default one"),
    (["--example", "   "], "Error: --example is empty; pass a sentence, or leave the option out for the default one"),
    (["RUN"], "Error: run RUN is given twice (as RUN); a report compares different runs, so pass each once"),
    (["--out", "project", "--overwrite"], "Error: project: holds main.py, which a headscan report does not write, "
                                          "and replacing the folder would delete it; move it out, or choose another --out"),
])
def test_cli_report_errors_are_one_line_and_load_no_model(runs, arguments, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "main.py").write_text("precious")
    monkeypatch.setattr(headscan.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    arguments = [str(runs[0]) if a == "RUN" else a for a in arguments]
    result = CliRunner().invoke(cli, ["report", str(runs[0]), *arguments])
    assert result.exit_code == 1 and result.output.strip() == message.replace("RUN", str(runs[0]))


def test_cli_report_without_models_hands_no_examples(runs, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(headscan.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(report, "build_report", stub_build(calls))
    result = CliRunner().invoke(cli, ["report", str(runs[0]), "--out", str(tmp_path / "r"), "--no-models"])
    assert result.exit_code == 0, result.output
    assert calls[0][2] is None


def test_cli_report_names_models_it_could_not_load(runs, tmp_path, monkeypatch):
    def missing(spec, **kwargs):
        raise ModelNotFoundError(f"model {spec!r} not found")

    calls = []
    monkeypatch.setattr(headscan.models, "load_model", missing)
    monkeypatch.setattr(report, "build_report", stub_build(calls))
    result = CliRunner().invoke(cli, ["report", str(runs[0]), "--out", str(tmp_path / "r"), "--top", "2", "-q"])
    assert result.exit_code == 0, result.output
    [(comparison, top, examples)] = calls
    assert [m.name for m in comparison.models] == ["gpt", "bert"] and top == 2 and len(examples.failed) == 2
    assert result.stderr.splitlines() == [
        "no example attention for gpt (`gpt`): ModelNotFoundError: model 'gpt' not found",
        "no example attention for bert (`bert`): ModelNotFoundError: model 'bert' not found"]
    assert result.stdout == f"wrote {tmp_path / 'r'}/index.html and {tmp_path / 'r'}/report.md\n"


def test_cli_report_says_what_it_is_doing(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "build_report", stub_build())
    result = CliRunner().invoke(cli, ["report", str(runs[0]), "--out", str(tmp_path / "r"), "--no-models"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == ["read 1 run", f"report: writing {tmp_path / 'r'}"]
    again = CliRunner().invoke(cli, ["report", str(runs[0]), "--out", str(tmp_path / "r"), "--no-models", "-q"])
    assert again.exit_code == 1 and again.output == (f"Error: --out {tmp_path / 'r'}: already holds a report; pass "
                                                     f"--overwrite to replace it, or choose another --out\n")
    quiet = CliRunner().invoke(cli, ["report", str(runs[0]), "--out", str(tmp_path / "r"), "--no-models", "-q",
                                     "--overwrite"])
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_the_python_report_refuses_to_write_over_a_report_without_overwrite(runs, tmp_path, monkeypatch):
    """headscan.report checks its folder itself, as the command does before loading models."""
    monkeypatch.setattr(report, "build_report", stub_build())
    headscan.report([runs[0]], out=tmp_path / "r")
    with pytest.raises(ConfigError, match=r"already holds a report; pass --overwrite to replace it"):
        headscan.report([runs[0]], out=tmp_path / "r")
    # before any run is read: a run that is not there is not what it says first
    with pytest.raises(ConfigError, match=r"already holds a report"):
        headscan.report([tmp_path / "no-such-run"], out=tmp_path / "r")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(HeadscanError, match=r"notes\.txt"):
        headscan.report([runs[0]], out=tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"


def test_build_report_reports_progress_part_by_part(runs):
    lines = []
    report.build_report(runs_module.compare_runs([load(runs[0])]), top=2, progress=lines.append)
    assert lines[0] == "report: the atlas" and "report: heatmaps" in lines and len(lines) == 9


def test_summary_table_compares_the_families(one_report):
    md = (one_report / "report.md").read_text()
    section = md[md.index("## Encoder versus decoder"):md.index("## Looking both ways")]
    assert ("| gpt | causal | 2 | 6 | L1H2 | 0.999 | 1.00 | 2 | – | – | – | – |\n"
            "| bert | bidirectional | 2 | 8 | L0H1 | 0.800 | 0.00 | 1 | L1H3 | 0.900 | 1.00 | 1 |") in section
    assert f"*gpt's `next_token`: {NEXT_IN_CAUSAL}.*" in section
    assert ("The strongest previous-token heads: gpt (causal) L1H2, 99.9% (chance 5.0%), at relative depth 1.00; bert "
            "(bidirectional) L0H1, 80.0% (chance 5.0%), at relative depth 0.00.") in md


def test_induction_findings_name_the_head_and_count_them():
    heads = make_tables([GPT]).heads
    at = (heads.metric == "induction") & (heads.label == "L1H1")
    heads.loc[at, ["value", "ci_low", "ci_high"]] = [0.953, 0.943, 0.963]
    sentences = findings.findings(heads)
    assert ("In gpt, L1H1 puts 95.3% of its attention on the tokens that follow other occurrences of its own token "
            "(95% interval 94.3% to 96.3%; chance 5.0%): prefix matching, with no evidence that it copies what it "
            "attends to.") in sentences
    # L0H0 (0.9), L0H2 (0.5), L1H0 (0.4) and L1H1 (0.953) reach the role's 0.4, with no copying evidence
    assert ("4 of 6 heads in gpt are prefix-matching heads, attending like induction heads with no evidence that "
            "they copy (`induction` \u2265 0.4 beyond chance, without copying evidence).") in sentences


def test_a_metric_this_headscan_does_not_know_is_drawn_but_not_ranked(tmp_path):
    run = make_tables([GPT])
    heads = run.frames["heads"]
    heads.loc[heads.metric == "induction", "metric"] = "retired_metric"
    out = report.write_report([write(run, tmp_path / "old")], tmp_path / "r")
    md = (out / "report.md").read_text()
    assert (out / "figures" / "heatmap_retired_metric.png").is_file() and "### Top prev_token" in md
    assert "### Top retired_metric" not in md
    assert "not registered in the installed headscan, so it is drawn but not ranked" in md


def test_report_on_a_real_sweep_of_tiny_checkpoints(tiny_gpt2, tiny_bert, tmp_path):
    import headscan

    headscan.sweep([str(tiny_gpt2), str(tiny_bert)], "builtin", tmp_path / "run", device="cpu", limit=3, bootstrap=0)
    run = load(tmp_path / "run")
    examples = examples_module.compute_examples([run])
    assert examples.failed == () and len(examples.drawn) == 3  # gpt2's previous-token head, bert's two
    # every layer in one forward pass agrees with the sweep's own reading of one layer
    model = headscan.models.load_model(str(tiny_bert), device="cpu")
    tokens, patterns = examples_module.every_layer(model, examples.text)
    ids = torch.tensor([encode(Corpus("example", "text", "", (Segment(examples.text, 0),)), model,
                               model.max_context).token_ids[0]])
    assert len(tokens) == ids.shape[1]
    for layer in range(model.n_layers):
        seen = {}
        with headscan.models.pattern_forward(model, {layer: lambda pattern, hook: seen.setdefault("pattern", pattern[0])}) as forward:
            forward(ids, torch.ones_like(ids))
        np.testing.assert_allclose(patterns[layer], seen["pattern"].float().numpy(), atol=1e-6)
    out = report.write_report([run], tmp_path / "report", top=3, examples=examples)
    page = (out / "index.html").read_text()
    assert (out / "figures" / "looking_both_ways.png").is_file()
    assert "could not be drawn" not in page


@pytest.mark.browser
def test_index_html_renders_in_a_headless_browser(two_reports, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        from conftest import missing

        missing("chromium is not installed (apt-get install -y chromium); it renders index.html headless")
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,2000",
         (two_reports / "index.html").resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    with Image.open(shot) as image:
        assert image.size == (1280, 2000)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 50  # text, tables, figures: not a blank page
    white = max(colours)[0] / (1280 * 2000)
    assert white < 0.95


def test_figures_are_palette_pngs_that_look_like_the_full_colour_ones():
    """Each figure is stored with at most 256 colours: far fewer bytes, the same pixels to within what the eye
    sees (a colormap has 256 colours; only anti-aliased edges move to a neighbouring shade)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from headscan.report.figures import DPI, palette_png

    fig, ax = plt.subplots(figsize=(6, 4))
    sns.heatmap(np.random.default_rng(0).random((12, 12)), cmap="rocket_r", ax=ax)
    ax.set_title("a heatmap with a title")
    small = palette_png(fig)
    full = io.BytesIO()
    fig.savefig(full, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    assert palette_png.__doc__ and small == palette_png(fig)  # the same figure, the same bytes
    with Image.open(io.BytesIO(small)) as a, Image.open(io.BytesIO(full.getvalue())) as b:
        assert a.mode == "P" and a.size == b.size
        pixels = np.asarray(a.convert("RGB"), dtype=float)
        reference = np.asarray(b.convert("RGB"), dtype=float)
    assert len(small) < 0.6 * len(full.getvalue())
    assert np.abs(pixels - reference).mean() < 1.0  # of 255, per channel
    assert np.percentile(np.abs(pixels - reference).max(-1), 99) < 24


def test_the_example_attention_figure_has_one_colour_bar_and_centres_a_note_in_its_slot():
    """Matplotlib objects, not pixels: two panels and a note, one shared colour bar (none per panel), the note
    centred in its empty slot."""
    from headscan.report.examples import ExampleAttention
    from headscan.report.sections.example_attention import _attention_figure

    pattern = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
    panels = [ExampleAttention("gpt", "causal", "prev_token", f"L0H{h}", 0, h, 0.5, ("a", "b", "c", "d"), pattern)
              for h in range(2)] + ["no example for bert: it could not be loaded"]
    fig = _attention_figure(panels, columns=2)
    colour_bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(colour_bars) == 1 and colour_bars[0].get_ylabel() == "share of attention"
    note = next(t for ax in fig.axes for t in ax.texts if t.get_text().startswith("no example"))
    assert (note.get_ha(), note.get_va()) == ("center", "center")
