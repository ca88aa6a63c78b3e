"""The table registry and the tables object: a new table needs no change elsewhere; wide(); old runs still load."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import headscan
from headscan import config, metrics, tables
from headscan.errors import MetricError, TablesError
from headscan.scan import sweep, sweep_model
from headscan.tables import RunProvenance
from headscan.tables.schema import ADDED_LATER

REPO = Path(__file__).resolve().parents[1]
V01_RUN = Path(__file__).parent / "data" / "run-v0.1.json"


@pytest.fixture()
def toy_table():
    """A table keyed by (metric, half) and one metric in it, registered for one test and then removed."""

    def halves(batch):
        """Mean attention on keys in the first half (half 0) and the second half (half 1) of the segment."""
        n = batch.key_mask.sum(-1, keepdim=True)  # (batch, 1) real length
        position = torch.arange(batch.pattern.shape[-1])[None, :]  # (1, k)
        first = (position < (n + 1) // 2) & batch.key_mask  # (batch, k)
        second = ~first & batch.key_mask
        parts = [(batch.masked * keys[:, None, None, :]).sum(-1) for keys in (first, second)]  # (batch, head, q) each
        valid = batch.query_mask[:, None, :, None]  # (batch, 1, q, 1)
        stacked = torch.stack(parts, -1)  # (batch, head, q, half)
        sums = torch.where(valid, stacked, torch.zeros(())).sum(2)  # (batch, head, half)
        counts = valid.sum(2).to(sums.dtype).expand_as(sums)
        return sums, counts

    tables.register_table("toy", {"metric": "string", "half": "int64"}, "one row per (model, layer, head, metric, half)")
    metrics.register("toy_halves", table="toy", axis=metrics.Axis(("half",), lambda config: [(0,), (1,)]))(halves)
    yield
    del metrics.METRICS["toy_halves"], tables.TABLES["toy"]


def test_a_table_whose_columns_clash_with_the_shared_ones_is_refused():
    for keys, extra in (({"value": "float64"}, None), ({"layer": "int64"}, None), ({"half": "int64"}, {"ci_low": "float64"}),
                        ({"half": "int64"}, {"half": "int64"})):
        with pytest.raises(TablesError, match="clash with the shared columns or each other"):
            tables.register_table("clashing", keys, "one row per nothing", extra)
        assert "clashing" not in tables.TABLES


def test_a_registered_table_is_swept_written_loaded_and_combined(toy_table, tiny_models, tiny_bert, tmp_path):
    out = tmp_path / "out"
    swept = sweep([str(tiny_bert)], "builtin", out, headscan.SweepConfig(device="cpu", limit=6, bootstrap=20))
    toy = swept["toy"]
    assert list(toy.columns) == list(tables.TABLES["toy"].columns)
    assert len(toy) == 2 * 4 * 2  # layers x heads x halves
    # every real query's attention lies in one half or the other: the two halves add up to 1
    per_head = toy.groupby(["layer", "head"])["value"].sum()
    assert per_head.between(1 - 1e-5, 1 + 1e-5).all()
    assert (toy["ci_low"] <= toy["value"] + 1e-12).all()
    loaded = tables.load(out)
    assert set(loaded.frames) == set(swept.frames) >= {"heads", "offsets", "toy"}
    pd.testing.assert_frame_equal(loaded["toy"], toy)
    corpus = headscan.corpus.read_corpus("builtin", limit=6)
    parts = [sweep_model(tiny_models["bert"], headscan.corpus.Corpus("h", "text", "", corpus.segments[i:i + 3]),
                         headscan.SweepConfig(device="cpu", bootstrap=0)) for i in (0, 3)]
    combined = tables.merge_tables(parts)["toy"]
    pd.testing.assert_series_equal(combined["sum"], toy["sum"], atol=1e-9, rtol=0)
    assert combined["ci_low"].isna().all()  # intervals cannot be combined from tables


def test_a_metric_must_fill_its_table_s_keys():
    def bad(batch):
        """A definition."""

    with pytest.raises(MetricError, match=r"table 'offsets' is keyed by \['offset'\] beyond the metric"):
        metrics.register("bad", table="offsets")(bad)
    with pytest.raises(MetricError, match="no table 'nowhere'"):
        metrics.register("bad", table="nowhere")(bad)
    assert "bad" not in metrics.METRICS
    with pytest.raises(TablesError, match="registered twice"):
        tables.register_table("heads", {"metric": "string"}, "again")


@pytest.fixture(scope="module")
def committed_ewt():
    return tables.load(REPO / "reports" / "runs" / "ewt-dev")


def test_wide_has_one_row_per_head(committed_ewt):
    wide = committed_ewt.wide()
    # Every swept model, controls included (each control has its model's heads): minilm's 72, smollm2's 270,
    # each with five random-init controls and a shuffled-words control.
    assert len(wide) == 7 * (6 * 12 + 30 * 9) == 2394
    assert len(wide) == len(committed_ewt.heads[list(tables.HEAD_COLUMNS)].drop_duplicates())
    trained = wide[[config.split_control(m)[1] is None for m in wide["model"]]]
    assert len(trained) == 6 * 12 + 30 * 9 == 342
    assert list(wide.columns[:6]) == list(tables.HEAD_COLUMNS)
    assert list(wide.columns[6:]) == list(dict.fromkeys(committed_ewt.heads["metric"]))
    minilm = tables.SweepTables({"heads": committed_ewt.heads[committed_ewt.heads["model"] == "minilm"]}).wide()
    assert len(minilm) == 72
    row = committed_ewt.heads.query("model == 'smollm2' and label == 'L16H0' and metric == 'prev_token'").iloc[0]
    assert wide.query("model == 'smollm2' and label == 'L16H0'")["prev_token"].item() == row["value"]
    assert wide["model"].tolist()[:72] == ["minilm"] * 72  # the run's model order, not alphabetical


LATER = list(ADDED_LATER)


def test_a_v0_1_run_json_still_loads(tmp_path, committed_ewt):
    run = RunProvenance.from_json(json.loads(V01_RUN.read_text()))
    assert run.schema_version == 1 and run.headscan_version == "0.1.0"
    assert [m.name for m in run.models] == ["minilm", "smollm2"]
    assert run.model("smollm2").n_kv_heads == 3 and run.model("minilm").has_sep
    assert run.corpus.kind == "conllu" and run.config["bootstrap"] == 200
    # A v0.1 folder: its tables without the support columns, stamped (as v0.1 did) with the run.json of no run id.
    folder = tmp_path / "old"
    folder.mkdir()
    shutil.copy(V01_RUN, folder / "run.json")
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name in ("heads", "offsets"):
        frame = committed_ewt[name].drop(columns=LATER)  # v0.1 wrote none of the columns added since
        table = pa.Table.from_pandas(frame, preserve_index=False)
        stamp = {**(table.schema.metadata or {}), b"headscan": V01_RUN.read_bytes()}
        pq.write_table(table.replace_schema_metadata(stamp), folder / f"{name}.parquet")
    loaded = tables.load(folder)
    assert loaded.provenance == run
    assert loaded.heads["units"].isna().all() and not tables.thin_rows(loaded.heads).any()  # not recorded then
    pd.testing.assert_frame_equal(loaded.heads.drop(columns=LATER), committed_ewt.heads.drop(columns=LATER))
    assert RunProvenance.from_json(run.to_json()) == run


@pytest.mark.parametrize("code", [
    "import headscan",
    "import headscan.cli, sys; sys.argv = ['headscan', '--help']\ntry: headscan.cli.cli()\nexcept SystemExit: pass",
    "import headscan; headscan.load",
])
def test_importing_headscan_imports_neither_torch_nor_transformers(code):
    check = "\nimport sys; heavy = {'torch', 'transformers'} & set(sys.modules); assert not heavy, heavy"
    result = subprocess.run([sys.executable, "-c", code + check], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
