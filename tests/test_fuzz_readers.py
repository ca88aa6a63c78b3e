"""Fuzzing the corpus readers: any file either reads into a sound `Corpus`, whose segments read again from
the file in any order are the same, or raises one clear `CorpusError`.

Inputs are random bytes, JSONL lines assembled from valid and broken fragments, and CoNLL-U sentences built
from plausible lines and then mutated. Any exception other than `CorpusError` fails the test.
"""

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from headscan.corpus import read_corpus
from headscan.errors import CorpusError

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def check_read(path, data: bytes, **options):
    """Read `data` from `path`: a corpus whose documents count 0, 1, 2, ... in order, or one clear error line."""
    path.write_bytes(data)
    try:
        corpus = read_corpus(path, **options)
    except CorpusError as error:
        message = str(error)
        assert message.startswith(f"{path}: ") or message.startswith(f"{path}, line ")
        assert "\n" not in message and "; " in message  # one line that says how to fix it
        event(f"CorpusError: {message.split(': ', 1)[1].split(';')[0][:30]}")  # see --hypothesis-show-statistics
        return None
    documents = [s.document for s in corpus.segments]
    event(f"read: {min(corpus.n_documents, 3)}{'+' if corpus.n_documents > 3 else ''} documents")
    assert documents and documents[0] == 0
    assert all(b - a in (0, 1) for a, b in zip(documents, documents[1:]))
    assert corpus.n_documents == documents[-1] + 1 == corpus.provenance()["n_documents"]
    segments = list(corpus.segments)
    assert all(s.text.strip() for s in segments)
    for segment in segments:
        assert len(segment.words) == len(segment.heads) == len(segment.deprels)
        assert all(0 <= head <= len(segment.words) for head in segment.heads)
    # read again from the file: from the end, and in slices, the segments are those read in order
    assert [corpus.segments[-i] for i in range(1, len(segments) + 1)] == segments[::-1]
    assert list(corpus.segments[1::2]) == segments[1::2] and corpus.segments[::-1] == segments[::-1]
    return corpus


SUFFIXES = st.sampled_from([".txt", ".jsonl", ".conllu"])
BOM = st.sampled_from([b"", b"\xef\xbb\xbf"])
NEWLINE = st.sampled_from(["\n", "\r\n"])


@FUZZ
@given(suffix=SUFFIXES, data=st.binary(max_size=300), bom=BOM)
def test_random_bytes(folder, suffix, data, bom):
    check_read(folder / f"bytes{suffix}", bom + data)


@FUZZ
@given(suffix=SUFFIXES, text=st.text(max_size=300), bom=BOM)
def test_random_text(folder, suffix, text, bom):
    check_read(folder / f"text{suffix}", bom + text.encode("utf-8", "surrogatepass"))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
TEXTS = st.text(max_size=20) | st.sampled_from(["", " ", "\x00", "\u2028", "caf\u00e9 \U0001f600", "a\nb"])
FIELDS = st.sampled_from(["text", "doc", "body"])
GOOD_LINES = st.builds(lambda t, d: {"text": t, "doc": d}, TEXTS, st.sampled_from(["a", "b", 1, 1.0, None, [1]]))
BAD_LINES = st.one_of(
    st.builds(lambda t: {"text": t}, TEXTS),  # no "doc", an error only when documents come from it
    st.dictionaries(FIELDS, JSON_VALUES, max_size=3),  # missing or non-string fields
    JSON_VALUES,  # arrays, strings, numbers, null
).map(json.dumps) | st.one_of(
    st.builds(lambda r, cut: json.dumps({"text": r})[:cut], TEXTS, st.integers(0, 12)),  # cut short
    st.sampled_from(['{"text": "\\ud800"}', "{'text': 'single quotes'}", "[" * 2000, "9" * 5000, "", "  "]),
    TEXTS,
)


@st.composite
def jsonl_lines(draw) -> list[str]:
    """Mostly good lines (unicode as is or escaped), with up to two others put among them."""
    lines = [json.dumps(record, ensure_ascii=draw(st.booleans())) for record in draw(st.lists(GOOD_LINES, max_size=8))]
    for where, line in draw(st.lists(st.tuples(st.integers(0, 8), BAD_LINES), max_size=2)):
        lines.insert(where, line)
    return lines


@FUZZ
@given(lines=jsonl_lines(), newline=NEWLINE, bom=BOM, document_field=st.sampled_from([None, "doc"]))
def test_jsonl_fragments(folder, lines, newline, bom, document_field):
    data = bom + newline.join(lines).encode("utf-8", "surrogatepass")
    check_read(folder / "lines.jsonl", data, document_field=document_field)


@st.composite
def conllu_sentence(draw) -> list[str]:
    """A well-formed sentence: a few comments, then words 1..n with heads in 0..n."""
    n = draw(st.integers(1, 5))
    comments = draw(st.lists(st.sampled_from(["# newdoc", "# newdoc id = d", "# sent_id = s", "# text = a b c", "# text ="]),
                             max_size=2))
    words = [[str(i), f"w{i}", "w", "X", "_", "_", str(draw(st.integers(0, n))), "dep", "_", "_"] for i in range(1, n + 1)]
    if n > 1 and draw(st.booleans()):
        words.insert(0, ["1-2", "w1w2", "_", "_", "_", "_", "_", "_", "_", "_"])
    return comments + ["\t".join(columns) for columns in words]


def mutate(line: str, how: int, value: str) -> str:
    columns = line.split("\t")
    if how == 0:
        return line  # most lines stay well formed
    if how == 1:
        return "\t".join(columns[:-1])  # a column short
    if how == 2:
        return line + "\t_"  # a column too many
    if how == 3:
        return line.replace("\t", " ")  # spaces for tabs
    if how == 4 and len(columns) == 10:
        return "\t".join([value, *columns[1:]])  # odd ID
    if how == 5 and len(columns) == 10:
        return "\t".join([*columns[:6], value, *columns[7:]])  # odd HEAD
    if how == 6:
        return ""  # a blank line inside a sentence
    return value  # a stray line: comment, newdoc or junk


ODD_VALUES = st.sampled_from(["x", "-1", "0", "1", "2", "7", "99", "1.5", "1-2", "", " 1", "\u0663", "# newdoc", "#", "_"])


@FUZZ
@given(
    sentences=st.lists(conllu_sentence(), min_size=1, max_size=5),
    mutations=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 7), ODD_VALUES), max_size=4),
    newline=NEWLINE,
    bom=BOM,
)
def test_conllu_fragments(folder, sentences, mutations, newline, bom):
    lines = [line for sentence in sentences for line in [*sentence, ""]]
    for where, how, value in mutations:
        if lines:
            lines[where % len(lines)] = mutate(lines[where % len(lines)], how, value)
    corpus = check_read(folder / "sentences.conllu", bom + newline.join(lines).encode("utf-8"))
    if corpus is not None and not mutations:
        assert len(corpus.segments) == len(sentences)
