"""A run exported as a Hugging Face dataset folder: `datasets.load_dataset` reads every table back as headscan wrote
it, the card declares one config per table, and the folder rules of every other output hold."""

from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

import headscan
from headscan.cli import cli
from headscan.errors import HeadscanError
from headscan.tables import export_dataset


@pytest.fixture(scope="module")
def run(tiny_bert, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    headscan.sweep(str(tiny_bert), "builtin", out, limit=6, device="cpu", bootstrap=20)
    return out


def test_datasets_loads_every_table_of_the_export_as_headscan_wrote_it(run, tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = export_dataset(run, tmp_path / "dataset")
    card = (folder / "README.md").read_text()
    tables = headscan.load(run)
    for name in tables.frames:
        assert f"- config_name: {name}\n" in card and f"  data_files: data/{name}.parquet\n" in card
        # a cache of this test's own: datasets reads HF_DATASETS_CACHE once, at import, and a shared cache has given
        # back an earlier run's table for a folder of the same name
        loaded = datasets.load_dataset(str(folder), name, split="train", cache_dir=str(tmp_path / "cache")).to_pandas()
        want = pd.read_parquet(run / f"{name}.parquet")
        assert list(loaded.columns) == list(want.columns) and len(loaded) == len(want), name
        pd.testing.assert_series_equal(loaded["value"], want["value"], check_dtype=False, check_names=False)
    assert card.startswith("---\nlibrary_name: headscan\n") and "0-indexed" in card
    assert (folder / "run.json").read_text() == (run / "run.json").read_text()


def test_an_export_never_replaces_anything_but_an_export(run, tmp_path):
    export_dataset(run, tmp_path / "d")
    with pytest.raises(HeadscanError, match="already holds a dataset export; pass --overwrite"):
        export_dataset(run, tmp_path / "d")
    export_dataset(run, tmp_path / "d", overwrite=True)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(HeadscanError, match="notes.txt"):
        export_dataset(run, tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    with pytest.raises(HeadscanError, match="is the run itself"):
        export_dataset(run, run, overwrite=True)


def test_the_export_command_writes_the_folder_or_refuses_in_one_line(run, tmp_path):
    result = CliRunner().invoke(cli, ["export", str(run), "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "d" / "data" / "heads.parquet").is_file()
    again = CliRunner().invoke(cli, ["export", str(run), "--out", str(tmp_path / "d")])
    assert again.exit_code == 1 and len(again.output.strip().splitlines()) == 1 and "Traceback" not in again.output
    missing = CliRunner().invoke(cli, ["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "e")])
    assert missing.exit_code == 1 and len(missing.output.strip().splitlines()) == 1
