"""Sweeps that survive: resume after SIGINT and SIGKILL, never overwrite or mix results, shards merge exactly."""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import assert_merged_equals_whole, paragraph_corpus, treebank_corpus

import headscan
from headscan import tables
from headscan.errors import ConfigError, ModelNotFoundError, TablesError
from headscan.scan import PartialState, merge, partial_folder, sweep
from headscan.scan.resume import spec_stem

SETTINGS = dict(device="cpu", bootstrap=20, window=7)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """300 short lines in paragraphs of 3 (documents), from the builtin sample."""
    return paragraph_corpus(tmp_path_factory.mktemp("corpus"), 300)


def assert_same_tables(a: tables.SweepTables, b: tables.SweepTables, exact: bool = True):
    assert list(a.frames) == list(b.frames)
    for name in a.frames:
        if exact:
            pd.testing.assert_frame_equal(a[name], b[name], check_exact=True)
        else:
            pd.testing.assert_frame_equal(a[name], b[name], check_exact=False, atol=1e-12, rtol=0)


# --- never lose or mix results ------------------------------------------------------------------------------


def test_an_existing_output_is_replaced_only_with_overwrite(tmp_path, tiny_bert):
    out = tmp_path / "out"
    sweep(str(tiny_bert), "builtin", out, limit=3, **SETTINGS)
    before = (out / "run.json").read_bytes()
    with pytest.raises(TablesError, match="already holds a headscan run; pass --overwrite to replace it"):
        sweep(str(tiny_bert), "builtin", out, limit=4, **SETTINGS)
    assert (out / "run.json").read_bytes() == before
    sweep(str(tiny_bert), "builtin", out, limit=4, overwrite=True, **SETTINGS)
    assert json.loads((out / "run.json").read_text())["corpus"]["n_segments"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or old folders left behind


def test_published_files_follow_the_umask(tmp_path, tiny_bert):
    previous = os.umask(0o022)
    try:
        sweep(str(tiny_bert), "builtin", tmp_path / "out", limit=2, **SETTINGS)
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755
    for path in (tmp_path / "out").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name


def test_files_of_two_runs_are_never_read_as_one(tmp_path, tiny_bert):
    first = sweep(str(tiny_bert), "builtin", tmp_path / "a", limit=2, **SETTINGS)
    sweep(str(tiny_bert), "builtin", tmp_path / "b", limit=3, **SETTINGS)
    assert first.provenance.run_id and len(first.provenance.run_id) == 32
    shutil.copy(tmp_path / "b" / "offsets.parquet", tmp_path / "a" / "offsets.parquet")
    with pytest.raises(TablesError, match=r"a: offsets.parquet and run.json come from different runs"):
        tables.load(tmp_path / "a")


def test_combine_refuses_a_run_given_twice(tmp_path, tiny_bert):
    run = sweep(str(tiny_bert), "builtin", tmp_path / "a", limit=2, **SETTINGS)
    with pytest.raises(TablesError, match="cover the same segments"):
        tables.merge_tables([run, tables.load(tmp_path / "a")])
    other = sweep(str(tiny_bert), "builtin", None, limit=2, **(SETTINGS | {"max_offset": 3}))
    with pytest.raises(TablesError, match=r"was swept with other settings than .* \(max_offset\)"):
        tables.merge_tables([run, other])


def test_everything_is_checked_before_the_first_model_loads(tmp_path, tiny_bert, monkeypatch):
    loaded = []
    monkeypatch.setattr("headscan.scan.controls.load_model", lambda *a, **k: loaded.append(a) or pytest.fail("loaded"))
    with pytest.raises(ModelNotFoundError, match=r"model 'smollm' not found: .* Did you mean 'smollm2'\?"):
        sweep([str(tiny_bert), "smollm"], "builtin", tmp_path / "out")
    with pytest.raises(ConfigError, match="bootstrap must be 0 .no intervals. or at least 20, got 1"):
        sweep(str(tiny_bert), "builtin", tmp_path / "out", bootstrap=1)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(TablesError, match="full: holds files but no run.json"):
        sweep(str(tiny_bert), "builtin", tmp_path / "full")
    with pytest.raises(headscan.HeadscanError, match="no such file"):
        sweep(str(tiny_bert), tmp_path / "missing.txt", tmp_path / "out")
    assert not loaded and not (tmp_path / "out").exists()


# --- resume ---------------------------------------------------------------------------------------------------


def _cli(*arguments, **kwargs):
    command = [sys.executable, "-m", "headscan", "sweep", *map(str, arguments), "-q", "--device", "cpu",
               "--bootstrap", "20", "--window", "7", "--batch-size", "4"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"HF_HUB_OFFLINE": "1"}, **kwargs)


def _stop_midway(process, state_file: Path, sig) -> None:
    """Send `sig` once the sweep has saved a state with at least two windows, well before its end."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if state_file.is_file():
            try:
                if PartialState.load(state_file).windows_done >= 2:
                    break
            except TablesError:
                pass  # being replaced right now
        if process.poll() is not None:
            pytest.fail(f"the sweep ended before it could be stopped: {process.communicate()}")
        time.sleep(0.005)
    process.send_signal(sig)


@pytest.mark.subprocess
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_stopped_sweep_resumes_to_the_same_tables_bit_for_bit(sig, tmp_path, tiny_bert, corpus_file):
    whole = tmp_path / "whole"
    assert _cli("-m", tiny_bert, "--corpus", corpus_file, "--out", whole).wait() == 0
    out = tmp_path / "stopped"
    state_file = partial_folder(out) / f"{spec_stem(str(tiny_bert))}.npz"
    process = _cli("-m", tiny_bert, "--corpus", corpus_file, "--out", out, "--save-every", "0")
    _stop_midway(process, state_file, sig)
    _, stderr = process.communicate(timeout=120)
    if sig == signal.SIGINT:
        assert process.returncode == 130, stderr
        said = re.search(rf"Interrupted: stopped while sweeping {re.escape(str(tiny_bert))} at segment (\d+) of "
                         rf"\d+: the (\d+) segments of its (\d+) finished windows \(of \d+\) are kept in "
                         rf"{re.escape(str(partial_folder(out)))}; run the same command again to resume from segment "
                         rf"\2", stderr)
        assert said, stderr
    else:
        assert process.returncode == -signal.SIGKILL
    assert not out.exists()
    saved = PartialState.load(state_file)
    assert saved.windows_done >= 2 and not saved.finished
    if sig == signal.SIGINT:  # what the message said was kept is what was kept
        assert (int(said[2]), int(said[3])) == (saved.n_segments, saved.windows_done)
    rerun = _cli("-m", tiny_bert, "--corpus", corpus_file, "--out", out)
    assert rerun.wait() == 0, rerun.communicate()
    assert not partial_folder(out).exists()
    assert_same_tables(tables.load(out), tables.load(whole), exact=True)


@pytest.mark.subprocess
def test_a_saved_state_with_other_settings_is_refused(tmp_path, tiny_bert, corpus_file):
    out = tmp_path / "out"
    state_file = partial_folder(out) / f"{spec_stem(str(tiny_bert))}.npz"
    process = _cli("-m", tiny_bert, "--corpus", corpus_file, "--out", out, "--save-every", "0")
    _stop_midway(process, state_file, signal.SIGINT)
    process.communicate(timeout=120)
    with pytest.raises(TablesError, match=r"a stopped sweep of .* with other inputs \(settings.max_offset: 8 != 3; columns: \d+ != \d+ score "
                                          r"columns \(10 only on the left, such as offsets -8; metrics or their axes differ\)\); "
                                          r"rerun that sweep to finish it, or pass --restart to discard it"):
        sweep(str(tiny_bert), corpus_file, out, max_offset=3, **SETTINGS | {"window": 7})
    restarted = sweep(str(tiny_bert), corpus_file, out, max_offset=3, restart=True, **SETTINGS)
    assert restarted.provenance.config["max_offset"] == 3 and not partial_folder(out).exists()


# --- shards and merge -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_gpt2, tiny_bert, corpus_file):
    root = tmp_path_factory.mktemp("shards")
    models = [str(tiny_gpt2), str(tiny_bert)]
    # One segment per forward pass: each segment's attention is then computed exactly as in the unsharded
    # sweep, so what is left to compare is the merge's own arithmetic (float64 sums in another order).
    # Other batch sizes change the float32 forward itself, by about 1e-8 (see the second test).
    config = dict(device="cpu", bootstrap=20, window=11, bootstrap_unit="document", limit=60, batch_size=1)
    whole = sweep(models, corpus_file, root / "whole", **config)
    parts = [root / f"part-{k}" for k in range(3)]
    for k, part in enumerate(parts):
        sweep(models, corpus_file, part, shard=f"{k}/3", **config)
    return whole, parts, root




def test_merged_shards_equal_the_unsharded_sweep(shards):
    whole, parts, root = shards
    merged = merge(parts, root / "merged")
    assert_merged_equals_whole(whole, merged)
    assert merged.provenance.models[0].n_segments == whole.provenance.models[0].n_segments == 60
    assert tables.load(root / "merged").provenance.extra["merged_from"] == [str(p) for p in parts]


def test_shards_with_other_batch_sizes_merge_to_within_float32_noise(shards, tmp_path, corpus_file):
    whole, parts, _ = shards
    models = tables.load(parts[0]).models
    config = dict(device="cpu", bootstrap=20, window=11, bootstrap_unit="document", limit=60)
    other = [tmp_path / f"p{k}" for k in range(3)]
    for k, part in enumerate(other):
        sweep(models, corpus_file, part, shard=f"{k}/3", batch_size=2 + k, **config)
    merged = merge(other)
    np.testing.assert_allclose(merged.heads["value"], whole.heads["value"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(merged.heads["ci_high"], whole.heads["ci_high"], rtol=0, atol=1e-6)


def test_merge_refuses_missing_repeated_and_foreign_shards(shards, tmp_path, tiny_bert, corpus_file):
    _, parts, root = shards
    with pytest.raises(TablesError, match="shards 2/3 are missing; merge needs all 3"):
        merge(parts[:2])
    with pytest.raises(TablesError, match=r"shard 1/3 is given twice"):
        merge([parts[0], parts[1], parts[1], parts[2]])
    with pytest.raises(TablesError, match=r"whole: has no partial state for"):
        merge([parts[0], root / "whole"])
    other = tmp_path / "other"
    sweep([str(p) for p in tables.load(parts[0]).models], corpus_file, other, shard="1/3", device="cpu",
          bootstrap=20, window=11, bootstrap_unit="document", limit=60, seed=1)
    with pytest.raises(TablesError, match=r"other: not a shard of the same sweep as .*part-0: settings.seed: 0 != 1"):
        merge([parts[0], other, parts[2]])


# --- every fingerprint field refuses a resume and a merge ---------------------------------------------------------

# One other valid value for every setting that enters the fingerprint (`fingerprint=False` marks, in
# headscan/config.py, each one that does not, with why).
CHANGED = {"max_len": 64, "long": "split", "limit": 5, "dtype": "bfloat16", "specials": "exclude", "max_offset": 3,
           "bootstrap": 20, "seed": 1, "prepend_bos": False, "bootstrap_unit": "document", "window": 7,
           "pack": "sentences", "attention": "chunked", "query_chunk": 128, "values": False,
           "document_field": "doc", "importance": "atp", "ablate_top": 3, "ablate_first": True, "importance_sample": 4, "mask_rate": 0.3,
           "sink": 4, "recent": 8, "similarity_sample": 4, "examples": 2, "composition": "on", "layers": "0"}
# The model, corpus and version facts of a fingerprint, changed in place.
FACTS = [("headscan", None, "0.0.1"), ("model", "name", "other"), ("model", "id", "other==1"),
         ("model", "revision", "0" * 40), ("model", "control", "random-init"), ("model", "control_seed", 1),
         ("corpus", "source", "other.txt"), ("corpus", "kind", "jsonl"),
         ("corpus", "sha256", "f" * 64)]


def test_every_fingerprinted_setting_has_another_value_here():
    from headscan.config import SweepConfig
    from headscan.setting import fingerprinted

    missing, extra = set(fingerprinted(SweepConfig)) - set(CHANGED), set(CHANGED) - set(fingerprinted(SweepConfig))
    assert not missing, f"give {sorted(missing)} another valid value in CHANGED, so its refusal is tested"
    assert not extra, f"{sorted(extra)} no longer enter the fingerprint; drop them from CHANGED"


def _fingerprints(tiny_models, change) -> tuple[dict, dict, str]:
    """The fingerprint of a base sweep, that of a sweep with one thing changed, and the key that names it."""
    import copy

    from headscan.config import SweepConfig
    from headscan.corpus import texts_corpus
    from headscan.scan import fingerprint

    model, corpus = tiny_models["gpt2"], texts_corpus(["the cat sat", "a dog ran"], None)
    needs = {"ablate_top": {"importance": "ablate"}}.get(change, {}) if isinstance(change, str) else {}
    base = SweepConfig(device="cpu", **needs)  # a setting that needs another gets it in both
    if isinstance(change, str):
        other = fingerprint(model, corpus, SweepConfig(device="cpu", **needs, **{change: CHANGED[change]}))
        return fingerprint(model, corpus, base), other, f"settings.{change}"
    group, key, value = change
    other = copy.deepcopy(fingerprint(model, corpus, base))
    if key is None:
        other[group] = value
    else:
        other[group][key] = value
    return fingerprint(model, corpus, base), other, f"{group}.{key}" if key else group


@pytest.mark.parametrize("change", list(CHANGED) + FACTS, ids=str)
def test_each_fingerprint_field_changed_alone_is_refused_by_resume_and_merge(tiny_models, change):
    from headscan.scan.resume import check_resumable
    from headscan.scan.state import Shard, merge_states

    base, other, key = _fingerprints(tiny_models, change)
    saved = PartialState.empty(base, Shard(0, 2), (2, 4, 3), 20)
    saved.finished = True
    with pytest.raises(TablesError, match=rf"with other inputs \(.*{key}: "):
        check_resumable(saved, other, Shard(0, 2), "out.partial/x.npz", "gpt2")
    check_resumable(saved, base, Shard(0, 2), "out.partial/x.npz", "gpt2")  # the same fingerprint resumes
    second = PartialState.empty(other, Shard(1, 2), (2, 4, 3), 20)
    second.finished = True
    with pytest.raises(TablesError, match=rf"b: not a shard of the same sweep as a: .*{key}: "):
        merge_states([saved, second], ["a", "b"])


@pytest.mark.parametrize("kind", ["conllu", "repeat-random"])
def test_shards_of_a_treebank_and_of_repeat_random_merge_to_the_unsharded_sweep(kind, tmp_path, tiny_gpt2, tiny_bert):
    """Windows of 2 over 9 segments, 3 shards: the syntax table and its baseline (a treebank, the tiny BERT), and
    repeat-random's tokens drawn per segment whatever window or shard holds it (the tiny GPT-2): a merge that
    dropped the shards' baseline, or tokens seeded by the position in the window, would pass every other test."""
    corpus = str(treebank_corpus(tmp_path, 9)) if kind == "conllu" else "repeat-random:n=6,count=9,seed=3"
    models = str(tiny_bert) if kind == "conllu" else str(tiny_gpt2)
    config = dict(device="cpu", bootstrap=20, window=2, batch_size=1, max_len=48)
    whole = sweep(models, corpus, tmp_path / "whole", **config)
    parts = [tmp_path / f"part-{k}" for k in range(3)]
    for k, part in enumerate(parts):
        sweep(models, corpus, part, shard=f"{k}/3", **config)
    merged = merge(parts, tmp_path / "merged")
    assert_merged_equals_whole(whole, merged)
    assert ("syntax" in merged.frames) == (kind == "conllu")
    if kind == "conllu":
        assert merged["syntax"]["baseline"].notna().any()


def test_a_fingerprint_names_the_version_model_corpus_settings_columns_and_passes(tiny_models):
    """The keys a saved state is read back by: a headscan that spells one otherwise cannot resume an older state."""
    import headscan
    from headscan.config import SweepConfig
    from headscan.corpus import texts_corpus
    from headscan.scan import fingerprint

    marks = fingerprint(tiny_models["gpt2"], texts_corpus(["the cat sat"], None), SweepConfig(device="cpu"))
    assert list(marks) == ["headscan", "model", "corpus", "settings", "columns", "passes"]
    assert marks["headscan"] == headscan.__version__
