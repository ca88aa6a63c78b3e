"""Provenance: what made a table, as small frozen dataclasses that read and write ``run.json``.

A run records how it was called, the corpus, the settings, the library versions and, per model, where its
weights came from and what the sweep fed it. ``to_json`` and ``from_json`` round-trip; ``from_json`` also
reads the untyped ``run.json`` of headscan 0.1 (no ``schema_version``). Fields a newer headscan wrote and
this one does not know are kept in ``extra``, so reading and writing back loses nothing.

This module does not compute anything; `headscan.scan` fills these in, `headscan.tables` stores them.

>>> run = RunProvenance.from_json({"headscan_version": "0.1.0", "models": [{"name": "minilm", "n_layers": 6}]})
>>> run.schema_version, run.models[0].name, run.models[0].n_layers, run.model("minilm").family
(1, 'minilm', 6, None)
>>> RunProvenance.from_json(run.to_json()) == run
True

A control model (``--control``) is a model of its own, named after the trained one:

>>> control = ModelProvenance("minilm [random init]", control="random-init", control_of="minilm")
>>> ModelProvenance.from_json(control.to_json()) == control, run.models[0].control
(True, None)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = ["SCHEMA_VERSION", "IMPORTED", "ModelProvenance", "CorpusProvenance", "RunProvenance"]

SCHEMA_VERSION = 2  # 1: headscan 0.1's untyped run.json; 2: these dataclasses
IMPORTED = "imported"  # ModelProvenance.source of scores read from a published file (headscan import-scores)


def _split(cls, data: dict) -> tuple[dict, dict]:
    """`data` split into the fields `cls` knows and the rest (kept in ``extra``)."""
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    known = {k: v for k, v in data.items() if k in names}
    extra = {k: v for k, v in data.items() if k not in names}
    return known, {**data.get("extra", {}), **{k: v for k, v in extra.items() if k != "extra"}}


def _to_json(instance) -> dict:
    data = {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance) if f.name != "extra"}
    return {**data, **instance.extra}


@dataclass(frozen=True)
class ModelProvenance:
    """One model of a run: where its weights came from, its shape, and what the sweep fed it."""

    name: str  # as given to the sweep: alias, Hugging Face id or folder
    source: str | None = None  # "alias", "local", "gguf", "huggingface" or IMPORTED
    id: str | None = None  # package==version, Hugging Face id or path the weights were read from
    revision: str | None = None  # the revision named (ID@step3000), else the Hugging Face commit or sha256 of the weights
    family: str | None = None  # "causal" or "bidirectional"
    architecture: str | None = None  # the Hugging Face class
    model_type: str | None = None  # the Hugging Face config's model_type ("bert", "llama", ...)
    path: str | None = None  # how patterns were read: "transformer_lens" or "hf_hooks"
    n_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    d_model: int | None = None
    n_params: int | None = None
    tokenizer: str | None = None
    vocab_size: int | None = None
    max_context: int | None = None
    special_token_ids: dict = field(default_factory=dict)  # bos, cls, sep, pad
    prepend_bos: bool | None = None
    n_segments: int | None = None
    n_tokens: int | None = None
    n_truncated: int | None = None
    n_tokens_lost: int | None = None  # tokens cut off the truncated segments
    max_len: int | None = None  # tokens per segment as swept: the sweep's max_len, clamped to max_context
    max_len_note: str | None = None  # the line saying max_len was clamped to the model's context (None: it was not)
    seconds: float | None = None
    # Controls: "random-init" (the same architecture, weights drawn from the config's own initialiser)
    # or "shuffled-words" (the trained model on each segment's words permuted); None for a trained model as given.
    control: str | None = None
    control_of: str | None = None  # a control's trained model, by its name in this run
    # Checkpoint series: the training step the revision's or checkpoint folder's name holds, else None.
    step: int | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def has_sep(self) -> bool:
        return (self.special_token_ids or {}).get("sep") is not None

    def to_json(self) -> dict:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> ModelProvenance:
        known, extra = _split(cls, data)
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class CorpusProvenance:
    """The corpus a run read: its source, kind and the sha256 of its bytes."""

    source: str | None = None  # the path as given, "builtin", or a generator spec such as repeat-random
    kind: str | None = None  # "builtin", "conllu", "jsonl", "text", "list" or "repeat-random"
    sha256: str | None = None
    n_segments: int | None = None
    extra: dict = field(default_factory=dict, compare=False)  # e.g. repeat-random's n, count, seed; documents

    def to_json(self) -> dict:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> CorpusProvenance:
        known, extra = _split(cls, data)
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class RunProvenance:
    """A whole run: how it was called, on what, with which settings and versions, and its models."""

    schema_version: int = SCHEMA_VERSION
    run_id: str | None = None  # random, one per published run: every file of a run carries it
    headscan_version: str | None = None
    git_revision: str | None = None
    command: str | None = None  # the CLI line with every option spelled out, or the Python call
    started: str | None = None  # ISO 8601, UTC
    finished: str | None = None
    corpus: CorpusProvenance = field(default_factory=CorpusProvenance)
    config: dict = field(default_factory=dict)  # the SweepConfig's fields
    versions: dict = field(default_factory=dict)  # python, torch, transformers, ...
    models: tuple[ModelProvenance, ...] = ()
    extra: dict = field(default_factory=dict, compare=False)

    def model(self, name: str) -> ModelProvenance:
        """The provenance of model `name`, or an empty one (every field None) when the run has none."""
        return next((m for m in self.models if m.name == name), ModelProvenance(name))

    def to_json(self) -> dict:
        data = _to_json(self)
        data["corpus"] = self.corpus.to_json()
        data["models"] = [m.to_json() for m in self.models]
        return data

    @classmethod
    def from_json(cls, data: dict) -> RunProvenance:
        known, extra = _split(cls, data)
        known.setdefault("schema_version", 1)  # headscan 0.1 wrote no version
        known["corpus"] = CorpusProvenance.from_json(known.get("corpus") or {})
        known["models"] = tuple(ModelProvenance.from_json(m) for m in known.get("models") or ())
        return cls(**known, extra=extra)
