"""benchmarks/same_tables.py compare: two hand-written run folders, equal ones pass and one flipped bit of one
float fails naming its column; a row only one side has fails unless only what both have is compared."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "same_tables.py"


@pytest.fixture(scope="module")
def same_tables(load_script):
    return load_script(SCRIPT, "same_tables")


def heads() -> pd.DataFrame:
    return pd.DataFrame({"model": pd.array(["m"] * 4, dtype="string"), "family": pd.array(["causal"] * 4, "string"),
                         "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "label": ["L0H0", "L0H1", "L1H0", "L1H1"],
                         "kv_group": [0, 1, 0, 1], "metric": ["prev_token"] * 4,
                         "value": [0.25, 1 / 3, float("nan"), 0.9], "count": pd.array([3, 3, 0, 3], dtype="Int64"),
                         "verdict": ["finding", None, "too few units to assess", "finding"]})


def written(folder: Path, frame: pd.DataFrame, **run) -> Path:
    (folder / "sweep").mkdir(parents=True)
    frame.to_parquet(folder / "sweep" / "heads.parquet")
    (folder / "sweep" / "run.json").write_text(json.dumps({"seconds": 1.0, "config": {"seed": 0}, **run}))
    (folder / "pairs.jsonl").write_text('{"clean": "a"}\n')
    return folder


def test_equal_folders_pass_whatever_their_times(same_tables, tmp_path, capsys):
    before = written(tmp_path / "before", heads(), seconds=1.0)
    after = written(tmp_path / "after", heads(), seconds=7.5)
    assert same_tables.compare(before, after) == 0
    assert "sweep/heads.parquet: equal to the bit" in capsys.readouterr().out


def test_one_flipped_bit_fails_naming_its_column(same_tables, tmp_path, capsys):
    changed = heads()
    bits = changed["value"].to_numpy().copy().view(np.uint64)
    bits[1] ^= np.uint64(1)  # the last bit of 1/3's mantissa: 2.2e-17 away
    changed["value"] = bits.view(np.float64)
    before, after = written(tmp_path / "before", heads()), written(tmp_path / "after", changed)
    assert same_tables.compare(before, after) == 1
    out = capsys.readouterr().out
    assert "sweep/heads.parquet: DIFFERS" in out
    assert "value: 1 of 4 cells differ, largest difference 5.55e-17" in out
    assert "count:" not in out and "verdict:" not in out


def test_a_changed_word_or_setting_fails(same_tables, tmp_path, capsys):
    changed = heads()
    changed.loc[1, "verdict"] = "finding"
    before = written(tmp_path / "before", heads())
    after = written(tmp_path / "after", changed, config={"seed": 1})
    assert same_tables.compare(before, after) == 1
    out = capsys.readouterr().out
    assert "verdict: 1 of 4 cells differ" in out
    assert ".config.seed: 0 against 1" in out


def test_rows_only_one_side_has_fail_unless_only_what_both_have_is_compared(same_tables, tmp_path, capsys):
    more = pd.concat([heads(), heads().assign(metric="sink_ratio")], ignore_index=True)
    before, after = written(tmp_path / "before", heads()), written(tmp_path / "after", more.iloc[::-1])
    assert same_tables.compare(before, after) == 1
    assert same_tables.compare(before, after, common=True) == 0
    out = capsys.readouterr().out
    assert "4 rows only in after, by metric: sink_ratio 4" in out
    assert "all equal in what both have" in out


def test_a_run_one_side_could_not_write_is_named_with_why(same_tables, tmp_path, capsys):
    before, after = written(tmp_path / "before", heads()), written(tmp_path / "after", heads())
    (before / "patch").mkdir()
    (after / "patch.skipped").write_text("this headscan's `headscan patch` has no --path-top\n")
    assert same_tables.compare(before, after) == 1
    assert "patch: NOT COMPARED, not written by after: this headscan's `headscan patch` has no --path-top" \
        in capsys.readouterr().out


def test_an_option_the_command_lacks_is_found_before_it_runs(same_tables):
    from headscan.cli import cli

    assert same_tables.missing_options(cli.commands["patch"], ["-m", "x", "--path-top", "2", "--no-such"]) \
        == ["--no-such"]
