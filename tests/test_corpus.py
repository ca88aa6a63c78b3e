"""Reading corpora: every source, its documents, its errors (exact text), reading files lazily and in bounded
memory, tokenisation and batching."""

import dataclasses
import json
import os
import pickle
import tracemalloc

import pytest
import torch

from headscan.corpus import INDEX, EncodedCorpus, FileSegments, batches, encode, read_corpus
from headscan.corpus import files as readers
from headscan.errors import ConfigError, CorpusError

WORD = "{id}\tw{id}\tw\tX\t_\t_\t{head}\tdep\t_\t_"  # a CoNLL-U word line


def conllu(*sentences, newdoc=None) -> str:
    """CoNLL-U text: each sentence a list of heads; `newdoc` maps a sentence index to its comment line."""
    blocks = []
    for index, heads in enumerate(sentences):
        comments = [newdoc[index]] if newdoc and index in newdoc else []
        blocks.append("\n".join(comments + [WORD.format(id=i, head=h) for i, h in enumerate(heads, start=1)]))
    return "\n\n".join(blocks) + "\n\n"


def documents(path, **options) -> list[int]:
    return [s.document for s in read_corpus(path, **options).segments]


def test_builtin_sample_ships_with_the_package():
    corpus = read_corpus("builtin")
    assert corpus.kind == "builtin" and len(corpus.segments) == 80
    assert len(corpus.sha256) == 64
    assert corpus.n_documents == 80 and corpus.documents == "none: each segment is its own document"


def test_conllu_keeps_words_heads_and_relations(ewt_dev):
    corpus = read_corpus(ewt_dev, limit=5)
    first = corpus.segments[0]
    assert first.text == "From the AP comes this story :"
    assert first.words == ("From", "the", "AP", "comes", "this", "story", ":")
    assert first.heads == (3, 3, 4, 0, 6, 4, 4)
    assert first.deprels[3] == "root" and first.line == 1
    assert all(len(s.words) == len(s.heads) == len(s.deprels) for s in corpus.segments)


def test_ewt_dev_has_one_document_per_newdoc_line(ewt_dev):
    corpus = read_corpus(ewt_dev)
    n_newdoc = sum(line.startswith("# newdoc") for line in ewt_dev.read_text(encoding="utf-8").splitlines())
    assert (len(corpus.segments), corpus.n_documents, n_newdoc) == (2001, 318, 318)
    assert corpus.documents == "conllu # newdoc lines"
    assert corpus.provenance()["n_documents"] == 318
    assert [s.document for s in corpus.segments[:6]] == [0, 0, 0, 0, 0, 1]  # a five-sentence weblog post first


def test_conllu_skips_multiword_ranges_and_empty_nodes(tmp_path):
    path = tmp_path / "t.conllu"
    rows = [
        "# text = I don't know",
        "1\tI\tI\tPRON\t_\t_\t3\tnsubj\t_\t_",
        "2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_",
        "2\tdo\tdo\tAUX\t_\t_\t3\taux\t_\t_",
        "3\tknow\tknow\tVERB\t_\t_\t0\troot\t_\t_",
        "3.1\tgone\tgo\tVERB\t_\t_\t_\t_\t_\t_",
    ]
    path.write_text("\n".join(rows) + "\n\n")
    (segment,) = read_corpus(path).segments
    assert segment.words == ("I", "do", "know") and segment.heads == (3, 3, 0)


def test_conllu_newdoc_lines_start_documents(tmp_path):
    path = tmp_path / "d.conllu"
    path.write_text(conllu([0], [0], [2, 0], [0], newdoc={1: "# newdoc id = b", 3: "# newdoc"}))
    corpus = read_corpus(path)
    assert [s.document for s in corpus.segments] == [0, 1, 1, 2]  # before the first newdoc: document 0
    assert (corpus.documents, corpus.n_documents) == ("conllu # newdoc lines", 3)
    path.write_text(conllu([0], [0], [0], newdoc={0: "# newdoc id = a", 2: "# newdoc id = b"}))
    assert documents(path) == [0, 0, 1]


def test_conllu_without_newdoc_makes_each_sentence_a_document(tmp_path):
    path = tmp_path / "d.conllu"
    path.write_text(conllu([0], [2, 0], [0]))
    corpus = read_corpus(path)
    assert [s.document for s in corpus.segments] == [0, 1, 2]
    assert corpus.documents == "none: no # newdoc lines, so each sentence is its own document"


def test_jsonl_reads_the_text_field(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "one"}) + "\n\n" + json.dumps({"text": " "}) + "\n" + json.dumps({"text": "two"}) + "\n")
    corpus = read_corpus(path)
    assert [(s.text, s.line) for s in corpus.segments] == [("one", 1), ("two", 4)]
    assert [s.document for s in corpus.segments] == [0, 1] and corpus.documents == "none: each line is its own document"


def test_jsonl_lines_split_on_newlines_only(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "a\u2028b\x85c"}\r\n{"text": "d"}\n', encoding="utf-8")
    assert [(s.text, s.line) for s in read_corpus(path).segments] == [("a\u2028b\x85c", 1), ("d", 2)]


def test_jsonl_document_field_groups_consecutive_equal_values(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [("a", 1), ("b", 1), ("c", 2), ("", 3), ("d", 1), ("e", "1"), ("f", "1")]
    path.write_text("".join(json.dumps({"text": t, "doc": d}) + "\n" for t, d in rows))
    corpus = read_corpus(path, document_field="doc")
    assert [s.document for s in corpus.segments] == [0, 0, 1, 2, 3, 3]  # a document of empty text leaves no gap
    assert corpus.documents == "jsonl field 'doc': consecutive lines with equal values"
    assert documents(path) == [0, 1, 2, 3, 4, 5]
    assert documents(path, document_field="doc", limit=3) == [0, 0, 1]


def test_plain_text_is_one_segment_per_non_blank_line_and_paragraphs_are_documents(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("first line\nsecond line\n\n  \nthird line\n\nfourth\n\n")
    corpus = read_corpus(path)
    assert [(s.text, s.line, s.document) for s in corpus.segments] == [
        ("first line", 1, 0), ("second line", 2, 0), ("third line", 5, 1), ("fourth", 7, 2)
    ]
    assert (corpus.documents, corpus.n_documents) == ("blank-line paragraphs", 3)
    assert corpus.provenance() | {"sha256": ""} == {
        "source": str(path), "kind": "text", "sha256": "", "n_segments": 4,
        "documents": "blank-line paragraphs", "n_documents": 3,
    }


def test_plain_text_without_blank_lines_between_segments_makes_each_line_a_document(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("\n\none\ntwo\nthree\n\n\n")
    corpus = read_corpus(path)
    assert [s.document for s in corpus.segments] == [0, 1, 2]
    assert corpus.documents == "none: no blank line between segments, so each line is its own document"


@pytest.mark.parametrize("name, content", [
    ("c.txt", b"\xef\xbb\xbfone\ntwo\n"),
    ("c.jsonl", b'\xef\xbb\xbf{"text": "one"}\n{"text": "two"}\n'),
    ("c.conllu", b"\xef\xbb\xbf# text = one\n1\tone\t_\t_\t_\t_\t0\troot\t_\t_\n\n# text = two\n1\ttwo\t_\t_\t_\t_\t0\troot\t_\t_\n"),
])
def test_a_utf8_byte_order_mark_is_accepted(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    assert [s.text for s in read_corpus(path).segments] == ["one", "two"]


def test_a_byte_order_mark_does_not_hide_the_first_newdoc(tmp_path):
    path = tmp_path / "d.conllu"
    path.write_bytes(b"\xef\xbb\xbf" + conllu([0], [0], [0], newdoc={0: "# newdoc id = a", 2: "# newdoc"}).encode())
    assert documents(path) == [0, 0, 1]


JSONL_HOW = "put one JSON object on each line, the segment in its 'text' field"
CONLLU_HOW = "give it sentences: word lines of 10 tab-separated columns, a blank line after each"
BAD_FILES = [
    # every kind of file
    ("c.txt", b"", "{path}: is empty; pass a file with at least one segment of text"),
    ("c.jsonl", b"\xef\xbb\xbf", "{path}: is empty; pass a file with at least one segment of text"),
    ("c.txt", b"\n \n\t\n", "{path}: holds only blank lines; put one segment on each line"),
    ("c.txt", b"ok\n\xff\xfe\n", "{path}, line 2: not UTF-8 text; convert it first (iconv -t utf-8)"),
    ("c.conllu", b"ok\nbin\x00ary\n", "{path}, line 2: holds a NUL byte, so it looks binary (or UTF-16); pass a UTF-8 text file"),
    ("c.txt", "utf-16 text".encode("utf-16"), "{path}, line 1: holds a NUL byte, so it looks binary (or UTF-16); pass a UTF-8 text file"),
    # JSONL
    ("c.jsonl", b"\n\n", f"{{path}}: holds only blank lines; {JSONL_HOW}"),
    ("c.jsonl", b'{"text": "one"}\n{oops\n',
     "{path}, line 2: not valid JSON (Expecting property name enclosed in double quotes); put one JSON object on each line"),
    ("c.jsonl", b"[" * 100_000, "{path}, line 1: not valid JSON (nested too deeply); put one JSON object on each line"),
    ("c.jsonl", b"1" * 5000, "{path}, line 1: not valid JSON (a number has too many digits); put one JSON object on each line"),
    ("c.jsonl", b'["one"]\n', '{path}, line 1: expected a JSON object, found an array; put one object like {"text": "..."} on each line'),
    ("c.jsonl", b'"one"\n', '{path}, line 1: expected a JSON object, found a string; put one object like {"text": "..."} on each line'),
    ("c.jsonl", b'{"text": "a"}\n{"body": "one"}\n', "{path}, line 2: no 'text' field; every line needs one holding its text"),
    ("c.jsonl", b'{"text": 3}\n', "{path}, line 1: field 'text' is a number; it must be a string"),
    ("c.jsonl", b'{"text": null}\n', "{path}, line 1: field 'text' is null; it must be a string"),
    ("c.jsonl", b'{"text": ["a"]}\n', "{path}, line 1: field 'text' is an array; it must be a string"),
    ("c.jsonl", b'{"text": "a\\ud800"}\n', "{path}, line 1: field 'text' holds a lone surrogate (\\ud800-\\udfff); remove it"),
    ("c.jsonl", b'{"text": " "}\n\n{"text": ""}\n', f"{{path}}: every segment is empty or whitespace; {JSONL_HOW}"),
    # CoNLL-U
    ("c.conllu", b"\n\n\n", f"{{path}}: holds only blank lines; {CONLLU_HOW}"),
    ("c.conllu", b"# text = a\n1\ta\ta\n",
     "{path}, line 2: a CoNLL-U word line has 10 tab-separated columns, found 3; "
     "separate columns with tabs and write _ for an empty one"),
    ("c.conllu", conllu([0]).replace("1\t", "one\t", 1).encode(),
     "{path}, line 1: ID column is 'one', expected a whole number; "
     "number words 1, 2, 3, ... (ranges like 2-3 and empty nodes like 3.1 are skipped)"),
    ("c.conllu", conllu([0], [2, 0, 2]).replace("2\tw2", "3\tw2").encode(),
     "{path}, line 4: word ID is 3, expected 2; number each sentence's words 1, 2, 3, ... in order"),
    ("c.conllu", conllu([0, 1]).replace("\t1\tdep", "\troot\tdep").encode(),
     "{path}, line 2: HEAD column is 'root', expected a whole number; write the ID of the word's head, 0 for the root"),
    ("c.conllu", conllu([0], [3, 0]).encode(),
     "{path}, line 3: HEAD is 3 but the sentence has 2 words; use 0 for the root or a word ID from 1 to 2"),
    ("c.conllu", conllu([2, -1]).encode(),
     "{path}, line 2: HEAD is -1 but the sentence has 2 words; use 0 for the root or a word ID from 1 to 2"),
    ("c.conllu", b"# sent_id = 1\n# text = a\n\n",
     "{path}, line 1: sentence has no word lines; add them, or a blank line is missing"),
    ("c.conllu", b"# text = \n1\t \t_\t_\t_\t_\t0\troot\t_\t_\n", f"{{path}}: every segment is empty or whitespace; {CONLLU_HOW}"),
]


@pytest.mark.parametrize("name, content, message", BAD_FILES)
def test_bad_files_are_one_clear_error(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CorpusError) as error:
        read_corpus(path)
    assert str(error.value) == message.replace("{path}", str(path))


def test_missing_document_field_names_file_and_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "a", "doc": 1}\n{"text": "b"}\n')
    with pytest.raises(CorpusError) as error:
        read_corpus(path, document_field="doc")
    assert str(error.value) == f"{path}, line 2: no 'doc' field; every line needs one when documents come from it"


def test_document_field_is_for_jsonl_only(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("one\n")
    with pytest.raises(CorpusError) as error:
        read_corpus(path, document_field="doc")
    assert str(error.value) == f"{path}: document_field='doc' applies to .jsonl files only; leave it out"


def test_missing_file_or_a_directory_says_what_a_corpus_can_be(tmp_path):
    with pytest.raises(CorpusError) as error:
        read_corpus(tmp_path / "nope.txt")
    assert str(error.value) == f"{tmp_path / 'nope.txt'}: no such file; pass a .txt, .jsonl or .conllu file, 'builtin' or 'repeat-random'"
    with pytest.raises(CorpusError) as error:
        read_corpus(tmp_path)
    assert str(error.value) == f"{tmp_path}: is a directory; pass a .txt, .jsonl or .conllu file"


def count_reads(monkeypatch) -> list:
    """Every read of a corpus file after its reading pass, as (start, stop) byte offsets."""
    reads, read = [], readers.CorpusFile.read

    def counted(self, start, stop):
        reads.append((start, stop))
        return read(self, start, stop)

    monkeypatch.setattr(readers.CorpusFile, "read", counted)
    return reads


def test_file_segments_are_a_lazy_read_only_sequence(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("".join(f"line {i}\n" + "\n" * (i % 7 == 6) for i in range(50)))
    corpus = read_corpus(path)
    segments = corpus.segments
    assert isinstance(segments, FileSegments) and len(segments) == 50 and segments.nbytes == 50 * INDEX.itemsize
    eager = list(segments)
    assert [s.text for s in eager] == [f"line {i}" for i in range(50)]
    assert [segments[i] for i in reversed(range(50))][::-1] == eager  # random access agrees with reading on
    assert segments[-1] == eager[49] and segments[-50] == eager[0]
    for key in (slice(10, 20), slice(None, None, 7), slice(-5, None), slice(30, 10, -3), slice(60, 70)):
        part = segments[key]
        assert isinstance(part, FileSegments) and list(part) == eager[key] and part == tuple(eager[key])
    assert segments == tuple(eager) and tuple(eager) == segments and segments != tuple(eager[1:])
    assert segments[3:][2:5] == eager[5:8]
    assert corpus.segment_documents.tolist() == [s.document for s in eager] and corpus.n_documents == 8
    with pytest.raises(IndexError, match="segment 50 is out of range: the corpus has 50 segments"):
        segments[50]
    with pytest.raises(IndexError):
        segments[-51]
    with pytest.raises(TypeError, match="not str"):
        segments["1"]
    assert pickle.loads(pickle.dumps(corpus)) == corpus  # travels to other processes (Ray workers) without its cache


def test_documents_and_provenance_read_no_segment(tmp_path, monkeypatch, ewt_dev):
    corpus = read_corpus(ewt_dev)
    reads = count_reads(monkeypatch)
    assert corpus.n_documents == 318 and corpus.provenance()["n_segments"] == 2001 and not reads


def test_a_window_of_consecutive_segments_is_one_read(tmp_path, monkeypatch):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": f"segment {i}"}) + "\n" for i in range(3000)))
    segments = read_corpus(path).segments
    reads = count_reads(monkeypatch)
    [segments[i] for i in range(1024)]
    assert len(reads) == 12  # reading on reads further ahead each time: 1, 2, 4, ... 256, 256, 256 segments
    reads.clear()
    for start in range(1024, 3000, 256):  # a sweep's windows: the units of a window, then its texts
        window = range(start, min(start + 256, 3000))
        assert [segments[i].line for i in window] == [i + 1 for i in window]
        assert [segments[i].text for i in window] == [f"segment {i}" for i in window]
    assert len(reads) <= 8  # a read per window of 256 at most
    assert len({start for start, _ in reads}) == len(reads)  # nothing read twice


def test_a_file_changed_after_reading_is_refused(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("one\ntwo\nsix\n")
    corpus = read_corpus(path)
    fix = "read it again, and leave a corpus file unchanged while it is swept"
    status = path.stat()
    path.write_text("one\ntwo\nten\n")  # same size, and the same modification time restored
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert corpus.segments[:2] == corpus.segments[:2] and corpus.segments[1].text == "two"
    with pytest.raises(CorpusError) as error:
        corpus.segments[2:][0]
    assert str(error.value) == f"{path}: changed since it was read (line 3 differs); {fix}"
    path.write_text("one\ntwo\nsix\nseven\n")
    with pytest.raises(CorpusError) as error:
        corpus.segments[1:][0]
    assert str(error.value) == f"{path}: changed since it was read (its size or modification time differ); {fix}"
    path.unlink()
    with pytest.raises(CorpusError) as error:
        corpus.segments[1:][0]
    assert str(error.value) == f"{path}: changed since it was read (No such file or directory); {fix}"


def peak_bytes(function) -> int:
    """The most memory Python held at once while `function` ran, beyond what it held before."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        function()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_reading_a_corpus_keeps_an_index_not_its_text(tmp_path, suffix):
    """Ten times the lines cost the index's 40 bytes a segment more, not ten times the text."""
    sizes, peaks, corpora = {}, {}, {}
    for n in (2_000, 20_000):
        path = tmp_path / f"c{n}{suffix}"
        with path.open("w") as out:
            for i in range(n):
                text = f"segment {i} " + "lorem ipsum dolor sit amet " * 14  # about 400 characters
                out.write((json.dumps({"text": text}) if suffix == ".jsonl" else text) + "\n")
                out.write("\n" * (i % 10 == 9))
        sizes[n] = path.stat().st_size
        peaks[n] = peak_bytes(lambda: corpora.setdefault(n, read_corpus(path)))
    assert corpora[20_000].n_documents == 2_000 if suffix == ".txt" else 20_000
    grown = peaks[20_000] - peaks[2_000]
    assert grown < (sizes[20_000] - sizes[2_000]) / 4, (peaks, sizes)  # the text is 10x larger, the peak is not
    assert peaks[20_000] < sizes[20_000] / 4, (peaks, sizes)
    # reading every segment keeps only the last ones read
    assert peak_bytes(lambda: sum(len(s.text) for s in corpora[20_000].segments)) < sizes[20_000] / 4


def test_repeat_random_options_and_errors():
    corpus = read_corpus("repeat-random:n=5,count=7,seed=3")
    assert corpus.options == {"n": 5, "count": 7, "seed": 3}
    assert [s.document for s in corpus.segments] == list(range(7))
    assert corpus.provenance()["n_documents"] == 7
    assert len(read_corpus("repeat-random", limit=4).segments) == 4
    with pytest.raises(CorpusError, match="bad option 'm=5'"):
        read_corpus("repeat-random:m=5")


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_long_segments_split_into_windows_lose_no_token(tiny_models, arch):
    from headscan.corpus import Corpus, Segment

    text = "the old man walked down to the river and looked at the boats for a long time before going home"
    model = tiny_models[arch]
    corpus = Corpus("test", "text", "", (Segment(text + " " + text, 1), Segment("a dog ran", 2)))
    whole = model.token_ids([corpus.segments[0].text])[0]
    split = encode(corpus, model, 8, long="split")
    cut = encode(corpus, model, 8)
    assert all(len(ids) <= 8 for ids in split.token_ids) and split.n_tokens_lost == 0
    assert [split.segment_of(i) for i in range(len(split.token_ids))] == [0] * (len(split.token_ids) - 1) + [1]
    specials = (1 if arch == "gpt2" else 2)  # BOS; or [CLS] and [SEP]
    bodies = [ids[1: len(ids) - (specials - 1)] for ids in split.token_ids[:-1]]
    assert [t for body in bodies for t in body] == list(whole[1: len(whole) - (specials - 1)])  # nothing lost or repeated
    assert all(ids[0] == whole[0] for ids in split.token_ids)  # every window opens like the segment
    assert cut.n_truncated == split.n_truncated == 1 and cut.n_tokens_lost == len(whole) - 8


def test_repeat_random_tokens_repeat_and_are_seeded(tiny_models):
    model = tiny_models["bert"]
    corpus = read_corpus("repeat-random:n=6,count=3,seed=1")
    encoded = encode(corpus, model, 64)
    cls, sep = model.special_token_ids["cls"], model.special_token_ids["sep"]
    for ids in encoded.token_ids:
        assert ids[0] == cls and ids[-1] == sep and ids[1:7] == ids[7:13] and len(set(ids[1:7])) == 6
    assert encode(corpus, model, 64).token_ids == encoded.token_ids
    assert encode(read_corpus("repeat-random:n=6,count=3,seed=2"), model, 64).token_ids != encoded.token_ids
    with pytest.raises(ConfigError, match="lower n or raise --max-len"):
        encode(read_corpus("repeat-random:n=40,count=1"), model, 64)
    # a segment swept in a part of the corpus alone gets its own tokens, not the first segment's (the per-document
    # sums of experiments/unit_sums.py once came out 318 times the same)
    for i in range(3):
        part = dataclasses.replace(corpus, segments=(corpus.segments[i],))
        assert encode(part, model, 64).token_ids == (encoded.token_ids[i],)
    assert len(set(encoded.token_ids)) == 3


def test_encoders_get_cls_and_sep_and_keep_sep_when_truncated(tiny_models):
    model = tiny_models["bert"]
    encoded = encode(read_corpus("builtin", limit=3), model, 6)
    cls, sep = model.special_token_ids["cls"], model.special_token_ids["sep"]
    assert all(len(ids) <= 6 and ids[0] == cls and ids[-1] == sep for ids in encoded.token_ids)
    assert encoded.n_truncated == 3


def test_causal_models_get_bos_when_the_model_uses_one(tiny_models):
    model = tiny_models["gpt2"]
    encoded = encode(read_corpus("builtin", limit=2), model, 32)
    assert model.prepend_bos  # TransformerLens' default for GPT-2
    assert all(ids[0] == model.special_token_ids["bos"] for ids in encoded.token_ids)


def test_batches_are_right_padded_with_a_mask():
    encoded = EncodedCorpus(((1, 2, 3), (4,), (5, 6)), 0, 8)
    out = list(batches(encoded, 2, pad_id=0))
    assert [b.index.tolist() for b in out] == [[1, 2], [0]]
    assert out[0].input_ids.tolist() == [[4, 0], [5, 6]]
    assert out[0].attention_mask.tolist() == [[1, 0], [1, 1]]
    assert out[0].input_ids.dtype == torch.long
    assert sum(b.n_tokens for b in out) == 6


# --- packing short segments into long inputs ---------------------------------------------------------------


def test_packing_conllu_sentences_joins_their_trees_with_heads_shifted(ewt_dev):
    from headscan.corpus import pack_corpus

    corpus = read_corpus(ewt_dev, limit=60)
    packed = pack_corpus(corpus, "sentences", 200)
    assert sum(len(s.words) for s in packed.segments) == sum(len(s.words) for s in corpus.segments)
    assert all(len(s.words) >= 200 for s in packed.segments[:-1])
    assert [s.document for s in packed.segments] == list(range(len(packed.segments)))
    first = packed.segments[0]
    shift, n_sentences = 0, 0
    for sentence in corpus.segments:  # each sentence's tree sits in the packed one, shifted by the words before it
        if shift >= len(first.words):
            break
        heads = first.heads[shift: shift + len(sentence.words)]
        assert heads == tuple(h + shift if h else 0 for h in sentence.heads)
        assert first.deprels[shift: shift + len(sentence.words)] == sentence.deprels
        shift += len(sentence.words)
        n_sentences += 1
    assert n_sentences > 5 and packed.options["pack"] == "sentences" and packed.options["n_segments_before_packing"] == 60


def test_packing_documents_keeps_one_segment_per_document(ewt_dev):
    from headscan.corpus import pack_corpus

    corpus = read_corpus(ewt_dev, limit=80)
    packed = pack_corpus(corpus, "documents", 128)
    assert len(packed.segments) == corpus.n_documents == packed.n_documents
    assert pack_corpus(corpus, "none", 128) is corpus


def test_a_packed_sweep_fills_max_len_and_scores_syntax(tiny_gpt2, ewt_dev):
    import headscan

    tables = headscan.sweep(str(tiny_gpt2), ewt_dev, limit=40, max_len=96, pack="sentences", bootstrap=0)
    (model,) = tables.provenance.models
    assert model.n_truncated == model.n_segments and model.n_tokens == 96 * model.n_segments
    assert tables.provenance.corpus.extra["pack"] == "sentences"
    syntax = tables["syntax"]
    assert syntax.query("relation == 'all'")["count"].min() > 0


def test_words_without_spans_are_found_in_the_text_in_order():
    """A segment made by hand with words but no spans (not from a CoNLL-U file) has each word's characters found
    left to right, so a repeated word maps to its own occurrence."""
    from headscan.corpus.segment import Segment
    from headscan.corpus.tokens import _word_spans

    segment = Segment("the cat saw the  dog.", 0, words=("the", "cat", "saw", "the", "dog", "."))
    assert _word_spans(segment) == ((0, 3), (4, 7), (8, 11), (12, 15), (17, 20), (20, 21))
