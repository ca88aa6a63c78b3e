"""Your own questions: `pattern` and `metric` define a head score outside headscan; `load_metric_modules` loads
a file of them for a sweep (``headscan sweep --metric-module FILE``).

A **pattern** says where a head should look: a function of one batch of segments (`Segments`: token ids, what
each token's text is, positions, gold words) that returns, for every query and key, whether the key is a target
(bool) or how much it is one (a weight in [0, 1]), shape (batch, q, k). Its score is the head's mean attention on
the targets over the real queries that have at least one target they can see (keys the model's mask hides from a
query, and keys that do not count, are never targets); its chance is uniform attention's share on the same
targets, and its findings are tested against uniform attention and random-init controls, as ``prev_token``'s
are. One definition serves encoders and decoders alike, eager and chunked attention alike: query positions are
absolute (`Segments.query_positions`), so a pattern must not assume it sees every query row.

>>> import torch, headscan
>>> @headscan.pattern("two_back_demo")
... def two_back(s):
...     '''Attention on the token two before the query.'''
...     return (s.key_positions[None, None, :] == s.query_positions[None, :, None] - 2).expand(len(s.tokens), -1, -1)
>>> headscan.METRICS["two_back_demo"].table, headscan.METRICS["two_back_demo"].origin["kind"]
('heads', 'python')
>>> _ = headscan.METRICS.pop("two_back_demo")  # (the doctest's own metric, removed again)

A **metric** is anything else: `register`'s function of an `headscan.metrics.batch.AttentionBatch` returning
per-segment ``(sums, counts)``, (batch, head), with its own chance.

A module loaded with `load_metric_modules` is read once, hashed (sha256 of its text) and executed; every metric it
defines records that origin, which the sweep writes into run.json and its fingerprint, so a resumed or merged
sweep refuses a changed definition and Ray workers run the very text the driver read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import MetricError
from .batch import AttentionBatch, mean_over_queries
from .registry import METRICS, register

__all__ = ["Segments", "Vocabulary", "ModuleSource", "pattern", "metric", "read_module", "install",
           "load_metric_modules", "sources_for_workers", "vocabulary_of", "custom_metrics", "custom_provenance",
           "check_custom", "clear_custom"]


class Vocabulary:
    """Every token id's text under one tokenizer, read once, so that a pattern flags tokens by their text with one
    lookup per batch (`Segments.token_flags`). `pieces` gives the tokenizer's own pieces (``Ġthe``, ``##ing``,
    ``▁the``), `texts` each id decoded alone (``" the"``, ``"ing"``); both are called only when first needed."""

    def __init__(self, pieces: Callable[[], list[str]], texts: Callable[[], list[str]]):
        self._read = {"pieces": pieces, "texts": texts}
        self._lists: dict[str, list[str]] = {}
        self._flags: dict[tuple, torch.Tensor] = {}

    @classmethod
    def of_tokenizer(cls, tokenizer) -> Vocabulary:
        """The vocabulary of a Hugging Face tokenizer."""
        size = len(tokenizer)
        return cls(lambda: [str(p) for p in tokenizer.convert_ids_to_tokens(list(range(size)))],
                   lambda: [tokenizer.decode([i]) for i in range(size)])

    def strings(self, kind: str = "texts") -> list[str]:
        """Every id's piece (``kind="pieces"``) or decoded text (``"texts"``), indexed by id."""
        if kind not in self._read:
            raise MetricError(f"a vocabulary has 'pieces' and 'texts', not {kind!r}")
        if kind not in self._lists:
            self._lists[kind] = self._read[kind]()
        return self._lists[kind]

    def flags(self, predicate: Callable[[str], bool], kind: str = "texts") -> torch.Tensor:
        """(vocab,) bool: `predicate` of every id's string, computed once per predicate."""
        key = (predicate, kind)
        if key not in self._flags:
            self._flags[key] = torch.tensor([bool(predicate(s)) for s in self.strings(kind)], dtype=torch.bool)
        return self._flags[key]


@dataclass(frozen=True)
class Segments:
    """What a pattern reads: one batch of right-padded segments. Positions are absolute within a segment;
    `query_positions` may be one block of them (chunked attention). Nothing here may be written to."""

    tokens: torch.Tensor  # (batch, k) token ids
    counts: torch.Tensor  # (batch, k) bool: tokens that count (real; not special when specials are excluded)
    query_positions: torch.Tensor  # (q,) the absolute position of each query row
    key_positions: torch.Tensor  # (k,) 0 .. k - 1
    causal: bool  # a query sees only keys at or before it
    token_word: torch.Tensor | None  # (batch, k) gold word of each token (CoNLL-U corpora), -1 for specials; else None
    vocabulary: Vocabulary | None  # the model's tokenizer's strings (None where the sweep has no tokenizer)

    def token_flags(self, predicate: Callable[[str], bool], kind: str = "texts") -> torch.Tensor:
        """(batch, k) bool: `predicate` of each token's decoded text (``kind="texts"``) or tokenizer piece
        (``"pieces"``), as one lookup of the vocabulary."""
        if self.vocabulary is None:
            raise MetricError("this sweep has no tokenizer, so no token's text is known; a pattern that reads "
                              "token text needs a model with a tokenizer")
        table = self.vocabulary.flags(predicate, kind).to(self.tokens.device)
        return table[self.tokens.clamp(0, len(table) - 1)] & (self.tokens < len(table))

    @property
    def before(self) -> torch.Tensor:
        """(q, k) bool: the key lies before the query."""
        return self.key_positions[None, :] < self.query_positions[:, None]

    def latest(self, flags: torch.Tensor, *, strictly_before: bool = True) -> torch.Tensor:
        """(batch, q, k) bool: for each query, the last key before it (at or before it, unless `strictly_before`)
        where `flags` (batch, k) holds; none where no key does. The building block of "the previous X"."""
        keys = self.key_positions
        allowed = self.before if strictly_before else keys[None, :] <= self.query_positions[:, None]  # (q, k)
        candidates = flags[:, None, :] & allowed[None]  # (batch, q, k)
        last = torch.where(candidates, keys, -1).amax(-1)  # (batch, q): -1 where there is none
        return candidates & (keys[None, None, :] == last[..., None])


def _segments(batch: AttentionBatch) -> Segments:
    words = batch.words.token_word if batch.words is not None else None
    return Segments(batch.tokens, batch.key_mask, batch.query_positions, batch.key_positions, batch.causal, words,
                    batch.vocabulary)


# --- where a metric comes from -------------------------------------------------------------------------------------

# Set while `load_metric_modules` executes a module: the origin every metric it defines records.
_LOADING: list[dict] = []
_INSTALLED: dict[str, str] = {}  # spec -> sha256 of every module installed in this process
_VOCABULARIES: dict[int, tuple[object, Vocabulary]] = {}  # id(tokenizer) -> (tokenizer, its vocabulary)


def _origin(function) -> dict:
    if _LOADING:
        return dict(_LOADING[-1])
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        source = function.__qualname__
    return {"kind": "python", "module": getattr(function, "__module__", None),
            "sha256": hashlib.sha256(source.encode()).hexdigest()}


def custom_metrics() -> dict[str, dict]:
    """{name: origin} of every registered metric defined outside headscan, in registry order."""
    return {name: m.origin for name, m in METRICS.items() if m.origin is not None}


def custom_provenance() -> dict[str, dict]:
    """{name: origin, definition and chance's definition} of every metric defined outside headscan: run.json's
    ``custom_metrics``, which says what a column of a run meant where the module is not at hand."""
    return {name: dict(m.origin) | {"definition": m.definition, "chance": m.chance_definition, "table": m.table}
            for name, m in METRICS.items() if m.origin is not None}


def clear_custom() -> list[str]:
    """Unregister every metric defined outside headscan and forget the modules loaded (a notebook starting over,
    a test cleaning up); the names removed."""
    removed = list(custom_metrics())
    for name in removed:
        del METRICS[name]
    _INSTALLED.clear()
    return removed


def check_custom(sources: list[ModuleSource], recorded: dict[str, dict], where: str) -> None:
    """Refuse modules whose text is not the one a run recorded (`recorded`: its ``custom_metrics``)."""
    hashes = {source.spec: source.sha256 for source in sources}
    for name, origin in recorded.items():
        spec = origin.get("module")
        if origin.get("kind") == "module" and spec in hashes and hashes[spec] != origin.get("sha256"):
            raise MetricError(f"{where}: metric {name!r} was swept with another text of --metric-module {spec} "
                              f"(sha256 {str(origin.get('sha256'))[:12]}, now {hashes[spec][:12]}); restore that text")


def _checked_name(name: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise MetricError(f"a metric's name is a Python identifier (it names table rows and columns), got {name!r}")


# --- the public API --------------------------------------------------------------------------------------------------


def pattern(name: str, target: Callable[[Segments], torch.Tensor] | None = None, *, definition: str | None = None,
            sparse: bool = False, null_why: str = ""):
    """Register where a head should look as a heads.parquet metric called `name`; usable as a decorator.

    `target(segments)` returns (batch, q, k) bool, or weights in [0, 1], for `Segments`' queries and keys. The
    score is the head's mean attention on the targets, over the real queries with at least one target they see;
    chance is uniform attention's share on them; the null of its findings is uniform attention, and random-init
    controls' heads where the run has them. `definition` (default: `target`'s docstring) is what docs and
    reports print. `sparse`: the text's content picks the queries (a repeated token), so that a few documents can
    hold most of the sum (`headscan.intervals.thin`).
    """

    def decorate(target):
        _checked_name(name)
        text = inspect.cleandoc(definition or target.__doc__ or "")
        if not text:
            raise MetricError(f"pattern {name!r} has no definition: give definition=... or a docstring")
        origin = _origin(target)

        def targets_of(batch: AttentionBatch) -> torch.Tensor:
            seen = _targets(name, target, batch)  # (batch, q, k) float in [0, 1]
            gap = batch.query_positions[:, None] - batch.key_positions[None, :]  # (q, k)
            visible = batch.sees(gap)[None] & batch.key_mask[:, None, :]  # (batch, q, k) a target the query sees
            return torch.where(visible, seen, torch.zeros((), dtype=seen.dtype, device=seen.device))

        def score(batch: AttentionBatch):
            targets = targets_of(batch)
            weights = (batch.masked * targets[:, None]).sum(-1)  # (batch, head, q)
            return mean_over_queries(weights, batch.query_mask & (targets > 0).any(-1))

        def chance(batch: AttentionBatch):
            targets = targets_of(batch)
            return mean_over_queries(batch.null.on(targets), batch.query_mask & (targets > 0).any(-1))[0]

        score.__doc__ = text
        chance.__doc__ = "Uniform attention's share on the targets: their number (or weight) over the keys the query sees."
        score.__qualname__ = chance.__qualname__ = f"pattern[{name}]"
        register(name, chance=chance, sparse=sparse, null="uniform", null_why=null_why, origin=origin)(score)
        return target

    return decorate if target is None else decorate(target)


def _targets(name: str, target, batch: AttentionBatch) -> torch.Tensor:
    """The user's targets for `batch`, checked: (batch, q, k), bool or weights in [0, 1], as float32."""
    try:
        found = target(_segments(batch))
    except MetricError:
        raise
    except Exception as error:  # the user's code: one line that names the pattern, the cause chained
        raise MetricError(f"pattern {name!r}: {type(error).__name__}: {error}") from error
    b, _, n_q, n_k = batch.pattern.shape
    if not isinstance(found, torch.Tensor) or tuple(found.shape) != (b, n_q, n_k):
        shape = tuple(found.shape) if isinstance(found, torch.Tensor) else type(found).__name__
        raise MetricError(f"pattern {name!r}: returned {shape}; it must return a (batch, q, k) = {(b, n_q, n_k)} "
                          "tensor, one row per query of Segments.query_positions")
    if found.dtype == torch.bool:
        return found.to(torch.float32)
    if not found.is_floating_point():
        raise MetricError(f"pattern {name!r}: returned {found.dtype}; return bool targets or float weights in [0, 1]")
    found = found.to(torch.float32)
    if found.numel() and not (bool(torch.isfinite(found).all()) and float(found.min()) >= 0 and float(found.max()) <= 1):
        raise MetricError(f"pattern {name!r}: weights must lie in [0, 1], got {float(found.min()):g} to "
                          f"{float(found.max()):g}")
    return found


def metric(name: str, **settings):
    """Register any vectorised score as a metric called `name` (a decorator): `headscan.metrics.register`'s
    settings (``table``, ``unit``, ``bounded``, ``striking``, ``chance``, ``null``, ...), and the function of an
    `AttentionBatch` returning per-segment ``(sums, counts)``. Its docstring is its definition, its chance
    function's docstring how chance is defined for it."""

    def decorate(function):
        _checked_name(name)
        return register(name, origin=_origin(function), **settings)(function)

    return decorate


# --- modules of metrics --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleSource:
    """A module of metrics as read once: what was asked for, its text and that text's sha256. Sent as is to Ray
    workers, which execute the same text."""

    spec: str  # a file path or a dotted module name, as given
    text: str
    sha256: str
    path: str | None  # the file read (None: not known)

    def origin(self) -> dict:
        return {"kind": "module", "module": self.spec, "path": self.path, "sha256": self.sha256}


def read_module(spec: str) -> ModuleSource:
    """The text of the module `spec` names: a ``.py`` file, or a dotted module name on the import path."""
    path = Path(spec).expanduser()
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise MetricError(f"--metric-module {spec}: no such file")
        file = path.resolve()
    else:
        try:
            found = importlib.util.find_spec(spec)
        except (ImportError, ValueError) as error:
            raise MetricError(f"--metric-module {spec}: {error}") from None
        if found is None or not found.origin or not Path(found.origin).is_file():
            raise MetricError(f"--metric-module {spec}: neither a .py file nor a module on the import path")
        file = Path(found.origin)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise MetricError(f"--metric-module {spec}: cannot read {file}: {error}") from None
    return ModuleSource(spec, text, hashlib.sha256(text.encode()).hexdigest(), str(file))


def install(*sources: ModuleSource) -> list[str]:
    """Execute each of `sources` once in this process (again: nothing; a different text under the same spec:
    refused), registering its metrics with their origin; the names they registered."""
    return [name for source in sources for name in _install(source)]


def _install(source: ModuleSource) -> list[str]:
    if source.spec in _INSTALLED:
        if _INSTALLED[source.spec] != source.sha256:
            raise MetricError(f"--metric-module {source.spec} changed since this process loaded it; start a new "
                              "process to load the new text")
        return [name for name, origin in custom_metrics().items() if origin.get("module") == source.spec]
    module = types.ModuleType(f"headscan_metric_module_{source.sha256[:12]}")
    module.__file__ = source.path or source.spec
    before = set(METRICS)
    _LOADING.append(source.origin())
    sys.modules[module.__name__] = module  # so dataclasses and pickling inside it find the module
    try:
        exec(compile(source.text, source.path or source.spec, "exec"), module.__dict__)  # noqa: S102
    except Exception as error:
        for name in set(METRICS) - before:  # a module that failed half-way leaves nothing behind
            del METRICS[name]
        sys.modules.pop(module.__name__, None)
        why = str(error) if isinstance(error, MetricError) else f"{type(error).__name__}: {error}"
        raise MetricError(f"--metric-module {source.spec}: {why}") from error
    finally:
        _LOADING.pop()
    added = [name for name in METRICS if name not in before]
    if not added:
        raise MetricError(f"--metric-module {source.spec} defines no metric; decorate a function with "
                          "@headscan.pattern(...) or @headscan.metric(...)")
    _INSTALLED[source.spec] = source.sha256
    return added


def sources_for_workers(specs) -> tuple[ModuleSource, ...]:
    """The modules of `specs`, read and installed here, to send to workers of other processes; refuses a metric
    defined in this process outside a module, which no worker could run."""
    sources = tuple(load_metric_modules(specs))
    unsent = [name for name, origin in custom_metrics().items() if origin.get("kind") != "module"]
    if unsent:
        raise MetricError(f"metric {unsent[0]!r} was defined in this Python process, which workers cannot see; "
                          "define it in a file and pass metric_modules=[FILE] (--metric-module FILE)")
    return sources


def vocabulary_of(model) -> Vocabulary | None:
    """The vocabulary of `model`'s tokenizer (a `headscan.models.HookedModel`'s), one per tokenizer; its strings
    are read only if a pattern asks."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return None
    held = _VOCABULARIES.get(id(tokenizer))
    if held is None or held[0] is not tokenizer:  # an id reused by a new tokenizer: a new vocabulary
        _VOCABULARIES.clear()  # one model is swept at a time: keep no released tokenizer alive
        held = _VOCABULARIES[id(tokenizer)] = (tokenizer, Vocabulary.of_tokenizer(tokenizer))
    return held[1]


def load_metric_modules(specs) -> list[ModuleSource]:
    """Read and install each module of `specs` (files or dotted names) in this process; their sources, for workers."""
    sources = [read_module(spec) for spec in specs]
    for source in sources:
        install(source)
    return sources
