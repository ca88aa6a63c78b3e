"""Sweeps of part of a model's layers (--layers): merged with a sweep of the other layers, every table is the whole
sweep's to the bit; run.json records the layers; overlapping or foreign runs and bad specs are refused in one line."""

import json

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import treebank_corpus

from headscan import tables
from headscan.cli import cli
from headscan.config import SweepConfig
from headscan.errors import ConfigError, TablesError
from headscan.scan import PartialState, merge, sweep

# syntax (a treebank), value weighting and dla (values on), examples, composition (auto: the tiny GPT-2's heads)
CONFIG = dict(device="cpu", max_len=24, bootstrap=20, window=4, batch_size=4, bootstrap_unit="document")


@pytest.fixture(scope="module")
def parts(tmp_path_factory, tiny_gpt2, tiny_bert):
    root = tmp_path_factory.mktemp("layers")
    corpus = treebank_corpus(root, 12)
    models = [str(tiny_gpt2), str(tiny_bert)]  # two layers each: layer 0, and the rest
    whole = sweep(models, corpus, root / "whole", **CONFIG)
    first = sweep(models, corpus, root / "first", layers="0", **CONFIG)
    rest = sweep(models, corpus, root / "rest", layers="1", **CONFIG)
    return root, corpus, models, whole, first, rest


def test_layer_0_merged_with_the_rest_equals_the_whole_sweep_to_the_bit(parts):
    root, _, _, whole, first, rest = parts
    assert set(first.heads["layer"]) == {0} and set(rest.heads["layer"]) == {1}
    merged = merge([root / "rest", root / "first"], root / "merged")  # in either order
    assert list(merged.frames) == list(whole.frames)
    assert {"heads", "value", "syntax", "offsets", "positions", "weights", "examples", "composition"} <= set(whole.frames)
    for name in whole.frames:
        pd.testing.assert_frame_equal(merged[name], whole[name], check_exact=True, obj=name)
    # the findings were tested again over the whole family, not concatenated from the parts
    assert merged.provenance.extra["findings"] == whole.provenance.extra["findings"]
    assert merged.provenance.config["layers"] is None
    assert "layers" not in merged.provenance.models[0].extra


def test_a_part_holds_its_layers_rows_and_run_json_records_its_layers(parts):
    root, _, models, whole, first, rest = parts
    for name in ("heads", "value", "syntax", "examples", "weights"):
        expected = whole[name][whole[name]["layer"] == 0].reset_index(drop=True)
        assert len(first[name]) == len(expected) > 0
        keys = ["model", "layer", "head"]
        pd.testing.assert_frame_equal(first[name][keys].reset_index(drop=True), expected[keys])
    # a pattern metric of one layer is that layer's whole-sweep value
    pd.testing.assert_series_equal(first.heads["value"].reset_index(drop=True),
                                   whole.heads[whole.heads["layer"] == 0]["value"].reset_index(drop=True),
                                   check_exact=True)
    # composition: the rows whose receiver it swept (layer 0 receives from no earlier layer), read off the whole
    # model's weights, its sources in the layers it did not sweep
    assert first.frames.get("composition", pd.DataFrame()).empty
    assert set(rest["composition"]["layer"]) == {1} and set(rest["composition"]["source_layer"]) == {0}
    run = json.loads((root / "first" / "run.json").read_text())
    assert run["config"]["layers"] == [0]
    assert [m["layers"] for m in run["models"]] == [[0], [0]]
    assert tables.load(root / "first").provenance.config["layers"] == [0]
    state = PartialState.load(next((root / "first" / "state").iterdir()))
    assert state.fingerprint["settings"]["layers"] == [0] and state.layers == (0,)


def test_merge_refuses_overlapping_layers_naming_the_runs_and_layers(parts, tmp_path):
    root, corpus, models, *_ = parts
    sweep(models, corpus, tmp_path / "both", layers="0-1", **CONFIG)
    with pytest.raises(TablesError) as refused:
        merge([root / "first", tmp_path / "both"])
    message = str(refused.value)
    assert str(tmp_path / "both") in message and str(root / "first") in message and "layer 0" in message
    assert "--layers 0-1" in message


def test_merge_refuses_layers_of_another_sweep_naming_what_differs(parts, tmp_path):
    root, corpus, models, *_ = parts
    sweep(models, corpus, tmp_path / "other", layers="1", **(CONFIG | {"max_offset": 3}))
    with pytest.raises(TablesError, match=r"not a sweep of other layers of the same model.*max_offset: 8 != 3"):
        merge([root / "first", tmp_path / "other"])


def test_a_bad_layer_spec_is_one_line_naming_the_flag_and_the_layer_count(tiny_gpt2, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    common = ["sweep", "-m", str(tiny_gpt2), "-c", "builtin", "--bootstrap", "0", "-q", "--out", "out"]
    result = runner.invoke(cli, [*common, "--layers", "0,5-7"])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output == (f"Error: --layers 0,5-7: {tiny_gpt2} has 2 layers (0-1); layers 5-7 out of range\n")
    result = runner.invoke(cli, [*common, "--layers", "3-1"])
    assert result.exit_code == 1 and result.output == (
        "Error: --layers must be layer numbers from 0 and ranges A-B with A <= B, separated by commas (e.g. 0,5-7); "
        "got '3-1'\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("spec, expected", [("0,5-7", (0, 5, 6, 7)), ("7, 1-2", (1, 2, 7)), ([4, 0], (0, 4))])
def test_layer_specs_parse_to_sorted_layers(spec, expected):
    assert SweepConfig(layers=spec).layers == expected


@pytest.mark.parametrize("spec", ["", "a", "1-", "-1", "2-1", "0,0-3", "1.5"])
def test_malformed_layer_specs_are_refused(spec):
    with pytest.raises(ConfigError, match="^layers must be layer numbers"):
        SweepConfig(layers=spec)


@pytest.mark.parametrize("setting", [{"importance": "atp"}, {"similarity_sample": 4}])
def test_settings_that_relate_every_layer_are_refused_with_layers(setting):
    with pytest.raises(ConfigError, match="cannot be swept on a part of the layers; sweep it without --layers"):
        SweepConfig(layers="0", **setting)


def test_the_report_says_which_layers_a_part_swept(parts):
    from headscan.analysis.runs import compare_runs, model_shapes
    from headscan.report.build import build_report
    from headscan.report.document import to_markdown

    root, *_ = parts
    comparison = compare_runs([tables.load(root / "first")])
    assert set(model_shapes(comparison)["layers"]) == {"2 (swept: 0)"}
    markdown = to_markdown(build_report(comparison, top=2))
    assert "Swept on part of their layers (--layers)" in markdown and "layers 0 of 2" in markdown


def test_join_layers_puts_every_array_of_each_part_at_its_layers():
    """States of layers (0, 2) and (1,) of a three-layer model, cut by hand from one whole state: joined, every array
    is the whole state's (numpy's own slicing is the reference), whatever order the parts come in."""
    import numpy as np

    from headscan.config import SweepConfig
    from headscan.scan.passes.weights import WeightsState
    from headscan.scan.state import join_layers
    from headscan.setting import fingerprinted

    rng = np.random.default_rng(0)
    settings = {name: None for name in fingerprinted(SweepConfig)}
    fingerprint = {"model": {"name": "m"}, "corpus": {"sha256": "0" * 64}, "settings": settings, "columns": [["x", []]]}
    axes = {"sums": 0, "counts": 0, "chance": 0, "replicate_sums": 1, "replicate_counts": 1, "moments": 1,
            "replicate_power": 2}
    shapes = {"sums": (3, 2, 4), "counts": (3, 2, 4), "chance": (3, 2, 4), "replicate_sums": (5, 3, 2, 4),
              "replicate_counts": (5, 3, 2, 4), "moments": (7, 3, 2, 4), "replicate_power": (3, 5, 3, 2, 4)}
    whole = {name: rng.normal(size=shape) for name, shape in shapes.items()}
    copying = rng.normal(size=(1, 3, 2))

    def part(layers):
        state = PartialState({**fingerprint, "settings": {**settings, "layers": list(layers)}}, None,
                             **{name: np.take(array, layers, axes[name]) for name, array in whole.items()},
                             finished=True, model={"name": "m", "n_layers": 3, "layers": list(layers)},
                             n_segments=9, n_tokens=90, seconds=1.0,
                             passes={"weights": WeightsState(copying[:, layers], "tied", "note")})
        return state

    for order in ([(0, 2), (1,)], [(1,), (0, 2)]):
        joined = join_layers([part(list(layers)) for layers in order], ["a", "b"])
        for name, array in whole.items():
            np.testing.assert_array_equal(getattr(joined, name), array, err_msg=name)
        np.testing.assert_array_equal(joined.passes["weights"].scores, copying)
        assert joined.layers == (0, 1, 2) and joined.fingerprint["settings"]["layers"] is None
        assert "layers" not in joined.model and joined.n_segments == 9 and joined.seconds == 2.0
    with pytest.raises(TablesError, match=r"^b and a both swept layer 2 \(--layers 1-2 and 0,2\); merge runs of "
                                          r"disjoint layers$"):
        join_layers([part([0, 2]), part([1, 2])], ["a", "b"])
