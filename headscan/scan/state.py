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

Beside them, ``passes`` holds the state of each optional pass the sweep runs (`headscan.scan.passes`: weights,
syntax baseline, importance, similarity, or one registered elsewhere), which adds, saves and loads itself.

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
import tokenize
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import intervals
from ..errors import TablesError
from ..setting_values import format_layers
from .columns_text import columns_text

__all__ = ["PartialState", "merge_states", "join_layers", "add_tallies", "Shard", "columns_text"]

# 2: states carry the null head's sums (chance); 3: the replicates' power sums (replicate_power); 4: each pass's state
# under its own name. An older state is refused, to be swept again: what it lacks cannot be rebuilt from it.
STATE_VERSION = 4
_ADDED_IN = {2: "the chance sums", 3: "the replicates' power sums, which the studentized interval needs",
             4: "each pass's state under its own name"}
_CORE = ("sums", "counts", "replicate_sums", "replicate_counts", "moments", "chance", "replicate_power")

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
    """Running sums of one model over (a part of) a corpus; numpy float64 arrays (see the module docstring), and
    each pass's own state (`headscan.scan.passes`)."""

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
    # Counts of how the corpus was read for this model, added up like n_tokens (CoNLL-U: tokens straddling two
    # words, words without a token); they go into the model's provenance.
    tallies: dict = field(default_factory=dict)
    # pass name -> that pass's state (a dataclass of its own), for the passes the sweep runs, in registry order
    passes: dict = field(default_factory=dict)

    @classmethod
    def empty(cls, fingerprint: dict, shard: Shard | None, shape: tuple[int, int, int], n_replicates: int) -> PartialState:
        zeros = np.zeros(shape)
        return cls(fingerprint, shard, zeros, zeros.copy(), np.zeros((n_replicates, *shape)),
                   np.zeros((n_replicates, *shape)), intervals.unit_moments(zeros[None], zeros[None]) * 0, zeros.copy(),
                   np.zeros((len(intervals.REPLICATE_TERMS), n_replicates, *shape)))

    @property
    def layers(self) -> tuple[int, ...]:
        """The model's layers along the layer axis of the arrays: those the sweep was given (`SweepConfig.layers`),
        else every one."""
        given = self.fingerprint.get("settings", {}).get("layers")
        return tuple(range(self.sums.shape[0])) if given is None else tuple(given)

    # --- saving and loading ----------------------------------------------------------------------------

    def header(self) -> dict:
        return {
            "state_version": STATE_VERSION, "fingerprint": self.fingerprint,
            "shard": None if self.shard is None else [self.shard.index, self.shard.count],
            "windows_done": self.windows_done, "finished": self.finished, "model": self.model,
            "n_segments": self.n_segments, "n_tokens": self.n_tokens, "n_truncated": self.n_truncated,
            "n_tokens_lost": self.n_tokens_lost, "seconds": self.seconds, "tallies": self.tallies,
            "passes": {name: _passes()[name].save(state)[0] for name, state in self.passes.items()},
        }

    def save(self, path: Path) -> None:
        """Write the state to `path` atomically: a reader sees the old file or the new one, never half of one.
        A pass's arrays are stored as ``NAME.ARRAY``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        own = {f"{name}.{key}": array for name, state in self.passes.items()
               for key, array in _passes()[name].save(state)[1].items()}
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                np.savez(handle, header=np.frombuffer(json.dumps(self.header()).encode(), dtype=np.uint8),
                         **{name: getattr(self, name) for name in _CORE}, **own)
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
                stored = {name: data[name] for name in data.files if name != "header"}
        # a flipped byte in an array's header reaches numpy's header parser: SyntaxError, or tokenize's error
        except (OSError, ValueError, KeyError, EOFError, SyntaxError, tokenize.TokenError, zipfile.BadZipFile,
                zlib.error) as error:
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
        arrays = {name: stored[name] for name in _CORE if name in stored}
        if len(arrays) < len(_CORE):
            raise damaged("an array is missing")
        odd = [f"{name} ({array.dtype})" for name, array in arrays.items() if array.dtype.kind not in "fiub"]
        if odd:
            raise damaged(f"{', '.join(odd)} not numbers")
        # the sweep adds into these in place, as C-ordered float64 (what `save` writes: then nothing is copied)
        arrays = {name: np.asarray(array, dtype=np.float64, order="C") for name, array in arrays.items()}
        _check_header(header, damaged)
        shapes = {name: array.shape for name, array in arrays.items()}
        if (len({shapes["sums"], shapes["counts"], shapes["chance"]}) != 1
                or shapes["replicate_sums"] != shapes["replicate_counts"]
                or shapes["replicate_power"] != (len(intervals.REPLICATE_TERMS), *shapes["replicate_sums"])):
            raise damaged("its arrays do not fit together")
        shard = header.get("shard")
        return cls(header["fingerprint"], Shard(*shard) if shard else None, **arrays,
                   windows_done=header["windows_done"], finished=header["finished"], model=header["model"],
                   n_segments=header["n_segments"], n_tokens=header["n_tokens"], n_truncated=header["n_truncated"],
                   n_tokens_lost=header["n_tokens_lost"], seconds=header["seconds"],
                   tallies=dict(header.get("tallies") or {}), passes=_load_passes(path, header["passes"], stored, damaged))

    # --- finishing -------------------------------------------------------------------------------------

    def values(self, method: str, level: float = 0.95, *, bounds=None, sparse=False) -> dict[str, np.ndarray]:
        """The table's value columns, each (layer, head, column): value, sum, count, ci_low, ci_high, units,
        top_unit_share, n_eff, variance_df, thin, chance, and joint_low and joint_high (the interval that holds for
        every head of the column at once, `headscan.intervals.joint_interval`). NaN where a score is undefined.

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
            # every head of a column at once (max-t): what a head picked as the top may claim
            joint_low, joint_high = intervals.joint_interval(value, self.replicate_sums, self.replicate_counts,
                                                             intervals.standard_error(value, self.moments),
                                                             level=level, bounds=bounds)
            # never narrower than the row's own: where heads move together (near-uniform heads of one layer, whose
            # values follow the segments' lengths) the largest deviation is one head's, read off plain replicates
            joint_low, joint_high = np.fmin(joint_low, low), np.fmax(joint_high, high)
        else:
            low = high = df = joint_low = joint_high = np.full_like(value, np.nan)
        units, top_share = intervals.support(self.moments)
        n_eff = intervals.effective_units(self.moments)
        # without the replicates' power sums (no replicates, or a state built by hand) the previous rule
        # (a value at an end of its range with all units agreeing is not thin for lack of variance: `at_bound`)
        ceiling = {} if bounds is None else {"value": value, "low": low, "high": high, "bounds": bounds}
        thin = (intervals.thin(n_eff, df, units, sparse=sparse, **ceiling) if replicated and power is not None
                else intervals.thin_support(self.moments))
        nan = np.nan
        return {
            "value": value, "sum": self.sums, "count": self.counts,
            "ci_low": np.where(defined, low, nan), "ci_high": np.where(defined, high, nan),
            "units": units, "top_unit_share": np.where(defined, top_share, nan),
            "n_eff": np.where(defined, n_eff, nan), "variance_df": np.where(defined, df, nan),
            "thin": thin | ~defined, "chance": chance, "joint_low": joint_low, "joint_high": joint_high,
        }


def _passes() -> dict:
    """The registry of passes (`headscan.scan.passes`), imported when a state is saved, loaded or merged: the passes
    import torch, which `Shard` and the checks of a sweep's inputs (`headscan.scan.inputs`) do without."""
    from .passes.base import PASSES

    return PASSES


def _check_header(header: dict, damaged) -> None:
    types = {"fingerprint": dict, "model": dict, "finished": bool, "windows_done": int, "n_segments": int,
             "n_tokens": int, "n_truncated": int, "n_tokens_lost": int, "seconds": (int, float), "passes": dict}
    wrong = [key for key, kind in types.items() if not isinstance(header.get(key), kind)]
    shard = header.get("shard")
    if shard is not None and not (isinstance(shard, list) and len(shard) == 2
                                  and all(isinstance(x, int) and not isinstance(x, bool) for x in shard)):
        wrong.append("shard")
    if wrong:
        raise damaged(f"bad or missing {', '.join(wrong)} in its header")


def _load_passes(path: Path, headers: dict, stored: dict, damaged) -> dict:
    """Each pass's state, read by the pass itself from its header and its ``NAME.ARRAY`` arrays."""
    passes, registry = {}, _passes()
    for name, own in headers.items():
        if name not in registry:
            raise TablesError(f"{path}: holds the state of a pass {name!r} this headscan does not have (it has "
                              f"{', '.join(registry)}); register that pass, or delete the state (or pass --restart) "
                              f"to start that part again")
        arrays = {key.removeprefix(f"{name}."): array for key, array in stored.items() if key.startswith(f"{name}.")}
        try:
            passes[name] = registry[name].load(own if isinstance(own, dict) else {}, arrays)
        except (ValueError, KeyError, TypeError) as error:
            raise damaged(f"pass {name}: {error}") from None
    return dict(sorted(passes.items(), key=lambda item: list(registry).index(item[0])))


def add_tallies(a: dict, b: dict) -> dict:
    """Two states' tallies added up, name by name.

    >>> add_tallies({"words_without_token": 2}, {"words_without_token": 1, "tokens_straddling_words": 3})
    {'words_without_token': 3, 'tokens_straddling_words': 3}
    """
    return {name: a.get(name, 0) + b.get(name, 0) for name in dict.fromkeys([*a, *b])}


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Where two fingerprints differ, as 'key: a != b' strings; the score columns last and in short."""
    out = []
    for key in sorted(set(a) | set(b), key=lambda k: (k == "columns", k)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differences(x, y, f"{prefix}{key}.")
        elif key == "columns" and x != y:
            out.append(f"{prefix}columns: {columns_text(x, y)}")
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
        if list(state.passes) != list(first.passes):
            raise TablesError(f"{name}: ran the passes {list(state.passes)}, {names[0]} {list(first.passes)}; "
                              f"merge shards of one sweep")
    # each pass adds its shards' states up (or refuses ones that cannot be added)
    passes = {name: _passes()[name].merge([state.passes[name] for state in states], names) for name in first.passes}
    missing = sorted(set(range(first.shard.count)) - set(seen))
    if missing:
        raise TablesError(f"shards {', '.join(f'{k}/{first.shard.count}' for k in missing)} are missing; "
                          f"merge needs all {first.shard.count}")
    total = PartialState(dict(first.fingerprint), None, first.sums.copy(), first.counts.copy(),
                         first.replicate_sums.copy(), first.replicate_counts.copy(), first.moments.copy(),
                         first.chance.copy(), first.replicate_power.copy(), finished=True, model=dict(first.model),
                         passes=passes)
    for state in states[1:]:
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


def join_layers(states: list[PartialState], names: list[str]) -> PartialState:
    """Join finished states of disjoint layers of one model (sweeps with `SweepConfig.layers`, each over the whole
    corpus) into the state of their layers together: every array's layer axis concatenated and put in layer order,
    each pass's state joined by the pass (`headscan.scan.passes.base.Pass.join`). The counts of segments and tokens
    are the corpus's, the same in every part; the seconds add up.

    Refuses a state that did not finish, states of different sweeps (naming what differs besides the layers) and
    parts that sweep a layer twice (naming the parts and the layers).
    """
    first = states[0]
    for state, name in zip(states, names):
        if not state.finished:
            raise TablesError(f"{name}: did not finish ({state.windows_done} windows done); rerun its command to "
                              f"complete it")
        unlayered = [{**s.fingerprint, "settings": {**s.fingerprint.get("settings", {}), "layers": None}}
                     for s in (first, state)]
        differences = fingerprint_differences(*unlayered)
        if differences:
            raise TablesError(f"{name}: not a sweep of other layers of the same model, corpus and settings as "
                              f"{names[0]}: {'; '.join(differences[:3])}")
        if list(state.passes) != list(first.passes):
            raise TablesError(f"{name}: ran the passes {list(state.passes)}, {names[0]} {list(first.passes)}; join "
                              f"sweeps of one model with the same settings")
    owner: dict[int, str] = {}
    for state, name in zip(states, names):
        twice = [layer for layer in state.layers if layer in owner]
        if twice:
            raise TablesError(f"{name} and {owner[twice[0]]} both swept layer{'s' if len(twice) > 1 else ''} "
                              f"{format_layers(twice)} (--layers {format_layers(state.layers)} and "
                              f"{format_layers([k for k, v in owner.items() if v == owner[twice[0]]])}); merge "
                              f"runs of disjoint layers")
        owner.update(dict.fromkeys(state.layers, name))
    layers = [layer for state in states for layer in state.layers]
    order = np.argsort(layers, kind="stable")

    def joined(name: str, axis: int) -> np.ndarray:
        return np.take(np.concatenate([getattr(s, name) for s in states], axis), order, axis)

    n_layers = first.model.get("n_layers")
    every = n_layers is not None and len(layers) == n_layers
    fingerprint = {**first.fingerprint,
                   "settings": {**first.fingerprint["settings"], "layers": None if every else sorted(layers)}}
    model = {key: value for key, value in first.model.items() if key != "layers"} | \
        ({} if every else {"layers": sorted(layers)})
    passes = {name: _passes()[name].join([s.passes[name] for s in states], order, names) for name in first.passes}
    total = PartialState(fingerprint, first.shard, joined("sums", 0), joined("counts", 0), joined("replicate_sums", 1),
                         joined("replicate_counts", 1), joined("moments", 1), joined("chance", 0),
                         joined("replicate_power", 2), windows_done=first.windows_done, finished=True, model=model,
                         n_segments=first.n_segments, n_tokens=first.n_tokens, n_truncated=first.n_truncated,
                         n_tokens_lost=first.n_tokens_lost, seconds=sum(s.seconds for s in states),
                         tallies=dict(first.tallies), passes=passes)
    return total
