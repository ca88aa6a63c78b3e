"""Provenance checked against facts computed here, not against headscan's own numbers.

Hashes are recomputed with hashlib from the files (the corpus's bytes; a model's weight files, in the order
the revision's definition gives), versions are asked of importlib.metadata and git, and every file of a run
(run.json, the metadata of every parquet table, a shard's partial state) must say the same.
"""

import dataclasses
import hashlib
import json
import subprocess
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from headscan.config import SweepConfig
from headscan.scan import PartialState, merge, sweep
from headscan.tables import TABLES

REPO = Path(__file__).resolve().parents[1]
LINES = ["The cat sat on the mat.", "It slept all day.", "", "A dog barked at the mailman.", "Then it ran home.",
         "Nobody saw it go.", "", "The end."]
CONFIG = SweepConfig(max_len=32, batch_size=3, device="cpu", specials="exclude", max_offset=5, bootstrap=25, seed=11,
                     bootstrap_unit="document", interval="percentile", window=2)


def sha256_of(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def weight_revision(folder: Path) -> str:
    """A local checkpoint's revision: sha256 over its weight files' bytes, one after the other, in path order.

    Weight files are those ending in .safetensors, .bin, .gguf or .pt (`headscan.models.source._weight_files`).
    """
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in {".safetensors", ".bin", ".gguf", ".pt"})
    assert files, f"no weight files in {folder}"
    return "sha256:" + sha256_of(*files)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("provenance") / "three paragraphs.txt"
    path.write_bytes(("\n".join(LINES) + "\n").encode())
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_gpt2, tiny_bert, corpus_file) -> Path:
    out = tmp_path_factory.mktemp("provenance-run") / "out"
    sweep([str(tiny_gpt2), str(tiny_bert)], corpus_file, out, CONFIG)
    return out


def parquet_provenance(path: Path) -> dict:
    return json.loads(pq.read_schema(path).metadata[b"headscan"])


def test_the_corpus_hash_is_the_sha256_of_the_file_s_bytes(run, corpus_file):
    corpus = json.loads((run / "run.json").read_text())["corpus"]
    assert corpus["sha256"] == hashlib.sha256(corpus_file.read_bytes()).hexdigest()
    assert corpus["source"] == str(corpus_file) and corpus["kind"] == "text"
    assert corpus["n_segments"] == sum(1 for line in LINES if line) == 6
    assert corpus["n_documents"] == 3 and corpus["documents"] == "blank-line paragraphs"


def test_each_model_s_revision_is_the_sha256_of_its_weight_files(run, tiny_gpt2, tiny_bert):
    models = json.loads((run / "run.json").read_text())["models"]
    assert [m["name"] for m in models] == [str(tiny_gpt2), str(tiny_bert)]
    for model, folder in zip(models, (tiny_gpt2, tiny_bert)):
        assert [p.name for p in folder.iterdir() if p.suffix == ".safetensors"] == ["model.safetensors"]
        assert model["revision"] == weight_revision(folder)
        assert model["source"] == "local" and model["id"] == str(folder)
    assert models[0]["revision"] != models[1]["revision"]


def test_a_revision_covers_every_weight_file_in_path_order(tmp_path, tiny_bert):
    """Two weight files: the digest runs over both, sorted by path (so a.pt before model.safetensors)."""
    from headscan.models import load_model

    folder = tmp_path / "bert-with-extra"
    folder.mkdir()
    for path in tiny_bert.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "a.pt").write_bytes(b"not read by the loader, but hashed")
    expected = "sha256:" + sha256_of(folder / "a.pt", folder / "model.safetensors")
    assert weight_revision(folder) == expected
    assert load_model(str(folder), device="cpu").revision == expected


def test_every_table_carries_run_json_in_its_metadata(run):
    recorded = json.loads((run / "run.json").read_text())
    files = sorted(p.name for p in run.iterdir())
    written = [table for table in TABLES.values() if (run / table.file).exists()]
    assert {"heads", "offsets", "weights"} <= {table.name for table in written}  # syntax: CoNLL-U corpora only
    assert files == sorted([table.file for table in written] + ["run.json"])
    for table in written:
        assert parquet_provenance(run / table.file) == recorded, table.file
    # what made the run: this headscan, and in a git checkout the commit as 40 hex digits
    import re

    import headscan

    assert recorded["headscan_version"] == headscan.__version__
    revision = recorded["git_revision"]
    assert revision is None or re.fullmatch(r"[0-9a-f]{40}", revision), revision
    # run.json is read and diffed by people (the committed reports'): one key a line, indented by two
    text = (run / "run.json").read_text()
    assert text.startswith('{\n  "schema_version": ') and text.count("\n") > 40


def test_run_ids_match_across_files_and_differ_between_runs(run, tmp_path, tiny_bert, corpus_file):
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    assert len(run_id) == 32 and int(run_id, 16) >= 0
    assert {parquet_provenance(path)["run_id"] for path in run.glob("*.parquet")} == {run_id}
    other = tmp_path / "other"
    sweep(str(tiny_bert), corpus_file, other, CONFIG)
    assert json.loads((other / "run.json").read_text())["run_id"] != run_id


def test_the_config_recorded_is_the_settings_passed(run, corpus_file, tiny_gpt2, tiny_bert):
    recorded = json.loads((run / "run.json").read_text())
    assert recorded["config"] == CONFIG.to_json()  # "cpu" resolves to itself
    assert recorded["command"] == (
        f"headscan.sweep([{str(tiny_gpt2)!r}, {str(tiny_bert)!r}], {str(corpus_file)!r}, out={str(run)!r}, max_len=32, "
        f"batch_size=3, device='cpu', specials='exclude', max_offset=5, bootstrap=25, seed=11, "
        f"bootstrap_unit='document', interval='percentile', window=2)")
    for model in recorded["models"]:
        assert model["max_len"] == 32 and model["n_segments"] == 6 and model["n_truncated"] == 0
    offsets = sorted({int(k) for k in pd.read_parquet(run / "offsets.parquet")["offset"]})
    assert offsets == list(range(-5, 6))


def test_versions_and_git_revision_are_those_of_this_environment(run):
    recorded = json.loads((run / "run.json").read_text())
    for package in ("torch", "transformers", "numpy", "pandas"):
        assert recorded["versions"][package] == version(package), package
    assert recorded["versions"]["transformer_lens"] == version("transformer-lens")
    assert recorded["headscan_version"] == version("headscan") == recorded["versions"]["headscan"]
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert recorded["git_revision"] == head.stdout.strip()


def test_token_counts_are_those_of_the_model_s_own_tokenizer(run, tiny_gpt2, tiny_bert):
    from transformers import AutoTokenizer

    models = json.loads((run / "run.json").read_text())["models"]
    for model, folder in zip(models, (tiny_gpt2, tiny_bert)):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        total = 0
        for line in filter(None, LINES):
            ids = tokenizer(line)["input_ids"]
            if model["prepend_bos"] and ids[0] != tokenizer.bos_token_id:
                ids = [tokenizer.bos_token_id, *ids]
            total += min(len(ids), 32)
        assert model["n_tokens"] == total, model["name"]


def test_shards_and_their_merge_record_the_same_hashes(tmp_path, tiny_bert, corpus_file):
    config = dataclasses.replace(CONFIG, bootstrap_unit="segment")
    parts = [tmp_path / f"part-{k}" for k in range(3)]
    for k, part in enumerate(parts):
        sweep(str(tiny_bert), corpus_file, part, config, shard=f"{k}/3")
    corpus_hash = hashlib.sha256(corpus_file.read_bytes()).hexdigest()
    revision = weight_revision(tiny_bert)
    for k, part in enumerate(parts):
        recorded = json.loads((part / "run.json").read_text())
        assert recorded["shard"] == f"{k}/3"
        assert recorded["corpus"]["sha256"] == corpus_hash and recorded["models"][0]["revision"] == revision
        for path in part.glob("*.parquet"):
            assert parquet_provenance(path) == recorded
        (state_file,) = (part / "state").iterdir()
        state = PartialState.load(state_file)
        assert state.fingerprint["corpus"]["sha256"] == corpus_hash
        assert state.fingerprint["model"]["revision"] == state.model["revision"] == revision
        assert state.fingerprint["settings"]["seed"] == 11 and state.shard.index == k
    merged = merge(parts, tmp_path / "merged")
    recorded = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert recorded["corpus"]["sha256"] == corpus_hash and recorded["models"][0]["revision"] == revision
    assert recorded["run_id"] == merged.provenance.run_id
    assert recorded["run_id"] not in {json.loads((p / "run.json").read_text())["run_id"] for p in parts}
    assert len(list((tmp_path / "merged").glob("*.parquet"))) >= 3
    for path in (tmp_path / "merged").glob("*.parquet"):
        assert parquet_provenance(path) == recorded
    assert recorded["models"][0]["n_segments"] == 6
    assert np.isfinite(merged.heads["ci_low"]).any()
