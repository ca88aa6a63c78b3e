"""The hooked model: what a sweep needs to know about a loaded model, and how it tokenises text.

A `HookedModel` carries family, shape, special token ids and where the weights came from; it tokenises text
as a sweep feeds it (`HookedModel.token_ids`). Running it with hooks on every layer's attention is
`headscan.models.forward.pattern_forward`, a plain function over a `HookedModel`: the model's description sits at
the bottom of `headscan.models`, and the modules that read attention import it, never the other way round.

This module does not load models (see `headscan.models.load`), read attention or score heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .windows import window_notes

__all__ = ["HookedModel", "PATHS", "PROBE"]

PROBE = "The quick brown fox jumps over the lazy dog."  # checks every model as it loads

PATHS = ("transformer_lens", "hf_hooks")  # how a model's attention pattern is read; see headscan.models.load


@dataclass
class HookedModel:
    """A model whose attention patterns a sweep can read, with what the sweep needs to know about it."""

    name: str  # as given by the user: alias, Hugging Face id or folder
    hf_model: Any = field(repr=False)  # the Hugging Face model that runs (the bridge's original_model on its path)
    tokenizer: Any = field(repr=False)  # a Hugging Face tokenizer
    family: str  # "causal" (queries see only the past) or "bidirectional"
    n_layers: int
    n_heads: int  # query heads per layer
    n_kv_heads: int  # key/value heads per layer (< n_heads under grouped-query attention)
    d_model: int
    n_params: int
    vocab_size: int
    max_context: int  # the longest segment the model accepts, in tokens
    special_token_ids: dict[str, int | None]  # bos, cls, sep, pad
    prepend_bos: bool  # whether the sweep puts BOS before each segment of a causal model
    source: str  # "alias", "local", "gguf" or "huggingface"
    id: str  # Hugging Face id or path the weights were read from
    revision: str  # the revision named (ID@step3000), else the Hugging Face commit hash, or sha256 of the weights
    path: str = "transformer_lens"  # how patterns are read: "transformer_lens" or "hf_hooks" (see PATHS)
    bridge: Any = field(default=None, repr=False)  # the TransformerBridge on the transformer_lens path, else None
    # where each layer's attention parts are (`headscan.models.sites.LayerSites`), resolved as the model loads
    layer_sites: Any = field(default=None, repr=False)
    # per layer, the largest |q - k| a query sees under a sliding window, None for none (`headscan.models.windows`);
    # empty: no window anywhere
    windows: tuple = ()
    extra: dict = field(default_factory=dict)
    # forward.chunked_refusal's answer, once asked: the probe runs once per model
    _chunked_refusal: list = field(default_factory=list, repr=False, compare=False)
    loaded: dict = field(default_factory=dict, repr=False, compare=False)  # loaded on demand (decoding's LM head)

    @property
    def sites(self) -> tuple:
        """hf_hooks: the attention modules read (`headscan.models.sites.Site`), in call order; () on the bridge."""
        return self.layer_sites.attention if self.layer_sites is not None else ()

    @property
    def causal(self) -> bool:
        return self.family == "causal"

    def window(self, layer: int) -> int | None:
        """The largest distance |q - k| a query of `layer` sees under its sliding window; None: no window."""
        return self.windows[layer] if self.windows else None

    def kv_group(self, head):
        """The key/value head that query head `head` (an int or an integer array) reads under grouped-query
        attention: query heads are split into n_kv_heads consecutive groups, as in Llama."""
        return head // (self.n_heads // self.n_kv_heads)

    @property
    def device(self) -> torch.device:
        """Where the inputs go: the device of the input embeddings (the first of several under a device map)."""
        embeddings = self.hf_model.get_input_embeddings() if hasattr(self.hf_model, "get_input_embeddings") else None
        parameter = embeddings.weight if embeddings is not None else next(self.hf_model.parameters())
        return parameter.device

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The token ids of each text exactly as a sweep feeds them to the model, never truncated.

        Encoders get their tokenizer's own special tokens ([CLS] ... [SEP], <s> ... </s>). Causal models get
        the text's tokens with BOS before them exactly when `prepend_bos` is True, whatever the tokenizer does
        by itself: Llama's and OPT's tokenizers add BOS on their own, GPT-2's does not.

        >>> import tempfile
        >>> from headscan.models import load_model
        >>> from headscan.testing import build_tiny_checkpoint
        >>> folder = str(build_tiny_checkpoint(tempfile.mkdtemp(), "gpt2"))
        >>> load_model(folder).token_ids(["the cat sat"])  # BOS is <|endoftext|>, id 0
        [[0, 972, 270, 293, 257, 293]]
        >>> load_model(folder, prepend_bos=False).token_ids(["the cat sat"])
        [[972, 270, 293, 257, 293]]
        """
        texts = list(texts)
        if not texts:
            return []
        if not self.causal:
            encoded = self.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
            return [list(ids) for ids in encoded]
        # The tokenizer's own special tokens left out: BOS is put back below when wanted, and a causal
        # model's tokenizer adds nothing else a sweep needs.
        encoded = self.tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
        opening = [self.special_token_ids["bos"]] if self.prepend_bos else []
        return [opening + list(ids) for ids in encoded]

    def token_spans(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int] | None]]]:
        """`token_ids` of each text, and each token's [start, stop) characters in the text (None for special
        tokens): the fast tokenizer's own offset mapping, from the same call, so the ids are `token_ids`'.

        >>> import tempfile
        >>> from headscan.models import load_model
        >>> from headscan.testing import build_tiny_checkpoint
        >>> folder = str(build_tiny_checkpoint(tempfile.mkdtemp(), "bert"))
        >>> ids, spans = load_model(folder).token_spans(["the cat"])[0]  # the c ##a ##t
        >>> spans
        [None, (0, 3), (4, 5), (5, 6), (6, 7), None]
        """
        texts = list(texts)
        if not texts:
            return []
        if not getattr(self.tokenizer, "is_fast", False):
            from ..errors import CorpusError

            raise CorpusError(f"{self.name}: its tokenizer ({type(self.tokenizer).__name__}) is not a fast (Rust) "
                              f"tokenizer, so it cannot say which characters each token covers, which a CoNLL-U "
                              f"sweep needs to give tokens to words; load the model with its fast tokenizer")
        specials = not self.causal  # as token_ids: a causal model's BOS is put back below
        encoded = self.tokenizer(texts, add_special_tokens=specials, truncation=False, verbose=False,
                                 return_offsets_mapping=True, return_special_tokens_mask=True)
        out = []
        for ids, offsets, special in zip(encoded["input_ids"], encoded["offset_mapping"], encoded["special_tokens_mask"]):
            spans = [None if is_special else (int(start), int(stop))
                     for (start, stop), is_special in zip(offsets, special)]
            if self.causal and self.prepend_bos:
                ids, spans = [self.special_token_ids["bos"], *ids], [None, *spans]
            out.append((list(ids), spans))
        return out

    def fed_bos(self) -> bool:
        """Whether the ids a sweep feeds begin with BOS, read off a probe sentence (not off the setting)."""
        bos = self.special_token_ids["bos"]
        ids = self.token_ids([PROBE])[0]
        return bos is not None and bool(ids) and ids[0] == bos

    def provenance(self) -> dict:
        config = self.hf_model.config
        not_modelled = window_notes(config.get_text_config(), self.n_layers)  # chance as for full attention there
        return {
            "name": self.name,
            "source": self.source,
            "id": self.id,
            "revision": self.revision,
            "family": self.family,
            "architecture": type(self.hf_model).__name__,
            "model_type": getattr(config, "model_type", None),
            "path": self.path,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "d_model": self.d_model,
            "n_params": self.n_params,
            "tokenizer": type(self.tokenizer).__name__,
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
            "special_token_ids": self.special_token_ids,
            "prepend_bos": self.fed_bos(),
            **({"attention_windows": list(self.windows)} if self.windows else {}),
            **({"attention_not_modelled": not_modelled} if not_modelled else {}),
            **self.extra,
        }
