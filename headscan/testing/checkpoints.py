"""Tiny randomly initialised Hugging Face checkpoints, built offline in well under a second.

They let tests (and users without a network) run headscan end to end on a real GPT-2 or BERT
architecture. The weights are random, so the scores mean nothing: for heads with known answers see
`headscan.testing.planted`. Nothing here downloads anything; the tokenizers are built from a small
English text kept in this module.
"""

from __future__ import annotations

import pathlib
import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertTokenizerFast,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2TokenizerFast,
)

ARCHS = ("gpt2", "bert")

# Common English words: the BERT vocabulary lists them whole, and they (with TEXT) train the GPT-2 merges,
# so ordinary sentences tokenise into words and word pieces rather than [UNK] or single bytes.
WORDS = ["the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with", "as", "i", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "not", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my", "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "any", "new", "work", "part", "take", "get", "place", "made", "live", "where", "after", "back", "little", "only", "round", "man", "year", "came", "show", "every", "good", "me", "give", "our", "under", "name", "very", "through", "just", "form", "sentence", "great", "think", "say", "help", "low", "line", "differ", "turn", "cause", "much", "mean", "before", "move", "right", "boy", "old", "too", "same", "tell", "does", "set", "three", "want", "air", "well", "also", "play", "small", "end", "put", "home", "read", "hand", "port", "large", "spell", "add", "even", "land", "here", "must", "big", "high", "such", "follow", "act", "why", "ask", "men", "change", "went", "light", "kind", "off", "need", "house", "picture", "try", "us", "again", "animal", "point", "mother", "world", "near", "build", "self", "earth", "father", "head", "stand", "own", "page", "should", "country", "found", "answer", "school", "grow", "study", "still", "learn", "plant", "cover", "food", "sun", "four", "between", "state", "keep", "eye", "never", "last", "let", "thought", "city", "tree", "cross", "farm", "hard", "start", "might", "story", "saw", "far", "sea", "draw", "left", "late", "run", "don't", "while", "press", "close", "night", "real", "life", "few", "north", "open", "seem", "together", "next", "white", "children", "begin", "got", "walk", "example", "ease", "paper", "group", "always", "music", "those", "both", "mark", "often", "letter", "until", "mile", "river", "car", "feet", "care", "second", "book", "carry", "took", "science", "eat", "room", "friend", "began", "idea", "fish", "mountain", "stop", "once", "base", "hear", "horse", "cut", "sure", "watch", "color", "face", "wood", "main", "enough", "plain", "girl", "usual", "young", "ready", "above", "ever", "red", "list", "though", "feel", "talk", "bird", "soon", "body", "dog", "family", "direct", "pose", "leave", "song", "measure", "door", "product", "black", "short", "numeral", "class", "wind", "question", "happen", "complete", "ship", "area", "half", "rock", "order", "fire", "south", "problem", "piece", "told", "knew", "pass", "since", "top", "whole", "king", "space", "heard", "best", "hour", "better", "true", "during", "hundred", "five", "remember", "step", "early", "hold", "west", "ground", "interest", "reach", "fast", "verb", "sing", "listen", "six", "table", "travel", "less", "morning", "ten", "simple", "several", "vowel", "toward", "war", "lay", "against", "pattern", "slow", "center", "love", "person", "money", "serve", "appear", "road", "map", "rain", "rule", "govern", "pull", "cold", "notice", "voice", "unit", "power", "town", "fine", "certain", "fly", "fall", "lead", "cry", "dark", "machine", "note", "wait", "plan", "figure", "star", "box", "noun", "field", "rest", "correct", "able", "pound", "done", "beauty", "drive", "stood", "contain", "front", "teach", "week", "final", "gave", "green", "oh", "quick", "develop", "ocean", "warm", "free", "minute", "strong", "special", "mind", "behind", "clear", "tail", "produce", "fact", "street", "inch", "multiply", "nothing", "course", "stay", "wheel", "full", "force", "blue", "object", "decide", "surface", "deep", "moon", "island", "foot", "system", "busy", "test", "record", "boat", "common", "gold", "possible", "plane", "stead", "dry", "wonder", "laugh", "thousand", "ago", "ran", "check", "game", "shape", "equate", "hot", "miss", "brought", "heat", "snow", "tire", "bring", "yes", "distant", "fill", "east", "paint", "language", "among"]

TEXT = """
The quick brown fox jumps over the lazy dog. A small model reads a sentence and looks back at the words
it has seen. Attention heads in a transformer decide which earlier tokens matter for the next one. Some heads
look at the previous token, some at the first token, and some spread their attention over the whole sentence.
We wrote this text so that the tokenizer learns the usual pieces of English: -ing, -ed, -ly, -tion, the, and.
I'm sure you'd like it; they've said it's fine. Numbers like 1, 2, 3, 10, 42 and 2024 appear too.
"""

_SPECIAL_BERT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_EOT = "<|endoftext|>"


def build_tiny_checkpoint(
    path,
    arch: str = "gpt2",
    *,
    n_layers: int = 2,
    n_heads: int = 4,
    d_model: int = 32,
    max_positions: int = 128,
    seed: int = 0,
) -> pathlib.Path:
    """Write a randomly initialised GPT-2 or BERT checkpoint, with its tokenizer, into a folder.

    Parameters
    ----------
    path : str or os.PathLike
        Folder to write into; created if missing. Receives ``config.json``, ``model.safetensors`` and the
        tokenizer files, so ``from_pretrained(path)`` and headscan's loaders accept it.
    arch : {"gpt2", "bert"}
        ``"gpt2"`` writes a causal ``GPT2LMHeadModel`` with a byte-level BPE tokenizer (no pad token, as in
        GPT-2); ``"bert"`` writes a bidirectional ``BertForMaskedLM`` with a WordPiece tokenizer.
    n_layers, n_heads, d_model : int
        Model size; ``d_model`` must be divisible by ``n_heads``. Defaults 2, 4 and 32.
    max_positions : int
        Number of learned positions, the longest input the model accepts. Default 128.
    seed : int
        Seed for the weights; the same seed gives identical weights and the vocabulary never varies.

    Returns
    -------
    pathlib.Path
        ``path``, as a ``Path``.

    Examples
    --------
    >>> import tempfile
    >>> from transformers import AutoConfig
    >>> folder = build_tiny_checkpoint(tempfile.mkdtemp(), "bert", n_layers=1)
    >>> AutoConfig.from_pretrained(folder).num_hidden_layers
    1
    """
    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r} is not one of {ARCHS}")
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _gpt2_tokenizer() if arch == "gpt2" else bert_tokenizer(path)
    model = _random_model(arch, len(tokenizer), n_layers, n_heads, d_model, max_positions, seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _random_model(arch, vocab_size, n_layers, n_heads, d_model, max_positions, seed):
    """A model in eval mode with every dropout probability 0, so any loader's forward is deterministic."""
    if arch == "gpt2":
        config = GPT2Config(
            vocab_size=vocab_size, n_positions=max_positions, n_embd=d_model, n_layer=n_layers, n_head=n_heads,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        )
        model_class = GPT2LMHeadModel
    else:
        config = BertConfig(
            vocab_size=vocab_size, hidden_size=d_model, num_hidden_layers=n_layers, num_attention_heads=n_heads,
            intermediate_size=4 * d_model, max_position_embeddings=max_positions,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0,
        )
        model_class = BertForMaskedLM
    # fork_rng: seed the init without changing the caller's global random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    return model.eval()


def _gpt2_tokenizer() -> GPT2TokenizerFast:
    """A byte-level BPE (1000 tokens) trained on this module's English text; <|endoftext|> is id 0."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=[_EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([TEXT, " ".join(WORDS)], trainer=trainer)
    return GPT2TokenizerFast(tokenizer_object=bpe, bos_token=_EOT, eos_token=_EOT, unk_token=_EOT)


def bert_tokenizer(folder: pathlib.Path) -> BertTokenizerFast:
    """A lower-casing WordPiece tokenizer over printable characters, their ## pieces, suffixes and WORDS."""
    chars = string.ascii_lowercase + string.digits + string.punctuation
    suffixes = ["s", "es", "ed", "ing", "ly", "er", "est", "tion", "ment", "ness", "'s", "n't"]
    pieces = _SPECIAL_BERT + list(chars) + ["##" + c for c in chars] + ["##" + s for s in suffixes] + WORDS
    vocab = list(dict.fromkeys(pieces))  # no duplicates: ids must run 0 .. len(vocab) - 1
    # transformers 5 builds the fast tokenizer from a dict; vocab.txt is written too, for older loaders.
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)
