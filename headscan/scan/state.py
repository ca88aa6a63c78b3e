"""Partial state: the running per-head sums of one (model, corpus part), enough to resume, merge or finish a sweep.

A sweep reduces each layer's attention to per-segment sums and counts; `PartialState` adds them up, per
*unit* (a segment, or a whole document with ``bootstrap_unit="document"``), into

- ``sums`` and ``counts``, (layer, head, column): the scores themselves;
- ``replicate_sums`` and ``replicate_counts``, (replicate, layer, head, column): Poisson-bootstrap replicates,
  each unit weighted by draws keyed on (seed, unit index), so they do not depend on batching or sharding;
- ``replicate_power``, (term, replicate, layer, head, column): each replicate's weighted power sums of the units
  (`headscan.intervals.replicate_moments`), which give every replicate its own variance: the studentized
  interval's;
- ``moments``, (term, layer, head, column): per-unit power sums for the intervals and the support columns
  (`headscan.intervals`);
- ``chance``, (layer, head, column): the null head's sums over the same queries (`headscan.metrics.chance`),
  divided by ``counts`` at the end. Not bootstrapped: chance is the reference an interval is read against.

All of these add exactly across disjoint parts of a corpus (the largest-unit term takes the maximum), so
shards merge into the unsharded result, and a state saved at a window boundary resumes bit for bit. The
`fingerprint` holds everything that must match for two states to be added or for a state to be resumed.

A state is saved as one ``.npz`` file (numpy arrays and a JSON header, no pickle), written atomically.

This module does not run models (see `headscan.scan.reduce`) or draw anything.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import intervals
from ..errors import TablesError

__all__ = ["PartialState", "FINGERPRINT_FIELDS", "merge_states", "add_tallies", "Shard"]

# 2: states carry the null head's sums (chance); 3: the replicates' power sums (replicate_power). An older state is
# refused, to be swept again: neither can be rebuilt from what it holds.
STATE_VERSION = 3
_ADDED_IN = {2: "the chance sums", 3: "the replicates' power sums, which the studentized interval needs"}

# Settings whose change changes the numbers: two states must agree on each to be added, or to resume.
FINGERPRINT_FIELDS = ("max_len", "long", "limit", "dtype", "specials", "max_offset", "bootstrap", "seed", "prepend_bos",
                      "bootstrap_unit", "window", "pack", "attention", "query_chunk", "values", "document_field",
                      "importance", "ablate_top", "importance_sample", "mask_rate", "sink", "recent",
                      "similarity_sample")


@dataclass(frozen=True)
class Shard:
    """The K-th of N disjoint parts of a corpus (0-based K): the documents whose index is K modulo N.

    >>> Shard.parse("2/4")
    Shard(index=2, count=4)
    >>> Shard.parse("4/4")
    Traceback (most recent call last):
    ...
    headscan.errors.ConfigError: shard must be K/N with 0 <= K < N, got '4/4' (K counts from 0)
    """

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        from ..errors import ConfigError

        k, _, n = str(text).partition("/")
        if not (k.strip().isdigit() and n.strip().isdigit()) or not 0 <= int(k) < int(n):
            raise ConfigError(f"shard must be K/N with 0 <= K < N, got {text!r} (K counts from 0)", setting="shard")
        return cls(int(k), int(n))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, document: int) -> bool:
        return document % self.count == self.index


@dataclass
class PartialState:
    """Running sums of one model over (a part of) a corpus; numpy float64 arrays (see the module docstring)."""

    fingerprint: dict  # model, corpus, settings, headscan version, columns: what must match to add or resume
    shard: Shard | None  # the part of the corpus this state covers; None for all of it
    sums: np.ndarray  # (layer, head, column)
    counts: np.ndarray  # (layer, head, column)
    replicate_sums: np.ndarray  # (replicate, layer, head, column)
    replicate_counts: np.ndarray  # (replicate, layer, head, column)
    moments: np.ndarray  # (term, layer, head, column); see headscan.intervals.MOMENT_TERMS
    chance: np.ndarray  # (layer, head, column): the null head's sums over the same queries (NaN: not computable)
    # (3, replicate, layer, head, column): sum_u w_bu s_u^2, w_bu s_u c_u, w_bu c_u^2 (headscan.intervals.REPLICATE_TERMS)
    replicate_power: np.ndarray = field(default_factory=lambda: np.zeros((3, 0, 0, 0, 0)))
    windows_done: int = 0  # windows of the sweep's plan already added
    finished: bool = False  # every window added
    model: dict = field(default_factory=dict)  # the model's provenance (ModelProvenance.to_json())
    n_segments: int = 0
    n_tokens: int = 0
    n_truncated: int = 0
    n_tokens_lost: int = 0
    seconds: float = 0.0
    # CoNLL-U corpora: the syntax table's fixed-offset baseline, sums and counts (2, offset, syntax column);
    # (2, 0, 0) otherwise. Not bootstrapped: the baseline is a fixed rule, reported beside each head's interval.
    baseline: np.ndarray = field(default_factory=lambda: np.zeros((2, 0, 0)))
    # Scores read off the weights alone, (weight metric, layer, head): the OV copying score; NaN where the
    # architecture's weights could not be read (the model's provenance says why). No corpus, so not summed.
    weights: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    embedding: str | None = None  # how the weights table's unembedding was taken: "tied", "untied"; None: not read
    # Counts of how the corpus was read for this model, added up like n_tokens (CoNLL-U: tokens straddling two
    # words, words without a token); they go into the model's provenance.
    tallies: dict = field(default_factory=dict)
    # Head importance (headscan.scan.importance): each head's mean output over the mean pass's sample, (layer, head,
    # d_head), (0, 0, 0) before that pass; and what the pass decided (target, sample, heads ablated exactly).
    head_means: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    importance: dict = field(default_factory=dict)
    # Head similarity (headscan.scan.similarity), (2, layer * head, layer * head): every pair's summed Jensen-Shannon
    # divergence over the sample's queries, and the number of those queries; (2, 0, 0) without a sample.
    similarity: np.ndarray = field(default_factory=lambda: np.zeros((2, 0, 0)))
    # and, on a corpus with words, each sampled segment's word-level attention with its sink, segment -> (layer *
    # head, word, word + 1), float32 or float64: the similarity of heads across models (headscan.scan.similarity)
    word_attention: dict = field(default_factory=dict)

    @classmethod
    def empty(cls, fingerprint: dict, shard: Shard | None, shape: tuple[int, int, int], n_replicates: int) -> PartialState:
        zeros = np.zeros(shape)
        return cls(fingerprint, shard, zeros, zeros.copy(), np.zeros((n_replicates, *shape)),
                   np.zeros((n_replicates, *shape)), intervals.unit_moments(zeros[None], zeros[None]) * 0, zeros.copy(),
                   np.zeros((len(intervals.REPLICATE_TERMS), n_replicates, *shape)))

    # --- saving and loading ----------------------------------------------------------------------------

    def header(self) -> dict:
        return {
            "state_version": STATE_VERSION, "fingerprint": self.fingerprint,
            "shard": None if self.shard is None else [self.shard.index, self.shard.count],
            "windows_done": self.windows_done, "finished": self.finished, "model": self.model,
            "n_segments": self.n_segments, "n_tokens": self.n_tokens, "n_truncated": self.n_truncated,
            "n_tokens_lost": self.n_tokens_lost,
            "seconds": self.seconds, "embedding": self.embedding, "tallies": self.tallies,
            "importance": self.importance,
        }

    def save(self, path: Path) -> None:
        """Write the state to `path` atomically: a reader sees the old file or the new one, never half of one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                np.savez(handle, header=np.frombuffer(json.dumps(self.header()).encode(), dtype=np.uint8),
                         sums=self.sums, counts=self.counts, replicate_sums=self.replicate_sums,
                         replicate_counts=self.replicate_counts, moments=self.moments, chance=self.chance,
                         replicate_power=self.replicate_power, baseline=self.baseline, weights=self.weights, head_means=self.head_means,
                         similarity=self.similarity, **_packed(self.word_attention))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path) -> PartialState:
        """Read a state written by `save`; a damaged or foreign file is one clear error."""
        def damaged(why: str) -> TablesError:
            return TablesError(f"{path}: not a readable headscan partial state ({why}); delete it to start that "
                               f"part again")

        try:
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(data["header"].tobytes())
                names = ("sums", "counts", "replicate_sums", "replicate_counts", "moments", "chance", "replicate_power")
                arrays = {name: data[name] for name in names if name in data.files}
                baseline = data["baseline"] if "baseline" in data.files else np.zeros((2, 0, 0))
                weights = data["weights"] if "weights" in data.files else np.zeros((0, 0, 0))
                head_means = data["head_means"] if "head_means" in data.files else np.zeros((0, 0, 0))
                similarity = data["similarity"] if "similarity" in data.files else np.zeros((2, 0, 0))
                word_attention = _unpacked(data)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as error:
            raise damaged(type(error).__name__) from None
        if not isinstance(header, dict):
            raise damaged("its header is not a JSON object")
        version = header.get("state_version")
        if version != STATE_VERSION:
            added = "; ".join(f"version {v} added {what}" for v, what in _ADDED_IN.items()
                              if not isinstance(version, int) or version < v)
            raise TablesError(f"{path}: partial state version {version!r}, this headscan reads {STATE_VERSION} "
                              f"({added}, which an older state cannot supply); delete it, or pass --restart, to "
                              f"start that part again")
        if len(arrays) < 7:
            raise damaged("an array is missing")
        given = {**arrays, "baseline": baseline, "weights": weights, "head_means": head_means, "similarity": similarity}
        odd = [f"{name} ({array.dtype})" for name, array in given.items() if array.dtype.kind not in "fiub"]
        if odd:
            raise damaged(f"{', '.join(odd)} not numbers")
        # the sweep adds into these in place, as C-ordered float64 (what `save` writes: then nothing is copied)
        arrays = {name: np.asarray(array, dtype=np.float64, order="C") for name, array in arrays.items()}
        baseline, weights, head_means, similarity = (np.asarray(array, dtype=np.float64, order="C")
                                                     for array in (baseline, weights, head_means, similarity))
        types = {"fingerprint": dict, "model": dict, "finished": bool, "windows_done": int, "n_segments": int,
                 "n_tokens": int, "n_truncated": int, "seconds": (int, float), "importance": (dict, type(None))}
        wrong = [key for key, kind in types.items() if not isinstance(header.get(key), kind)]
        shard = header.get("shard")
        if shard is not None and not (isinstance(shard, list) and len(shard) == 2
                                      and all(isinstance(x, int) and not isinstance(x, bool) for x in shard)):
            wrong.append("shard")
        if wrong:
            raise damaged(f"bad or missing {', '.join(wrong)} in its header")
        shapes = {name: array.shape for name, array in arrays.items()}
        if (len({shapes["sums"], shapes["counts"], shapes["chance"]}) != 1
                or shapes["replicate_sums"] != shapes["replicate_counts"]
                or shapes["replicate_power"] != (len(intervals.REPLICATE_TERMS), *shapes["replicate_sums"])
                or baseline.ndim != 3 or baseline.shape[0] != 2
                or similarity.ndim != 3 or similarity.shape[0] != 2 or similarity.shape[1] != similarity.shape[2]):
            raise damaged("its arrays do not fit together")
        return cls(header["fingerprint"], Shard(*shard) if shard else None, **arrays,
                   windows_done=header["windows_done"], finished=header["finished"], model=header["model"],
                   n_segments=header["n_segments"], n_tokens=header["n_tokens"], n_truncated=header["n_truncated"],
                   n_tokens_lost=int(header.get("n_tokens_lost") or 0), seconds=header["seconds"], baseline=baseline,
                   weights=weights, embedding=header.get("embedding", _embedding_of(header["model"])),
                   tallies=dict(header.get("tallies") or {}), head_means=head_means,
                   importance=header.get("importance") or {}, similarity=similarity, word_attention=word_attention)

    # --- finishing -------------------------------------------------------------------------------------

    def values(self, method: str, level: float = 0.95, *, bounds=None, sparse=False) -> dict[str, np.ndarray]:
        """The table's value columns, each (layer, head, column): value, sum, count, ci_low, ci_high, units,
        top_unit_share, n_eff, variance_df, thin, chance. NaN where a score is undefined (count 0).

        `bounds` (low, high), each broadcastable to (layer, head, column), is each column's own range, into which
        the interval is clipped; `sparse` marks the columns `headscan.intervals.thin` holds to an even spread.
        """
        defined = self.counts > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            value = np.where(defined, self.sums / self.counts, np.nan)
            chance = np.where(defined, self.chance / self.counts, np.nan)
        replicated = self.replicate_sums.shape[0] > 0
        power = self.replicate_power if self.replicate_power.shape[1:] == self.replicate_sums.shape else None
        if replicated:
            low, high = intervals.interval(value, self.replicate_sums, self.replicate_counts, self.moments,
                                           method=method, level=level, replicate_power=power, bounds=bounds)
            df = (intervals.variance_df(self.replicate_sums, self.replicate_counts, power) if power is not None
                  else np.full_like(value, np.nan))
        else:
            low = high = df = np.full_like(value, np.nan)
        units, top_share = intervals.support(self.moments)
        n_eff = intervals.effective_units(self.moments)
        # without the replicates' power sums (no replicates, or a state built by hand) the previous rule
        thin = (intervals.thin(n_eff, df, units, sparse=sparse) if replicated and power is not None
                else intervals.thin_support(self.moments))
        nan = np.nan
        return {
            "value": value, "sum": self.sums, "count": self.counts,
            "ci_low": np.where(defined, low, nan), "ci_high": np.where(defined, high, nan),
            "units": units, "top_unit_share": np.where(defined, top_share, nan),
            "n_eff": np.where(defined, n_eff, nan), "variance_df": np.where(defined, df, nan),
            "thin": thin | ~defined, "chance": chance,
        }


def _packed(word_attention: dict) -> dict:
    """Word-level attention per segment as two arrays for the .npz: (segment, heads, words, offset) rows and the
    flat values; nothing when there is none."""
    if not word_attention:
        return {}
    segments = sorted(word_attention)
    offsets = np.cumsum([0] + [word_attention[s].size for s in segments])
    index = np.array([[s, *word_attention[s].shape[:2], o] for s, o in zip(segments, offsets)], dtype=np.int64)
    return {"word_index": index.reshape(-1, 4),
            "word_values": np.concatenate([word_attention[s].ravel() for s in segments])}


def _unpacked(data) -> dict:
    """`_packed`'s arrays back as segment -> (heads, words, words + 1); {} for a state without them."""
    if "word_index" not in data.files:
        return {}
    values = data["word_values"]
    return {int(segment): values[offset: offset + heads * words * (words + 1)].reshape(heads, words, words + 1)
            for segment, heads, words, offset in data["word_index"].tolist()}


def add_tallies(a: dict, b: dict) -> dict:
    """Two states' tallies added up, name by name.

    >>> add_tallies({"words_without_token": 2}, {"words_without_token": 1, "tokens_straddling_words": 3})
    {'words_without_token': 3, 'tokens_straddling_words': 3}
    """
    return {name: a.get(name, 0) + b.get(name, 0) for name in dict.fromkeys([*a, *b])}


def _embedding_of(model: dict) -> str | None:
    """How a state saved before states recorded `PartialState.embedding` took its embedding: its weights note,
    "embedding tied; folded: ...", the one place that note is read back."""
    note = str(model.get("weights", ""))
    return note.split(";")[0].removeprefix("embedding ") if note.startswith("embedding ") else None


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Where two fingerprints differ, as 'key: a != b' strings; the score columns last and in short."""
    out = []
    for key in sorted(set(a) | set(b), key=lambda k: (k == "columns", k)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differences(x, y, f"{prefix}{key}.")
        elif key == "columns" and x != y:
            out.append(f"{prefix}columns: {len(x or [])} != {len(y or [])} score columns (metrics or their axes differ)")
        elif x != y:
            out.append(f"{prefix}{key}: {x!r} != {y!r}")
            if key == "query_chunk" and None in (x, y):  # its default became None (blocks sized by bytes): an older
                # run recorded a number, which the flag reproduces
                out[-1] += f" (pass --query-chunk {x if y is None else y} to match the other run)"
    return out


def fingerprint_differences(a: dict, b: dict) -> list[str]:
    """The settings, model or corpus facts on which two fingerprints differ (empty when they match)."""
    return _differences(a, b)


def merge_states(states: list[PartialState], names: list[str]) -> PartialState:
    """Add up the states of the shards of one sweep into the state of the whole corpus.

    Refuses states that do not come from the same sweep (the fingerprint names what differs), unsharded
    states, shards of different counts, and a set of shards that misses one or repeats one.
    """
    if not states:
        raise TablesError("merge needs at least one shard")
    first = states[0]
    for state, name in zip(states, names):
        if state.shard is None:
            raise TablesError(f"{name}: was not swept with --shard; merge combines the shards of one sweep")
        if not state.finished:
            raise TablesError(f"{name}: shard {state.shard} did not finish ({state.windows_done} windows done); "
                              f"rerun its command to complete it")
        differences = fingerprint_differences(first.fingerprint, state.fingerprint)
        if differences:
            raise TablesError(f"{name}: not a shard of the same sweep as {names[0]}: {'; '.join(differences[:3])}")
        if state.shard.count != first.shard.count:
            raise TablesError(f"{name}: shard {state.shard} is one of {state.shard.count}, but {names[0]} is one "
                              f"of {first.shard.count}")
    seen: dict[int, str] = {}
    for state, name in zip(states, names):
        if state.shard.index in seen:
            raise TablesError(f"shard {state.shard} is given twice ({seen[state.shard.index]} and {name}); "
                              f"each shard must be merged once")
        seen[state.shard.index] = name
    for state, name in zip(states[1:], names[1:]):
        _same_importance(first, state, names[0], name)
    missing = sorted(set(range(first.shard.count)) - set(seen))
    if missing:
        raise TablesError(f"shards {', '.join(f'{k}/{first.shard.count}' for k in missing)} are missing; "
                          f"merge needs all {first.shard.count}")
    total = PartialState(dict(first.fingerprint), None, first.sums.copy(), first.counts.copy(),
                         first.replicate_sums.copy(), first.replicate_counts.copy(), first.moments.copy(),
                         first.chance.copy(), first.replicate_power.copy(), finished=True, model=dict(first.model),
                         baseline=first.baseline.copy(),
                         weights=first.weights.copy(), embedding=first.embedding,  # the same weights in every shard
                         head_means=first.head_means.copy(), importance=dict(first.importance),
                         similarity=first.similarity.copy(), word_attention=dict(first.word_attention))
    for state in states[1:]:
        total.similarity = total.similarity + state.similarity  # the same sample in every shard: its sums add up
        total.word_attention = total.word_attention | state.word_attention  # disjoint segments
        total.baseline = total.baseline + state.baseline  # same fingerprint, so the same shape
        total.sums += state.sums
        total.counts += state.counts
        total.replicate_sums += state.replicate_sums
        total.replicate_counts += state.replicate_counts
        total.replicate_power = total.replicate_power + state.replicate_power  # same fingerprint: same shape
        total.chance += state.chance
        total.moments = intervals.combine_moments(total.moments, state.moments)
    for state in states:
        total.n_segments += state.n_segments
        total.n_tokens += state.n_tokens
        total.n_truncated += state.n_truncated
        total.n_tokens_lost += state.n_tokens_lost
        total.seconds += state.seconds
        total.tallies = add_tallies(total.tallies, state.tallies)
    total.fingerprint["shard"] = None
    return total


def _same_importance(first: PartialState, state: PartialState, first_name: str, name: str) -> None:
    """Shards add up only if they ablated with the same means and the same heads: every shard draws the same
    sample of the whole corpus, so they agree up to the float rounding of the machines that computed them."""
    if first.importance.get("ablated") != state.importance.get("ablated"):
        raise TablesError(f"{name}: ablated other heads than {first_name} (their mean passes ranked the heads "
                          f"differently); sweep the shards again on one kind of machine")
    if first.head_means.shape != state.head_means.shape:
        raise TablesError(f"{name}: its head means have shape {state.head_means.shape}, {first_name}'s "
                          f"{first.head_means.shape}; merge shards of one sweep")
    scale = float(np.abs(first.head_means).max()) if first.head_means.size else 0.0
    gap = float(np.abs(first.head_means - state.head_means).max()) if first.head_means.size else 0.0
    if gap > 1e-5 * max(scale, 1e-12):
        raise TablesError(f"{name}: its head means differ from {first_name}'s by {gap:.1e}, so their mean "
                          f"ablations removed different things; sweep the shards again on one kind of machine")
