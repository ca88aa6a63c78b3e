"""The answer gate of the retrieval score: ROUGE-1 recall of a decoded answer, with Porter stemming.

Wu et al.'s (2024) reference code counts a needle-in-a-haystack trial only when ``rouge_score``'s ROUGE-1
recall of the expected answer by the decoded response is above 50%, with ``use_stemmer=True``. That package's
tokenizer lower-cases, turns every run of characters outside ``[a-z0-9]`` into a space, and stems words longer
than three letters with NLTK's Porter stemmer (its default mode, with NLTK's extensions to Porter 1980); recall
is the clipped count of the reference's words found in the response over the reference's word count.
`rouge1_recall` computes exactly that here, so headscan needs neither ``rouge_score`` nor NLTK; the tests
compare it with ``rouge_score`` itself over every word of the EWT treebank.

>>> porter_stem("retrieval"), porter_stem("copying"), porter_stem("heads")
('retriev', 'copi', 'head')
>>> rouge1_recall("watch the lantern boats at dusk", "They watched a lantern boat.")
0.5

This module does not run models.
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["porter_stem", "rouge_words", "rouge1_recall", "GATE_RULE"]

GATE_RULE = ("ROUGE-1 recall of the answer by the decoded response (skip_special_tokens, stripped), as rouge_score "
             "computes it with use_stemmer=True: lower-cased, runs of characters outside [a-z0-9] as spaces, words "
             "of more than 3 letters Porter-stemmed (NLTK's default mode)")

_NON_ALPHANUMERIC = re.compile(r"[^a-z0-9]+")

# NLTK's extension: words the algorithm would mangle, with their stem.
_IRREGULAR = {form: stem for stem, forms in {
    "sky": ("sky", "skies"), "die": ("dying",), "lie": ("lying",), "tie": ("tying",), "news": ("news",),
    "inning": ("innings", "inning"), "outing": ("outings", "outing"), "canning": ("cannings", "canning"),
    "howe": ("howe",), "proceed": ("proceed",), "exceed": ("exceed",), "succeed": ("succeed",),
}.items() for form in forms}


def _consonant(word: str, i: int) -> bool:
    """Porter's consonant: not a vowel, and a 'y' only after a vowel (or at the start)."""
    if word[i] in "aeiou":
        return False
    if word[i] == "y":
        return i == 0 or not _consonant(word, i - 1)
    return True


def _measure(stem: str) -> int:
    """m in [C](VC)^m[V]: how many vowel-consonant runs the stem has."""
    pattern = "".join("c" if _consonant(stem, i) else "v" for i in range(len(stem)))
    return pattern.count("vc")


def _has_vowel(stem: str) -> bool:
    return any(not _consonant(stem, i) for i in range(len(stem)))


def _double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _consonant(word, len(word) - 1)


def _cvc(word: str) -> bool:
    """*o: ends consonant-vowel-consonant, the last not w, x or y (NLTK also takes a two-letter vowel-consonant)."""
    n = len(word)
    if n >= 3:
        return (_consonant(word, n - 3) and not _consonant(word, n - 2) and _consonant(word, n - 1)
                and word[-1] not in "wxy")
    return n == 2 and not _consonant(word, 0) and _consonant(word, 1)


def _rules(word: str, rules) -> str:
    """The first rule whose suffix `word` ends with decides: applied if its condition holds on the stem, else
    the word is left as it is. The suffix "*d" is a double consonant."""
    for suffix, replacement, condition in rules:
        if suffix == "*d":
            if not _double_consonant(word):
                continue
            stem = word[:-2]
        elif word.endswith(suffix):
            stem = word[: len(word) - len(suffix)]
        else:
            continue
        return stem + replacement if condition is None or condition(stem) else word
    return word


def _positive(stem: str) -> bool:
    return _measure(stem) > 0


def _above_one(stem: str) -> bool:
    return _measure(stem) > 1


def _step1a(word: str) -> str:
    if word.endswith("ies") and len(word) == 4:  # NLTK: "dies" -> "die", but "flies" -> "fli"
        return word[:-3] + "ie"
    return _rules(word, [("sses", "ss", None), ("ies", "i", None), ("ss", "ss", None), ("s", "", None)])


def _step1b(word: str) -> str:
    if word.endswith("ied"):  # NLTK: "died" -> "die", but "spied" -> "spi"
        return word[:-3] + ("ie" if len(word) == 4 else "i")
    if word.endswith("eed"):
        return word[:-1] if _measure(word[:-3]) > 0 else word
    for suffix in ("ed", "ing"):
        if word.endswith(suffix) and _has_vowel(word[: -len(suffix)]):
            stem = word[: -len(suffix)]
            break
    else:
        return word
    return _rules(stem, [
        ("at", "ate", None), ("bl", "ble", None), ("iz", "ize", None),
        ("*d", stem[-1:], lambda s: stem[-1] not in "lsz"),
        ("", "e", lambda s: _measure(s) == 1 and _cvc(s)),
    ])


def _step1c(word: str) -> str:
    return _rules(word, [("y", "i", lambda s: len(s) > 1 and _consonant(s, len(s) - 1))])


_STEP2 = [("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"), ("izer", "ize"),
          ("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous"), ("ization", "ize"),
          ("ation", "ate"), ("ator", "ate"), ("alism", "al"), ("iveness", "ive"), ("fulness", "ful"),
          ("ousness", "ous"), ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"), ("fulli", "ful")]


def _step2(word: str) -> str:
    if word.endswith("alli") and _positive(word[:-4]):  # NLTK applies ALLI -> AL first, then step 2 again
        return _step2(word[:-4] + "al")
    rules = [(suffix, replacement, _positive) for suffix, replacement in _STEP2]
    # NLTK keeps the 'l' of LOGI -> LOG with the stem, so "geologi" and "theologi" stem alike
    rules.append(("logi", "log", lambda stem: _positive(word[:-3])))
    return _rules(word, rules)


def _step3(word: str) -> str:
    return _rules(word, [(suffix, replacement, _positive) for suffix, replacement in
                         [("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"),
                          ("ful", ""), ("ness", "")]])


_STEP4 = ["al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion", "ou", "ism", "ate",
          "iti", "ous", "ive", "ize"]


def _step4(word: str) -> str:
    return _rules(word, [(suffix, "", (lambda s: _above_one(s) and s[-1:] in ("s", "t")) if suffix == "ion"
                          else _above_one) for suffix in _STEP4])


def _step5(word: str) -> str:
    if word.endswith("e"):
        stem = word[:-1]
        if _measure(stem) > 1 or (_measure(stem) == 1 and not _cvc(stem)):
            word = stem
    return _rules(word, [("ll", "l", lambda s: _measure(word[:-1]) > 1)])


def porter_stem(word: str) -> str:
    """The Porter stem of a lower-case word, as NLTK's ``PorterStemmer()`` (mode NLTK_EXTENSIONS) gives it.

    >>> [porter_stem(w) for w in ("caresses", "ponies", "relational", "hopping", "generalization", "dying")]
    ['caress', 'poni', 'relat', 'hop', 'gener', 'die']
    """
    word = word.lower()
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if len(word) <= 2:
        return word
    for step in (_step1a, _step1b, _step1c, _step2, _step3, _step4, _step5):
        word = step(word)
    return word


def rouge_words(text: str) -> list[str]:
    """`text` as rouge_score's tokenizer with stemming reads it.

    >>> rouge_words("The Quiet-Heron's sails, 1999!")
    ['the', 'quiet', 'heron', 's', 'sail', '1999']
    """
    words = _NON_ALPHANUMERIC.sub(" ", text.lower()).split()
    return [porter_stem(w) if len(w) > 3 else w for w in words]


def rouge1_recall(reference: str, response: str) -> float:
    """ROUGE-1 recall of `reference` by `response`: the reference's words (with repeats) found in the response,
    each counted at most as often as the response has it, over the reference's word count; 0 for an empty
    reference.

    >>> rouge1_recall("violet anchor seventeen", "The password is violet anchor.")
    0.6666666666666666
    """
    wanted, found = Counter(rouge_words(reference)), Counter(rouge_words(response))
    total = sum(wanted.values())
    return sum(min(n, found[w]) for w, n in wanted.items()) / total if total else 0.0
