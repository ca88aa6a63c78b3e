"""Reading corpora: every source, its errors (with file and line), tokenisation and batching."""

import json

import pytest
import torch

from headscan.corpus import batches, encode, read_corpus
from headscan.errors import ConfigError, CorpusError


def test_builtin_sample_ships_with_the_package():
    corpus = read_corpus("builtin")
    assert corpus.kind == "builtin" and len(corpus.segments) == 80
    assert len(corpus.sha256) == 64


def test_conllu_keeps_words_heads_and_relations(ewt_dev):
    corpus = read_corpus(ewt_dev, limit=5)
    first = corpus.segments[0]
    assert first.text == "From the AP comes this story :"
    assert first.words == ("From", "the", "AP", "comes", "this", "story", ":")
    assert first.heads == (3, 3, 4, 0, 6, 4, 4)
    assert first.deprels[3] == "root" and first.line == 1
    assert all(len(s.words) == len(s.heads) == len(s.deprels) for s in corpus.segments)


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


def test_conllu_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.conllu"
    path.write_text("# text = a\n1\ta\ta\n")
    with pytest.raises(CorpusError, match=r"bad.conllu, line 2: a CoNLL-U word line has 10 tab-separated columns, found 3"):
        read_corpus(path)


def test_jsonl_reads_the_text_field_and_names_bad_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "one"}) + "\n\n" + json.dumps({"text": "two"}) + "\n")
    assert [s.text for s in read_corpus(path).segments] == ["one", "two"]
    path.write_text(json.dumps({"text": "one"}) + "\n{oops\n")
    with pytest.raises(CorpusError, match=r"c.jsonl, line 2: not valid JSON"):
        read_corpus(path)
    path.write_text(json.dumps({"body": "one"}) + "\n")
    with pytest.raises(CorpusError, match=r"line 1: expected an object with a string field 'text'"):
        read_corpus(path)


def test_plain_text_is_one_segment_per_non_blank_line(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("first line\n\n  \nsecond line\n")
    corpus = read_corpus(path)
    assert [(s.text, s.line) for s in corpus.segments] == [("first line", 1), ("second line", 4)]


@pytest.mark.parametrize(
    "content, message",
    [(b"", "holds no text segments"), (b"\n \n", "holds no text segments"), (b"ok\n\xff\xfe\n", "line 2: not UTF-8")],
)
def test_empty_or_undecodable_corpus_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "c.txt"
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=message):
        read_corpus(path)


def test_missing_file_says_what_a_corpus_can_be(tmp_path):
    with pytest.raises(CorpusError, match="no such file; pass a .txt, .jsonl or .conllu file, 'builtin' or 'repeat-random'"):
        read_corpus(tmp_path / "nope.txt")


def test_repeat_random_options_and_errors():
    assert read_corpus("repeat-random:n=5,count=7,seed=3").options == {"n": 5, "count": 7, "seed": 3}
    assert len(read_corpus("repeat-random", limit=4).segments) == 4
    with pytest.raises(CorpusError, match="bad option 'm=5'"):
        read_corpus("repeat-random:m=5")


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
    from headscan.corpus import EncodedCorpus

    encoded = EncodedCorpus(((1, 2, 3), (4,), (5, 6)), 0, 8)
    out = list(batches(encoded, 2, pad_id=0))
    assert [b.index.tolist() for b in out] == [[1, 2], [0]]
    assert out[0].input_ids.tolist() == [[4, 0], [5, 6]]
    assert out[0].attention_mask.tolist() == [[1, 0], [1, 1]]
    assert sum(b.n_tokens for b in out) == 6
