"""The figure functions: each draws what its table says, checked on the matplotlib objects, never on pixels."""

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

from headscan.metrics import METRICS as METRICS_REGISTRY
from headscan.metrics import describe
from headscan.plots import heatmaps as figures
from headscan.plots import profiles as charts
from headscan.plots.style import SHARE_CMAP

METRICS = ["prev_token", "next_token", "self", "entropy", "entropy_norm", "distance", "positional_prev"]


def value(model, metric, layer, head):
    """Known, distinct values: shares in [0, 1], entropy and distance larger."""
    if metric == "entropy":
        return 0.5 + layer + 0.25 * head
    if metric == "entropy_norm":
        return 0.9 - 0.2 * layer - 0.1 * head
    if metric == "distance":
        return 1.0 + 2 * head + layer
    if metric == "next_token" and model == "gpt":
        return 0.0
    return round(((layer * 5 + head * 3 + len(metric)) % 11) / 10, 2)


def make_heads(models=(("gpt", "causal", 2, 3), ("bert", "bidirectional", 2, 4))):
    rows = []
    for model, family, n_layers, n_heads in models:
        for layer in range(n_layers):
            for head in range(n_heads):
                for metric in METRICS:
                    v = value(model, metric, layer, head)
                    width = 0.3 if (layer, head) == (1, 0) else 0.02  # one head has a wide interval
                    rows.append(dict(model=model, family=family, layer=layer, head=head, label=f"L{layer}H{head}",
                                     kv_group=head, metric=metric, value=v, ci_low=v - width / 2,
                                     ci_high=v + width / 2))
    return pd.DataFrame(rows)


def make_offsets():
    rows = []
    for model, family, n_layers, n_heads in (("gpt", "causal", 2, 3),):
        for layer in range(n_layers):
            for head in range(n_heads):
                for offset in range(-8, 9):
                    v = 0.5 ** abs(offset + head)  # head h peaks at offset -h
                    rows.append(dict(model=model, family=family, layer=layer, head=head, label=f"L{layer}H{head}",
                                     offset=offset, value=v, ci_low=v - 0.01, ci_high=v + 0.01))
    return pd.DataFrame(rows)


def test_heatmap_cells_are_the_pivoted_table():
    heads = make_heads()
    ax = figures.head_heatmap(heads, model="bert", metric="prev_token")
    expected = np.array([[value("bert", "prev_token", layer, head) for head in range(4)] for layer in range(2)])
    np.testing.assert_allclose(np.asarray(ax.collections[0].get_array()).reshape(2, 4), expected)
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1"]  # layers are rows, layer 0 first
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "3"]
    assert ax.get_title() == "bert: prev_token"


def test_heatmap_annotates_the_strongest_heads_with_their_value():
    heads = make_heads()
    ax = figures.head_heatmap(heads, model="bert", metric="prev_token", annotate_top=2)
    rows = heads[(heads.model == "bert") & (heads.metric == "prev_token")]
    top = rows.sort_values(["value", "layer", "head"], ascending=[False, True, True]).head(2)
    assert [t.get_text() for t in ax.texts] == [f"{v:.2f}" for v in top["value"]]
    # Each number sits in its head's cell: x is head + 0.5, y is layer + 0.5.
    assert [t.get_position() for t in ax.texts] == [(head + 0.5, layer + 0.5) for layer, head in zip(top["layer"], top["head"])]


def test_heatmap_shares_use_one_0_1_scale_and_unbounded_metrics_their_own():
    heads = make_heads()
    share = figures.head_heatmap(heads, model="gpt", metric="self", ax=Figure().subplots())
    assert share.collections[0].get_clim() == (0.0, 1.0)
    assert share.collections[0].cmap.name.startswith(SHARE_CMAP)
    entropy = figures.head_heatmap(heads, model="gpt", metric="entropy", ax=Figure().subplots())
    assert entropy.collections[0].get_clim() == (0.0, value("gpt", "entropy", 1, 2))
    assert not entropy.collections[0].cmap.name.startswith(SHARE_CMAP)



@pytest.mark.parametrize("metric, label", [
    ("self", "share of attention"),
    ("entropy", "nats"),
    ("entropy_norm", "fraction of the largest possible entropy"),  # bounded, but not a share of attention
    ("positional_prev", "share of queries"),
    ("distance", "tokens"),
])
def test_heatmap_colour_bar_is_labelled_with_the_metric_s_unit(metric, label):
    ax = figures.head_heatmap(make_heads(), model="gpt", metric=metric, ax=Figure().subplots())
    assert " ".join(ax.collections[0].colorbar.ax.get_ylabel().split()) == label  # wrapped when long


def test_heatmap_annotates_the_lowest_heads_where_low_is_striking():
    heads = make_heads()
    entropy = figures.head_heatmap(heads, model="bert", metric="entropy", annotate_top=2, ax=Figure().subplots())
    # bert's entropy is 0.5 + layer + 0.25 head: the most focused heads are L0H0 (0.5) and L0H1 (0.75).
    assert [t.get_text() for t in entropy.texts] == ["0.50", "0.75"]
    assert [t.get_position() for t in entropy.texts] == [(0.5, 0.5), (1.5, 0.5)]
    norm = figures.head_heatmap(heads, model="bert", metric="entropy_norm", annotate_top=1, ax=Figure().subplots())
    assert [(t.get_text(), t.get_position()) for t in norm.texts] == [("0.40", (3.5, 1.5))]  # L1H3: 0.9 - 0.2 - 0.3


def test_heatmap_of_a_constant_metric_annotates_nothing():
    ax = figures.head_heatmap(make_heads(), model="gpt", metric="next_token")
    assert len(ax.texts) == 0


def test_heatmap_leaves_undefined_cells_empty():
    heads = make_heads()
    heads.loc[(heads.model == "gpt") & (heads.metric == "self") & (heads.layer == 0) & (heads["head"] == 1), "value"] = np.nan
    cells = np.ma.masked_invalid(figures.head_heatmap(heads, model="gpt", metric="self").collections[0].get_array())
    assert cells.reshape(2, 3).mask[0, 1] and cells.mask.sum() == 1


def test_heatmap_names_what_is_available_when_nothing_matches():
    with pytest.raises(ValueError, match="model='nope'.*'bert', 'gpt'"):
        figures.head_heatmap(make_heads(), model="nope", metric="self")


def test_heatmap_refuses_two_runs_of_one_model():
    heads = make_heads()
    with pytest.raises(ValueError, match="several rows per"):
        figures.head_heatmap(pd.concat([heads, heads]), model="gpt", metric="self")


def test_heatmap_draws_on_the_axes_it_is_given():
    ax = Figure().subplots()
    assert figures.head_heatmap(make_heads(), model="gpt", metric="self", ax=ax) is ax


def test_attention_matrix_shows_the_pattern_with_tokens_as_ticks():
    tokens = ["The", "cat", "$", "sat"]
    pattern = np.tril(np.ones((4, 4)))
    pattern /= pattern.sum(axis=1, keepdims=True)
    ax = figures.attention_matrix(tokens, pattern, title="gpt L0H1", causal=True)
    cells = ax.collections[0].get_array()
    # Causal: the keys after the query are blank (masked), the rest is the pattern.
    assert cells.mask.reshape(4, 4).tolist() == np.triu(np.ones((4, 4), bool), k=1).tolist()
    np.testing.assert_allclose(cells.filled(np.nan).reshape(4, 4)[np.tril_indices(4)], pattern[np.tril_indices(4)])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["The", "cat", r"\$", "sat"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["The", "cat", r"\$", "sat"]
    assert ax.collections[0].get_clim() == (0.0, 1.0)
    assert ax.get_title() == "gpt L0H1" and "query" in ax.get_ylabel() and "key" in ax.get_xlabel()


def test_attention_matrix_bidirectional_is_the_full_square():
    pattern = np.full((3, 3), 1 / 3)
    ax = figures.attention_matrix(["a", "b", "c"], pattern, causal=False)
    assert not np.ma.getmaskarray(ax.collections[0].get_array()).any()


def test_attention_matrix_checks_the_shape():
    with pytest.raises(ValueError, match=r"shape \(2, 3\).*3 tokens"):
        figures.attention_matrix(["a", "b", "c"], np.zeros((2, 3)))


def test_offset_profiles_draw_one_line_per_head():
    offsets = make_offsets()
    ax = charts.offset_profiles(offsets, model="gpt", heads=["L0H2", "L1H0"])
    assert [line.get_label() for line in ax.lines[:2]] == ["L0H2", "L1H0"]
    for line, (layer, head) in zip(ax.lines, [(0, 2), (1, 0)]):
        expected = offsets[(offsets.layer == layer) & (offsets["head"] == head)].sort_values("offset")
        np.testing.assert_allclose(line.get_xydata(), expected[["offset", "value"]].to_numpy())
    assert ax.get_xlabel().startswith("offset") and ax.get_ylabel() == "mean attention"
    assert ax.get_ylim() == (0, 1.02)


def test_prev_next_scatter_points_are_the_scores():
    heads = make_heads()
    ax = charts.prev_next_scatter(heads)
    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    wide = {model: heads[heads.model == model].pivot(index=["layer", "head"], columns="metric", values="value")
            for model in ("gpt", "bert")}
    np.testing.assert_allclose(points[1].get_offsets(), wide["bert"][["prev_token", "next_token"]].to_numpy())
    # The causal model cannot look ahead: its points go to a strip below the axis, x its scores, y jittered.
    np.testing.assert_allclose(points[0].get_offsets()[:, 0], wide["gpt"]["prev_token"].to_numpy())
    ys = points[0].get_offsets()[:, 1]
    assert (ys < -0.04).all() and (ys > -0.13).all() and len(set(ys)) == len(ys)
    assert ax.get_ylim()[0] < -0.12
    assert ax.get_xlabel().startswith("prev_token") and ax.get_ylabel().startswith("next_token")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "gpt (causal), next_token 0 for every head", "bert (bidirectional)",
        "x + y = 1: all attention on the two neighbours\n(no head can lie above it)"]


def test_prev_next_scatter_without_a_flat_model_keeps_the_axis():
    heads = make_heads(models=(("bert", "bidirectional", 2, 4),))
    ax = charts.prev_next_scatter(heads)
    assert ax.get_ylim() == (-0.02, 1.02)


def test_prev_next_scatter_shows_only_wide_intervals():
    heads = make_heads()
    ax = charts.prev_next_scatter(heads, ci_threshold=0.1)
    bars = [c for c in ax.collections if not isinstance(c, PathCollection)]
    # L1H0 of each model has the one wide interval; its error bars, and no others, are drawn.
    segments = [s for c in bars for s in c.get_segments()]
    assert segments and all(np.ptp(s[:, 0]) + np.ptp(s[:, 1]) == pytest.approx(0.3) for s in segments)
    assert charts.prev_next_scatter(heads, ci_threshold=1.0, ax=Figure().subplots()).collections[2:] == []


def test_prev_next_scatter_keeps_given_colours():
    palette = {"gpt": (1.0, 0.0, 0.0), "bert": (0.0, 0.0, 1.0)}
    ax = charts.prev_next_scatter(make_heads(), palette=palette)
    np.testing.assert_allclose(ax.collections[0].get_facecolor()[0][:3], palette["gpt"])
    np.testing.assert_allclose(ax.collections[1].get_facecolor()[0][:3], palette["bert"])


def test_entropy_by_depth_lines_are_layer_means_at_relative_depth():
    heads = make_heads(models=(("gpt", "causal", 3, 3), ("bert", "bidirectional", 2, 4)))
    ax = charts.entropy_by_depth(heads)
    for line, model, n_layers, n_heads in zip(ax.lines, ["gpt", "bert"], [3, 2], [3, 4]):
        means = [np.mean([value(model, "entropy", layer, h) for h in range(n_heads)]) for layer in range(n_layers)]
        # layer / (layers - 1): both models run from 0 (first layer) to 1 (last), whatever their depth
        np.testing.assert_allclose(line.get_xydata(), np.column_stack([means, np.linspace(0, 1, n_layers)]))
    assert ax.get_ylabel().startswith("relative depth") and ax.get_xlabel() == "entropy (nats)"
    assert ax.get_ylim()[0] > ax.get_ylim()[1]  # the first layer at the top, as in the heatmaps


def test_offset_profiles_shade_each_interval():
    offsets = make_offsets()
    ax = charts.offset_profiles(offsets, model="gpt", heads=["L0H2", "L1H0"])
    bands = ax.collections
    assert len(bands) == 2 and all(band.get_alpha() == pytest.approx(0.3) for band in bands)
    line = offsets[(offsets.layer == 0) & (offsets["head"] == 2)]
    vertices = bands[0].get_paths()[0].vertices[:, 1]
    assert vertices.min() == pytest.approx(line.ci_low.min()) and vertices.max() == pytest.approx(line.ci_high.max())


def test_difference_heatmap_centres_on_zero_and_marks_intervals_apart():
    rows = pd.DataFrame({"metric": "prev_token", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                         "label": ["L0H0", "L0H1", "L1H0", "L1H1"], "difference": [0.2, -0.1, 0.0, np.nan],
                         "apart": [True, False, False, False]})
    ax = figures.difference_heatmap(rows, metric="prev_token")
    mesh = ax.collections[0]
    np.testing.assert_allclose(mesh.get_array().reshape(2, 2), [[0.2, -0.1], [0.0, np.nan]])
    assert mesh.norm.vmin == pytest.approx(-0.2) and mesh.norm.vmax == pytest.approx(0.2)
    assert [(t.get_text(), t.get_position()) for t in ax.texts] == [("\u2022", (0.5, 0.5))]


def test_bounds_and_unit_follow_the_registry():
    assert describe("entropy_norm").bounded and not describe("entropy").bounded
    assert all(describe(name) is metric for name, metric in METRICS_REGISTRY.items())
    assert describe("not_a_metric").bounded and describe("not_a_metric").unit == "value"  # another headscan's run
