"""Sweeps on Ray: a local two-CPU instance gives a local sweep's tables, retries lost workers, resumes reruns."""

import logging
import re
import shutil
import sys
import tempfile

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import assert_merged_equals_whole, missing, paragraph_corpus
from headscan import tables
from headscan.scan import cluster as distributed
from headscan.cli import cli
from headscan.errors import ConfigError, TablesError
from headscan.scan import partial_folder, sweep
from headscan.scan import PartialState, Shard

# One segment per forward pass: each segment's attention is then computed exactly as in the local sweep, so
# what is left to compare is the merge's float64 sums in another order (see tests/test_jobs.py).
SETTINGS = dict(device="cpu", bootstrap=20, window=2, batch_size=1, bootstrap_unit="document")



def test_states_from_ray_get_arrays_of_their_own():
    # Ray hands arrays over read-only; a resumed sweep adds into every total, the baseline and similarity too
    state = PartialState.empty({"model": "m"}, Shard(0, 2), (2, 3, 4), 5)
    state.baseline, state.similarity = np.ones((2, 4, 6)), np.ones((2, 6, 6))
    frozen = {}
    for name, value in vars(state).items():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
            frozen[name] = value
    owned = distributed._owned(state)
    for name, before in frozen.items():
        after = getattr(owned, name)
        assert after.flags.writeable and not np.shares_memory(after, before), name
        np.testing.assert_array_equal(after, before)
    assert {"baseline", "similarity", "replicate_power", "weights", "head_means"} <= set(frozen)

@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance with two CPUs, its logs in a temporary folder (short: Ray's socket paths are)."""
    try:
        import ray
    except ImportError:
        missing("ray is not installed: pip install 'headscan[ray]'")
    logs = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=logs, log_to_driver=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()
    shutil.rmtree(logs, ignore_errors=True)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """40 short lines in paragraphs of 3 (14 documents), from the builtin sample."""
    return paragraph_corpus(tmp_path_factory.mktemp("corpus"), 40)


@pytest.fixture(scope="module")
def models(tiny_gpt2, tiny_bert):
    return [str(tiny_gpt2), str(tiny_bert)]


@pytest.fixture(scope="module")
def local(models, corpus_file):
    return sweep(models, corpus_file, None, **SETTINGS)


def assert_same_tables(a: tables.SweepTables, b: tables.SweepTables) -> None:
    """A Ray sweep adds up shards: the same checks as merged shards against the whole sweep."""
    assert_merged_equals_whole(a, b)


def spy_on_tasks(monkeypatch) -> list[tuple]:
    """Record each task handed to a worker: (model, shard index, windows done before it, finished before it)."""
    handed = []
    submit = distributed._Slot.submit

    def spy(self, task, seconds):
        handed.append((task.spec, task.shard.index, task.state and task.state.windows_done,
                       bool(task.state and task.state.finished)))
        return submit(self, task, seconds)

    monkeypatch.setattr(distributed._Slot, "submit", spy)
    return handed


def test_a_ray_sweep_equals_a_local_sweep(cluster, models, corpus_file, local, tmp_path, monkeypatch):
    handed = spy_on_tasks(monkeypatch)
    out = tmp_path / "out"
    result = sweep(models, corpus_file, out, ray=True, save_every=0, **SETTINGS)  # a task per window
    assert_same_tables(local, result)
    assert_same_tables(local, tables.load(out))
    ray = tables.load(out).provenance.extra["ray"]
    assert ray["shards"] == 8 and ray["workers"] == 2 and ray["retries"] == 0  # 4 a worker, 14 documents
    assert result.provenance.models[1].n_segments == 40 and result.provenance.config["device"] == "cpu"
    assert not partial_folder(out).exists()
    assert len(handed) > 2 * 8 and any(windows for _, _, windows, _ in handed)  # shards went out again


def test_a_ray_sweep_carries_head_importance(cluster, models, corpus_file, tmp_path):
    import torch

    # every shard's mean pass runs the whole sample: a small one keeps this quick
    importance = SETTINGS | {"importance": "ablate", "ablate_top": 2, "importance_sample": 12}
    # Ray's workers run one thread (OMP_NUM_THREADS=1); so does the local sweep here, for the backward pass of
    # AtP sums its float32 gradients in an order that depends on the number of threads
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = sweep(models[0], corpus_file, None, **importance)
    finally:
        torch.set_num_threads(threads)
    result = sweep(models[0], corpus_file, tmp_path / "out", ray=True, save_every=0, **importance)
    assert_same_tables(local, result)
    assert result["importance"]["value"].notna().sum() == 2 * 8 + 2 * 2  # AtP of all 8 heads, 2 heads ablated


def test_a_lost_worker_is_retried_from_the_shards_last_state(cluster, models, corpus_file, local, tmp_path,
                                                              monkeypatch, capsys):
    submit, killed = distributed._Slot.submit, []

    def submit_and_lose_the_worker(self, task, seconds):
        ref = submit(self, task, seconds)
        if not killed and task.state is not None and task.state.windows_done:
            cluster.kill(self.actor)  # as if its machine went away, midway through its shard
            killed.append(task.shard)
        return ref

    monkeypatch.setattr(distributed._Slot, "submit", submit_and_lose_the_worker)
    result = sweep(models, corpus_file, tmp_path / "out", ray=True, save_every=0, progress=True, **SETTINGS)
    assert_same_tables(local, result)
    assert result.provenance.extra["ray"]["retries"] == 1
    assert f"lost the worker sweeping shard {killed[0]} of {models[0]} (ActorDiedError); retrying from its last " \
           f"state (1 windows done), 1 of 3" in capsys.readouterr().err


def test_the_same_command_again_sweeps_only_the_shards_that_are_missing(cluster, models, corpus_file, local, tmp_path,
                                                                       monkeypatch):
    out = tmp_path / "out"
    command = ["sweep", "-m", models[0], "-m", models[1], "--corpus", str(corpus_file), "--out", str(out), "--device",
               "cpu", "--bootstrap", "20", "--window", "2", "--batch-size", "1", "--bootstrap-unit", "document",
               "--save-every", "0", "--ray", "-q"]
    submit = distributed._Slot.submit

    def lose_the_worker_of_shard_5(self, task, seconds):
        ref = submit(self, task, seconds)
        if task.shard.index == 5:
            cluster.kill(self.actor)
        return ref

    monkeypatch.setattr(distributed._Slot, "submit", lose_the_worker_of_shard_5)
    monkeypatch.setattr(distributed, "RETRIES", 0)
    first = CliRunner().invoke(cli, command)
    assert first.exit_code == 1
    assert re.fullmatch(rf"Error: shard 5/8 of {re.escape(models[0])}: its worker was lost 1 times \(ActorDiedError: "
                        rf".*\); the finished shards are saved in {re.escape(str(partial_folder(out)))}; run the same "
                        rf"command again to resume\n", first.output), first.output
    assert not out.exists()
    saved = {path.name: PartialState.load(path) for path in partial_folder(out).iterdir()}
    assert saved and all(state.shard.count == 8 for state in saved.values())
    monkeypatch.undo()

    handed = spy_on_tasks(monkeypatch)
    again = CliRunner().invoke(cli, command)
    assert again.exit_code == 0, again.output
    run = tables.load(out)
    assert_same_tables(local, run)
    assert " --ray " in run.provenance.command + " " and not partial_folder(out).exists()
    finished = {(state.model["name"], state.shard.index) for state in saved.values() if state.finished}
    swept = {(spec, k) for spec, k, _, checked in handed if not checked}
    assert finished and not finished & swept  # no finished shard is swept again
    assert swept | finished == {(spec, k) for spec in models for k in range(8)}
    resumed = {(state.model["name"], state.shard.index, state.windows_done) for state in saved.values()
               if not state.finished}
    assert resumed <= {(spec, k, windows) for spec, k, windows, _ in handed}  # each from where it stopped
    checks = [(spec, k) for spec, k, _, checked in handed if checked]
    assert len(checks) == len({spec for spec, _ in finished})  # one check of the earlier run per model


def test_a_saved_state_of_another_sweep_is_refused(models, corpus_file):
    from headscan.config import SweepConfig
    from headscan.corpus import read_corpus

    corpus = read_corpus(corpus_file)
    worker = distributed._Worker(corpus, SweepConfig(**SETTINGS, max_offset=3), None)  # the actor's code, here
    state, device = worker.run(models[1], Shard(2, 8), None, "this run", 1e9)
    assert state.finished and device == "cpu"
    other = distributed._Worker(corpus, SweepConfig(**SETTINGS), None)
    with pytest.raises(TablesError, match=rf"^out.partial/x.npz: a stopped sweep of {re.escape(models[1])} with other "
                                          rf"inputs \(settings.max_offset: 3 != 8; .*\); rerun that sweep to finish "
                                          rf"it, or pass --restart to discard it$"):
        other.run(models[1], Shard(2, 8), state, "out.partial/x.npz", 1e9)


def test_errors_are_one_line(models, corpus_file, tmp_path, monkeypatch):
    runner = CliRunner()
    arguments = ["sweep", "-m", models[0], "--corpus", str(corpus_file), "--out", str(tmp_path / "out"), "-q"]
    result = runner.invoke(cli, arguments + ["--ray", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert result.output == ("Error: --ray: cannot reach a Ray cluster at 127.0.0.1:1 (Connection refused); start one "
                             "there with `ray start --head`, or check the host and port\n")
    result = runner.invoke(cli, arguments + ["--ray", "--shard", "0/2"])
    assert result.exit_code == 1
    assert result.output == ("Error: --shard: a sweep on Ray cuts the corpus into shards itself; run each --shard K/N "
                             "without --ray, or the whole corpus with --ray\n")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ConfigError, match=r"^ray: Ray is not installed; pip install 'headscan\[ray\]'$"):
        sweep(models[0], corpus_file, None, ray="auto", **SETTINGS)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["conllu", "repeat-random"])
def test_a_ray_sweep_of_a_treebank_and_of_repeat_random_equals_a_local_sweep(kind, cluster, models, tmp_path):
    """Windows of 3 over 8 segments, a task per window: the syntax table with its baseline (the tiny BERT), and
    repeat-random's tokens drawn per segment whatever task holds it (the tiny GPT-2), are the local sweep's
    (issue 18)."""
    from conftest import treebank_corpus
    from test_jobs import assert_merged_equals_whole

    model = models[1] if kind == "conllu" else models[0]
    corpus = str(treebank_corpus(tmp_path, 8)) if kind == "conllu" else "repeat-random:n=6,count=8,seed=3"
    settings = dict(device="cpu", bootstrap=20, window=3, batch_size=1, max_len=48)
    local = sweep(model, corpus, None, **settings)
    result = sweep(model, corpus, tmp_path / "out", ray=True, save_every=0, **settings)
    assert_merged_equals_whole(local, result)
    assert ("syntax" in result.frames) == (kind == "conllu")
