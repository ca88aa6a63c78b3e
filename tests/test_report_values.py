"""The report's "What heads move" section: how much of the sinks survives value weighting, OV copying
scores and direct logit attribution, each part only where its data is; `headscan show` and the atlas on such runs.

Expected numbers are written out by hand from the synthetic rows below.
"""

import numpy as np
import pandas as pd
import pytest
import seaborn as sns
from click.testing import CliRunner
from matplotlib.collections import QuadMesh
from matplotlib.figure import Figure

from headscan.analysis import movement
from headscan.analysis.runs import compare_runs
from headscan.analysis.show import top_heads_text
from headscan.cli import cli
from headscan.plots import heatmaps as figures
from headscan.plots import profiles as charts
from headscan.plots.style import SIGNED_CMAP
from headscan.report import atlas
from headscan.report import build as report
from headscan.report.document import Bullets, Figures, Heading
from headscan.report.figures import Pngs
from headscan.report.sections.movement import movement_section
from headscan.tables import TABLES, ModelProvenance, RunProvenance, SweepTables, load, write

SHAPES = {"bert": ("bidirectional", 2, 2), "gpt": ("causal", 3, 2)}


def attention(model, metric, layer, head):
    """heads.parquet: bert's first_token 0.8 in layer 1, 0.4 in layer 0; gpt's 0.9 in every head; bert's sep 0.2."""
    if metric == "first_token":
        return (0.4 + 0.4 * layer) if model == "bert" else 0.9
    if metric == "sep":
        return 0.2 if model == "bert" else np.nan
    return 0.1 * (layer + 1) + 0.01 * head


def weighted(model, metric, layer, head):
    """value.parquet: the sinks fall to a tenth (bert L1H1's first_token to 0.0); prev_token is unchanged."""
    if metric in ("first_token", "sep"):
        return 0.0 if (model, layer, head) == ("bert", 1, 1) and metric == "first_token" else \
            attention(model, metric, layer, head) / 10
    return attention(model, metric, layer, head)


def frame(table, rows):
    return TABLES[table].conform(pd.DataFrame(rows))


def each_head(models=SHAPES):
    for model, (family, n_layers, n_heads) in models.items():
        for layer in range(n_layers):
            for head in range(n_heads):
                yield dict(model=model, family=family, layer=layer, head=head, label=f"L{layer}H{head}", kv_group=head)


def scored(common, metric, value, **extra):
    return dict(common, metric=metric, value=value, sum=10 * value, count=10.0, ci_low=value - 0.01,
                ci_high=value + 0.01, units=400.0, top_unit_share=0.01, **extra)


def tables(*, value=True, weights=True, dla=True, models=SHAPES):
    heads, values, copy = [], [], []
    for common in each_head(models):
        layer, head, model = common["layer"], common["head"], common["model"]
        for metric in ("prev_token", "first_token", "sep", "entropy"):
            heads.append(scored(common, metric, attention(model, metric, layer, head)))
            values.append(scored(common, metric, weighted(model, metric, layer, head)))
        if dla and common["family"] == "causal":
            d = 0.5 * layer - 0.2 * head  # gpt: L2H0 +1.0, L2H1 +0.8, L1H0 +0.5
            heads.append(scored(common, "dla", d))
            heads.append(scored(common, "dla_positive", 0.5 + d / 4))
        c = {(0, 1): 0.9, (1, 0): -0.7}.get((layer, head), 0.1 * head)
        copy.append(dict(common, metric="copying", value=c, sum=np.nan, count=np.nan, ci_low=np.nan, ci_high=np.nan,
                         units=np.nan, top_unit_share=np.nan, embedding="tied" if model == "gpt" else "untied"))
    frames = {"heads": frame("heads", heads)}
    if value:
        frames["value"] = frame("value", values)
    if weights:
        frames["weights"] = frame("weights", copy)
    return SweepTables(frames)


def test_paired_and_layer_means():
    t = tables()
    both = movement.paired(t.heads, t["value"], metric="first_token")
    assert both["model"].tolist() == ["bert"] * 4 + ["gpt"] * 6
    pairs = movement.layer_pairs(t.heads, t["value"], metric="first_token").set_index(["model", "layer"])
    assert pairs.loc[("bert", 1), "attention"] == pytest.approx(0.8)
    assert pairs.loc[("bert", 1), "value_weighted"] == pytest.approx(0.04)  # (0.08 + 0.0) / 2
    assert pairs.loc[("gpt", 2), "depth"] == pytest.approx(1.0) and pairs.loc[("bert", 1), "depth"] == 1.0


def test_sink_summary_states_means_and_the_largest_fall():
    t = tables()
    summary = movement.sink_summary(t.heads, t["value"])
    assert summary[["model", "metric"]].values.tolist() == [["bert", "first_token"], ["bert", "sep"],
                                                            ["gpt", "first_token"]]
    bert = summary.iloc[0]
    assert bert["attention"] == pytest.approx(0.6) and bert["value_weighted"] == pytest.approx((0.04 + 0.04 + 0.08) / 4)
    assert bert["drop_label"] == "L1H1" and bert["drop_value"] == 0.0 and bert["heads"] == 4
    means = movement.value_means(t.heads, t["value"]).set_index(["model", "metric"])
    assert means.loc[("gpt", "prev_token"), "change"] == pytest.approx(0.0)
    assert means.loc[("gpt", "first_token"), "change"] == pytest.approx(-0.81)


def test_copying_heads_and_counts():
    t = tables()
    top = movement.copying_heads(t["weights"], n=2)
    assert top[["model", "label"]].values.tolist() == [["bert", "L0H1"], ["bert", "L1H1"], ["gpt", "L0H1"],
                                                       ["gpt", "L1H1"]]
    assert top["embedding"].tolist() == ["untied", "untied", "tied", "tied"]
    counts = movement.copying_counts(t["weights"]).set_index("model")
    assert counts.loc["gpt", ["heads", "positive", "high"]].tolist() == [6, 3, 1]
    # many heads of two models, interleaved: each model's block keeps its own order, highest first (a sort by
    # model alone that is not stable would shuffle the heads within a block)
    rng = np.random.default_rng(0)
    many = pd.DataFrame({"model": np.tile(["b", "a"], 60), "metric": "copying", "value": rng.permutation(120) / 120,
                         "layer": np.repeat(np.arange(12), 10), "head": np.tile(np.arange(10), 12)})
    many["label"] = [f"L{layer}H{head}" for layer, head in zip(many["layer"], many["head"])]
    top = movement.copying_heads(many, n=40)
    assert top["model"].tolist() == ["b"] * 40 + ["a"] * 40
    for model in ("a", "b"):
        values = top[top["model"] == model]["value"].tolist()
        assert values == sorted(values, reverse=True)


def test_dla_heads_of_causal_models_with_their_positive_share():
    top = movement.dla_heads(tables().heads, n=3)
    assert top["label"].tolist() == ["L2H0", "L2H1", "L1H0"] and set(top["model"]) == {"gpt"}
    np.testing.assert_allclose(top["dla"], [1.0, 0.8, 0.5])
    np.testing.assert_allclose(top["positive"], [0.75, 0.7, 0.625])


def test_charts_draw_two_lines_per_model_and_a_point_per_head():
    t = tables()
    fig = Figure()
    ax = charts.value_weighting_by_depth(movement.layer_pairs(t.heads, t["value"]), ax=fig.subplots())
    assert len(ax.lines) == 4
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.4, 0.8])
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [0.04, 0.04])
    assert ax.lines[1].get_linestyle() == "--"
    fig = Figure()
    ax = charts.value_weighting_scatter(movement.paired(t.heads, t["value"], metric="first_token"), ax=fig.subplots())
    np.testing.assert_allclose(ax.collections[0].get_offsets()[3], [0.8, 0.0])
    assert [text.get_text() for text in ax.texts] == ["L1H1", "L0H0"]  # each model's largest fall


class FiguresKept(Pngs):
    """Pngs that also keeps each Figure, so a test reads matplotlib objects rather than pixels."""

    def add(self, name, fig):
        name = super().add(name, fig)
        self.figures = {**getattr(self, "figures", {}), name: fig}
        return name


def test_copying_heatmap_is_diverging_from_minus_one_to_one():
    t = tables()
    pngs = FiguresKept()
    blocks = movement_section(compare_runs([t]), {}, pngs)
    assert "copying.png" in pngs
    drawn = [c for ax in pngs.figures["copying.png"].axes for c in ax.collections if isinstance(c, QuadMesh)]
    signed = sns.color_palette(SIGNED_CMAP, as_cmap=True)  # seaborn hands the heatmap an unnamed copy of it
    assert len(drawn) >= 2 and all(np.allclose(mesh.get_cmap()(np.linspace(0, 1, 5)), signed(np.linspace(0, 1, 5)))
                                   for mesh in drawn)  # each model's heatmap and the colour bar
    captions = [b.caption for b in blocks if isinstance(b, Figures)]
    assert any(c.startswith("Left: per model, the mean share of a layer's heads on the sink") for c in captions)
    fig = Figure()
    ax = figures.value_heatmap(t["weights"], model="bert", label="copying", ax=fig.subplots(), vmin=-1, vmax=1,
                               cmap=SIGNED_CMAP, center=0.0)
    mesh = ax.collections[0]
    assert (mesh.norm.vmin, mesh.norm.vmax) == (-1, 1)
    np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(2, 2), [[0.0, 0.9], [-0.7, 0.1]])
    assert any(isinstance(b, Heading) and b.text == "Copying heads" for b in blocks)


def test_section_text_and_parts():
    blocks = movement_section(compare_runs([tables()]), {}, Pngs())
    assert [b.text for b in blocks if isinstance(b, Heading)] == ["What heads move", "Value-weighted attention",
                                                                   "Copying heads", "Direct logit attribution"]
    items = [item for b in blocks if isinstance(b, Bullets) for item in b.items]
    assert ("bert: the mean [CLS] share falls from 0.60 to 0.04 once values count, over 4 heads (`first_token`, "
            "attention-weighted to value-weighted); the largest fall: L1H1, 0.80 to 0.00.") in items
    assert any(i.startswith("gpt: the mean BOS (first-token) share falls from 0.90 to 0.09") for i in items)
    assert ("gpt: 1 of 6 heads score above 0.5 (3 above 0, mean 0.07); the highest: L0H1 0.90, L1H1 0.10, L2H1 0.10 "
            "(embedding tied). A description of the weights; not tested: no null for copying (a sweep "
            "with --control random-init counts its untrained copies' heads the same way).") in items  # no controls
    # the fabricated table has no chance column: the claim gate makes no claim about L2H0's attribution
    assert "gpt: no head's attribution is a finding; the largest, L2H0 +1.00 [+0.99, +1.01] logits, no chance level." \
        in items


@pytest.mark.parametrize("parts, headings", [
    (dict(value=False, weights=False, dla=False), []),
    (dict(value=False, weights=True, dla=False), ["What heads move", "Copying heads"]),
    (dict(value=True, weights=False, dla=False), ["What heads move", "Value-weighted attention"]),
    (dict(value=False, weights=False, dla=True), ["What heads move", "Direct logit attribution"]),
])
def test_each_part_only_with_its_data(parts, headings):
    blocks = movement_section(compare_runs([tables(**parts)]), {}, Pngs())
    assert [b.text for b in blocks if isinstance(b, Heading)] == headings


def test_no_dla_part_for_a_bidirectional_model_alone():
    t = tables(value=False, weights=False, models={"bert": SHAPES["bert"]})
    assert movement_section(compare_runs([t]), {}, Pngs()) == []


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write(tables(), tmp_path_factory.mktemp("runs") / "moves")


def test_report_shows_the_section_once(written, tmp_path):
    out = report.write_report([written], tmp_path / "r")
    md, page = (out / "report.md").read_text(), (out / "index.html").read_text()
    assert '<h2 id="what-heads-move">What heads move</h2>' in page
    assert (out / "figures" / "value_weighted_sinks.png").is_file() and (out / "figures" / "copying.png").is_file()
    assert "### value (value.parquet)" not in md and "### weights (weights.parquet)" not in md
    assert "### dla" not in md[md.index("## Heatmaps"):md.index("## Top heads")]  # on its own scale, not 0-1
    section = page[page.index('id="what-heads-move"'):page.index('id="runs"')]
    assert section.count('<table class="sortable">') == 2


def test_show_says_why_a_model_has_no_copying_or_dla_scores():
    # bert's weights were not scored (the sweep recorded why): its copying rows are NaN, and a bidirectional
    # model has no dla rows at all; show prints gpt's heads and one line of reason for bert, not an empty table
    t = tables()
    weights = t["weights"]
    t.frames["weights"] = weights.assign(value=weights["value"].where(weights["model"] == "gpt"))
    why = "not scored: the checkpoint holds no trained LM head"
    t.provenance = RunProvenance(models=(ModelProvenance("gpt", family="causal"),
                                         ModelProvenance("bert", family="bidirectional", extra={"weights": why})))
    lines = top_heads_text(t, "copying", 1).splitlines()
    assert lines[0].split() == ["model", "label", "layer", "head", "value", "embedding"]
    assert lines[1].split()[:2] == ["gpt", "L0H1"] and lines[3:] == [f"bert: copying: {why}"]
    assert lines[2].startswith("columns | value: copying: ")
    assert top_heads_text(t, "dla", 1).splitlines()[3:] == [
        "bert: dla: an encoder has no next-token logit; NaN for every head"]


def test_show_and_atlas_on_a_run_with_value_weights_and_dla(written):
    runner = CliRunner()
    for metric in ("prev_token", "first_token", "dla", "copying"):
        result = runner.invoke(cli, ["show", str(written), "--metric", metric, "--top", "1"])
        assert result.exit_code == 0, result.output
    assert "L2H0" in runner.invoke(cli, ["show", str(written), "--metric", "dla", "--top", "1"]).output
    assert "untied" in runner.invoke(cli, ["show", str(written), "--metric", "copying", "--top", "1"]).output
    data = atlas.atlas_data(compare_runs([load(written)]))
    dla = next(m for m in data["metrics"] if m["name"] == "dla")
    assert dla["bounded"] is False  # in logits: not on the share scale
    assert {o["table"] for o in data["models"][0]["other"]} == {"value", "weights"}
