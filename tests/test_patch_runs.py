"""``headscan patch`` as a run that keeps its word, on the planted circuit (`headscan.testing.circuit`):

- stopped by a real SIGINT in the middle of the head patches or of the paths, it keeps its finished steps in
  OUT.partial/, writes no OUT, says how to resume; the same call resumes from the kept steps to tables equal to
  an uninterrupted run's to the bit; other settings are refused naming --restart;
- a run of two models stopped between them keeps the first one's tables, and resumes without patching it again;
- the progress bar moves once per head patched (and once per path), not once per batch;
- path candidates are chosen on pairs the paths are not estimated on (the odd lines of the file, or a selection
  file), shown by pairs that carry nothing on one side; q-values are scipy's Benjamini-Hochberg of the p-values;
- ``units`` counts a pair whose corrupted prompt has the larger logit difference.
"""

import os
import signal

import numpy as np
import pandas as pd
import pytest
from scipy.stats import false_discovery_control
from transformers import AutoTokenizer

import headscan
from headscan.corpus.pairs import Pair, generate_pairs
from headscan.errors import SweepInterrupted, TablesError
from headscan.scan import patch_steps
from headscan.scan.patching import patch
from headscan.scan.resume import spec_stem
from headscan.testing.circuit import build_circuit_checkpoint


@pytest.fixture(scope="module")
def circuit(tmp_path_factory):
    path, _ = build_circuit_checkpoint(tmp_path_factory.mktemp("circuit") / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    single = lambda word: len(tokenizer(word)["input_ids"]) == 1  # noqa: E731
    return str(path), generate_pairs("induction", 8, seed=2, single_token=single)


SETTINGS = dict(device="cpu", path_top=3, position_top=2, bootstrap=50, batch_size=2)


@pytest.fixture(scope="module")
def whole(circuit):
    path, pairs = circuit
    return patch(path, pairs, **SETTINGS)


def _interrupting(monkeypatch, name: str, after: int) -> None:
    """`patch_steps.NAME` sends this process a real SIGINT on its `after`-th call (Ctrl-C while that step runs)."""
    original, calls = getattr(patch_steps, name), {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == after:
            os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(patch_steps, name, wrapped)


@pytest.mark.parametrize("name, after", [("patch_layer", 3), ("patch_layer", 35), ("patch_sender", 2)],
                         ids=["heads", "positions", "paths"])
def test_a_run_stopped_by_sigint_resumes_to_the_same_tables(circuit, whole, tmp_path, monkeypatch, name, after):
    path, pairs = circuit
    out = tmp_path / "out"
    _interrupting(monkeypatch, name, after)
    with pytest.raises(SweepInterrupted, match=r"steps kept in .*out\.partial; run the same command again to resume"):
        patch(path, pairs, out, **SETTINGS)
    monkeypatch.undo()
    assert not out.exists()  # nothing published, only the kept steps
    kept = out.with_name("out.partial") / f"patch-{spec_stem(path)}.jsonl"
    assert len(kept.read_text().splitlines()) > 2  # the fingerprint and the steps finished before the stop
    with pytest.raises(TablesError, match="--restart"):  # other settings: refused, naming what differs
        patch(path, pairs, out, **(SETTINGS | {"attribution": False}))
    resumed = patch(path, pairs, out, **SETTINGS)
    assert resumed.provenance.models[0].extra["patching"]["steps_resumed"] > 0
    for table in ("patching", "paths"):
        pd.testing.assert_frame_equal(resumed[table], whole[table], check_exact=True)
    assert not out.with_name("out.partial").exists()
    assert headscan.load(out)["paths"].equals(whole["paths"])


def test_a_run_of_two_models_stopped_between_them_resumes_from_the_first_ones_tables(circuit, whole, tmp_path,
                                                                                      monkeypatch, capsys):
    import contextlib
    import shutil

    path, pairs = circuit
    copy = str(shutil.copytree(path, tmp_path / "copy"))  # the same weights under another name: the same numbers
    out = tmp_path / "out"
    finished = out.with_name("out.partial") / f"job-patch-{spec_stem(path)}.json"
    # a stop requested once the first model's tables are kept, as a Ctrl-C would be just then
    monkeypatch.setattr("headscan.scan.runner.stop_requests", lambda: contextlib.nullcontext(finished.is_file))
    with pytest.raises(SweepInterrupted, match=r"stopped after .*, 1 of 2 models finished: kept in .*out\.partial"):
        patch([path, copy], pairs, out, **SETTINGS)
    monkeypatch.undo()
    assert finished.is_file() and not out.exists()
    capsys.readouterr()
    resumed = patch([path, copy], pairs, out, progress=True, **SETTINGS)
    assert f"patch: model 1 of 2, {path}: kept from {finished}" in capsys.readouterr().err  # not patched again
    for table in ("patching", "paths"):
        rows = resumed[table]
        for name in (path, copy):  # each model's rows are the one-model run's, to the bit
            own = rows[rows["model"] == name].drop(columns="model").reset_index(drop=True)
            pd.testing.assert_frame_equal(own, whole[table].drop(columns="model"), check_exact=True)
    assert headscan.load(out)["patching"]["model"].unique().tolist() == [path, copy]


def test_restart_discards_the_kept_steps_and_the_message_says_so(circuit, tmp_path, monkeypatch):
    path, pairs = circuit
    out = tmp_path / "out"
    _interrupting(monkeypatch, "patch_layer", 2)
    with pytest.raises(SweepInterrupted, match="run the same command again without --restart to resume"):
        patch(path, pairs, out, restart=True, **SETTINGS)
    monkeypatch.undo()
    again = patch(path, pairs, out, restart=True, **SETTINGS)
    assert again.provenance.models[0].extra["patching"]["steps_resumed"] == 0


def test_the_bar_moves_per_head_and_per_path(circuit, monkeypatch):
    path, pairs = circuit
    moves = []
    original = patch_steps.KeptSteps.advance
    monkeypatch.setattr(patch_steps.KeptSteps, "advance", lambda self, n: (moves.append(n), original(self, n)))
    run = patch(path, pairs, progress=True, **SETTINGS)
    n_heads = len(run["patching"]["label"].unique())  # 8: 2 layers x 4
    n_paths = len(run["paths"]) // 2  # two targets a path
    # 4 batches of 2 pairs: one move per head per batch, one per top head patched by position per batch, then one
    # per path per batch of the 4 estimating pairs
    assert moves == [2] * (4 * n_heads) + [2] * (4 * 2) + [2] * (2 * n_paths)


def test_position_top_patches_only_the_top_heads_at_each_position(whole):
    rows = whole["patching"]
    at = rows[rows["position"].notna() & (rows["target"] == "fraction")]
    assert set(at["label"]) == {"L0H0", "L1H0"}  # the planted pair, the top two by denoising
    l0h0 = at[(at["label"] == "L0H0") & (at["method"] == "denoise")].set_index("position")["value"]
    # the previous-token head matters where it wrote the earlier occurrence's successor: position 3 of BOS w0 w1 w2
    assert l0h0.idxmax() == 3 and l0h0.max() > 0.9
    assert l0h0.drop(3).abs().max() < 1e-3


def _nothing(pair: Pair) -> Pair:
    """A pair whose corruption is the clean prompt itself: no difference for any head or path to carry."""
    return Pair(pair.clean, pair.clean, pair.answer, pair.wrong)


def test_path_candidates_are_chosen_on_the_odd_lines_and_estimated_on_the_even(circuit):
    path, pairs = circuit
    # odd lines (1, 3, ...) the induction task, even lines nothing: the candidates are the planted heads, and
    # their paths, estimated on the even lines, carry exactly nothing
    mixed = [p if i % 2 == 0 else _nothing(p) for i, p in enumerate(pairs)]
    run = patch(path, mixed, device="cpu", path_top=2, bootstrap=0, attribution=False)
    chosen = run.provenance.models[0].extra["patching"]["path_selection"]
    assert chosen["candidates"] == ["L0H0", "L1H0"]
    assert chosen["chosen_on"].startswith("1, 3, 5, 7 ") and chosen["estimated_on"].startswith("2, 4, 6, 8 ")
    paths = run["paths"]
    assert set(paths["count"]) == {4}
    assert (paths.loc[paths["target"] == "logit_diff", "value"] == 0).all()
    # the other way round the odd lines say nothing, so no pair of planted heads is chosen
    swapped = [_nothing(p) if i % 2 == 0 else p for i, p in enumerate(pairs)]
    run = patch(path, swapped, device="cpu", path_top=2, bootstrap=0, attribution=False)
    assert run.provenance.models[0].extra["patching"]["path_selection"]["candidates"] != ["L0H0", "L1H0"]


def test_a_selection_file_chooses_and_every_pair_estimates(circuit, tmp_path):
    path, pairs = circuit
    run = patch(path, [_nothing(p) for p in pairs], device="cpu", path_top=2, bootstrap=0, attribution=False,
                select_pairs=pairs)
    about = run.provenance.models[0].extra["patching"]["path_selection"]
    assert about["candidates"] == ["L0H0", "L1H0"] and about["chosen_on"] == "selection pairs file"
    assert set(run["paths"]["count"]) == {len(pairs)}
    assert run.provenance.extra["select_pairs"]["n"] == len(pairs)


def test_paths_carry_bh_q_values_over_the_paths_tested(whole):
    paths = whole["paths"]
    for _, rows in paths.groupby("target"):
        p = rows["p_value"].to_numpy()
        assert np.all((p >= 0) & (p <= 1))
        np.testing.assert_allclose(rows["q_value"], false_discovery_control(p, method="bh"), rtol=1e-12)
    fraction = paths[paths["target"] == "fraction"].set_index(["sender_label", "label", "path"])
    assert fraction["p_value"].idxmin() == ("L0H0", "L1H0", "k")
    assert fraction.loc[("L0H0", "L1H0", "k"), "q_value"] < 0.05


def test_units_count_a_pair_whose_corruption_has_the_larger_difference(circuit):
    path, pairs = circuit
    flipped = [Pair(pairs[0].corrupted, pairs[0].clean, pairs[0].answer, pairs[0].wrong), *pairs[1:]]
    run = patch(path, flipped, device="cpu", bootstrap=50, attribution=False)
    about = run.provenance.models[0].extra["patching"]
    assert about["difference_not_positive"] == "1 (1 pairs)"
    rows = run["patching"]
    assert (rows["units"] == len(pairs)).all() and (rows["count"] == len(pairs)).all()


def test_the_command_line_says_how_to_resume_and_exits_130(circuit, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from headscan.cli import cli
    from headscan.corpus.pairs import write_pairs

    path, pairs = circuit
    file = write_pairs(pairs, tmp_path / "pairs.jsonl")
    command = ["patch", "-m", path, "--pairs", str(file), "--path-top", "3", "--bootstrap", "50", "--batch-size", "2",
               "--device", "cpu", "--out", str(tmp_path / "out"), "-q"]
    _interrupting(monkeypatch, "patch_layer", 2)
    result = CliRunner().invoke(cli, command)
    monkeypatch.undo()
    assert result.exit_code == 130 and "Aborted" not in result.output
    assert "run the same command again to resume" in result.output.splitlines()[-1]
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out.partial").exists()
    _interrupting(monkeypatch, "patch_layer", 2)  # stopped after --restart: never told to restart again
    result = CliRunner().invoke(cli, [*command, "--overwrite", "--restart"])
    monkeypatch.undo()
    last = result.output.splitlines()[-1]
    assert result.exit_code == 130 and last.endswith("run the same command again without --restart to resume"), last
    assert last.count("--restart") == 1, last


@pytest.mark.subprocess
def test_a_patch_process_stopped_by_sigint_resumes_to_the_same_tables(circuit, whole, tmp_path):
    """As a user stops it: ``headscan patch`` in a process of its own gets SIGINT once its first step is kept (the
    kept-steps file polled, not a guessed sleep); it exits 130 keeping its steps, and the same command resumes to
    every table of the uninterrupted run (`whole`, the same settings), to the bit."""
    import subprocess
    import sys
    import time

    from click.testing import CliRunner

    from headscan.cli import cli
    from headscan.corpus.pairs import write_pairs

    path, pairs = circuit
    file = write_pairs(pairs, tmp_path / "pairs.jsonl")
    arguments = ["patch", "-m", path, "--pairs", str(file), "--path-top", "3", "--position-top", "2", "--bootstrap",
                 "50", "--batch-size", "2", "--device", "cpu", "-q", "--out", str(tmp_path / "out")]  # = SETTINGS
    kept = tmp_path / "out.partial" / f"patch-{spec_stem(path)}.jsonl"
    process = subprocess.Popen([sys.executable, "-m", "headscan", *arguments], text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 300
    while not (kept.is_file() and len(kept.read_text().splitlines()) >= 2):  # the fingerprint, then the first step
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the run ended or stalled before its first step was kept: {process.communicate()}")
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    assert "steps kept in" in stderr and "run the same command again to resume" in stderr, stderr
    assert not (tmp_path / "out").exists()
    steps = len(kept.read_text().splitlines()) - 1
    resumed = CliRunner().invoke(cli, arguments)
    assert resumed.exit_code == 0, resumed.output
    run = headscan.load(tmp_path / "out")
    assert run.provenance.models[0].extra["patching"]["steps_resumed"] == steps > 0
    assert list(run.frames) == list(whole.frames) == ["patching", "paths"]
    for table in run.frames:
        pd.testing.assert_frame_equal(run[table], whole[table], check_exact=True)
