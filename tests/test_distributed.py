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
from headscan.cli import cli
from headscan.errors import ConfigError, TablesError
from headscan.scan import PartialState, Shard, partial_folder, sweep
from headscan.scan import cluster as distributed

# One segment per forward pass: each segment's attention is then computed exactly as in the local sweep, so
# what is left to compare is the merge's float64 sums in another order (see tests/test_jobs.py).
SETTINGS = dict(device="cpu", bootstrap=20, window=2, batch_size=1, bootstrap_unit="document")



def test_states_from_ray_get_arrays_of_their_own():
    # Ray hands arrays over read-only; a resumed sweep adds into every total, the baseline and similarity too
    from headscan.scan.importance import ImportanceState
    from headscan.scan.passes.baseline import BaselineState
    from headscan.scan.passes.similarity import SimilarityState

    state = PartialState.empty({"model": "m"}, Shard(0, 2), (2, 3, 4), 5)
    state.passes = {"baseline": BaselineState(np.ones((2, 4, 6))), "similarity": SimilarityState(np.ones((2, 6, 6))),
                    "importance": ImportanceState(np.ones((2, 3, 4)))}
    frozen = {}
    for owner, fields in [(None, vars(state))] + [(name, vars(own)) for name, own in state.passes.items()]:
        for name, value in fields.items():
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
                frozen[(owner, name)] = value
    owned = distributed._owned(state)
    for (owner, name), before in frozen.items():
        after = getattr(owned if owner is None else owned.passes[owner], name)
        assert after.flags.writeable and not np.shares_memory(after, before), (owner, name)
        np.testing.assert_array_equal(after, before)
    assert {("baseline", "sums"), ("similarity", "sums"), (None, "replicate_power"),
            ("importance", "head_means")} <= set(frozen)

@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance with two CPUs and 8 GiB of Ray's `memory` resource (a number Ray schedules by, not
    memory it takes: fixed, so how many workers fit does not depend on what the machine has free), its logs in a
    temporary folder (short: Ray's socket paths are)."""
    try:
        import ray
    except ImportError:
        missing("ray is not installed: pip install 'headscan[ray]'")
    logs = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    ray.init(num_cpus=2, _memory=8 * 2**30, include_dashboard=False, _temp_dir=logs, log_to_driver=False,
             logging_level=logging.WARNING)
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


def test_a_ray_sweep_runs_a_metric_module_the_driver_read(cluster, models, corpus_file, tmp_path):
    """The workers, processes of their own, execute the module's text the driver sent them: their rows of its
    metric equal a local sweep's, under the same hash."""
    from headscan.metrics.custom import clear_custom

    module = tmp_path / "mine.py"
    module.write_text("import headscan\n@headscan.pattern('two_back')\ndef two_back(s):\n"
                      "    'Attention on the token two before the query.'\n"
                      "    return (s.key_positions[None, :] == s.query_positions[:, None] - 2)[None]"
                      ".expand(len(s.tokens), -1, -1)\n")
    try:
        here = sweep(models, corpus_file, None, metric_modules=[str(module)], **SETTINGS)
        there = sweep(models, corpus_file, None, metric_modules=[str(module)], ray=True, **SETTINGS)
    finally:
        clear_custom()
    mine = lambda t: t.heads[t.heads["metric"] == "two_back"].reset_index(drop=True)  # noqa: E731
    assert len(mine(there)) == len(mine(here)) > 0 and mine(there)["count"].min() > 0
    np.testing.assert_allclose(mine(there)["value"], mine(here)["value"], rtol=0, atol=1e-6)
    assert there.provenance.extra["custom_metrics"]["two_back"]["sha256"] == \
        here.provenance.extra["custom_metrics"]["two_back"]["sha256"]


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
    # AtP (mean and zero) of all 8 heads; the 2 heads ablated exactly by mean, zero and resample ablation
    assert result["importance"]["value"].notna().sum() == 2 * 8 + 3 * 2


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
    repeat-random's tokens drawn per segment whatever task holds it (the tiny GPT-2), are the local sweep's."""
    from conftest import treebank_corpus
    from test_jobs import assert_merged_equals_whole

    model = models[1] if kind == "conllu" else models[0]
    corpus = str(treebank_corpus(tmp_path, 8)) if kind == "conllu" else "repeat-random:n=6,count=8,seed=3"
    settings = dict(device="cpu", bootstrap=20, window=3, batch_size=1, max_len=48)
    local = sweep(model, corpus, None, **settings)
    result = sweep(model, corpus, tmp_path / "out", ray=True, save_every=0, **settings)
    assert_merged_equals_whole(local, result)
    assert ("syntax" in result.frames) == (kind == "conllu")


# --- sizing the workers by memory ---------------------------------------------------------------------

GIB = 2**30


def test_ray_places_as_many_workers_as_the_nodes_memory_holds():
    from headscan.scan.ray_cluster import plan_workers

    node = {"CPU": 64.0, "memory": 256.0 * GIB}
    # a 30 GiB model: 256 // 30 = 8 copies fit, each running torch on 64 / 8 CPUs (was: 64 copies of one CPU)
    assert plan_workers([node], memory=30 * GIB) == (8, {"num_cpus": 8, "memory": 30 * GIB})
    assert plan_workers([node], memory=GIB) == (64, {"num_cpus": 1, "memory": GIB})  # small: one per CPU
    # a node of 16 CPUs and 64 GiB beside it holds 4 copies of 15 GiB, the big node 17 (of 64 // 17 = 3 CPUs): each
    # actor asks for the smaller share, 3 CPUs, so both nodes fill their memory
    assert plan_workers([node, {"CPU": 16.0, "memory": 64.0 * GIB}], memory=15 * GIB) == \
        (17 + 4, {"num_cpus": 3, "memory": 15 * GIB})
    gpu_node = {"CPU": 16.0, "GPU": 4.0, "memory": 128.0 * GIB}
    assert plan_workers([gpu_node] * 2, memory=2 * GIB) == (8, {"num_gpus": 1, "num_cpus": 1, "memory": 2 * GIB})
    assert plan_workers([gpu_node] * 2, memory=50 * GIB)[0] == 4  # the host's memory holds two per node
    # --device-map auto: one actor a node, holding all of its GPUs
    assert plan_workers([gpu_node] * 2, memory=2 * GIB, device_map="auto") == \
        (2, {"num_gpus": 4, "num_cpus": 1, "memory": 2 * GIB})
    assert plan_workers([gpu_node], memory=2 * GIB, device="cpu")[1] == {"num_cpus": 1, "memory": 2 * GIB}


def test_a_model_that_no_node_holds_is_refused_in_one_line(models, corpus_file):
    from headscan.scan.ray_cluster import plan_workers

    with pytest.raises(ConfigError, match=r"^ray: a worker needs about 300\.0 GiB of memory for the largest model at "
                                          r"this --batch-size and --max-len, and no node of the Ray cluster \(local\) "
                                          r"has that much \(largest: 256\.0 GiB\); lower --batch-size or --max-len, "
                                          r"use --dtype bfloat16, or add a larger node$"):
        plan_workers([{"CPU": 64.0, "memory": 256.0 * GIB}], memory=300 * GIB)
    with pytest.raises(ConfigError, match=r"^device cuda: the Ray cluster \(local\) has no GPUs"):
        plan_workers([{"CPU": 64.0, "memory": 256.0 * GIB}], memory=GIB, device="cuda")


def test_a_workers_memory_is_the_models_weights_a_batchs_attention_and_the_process(tiny_gpt2):
    from transformers import AutoModelForCausalLM

    from headscan.config import SweepConfig
    from headscan.scan import budget
    from headscan.scan.ray_cluster import PROCESS_BYTES, worker_memory

    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2)  # loaded for real: the parameters it holds
    parameters = sum(p.numel() for p in model.parameters())
    heads = model.config.n_head
    config = SweepConfig(batch_size=4, max_len=64, device="cpu")
    # eager attention, scored whole at this size: the model's scores and pattern and the metrics' temporaries,
    # TEMPORARIES (batch, head, q, k) tensors in all, plus the float mask, as float32
    assert 4 * 4 * heads * 64 * 64 <= budget.EAGER_LAYER_BYTES
    attention = 4 * 4 * 64 * 64 * (budget.TEMPORARIES * heads + 1)
    # the weights twice: the model's, and what a sweep holds beside them (WEIGHT_COPIES)
    assert worker_memory(str(tiny_gpt2), config) == 2 * 4 * parameters + attention + PROCESS_BYTES
    half = SweepConfig(batch_size=4, max_len=64, device="cpu", dtype="bfloat16")
    assert worker_memory(str(tiny_gpt2), half) == 2 * 2 * parameters + attention + PROCESS_BYTES
    assert worker_memory(f"{tiny_gpt2} [random init]", config) == worker_memory(str(tiny_gpt2), config)


def test_a_model_that_fills_the_nodes_memory_gets_one_worker_with_all_its_cpus(cluster, models, tmp_path, monkeypatch):
    corpus = paragraph_corpus(tmp_path, 9)  # small: one actor on two threads crawls on a busy 2-core machine
    memory = int(cluster.cluster_resources()["memory"] * 0.6)  # one fits, two do not
    monkeypatch.setattr(distributed, "worker_memory", lambda spec, config: memory)
    result = sweep(models[1], corpus, tmp_path / "out", ray=True, **SETTINGS)
    assert_same_tables(sweep(models[1], corpus, None, **SETTINGS), result)
    ray = result.provenance.extra["ray"]
    assert ray["workers"] == 1 and ray["worker"] == {"num_cpus": 2, "memory": memory}  # was: 2 of one CPU each


# --- thread counts -------------------------------------------------------------------------------------

FLOAT32_U = 2.0**-24  # float32's unit roundoff


def short_lines(folder, n_lines: int):
    """`n_lines` lines of 2 to 12 words (5 to 15 tokens with BOS), in paragraphs of 3."""
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "far", "away", "from", "home"]
    lines = []
    for i in range(n_lines):
        lines.append(" ".join(words[: 2 + i % 11]))
        if i % 3 == 2:
            lines.append("")
    path = folder / "short.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_equal_to_float32_rounding(a: tables.SweepTables, b: tables.SweepTables, *, layers: int, width: int):
    """Every table of `b` is `a`'s up to the rounding of a float32 forward pass whose sums were added in another
    order: keys and supports exactly, each summed column within 2 L K u of its largest magnitude.

    Why 2 L K u: a dot product of K float32 terms added in two orders differs by at most 2 gamma_K ~ 2 K u of the
    sum of its terms' magnitudes (Higham, Accuracy and Stability, 3.1); each of L layers adds one such product
    (K = the width) to the residual stream, and layer norms and the softmax do not amplify a relative error. The
    float64 sums over segments add nothing measurable. variance_df, a ratio of differences of power sums, amplifies
    rounding: 1e-3 relative, as for merged shards (conftest.assert_merged_equals_whole).
    """
    rtol = 2 * layers * width * FLOAT32_U
    from conftest import SUMMED

    assert list(a.frames) == list(b.frames)
    for name in a.frames:
        x, y = a[name], b[name]
        if name == "examples":  # units whose values agree to float32 rounding may swap ranks; the values hold
            np.testing.assert_allclose(y["value"], x["value"], rtol=rtol, atol=rtol, err_msg=name)
            continue
        extra = [c for c in conftest_extras(name) if c in x]
        pd.testing.assert_frame_equal(x.drop(columns=SUMMED + extra), y.drop(columns=SUMMED + extra))
        for column in SUMMED + extra:
            if x[column].dtype != "float64":
                pd.testing.assert_series_equal(x[column], y[column], obj=f"{name}.{column}")
            elif column == "variance_df":
                np.testing.assert_allclose(y[column], x[column], rtol=1e-3, err_msg=f"{name}.{column}")
            else:
                np.testing.assert_allclose(y[column], x[column], rtol=0, err_msg=f"{name}.{column}",
                                           atol=rtol * max(1.0, x[column].abs().max()))


def conftest_extras(name: str) -> tuple:
    from conftest import TABLE_EXTRAS

    return TABLE_EXTRAS.get(name, ())


def sweep_with_threads(threads: int, *args, **kwargs):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return sweep(*args, **kwargs)
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny Llama (2 layers, 64 wide): its projections have no bias, so torch hands them to the BLAS as plain
    matrix products, which MKL splits between threads differently for inputs of 5 to 11 tokens (GPT-2's and
    BERT's products with a bias, addmm, come out the same on any thread count)."""
    from headscan.testing.architectures import build_architecture_checkpoint

    folder = tmp_path_factory.mktemp("threads")
    return str(build_architecture_checkpoint(folder / "llama", "llama", seed=1)), short_lines(folder, 15)


def test_sweeps_on_other_thread_counts_differ_by_float32_rounding_alone(tiny_llama, tmp_path):
    """docs/distributed.md's bound for a Ray sweep, merged shards and a resumed sweep whose processes ran torch on other
    thread counts than the local sweep (a Ray worker on one thread against a local sweep on two)."""
    model, corpus = tiny_llama
    one = sweep_with_threads(1, model, corpus, None, **SETTINGS)
    two = sweep_with_threads(2, model, corpus, None, **SETTINGS)
    assert_equal_to_float32_rounding(one, two, layers=2, width=64)
    # shards swept on one and on two threads, merged: the unsharded sweep's tables to the same bound
    sweep_with_threads(1, model, corpus, tmp_path / "part-0", shard=Shard(0, 2), **SETTINGS)
    sweep_with_threads(2, model, corpus, tmp_path / "part-1", shard=Shard(1, 2), **SETTINGS)
    from headscan.scan import merge

    assert_equal_to_float32_rounding(one, merge([tmp_path / "part-0", tmp_path / "part-1"]), layers=2, width=64)


def test_a_ray_sweep_on_other_thread_counts_equals_a_local_sweep_to_float32_rounding(cluster, tiny_llama, tmp_path):
    model, corpus = tiny_llama
    local = sweep_with_threads(2, model, corpus, None, **SETTINGS)  # the workers run one thread each
    result = sweep(model, corpus, tmp_path / "out", ray=True, **SETTINGS)
    assert result.provenance.extra["ray"]["worker"]["num_cpus"] == 1
    assert_equal_to_float32_rounding(local, result, layers=2, width=64)
