"""CoNLL-U read as written: a sentence is tokenised from its own text, as a plain-text line is, and its tokens
go to its words by their characters.

The answers are a plain-text sweep of the same sentences (the heads tables must be equal) and hand-made
sentences whose text, word spans and token-to-word mapping are written out here by hand.
"""

import numpy as np
import pytest

import headscan
from headscan.corpus import encode, read_corpus
from headscan.corpus.words import ROOT, align_tokens, word_alignment
from headscan.metrics.nulls import CALIBRATION_COLUMNS
from headscan.tables import VALUE_COLUMNS

# "I don't "know"." with a multiword token (do + n't) and SpaceAfter=No, without a # text line.
HAND = """\
1\tI\tI\tPRON\t_\t_\t4\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\t_\t_\t5\taux\t_\t_
3\tn't\tnot\tPART\t_\t_\t5\tadvmod\t_\t_
4\t"\t"\tPUNCT\t_\t_\t5\tpunct\t_\tSpaceAfter=No
5\tknow\tknow\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No
6\t"\t"\tPUNCT\t_\t_\t5\tpunct\t_\tSpaceAfter=No
7\t.\t.\tPUNCT\t_\t_\t5\tpunct\t_\t_

"""

# A multiword token whose words do not spell it (Spanish "del" = de + el): its span goes to "de".
MERGED = """\
# text = Vino del mar.
1\tVino\tvenir\tVERB\t_\t_\t0\troot\t_\t_
2-3\tdel\t_\t_\t_\t_\t_\t_\t_\t_
2\tde\tde\tADP\t_\t_\t4\tcase\t_\t_
3\tel\tel\tDET\t_\t_\t4\tdet\t_\t_
4\tmar\tmar\tNOUN\t_\t_\t1\tobl\t_\tSpaceAfter=No
5\t.\t.\tPUNCT\t_\t_\t1\tpunct\t_\t_

"""


def test_a_sentence_without_text_is_its_surface_tokens_joined_as_spaceafter_says(tmp_path):
    path = tmp_path / "hand.conllu"
    path.write_text(HAND)
    corpus = read_corpus(path)
    (segment,) = corpus.segments
    assert segment.text == 'I don\'t "know".'
    assert segment.words == ("I", "do", "n't", '"', "know", '"', ".")
    # by hand: I=0, do=2..4, n't=4..7 (the multiword token split by characters), "=8, know=9..13, "=13, .=14
    assert segment.spans == ((0, 1), (2, 4), (4, 7), (8, 9), (9, 13), (13, 14), (14, 15))
    extra = corpus.provenance()
    assert (extra["multiword_tokens"], extra["multiword_tokens_merged"], extra["words_not_in_text"]) == (1, 0, 0)


@pytest.mark.parametrize("arch, tokens, words, straddling", [
    # byte-level BPE: <|endoftext|> I Ġdon 't Ġ " k now " .  ("Ġdon" holds d, o of "do" and n of "n't": it goes
    # to "do", its first non-space character's word, and straddles; "Ġ", a space alone, goes to the next word)
    ("gpt2", ["<|endoftext|>", "I", "Ġdon", "'t", "Ġ", '"', "k", "now", '"', "."], [-1, 0, 1, 2, 3, 3, 4, 4, 5, 6], 1),
    # WordPiece: [CLS] i do ##n ' t " know " . [SEP]
    ("bert", ["[CLS]", "i", "do", "##n", "'", "t", '"', "know", '"', ".", "[SEP]"], [-1, 0, 1, 2, 2, 2, 3, 4, 5, 6, -1], 0),
])
def test_tokens_go_to_the_word_of_their_first_non_space_character(tmp_path, tiny_models, arch, tokens, words, straddling):
    path = tmp_path / "hand.conllu"
    path.write_text(HAND)
    corpus = read_corpus(path)
    model = tiny_models[arch]
    encoded = encode(corpus, model, 64)
    assert model.tokenizer.convert_ids_to_tokens(list(encoded.token_ids[0])) == tokens
    assert list(encoded.word_ids[0]) == words
    assert (encoded.n_straddling, encoded.n_words_without_token, encoded.missing) == (straddling, 0, ((),))
    # the ids are those of the same text as a line of a plain-text corpus
    assert [list(encoded.token_ids[0])] == model.token_ids([corpus.segments[0].text])


def test_a_merged_multiword_token_leaves_its_other_words_without_a_token_and_they_count_as_misses(tmp_path, tiny_models):
    path = tmp_path / "merged.conllu"
    path.write_text(MERGED)
    corpus = read_corpus(path)
    (segment,) = corpus.segments
    assert segment.spans == ((0, 4), (5, 8), (-1, -1), (9, 12), (12, 13))  # "el" has no characters of its own
    assert (corpus.provenance()["multiword_tokens"], corpus.provenance()["multiword_tokens_merged"]) == (1, 1)
    encoded = encode(corpus, tiny_models["bert"], 64)
    assert encoded.missing == ((2,),) and encoded.n_words_without_token == 1 and 2 not in encoded.word_ids[0]
    words = word_alignment(encoded.word_ids, [segment.heads], [segment.deprels], missing=encoded.missing)
    # every word is scored: "el" (word 2, head "mar") too, and it can only be a miss; the root as ROOT (-2)
    assert words.head.tolist() == [[ROOT, 3, 3, 0, 0]]


def test_a_word_the_tokenizer_drops_is_a_miss_not_a_crash():
    # a control character BERT's normaliser drops: the word between "a" and "b" gets no token
    word_ids, straddling, missing = align_tokens("a \x07 b", [None, (0, 1), (4, 5), None], [(0, 1), (2, 3), (4, 5)])
    assert (word_ids, straddling, missing) == ([-1, 0, 2, -1], 0, [1])


@pytest.mark.parametrize("text, spans, want", [
    ("It ", [(0, 2), (2, 3)], [0, 0]),  # a last token of one space: the word before it
    ("It is  ", [(0, 2), (2, 5), (5, 6), (6, 7), (7, 7)], [0, 1, 1, 1, 1]),  # spaces, then an empty token, at the end
    ("  It", [(0, 1), (1, 4)], [0, 0]),  # spaces at the start: the next word
])
def test_tokens_of_spaces_only_go_to_the_next_word_or_at_the_end_the_last(text, spans, want):
    words = [(text.index("It"), text.index("It") + 2)] + ([(3, 5)] if "is" in text else [])
    assert align_tokens(text, spans, words) == (want, 0, [])


def test_a_conllu_sweep_and_a_plain_text_sweep_of_the_same_sentences_have_equal_heads_tables(tmp_path, tiny_gpt2,
                                                                                                 tiny_bert, ewt_dev):
    """The first 40 EWT dev sentences as a treebank and as one line each of their # text (value weighting off: it
    reads the same patterns, at three times the cost)."""
    corpus = read_corpus(ewt_dev, limit=40)
    lines = tmp_path / "ewt.txt"
    lines.write_text("\n".join(s.text for s in corpus.segments) + "\n", encoding="utf-8")
    models = [str(tiny_gpt2), str(tiny_bert)]
    settings = dict(limit=40, device="cpu", bootstrap=0, max_len=128, values=False)
    treebank = headscan.sweep(models, ewt_dev, **settings)
    text = headscan.sweep(models, lines, **settings)
    assert "syntax" in treebank.frames and "syntax" not in text.frames
    for table in ("heads", "offsets"):
        # documents vs segments: support differs, and with it the calibration factor read off the units and the
        # calibrated interval, verdict and finding (the verdict's yes/no: False where thin, <NA> where too few units)
        support = {*VALUE_COLUMNS, *CALIBRATION_COLUMNS, "finding"}
        keys = [c for c in treebank[table].columns if c not in support]
        a, b = (t[table].set_index(keys).sort_index() for t in (treebank, text))
        assert a.index.equals(b.index) and len(a) > 100
        np.testing.assert_array_equal(a["count"], b["count"])
        np.testing.assert_allclose(a["value"], b["value"], rtol=0, atol=1e-6, equal_nan=True)
    for model in models:
        assert treebank.provenance.model(model).n_tokens == text.provenance.model(model).n_tokens
        extra = treebank.provenance.model(model).extra
        assert {"tokens_straddling_words", "words_without_token"} <= set(extra)
    syntax = treebank["syntax"]
    plain = syntax.direction.isin(["dependent_to_head", "head_to_dependent"])
    assert syntax.loc[(syntax.relation == "all") & plain, "count"].min() > 400
    # the _visible rows count a subset of the same dependents (a causal query sees no later word)
    key = ["model", "layer", "head", "relation"]
    for direction in ("dependent_to_head", "head_to_dependent"):
        both = syntax[syntax.direction == direction].merge(syntax[syntax.direction == f"{direction}_visible"], on=key)
        assert len(both) and (both["count_y"] <= both["count_x"]).all()
    # ... in the causal model alone: a bidirectional one sees every head, and has no _visible rows
    directions = {family: set(rows) for family, rows in syntax.groupby("family", observed=True)["direction"]}
    assert directions["bidirectional"] == {"dependent_to_head", "head_to_dependent"}
    assert directions["causal"] == {"dependent_to_head", "head_to_dependent", "dependent_to_head_visible",
                                    "head_to_dependent_visible"}


# A sentence whose last word ("el" of "del") has no characters of its own, so no token: it lies after the last word
# that has one.
TAIL = "# text = a b c d e f del\n" + "".join(
    f"{i}\t{w}\t{w}\tX\t_\t_\t{0 if i == 1 else 1}\t{'root' if i == 1 else 'dep'}\t_\t_\n"
    for i, w in enumerate("abcdef", start=1)) + "7-8\tdel\t_\t_\t_\t_\t_\t_\t_\t_\n7\tde\tde\tADP\t_\t_\t1\tcase\t_\t_\n" \
    "8\tel\tel\tDET\t_\t_\t1\tdet\t_\t_\n\n"


@pytest.mark.parametrize("long", ["split", "truncate"])
def test_a_tokenless_last_word_belongs_to_the_last_piece_of_a_split_segment_and_is_lost_with_a_cut_end(tmp_path,
                                                                                                     tiny_models, long):
    path = tmp_path / "tail.conllu"
    path.write_text(TAIL)
    corpus = read_corpus(path)
    model = tiny_models["bert"]
    whole = encode(corpus, model, 64)
    assert whole.missing == ((7,),) and 7 not in whole.word_ids[0] and 6 in whole.word_ids[0]
    pieces = encode(corpus, model, 5, long=long)  # [CLS] + 3 tokens + [SEP] a piece
    if long == "split":
        assert len(pieces.token_ids) > 1
        # the segment's end is in its last piece, and "el" with it: scored there as a miss, nowhere else
        assert pieces.missing[:-1] == ((),) * (len(pieces.token_ids) - 1) and pieces.missing[-1] == (7,)
    else:
        # the cut drops the end of the segment, "el" with it: not a miss, not a word at all
        assert len(pieces.token_ids) == 1 and pieces.missing == ((),)
