"""The hooked model: what a sweep needs to know about a loaded model, and the one way to read its attention.

A `HookedModel` carries family, shape, special token ids and where the weights came from; it tokenises text
as a sweep feeds it (`HookedModel.token_ids`), and `HookedModel.pattern_forward` runs it with hooks on every
layer's attention, whichever path reads it (`headscan.models.forward`).

This module does not load models (see `headscan.models.load`) or score heads.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .hooks import PROBE
from .windows import window_notes

__all__ = ["HookedModel", "PATHS"]

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
    sites: tuple = field(default=(), repr=False)  # hf_hooks: the attention modules read (hooks.Site), in call order
    # per layer, the largest |q - k| a query sees under a sliding window, None for none (`headscan.models.windows`);
    # empty: no window anywhere
    windows: tuple = ()
    extra: dict = field(default_factory=dict)
    _chunked_refusal: list = field(default_factory=list, repr=False, compare=False)  # the cached chunked_refusal()
    loaded: dict = field(default_factory=dict, repr=False, compare=False)  # loaded on demand (decoding's LM head)

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

    @contextlib.contextmanager
    def pattern_forward(self, hooks: dict[int, Callable], attention: str = "eager", query_chunk: int | None = None,
                        internals: dict[str, dict[int, Callable]] | None = None):
        """Attach `hooks` (layer -> ``hook(pattern, hook)``) for a loop of forward passes that only read patterns.

        Yields ``forward(input_ids, attention_mask)``. The hooks must not write into what they are handed; what
        they return is ignored on the ``hf_hooks`` path and replaces the pattern on the bridge, so return None.
        The forward pass runs without autograd (inference mode) and stops at the last hooked layer's pattern
        when nothing else of that layer is wanted (else after its block), so the output head never runs
        (the vocabulary projection alone is about half of minilm's forward and a fifth of smollm2's:
        benchmarks/bridge_overhead.py), nor, when only patterns (and values) are wanted, the last layer's MLP.

        ``attention="eager"``: each hook gets its layer's whole pattern, (batch, head, q, k), once per forward;
        its second argument says where it was read (a TransformerLens ``HookPoint`` or a `PatternSite`).

        ``attention="chunked"``: the pattern is never built. Each hook is called once per block of at most
        `query_chunk` queries (None: as many as keep a block within 8 MiB, `headscan.models.chunked.block_rows`),
        in order, with rows ``start .. stop - 1`` of the pattern, (batch, head, block, k),
        exactly as eager attention gives them (`headscan.models.chunked`), and a `QueryBlock` saying which rows
        they are. A model whose scores chunked mode cannot reproduce is refused (`chunked_refusal`).

        `internals` also hands over other per-layer tensors of the same forward pass, never to be written into:
        ``{"v": {layer: fn}, "z": {layer: fn}, "out": {layer: fn}}`` calls ``fn(tensor, layer)`` with the
        layer's values, (batch, k, kv_head, d_head), value bias included, before the layer's pattern hook; its
        per-head attention output before the output projection, (batch, q, head, d_head); or the residual
        stream after the layer's block, (batch, q, d_model). A layer named only there is run to as well.
        Eager mode hands them over on the ``transformer_lens`` path (the bridge's ``hook_v``, ``hook_z`` and
        ``hook_out``); chunked mode hands over v and z on both paths, and "out" on the ``transformer_lens``
        path. Elsewhere asking for them is a `ConfigError`.
        """
        from .forward import pattern_forward

        with pattern_forward(self, hooks, attention=attention, query_chunk=query_chunk, internals=internals) as forward:
            yield forward

    def chunked_refusal(self) -> str | None:
        """None when chunked attention reproduces this model's scores exactly, else one sentence saying why not.

        Checked once per model (static checks, then a probe through both modes; see
        `headscan.models.forward.chunked_refusal`).
        """
        if not self._chunked_refusal:
            from .forward import chunked_refusal

            self._chunked_refusal.append(chunked_refusal(self))
        return self._chunked_refusal[0]

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
