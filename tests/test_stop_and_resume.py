"""A sweep stopped part way says where it stopped, what it kept and what resuming sweeps again, and that is so.

The segments the model sees are counted independently of the sweep, by wrapping the batches it is handed: a
batch counts once the loop has asked for the next one (a batch the stop request interrupts never ran). The
stopped sweep's count must be the segment it says it stopped at, the resumed sweep's count the rest from the
segment it says it resumes from, and the resumed tables those of a sweep never stopped, bit for bit.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import paragraph_corpus, stop_after

import headscan.scan.reduce as reduce
from headscan.cli import cli
from headscan.errors import SweepInterrupted
from headscan.scan import partial_folder, sweep

SETTINGS = dict(device="cpu", bootstrap=20, batch_size=4, bootstrap_unit="segment")
SAID = re.compile(r"stopped while sweeping .* at segment (?P<at>\d+) of (?P<total>\d+)(?:, before its first window "
                  r"of --window \d+ segments ended|: the (?P<kept>\d+) segments of its \d+ finished windows? \(of "
                  r"\d+\) are kept in .*); (?P<again>run the same command (?:again|without --restart)) to resume "
                  r"from segment (?P<resume>\d+)(?: \(the (?P<redo>\d+) segments swept (?:so far|since) are swept "
                  r"again.*\))?$")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """160 short lines from the builtin sample."""
    return paragraph_corpus(tmp_path_factory.mktemp("corpus"), 160)


@pytest.fixture
def swept_segments(monkeypatch):
    """How many segments went through the model, counted from the batches the sweep is handed."""
    count = {"n": 0}
    real = reduce.batches

    def counting(encoded, *args):
        for batch in real(encoded, *args):
            yield batch
            count["n"] += len({encoded.segment_of(int(i)) for i in batch.index})  # the loop came back: it ran

    monkeypatch.setattr(reduce, "batches", counting)
    return count


@pytest.mark.parametrize("window", [256, 64], ids=["nothing-kept", "a-window-kept"])
def test_a_sweep_stopped_after_about_100_segments_resumes_where_it_says(window, tmp_path, tiny_bert, corpus_file,
                                                                        swept_segments, monkeypatch):
    settings = SETTINGS | {"window": window}
    whole = sweep(str(tiny_bert), corpus_file, tmp_path / "whole", **settings)
    total = swept_segments["n"]
    out = tmp_path / "stopped"
    swept_segments["n"] = 0
    with monkeypatch.context() as patched:
        patched.setattr("headscan.scan.run.stop_requests", stop_after(25))  # 25 batches of 4: segment 100
        with pytest.raises(SweepInterrupted) as stopped:
            sweep(str(tiny_bert), corpus_file, out, **settings)
    said = SAID.fullmatch(str(stopped.value))
    assert said, str(stopped.value)
    assert int(said["at"]) == swept_segments["n"] == 100 and int(said["total"]) == total
    resume_at = int(said["resume"])
    assert int(said["redo"] or 0) == 100 - resume_at  # what it says it sweeps again
    assert resume_at == int(said["kept"] or 0) == (0 if window == 256 else 64)
    assert not out.exists() and partial_folder(out).is_dir()

    swept_segments["n"] = 0
    resumed = sweep(str(tiny_bert), corpus_file, out, **settings)
    assert swept_segments["n"] == total - resume_at  # nothing before the segment it said it resumes from
    for name in whole.frames:
        pd.testing.assert_frame_equal(resumed[name], whole[name], check_exact=True)
    assert not partial_folder(out).exists()


def test_after_restart_the_advice_is_never_restart_again(tmp_path, tiny_bert, corpus_file, monkeypatch):
    out = tmp_path / "out"
    arguments = ["sweep", "-m", str(tiny_bert), "-c", str(corpus_file), "--out", str(out), "-q", "--device", "cpu",
                 "--bootstrap", "20", "--batch-size", "4", "--window", "16", "--restart"]
    monkeypatch.setattr("headscan.scan.run.stop_requests", stop_after(10))
    result = CliRunner().invoke(cli, arguments)
    assert result.exit_code == 130, result.output
    line = result.output.strip().splitlines()[-1]
    said = SAID.fullmatch(line.removeprefix("Interrupted: "))
    assert said and said["again"] == "run the same command without --restart", line
    assert int(said["resume"]) == int(said["kept"]) > 0


def test_a_retrieval_run_stopped_after_restart_is_not_told_to_restart_again(tmp_path, monkeypatch):
    from conftest import planted_needles

    planted = planted_needles(tmp_path / "planted")
    arguments = ["retrieval", "-m", planted["folder"], "-c", planted["haystack"], "--needles", planted["needles"],
                 "--lengths", "160", "--depths", "0,0.5,1", "--bootstrap", "20", "--out", str(tmp_path / "out"),
                 "-q", "--restart"]
    monkeypatch.setattr("headscan.scan.trials.stop_requests", stop_after(2))
    result = CliRunner().invoke(cli, arguments)
    assert result.exit_code == 130, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Interrupted: stopped while scoring") and "2 trials kept" in line, line
    assert line.endswith("run the same command without --restart to resume"), line
