"""Hugging Face datasets as corpora (``hf:NAME``), on datasets written here in a temporary folder: a save_to_disk
folder (one split and several), a folder of parquet files read as a stream, and the one-line errors."""

from __future__ import annotations

import datasets
import pandas as pd
import pytest

import headscan
from headscan.corpus import read_corpus
from headscan.errors import CorpusError

ROWS = {"text": ["The cat sat.", "", "  It slept.  ", "Dogs bark.", "A bird sang."],
        "doc": ["a", "a", "a", "b", "c"], "n": [1, 2, 3, 4, 5]}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "saved"
    datasets.Dataset.from_dict(ROWS).save_to_disk(str(folder))
    return folder


def test_a_saved_dataset_is_one_segment_per_row_with_text(saved):
    corpus = read_corpus(f"hf:{saved}")
    # the blank row is skipped as a blank line is; each segment keeps its row number as its line
    assert [(s.text, s.line, s.document) for s in corpus.segments] == [
        ("The cat sat.", 1, 0), ("It slept.", 3, 1), ("Dogs bark.", 4, 2), ("A bird sang.", 5, 3)]
    assert corpus.kind == "hf" and corpus.options == {"dataset": str(saved)}
    assert read_corpus(f"hf:{saved}", limit=2).segments[-1].text == "It slept."
    assert read_corpus(f"hf:{saved}").sha256 == corpus.sha256 != read_corpus(f"hf:{saved}", limit=2).sha256


def test_documents_from_a_field_and_splits_of_a_dataset_dict(saved, tmp_path):
    by_doc = read_corpus(f"hf:{saved}", document_field="doc")
    assert [s.document for s in by_doc.segments] == [0, 0, 1, 2] and by_doc.n_documents == 3
    both = tmp_path / "dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(ROWS),
                          "test": datasets.Dataset.from_dict({"body": ["Only one."]})}).save_to_disk(str(both))
    assert [s.text for s in read_corpus(f"hf:{both}:split=test,field=body").segments] == ["Only one."]
    with pytest.raises(CorpusError, match=r"no split 'dev' in .* \(splits: train, test\); pass split="):
        read_corpus(f"hf:{both}:split=dev")


def test_a_folder_of_parquet_files_is_streamed(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    pd.DataFrame({"text": [f"Sentence number {i}." for i in range(50)]}).to_parquet(folder / "part-0.parquet")
    corpus = read_corpus(f"hf:{folder}", limit=3)
    assert [s.text for s in corpus.segments] == ["Sentence number 0.", "Sentence number 1.", "Sentence number 2."]


def test_a_sweep_reads_an_hf_corpus_and_records_it(saved, tiny_gpt2):
    tables = headscan.sweep(str(tiny_gpt2), f"hf:{saved}", device="cpu", bootstrap=0)
    corpus = tables.provenance.corpus
    assert (corpus.source, corpus.kind, corpus.n_segments) == (f"hf:{saved}", "hf", 4)


def test_a_saved_dataset_sweeps_to_the_tables_of_the_same_texts_in_a_jsonl_file(saved, tiny_gpt2, tmp_path):
    """A dataset is only another way to hand headscan the same text; documents from the same field."""
    import json

    jsonl = tmp_path / "same.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "doc": d}) + "\n" for t, d in zip(ROWS["text"], ROWS["doc"])),
                     encoding="utf-8")
    settings = dict(device="cpu", bootstrap=50, bootstrap_unit="document", document_field="doc")
    from_dataset = headscan.sweep(str(tiny_gpt2), f"hf:{saved}", **settings)
    from_jsonl = headscan.sweep(str(tiny_gpt2), str(jsonl), **settings)
    assert from_dataset.provenance.corpus.n_segments == from_jsonl.provenance.corpus.n_segments == 4
    assert list(from_dataset.frames) == list(from_jsonl.frames)
    for name in from_dataset.frames:
        pd.testing.assert_frame_equal(from_dataset[name], from_jsonl[name], check_exact=True, obj=name)


@pytest.mark.parametrize("spec, message", [
    ("hf:{saved}:split=validation", "holds one dataset without splits; leave split= out"),
    ("hf:{saved}:field=body", "row 1: no field 'body' (fields: text, doc, n); name the text's column"),
    ("hf:{saved}:field=n", "row 1: field 'n' holds int, not text"),
    ("hf:{saved}:colour=red", "bad option 'colour=red'"),
    ("hf:", "no dataset named"),
    ("hf:surely-not-a-dataset-anyone-has/xyz", "surely-not-a-dataset-anyone-has/xyz"),
])
def test_bad_hf_corpora_say_why_in_one_line(saved, spec, message, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(CorpusError, match=None) as error:
        read_corpus(spec.format(saved=saved))
    assert message in str(error.value) and "\n" not in str(error.value)
