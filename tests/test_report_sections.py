"""Report sections are registered objects: a test module adds one without editing headscan/report/, and the
report builds it in its order, where the runs have what it draws; ``headscan.report(...)`` writes the report."""

import pandas as pd
import pytest

import headscan
from headscan.analysis.runs import compare_runs
from headscan.errors import ConfigError
from headscan.report import build_report
from headscan.report.document import Heading, Table, Text, to_html, to_markdown
from headscan.report.sections import SECTIONS, register_section
from headscan.tables import SweepTables


def heads_table(model="gpt", n_layers=2, n_heads=2, metrics=("prev_token", "entropy")) -> pd.DataFrame:
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            for metric in metrics:
                v = 0.1 * (layer + 1) + 0.01 * head
                rows.append(dict(model=model, family="causal", layer=layer, head=head, label=f"L{layer}H{head}",
                                 kv_group=head, metric=metric, value=v, sum=10 * v, count=10.0, ci_low=v - 0.01,
                                 ci_high=v + 0.01, units=400.0, top_unit_share=0.01))
    return pd.DataFrame(rows)


@pytest.fixture
def head_count_section():
    """A section of the test's own: the number of heads per model, shown only for runs that scored `entropy`."""
    seen = []

    def shown(comparison):
        return "entropy" in comparison.metrics

    @register_section("head counts", order=65, shown=shown)
    def head_counts(context):
        seen.append(context.top)
        heads = context.comparison.heads.drop_duplicates(["model", "layer", "head"])
        counts = heads.groupby("model").size()
        return [Heading(2, "Head counts"), Text("Heads per model, counted by a section registered in a test."),
                Table(pd.DataFrame({"model": counts.index, "heads": counts.astype(str).to_numpy()}))]

    try:
        yield seen
    finally:
        del SECTIONS["head counts"]


def test_a_section_registered_from_a_test_module_is_built_in_its_order(head_count_section):
    lines = []
    document = build_report(compare_runs([SweepTables({"heads": heads_table()})]), top=3, progress=lines.append)
    assert head_count_section == [3]  # built once, with the report's settings
    # after "top heads" (order 60), before "offset profiles" (order 70)
    assert lines.index("report: top heads") + 1 == lines.index("report: head counts") == \
        lines.index("report: offset profiles") - 1
    titles = [b.text for b in document.blocks if isinstance(b, Heading) and b.level == 2]
    assert titles.index("Top heads") + 1 == titles.index("Head counts") == titles.index("Offset profiles") - 1
    markdown, page = to_markdown(document), to_html(document)
    assert "## Head counts" in markdown and "| gpt | 4 |" in markdown  # 2 layers x 2 heads
    assert '<h2 id="head-counts">Head counts</h2>' in page and '<a href="#head-counts">Head counts</a>' in page


def test_a_registered_section_is_left_out_where_the_runs_lack_what_it_draws(head_count_section):
    lines = []
    document = build_report(compare_runs([SweepTables({"heads": heads_table(metrics=("prev_token",))})]),
                            progress=lines.append)
    assert head_count_section == [] and "report: head counts" not in lines
    assert "Head counts" not in to_markdown(document)


def test_a_section_name_is_registered_once(head_count_section):
    with pytest.raises(ConfigError, match="report section 'head counts' is registered already"):
        register_section("head counts")(lambda context: [])
    assert SECTIONS["head counts"].order == 65  # the first one stays


def test_headscan_report_writes_the_report_with_the_registered_section(head_count_section, tmp_path):
    folder = headscan.report([SweepTables({"heads": heads_table()})], out=tmp_path / "report", top=2)
    assert folder == tmp_path / "report"
    assert sorted(p.name for p in folder.iterdir()) == ["figures", "index.html", "report.md"]
    markdown = (folder / "report.md").read_text(encoding="utf-8")
    assert "## Head counts" in markdown and "| gpt | 4 |" in markdown
    assert head_count_section == [2]


def test_the_built_in_sections_keep_the_report_s_order():
    built_in = [s.name for s in sorted(SECTIONS.values(), key=lambda s: s.order)]
    assert built_in == ["the atlas", "findings", "example attention", "differences between runs", "heatmaps",
                        "top heads", "offset profiles", "composition", "scatter and entropy", "syntactic heads",
                        "attention along the context", "which heads need the whole context", "what heads move",
                        "does the head matter", "what carries the answer", "head families", "heads over training", "provenance"]


def test_the_header_states_each_embedded_model_s_caveat_once_for_it_and_its_controls():
    from headscan.tables import ModelProvenance, RunProvenance

    caveat = "a sentence encoder distilled from a larger model"
    models = (ModelProvenance("gpt", extra={"caveat": caveat}),
              ModelProvenance("gpt [shuffled words]", extra={"caveat": caveat}), ModelProvenance("other"))
    heads = pd.concat([heads_table(), heads_table("gpt [shuffled words]"), heads_table("other")], ignore_index=True)
    document = build_report(compare_runs([SweepTables({"heads": heads}, RunProvenance(models=models))]))
    markdown = to_markdown(document)
    assert markdown.count(caveat) == 1
    assert f"Caveat (gpt, gpt [shuffled words]): {caveat}." in markdown


def test_findings_warn_where_intervals_rest_on_fewer_than_100_units():
    few = build_report(compare_runs([SweepTables({"heads": heads_table().assign(units=20.0)})]))
    many = build_report(compare_runs([SweepTables({"heads": heads_table()})]))  # 400 units
    assert "rest on at most 20 bootstrap units" in to_markdown(few)
    assert "bootstrap units" not in to_markdown(many)
