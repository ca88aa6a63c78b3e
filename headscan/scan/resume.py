"""Resuming: where a sweep keeps its partial states, under which names, and how it is asked to stop.

Both runners use it: the local sweep (`headscan.scan.run`) and the Ray sweep (`headscan.scan.cluster`). A sweep
into ``OUT`` keeps each model's state in ``OUT.partial/`` (`partial_folder`), in a file named after the model
spec and the shard (`state_file`); SIGINT and SIGTERM become a request to stop between two batches
(`stop_requests`); a saved state of another sweep is refused with what differs (`check_resumable`).

This module runs no model, and imports no torch: `headscan.scan.inputs` checks a run's inputs with it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from pathlib import Path

from ..config import control_number, split_control
from ..errors import ConfigError, TablesError
from ..setting import with_settings
from ..tables.folders import fitting, where
from .state import PartialState, Shard, fingerprint_differences

__all__ = ["SAVE_EVERY", "partial_folder", "spec_stem", "state_file", "kept_states", "stop_requests",
           "check_resumable", "check_models", "checked_call"]

SAVE_EVERY = 120.0  # seconds between saves of a model's partial state


# All that a sweep (`state_file`, saved through a hidden temporary file), a retrieval run (its trials, and its
# masked trials), a patch run (its steps) or a job (`headscan.scan.runner.Kept`: a state, finished tables) keeps in
# OUT.partial/
_PARTIAL_ENTRY = re.compile(r"[^.].*\.npz|(retrieval|masking|patch)-.+\.jsonl|job-.+\.(parquet|json)|\..+\.tmp")


def partial_folder(out: str | Path) -> Path:
    """Where a sweep into `out` keeps its partial states until it finishes: ``OUT.partial`` beside it.

    Refuses one that holds anything else, naming it: the sweep removes the folder whole once it finishes (or on
    `restart`), which must never take a user's files with it. Call it before any work.
    """
    out = where(out)  # as the system resolves it: "." and "link/.." name the folder they stand for
    partial = out.with_name(out.name + ".partial")
    if partial.is_dir():
        others = sorted(entry.name for entry in partial.iterdir() if not _PARTIAL_ENTRY.fullmatch(entry.name))
        if others:
            named = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            them = "it" if len(others) == 1 else "them"
            raise TablesError(f"{partial}: holds {named}, which a stopped sweep does not keep there, and the sweep "
                              f"removes the folder once it finishes; move {them} out, or choose another --out")
    elif os.path.lexists(partial):
        raise TablesError(f"{partial}: is not a folder, and a sweep into {out.name} keeps its partial states there; "
                          f"move it, or choose another --out")
    return partial


def spec_stem(spec: str) -> str:
    """A model spec (an alias, a Hugging Face id or a path), or a control of one, as the stem of its state file's name.

    >>> spec_stem("meta-llama/Llama-3.2-1B"), spec_stem("/tmp/my model/"), spec_stem("minilm [random init]")
    ('meta-llama--Llama-3.2-1B', 'tmp--my_model', 'minilm.random-init')
    >>> spec_stem("minilm [random init 2]")
    'minilm.random-init-2'
    """
    number = control_number(spec)
    spec, control = split_control(spec)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.strip("/").replace("/", "--")) or "model"
    stem = stem if control is None else f"{stem}.{control}" + (f"-{number}" if number > 1 else "")
    return fitting(stem, 200)  # a long path as a spec: room left for the shard and the temporary file's additions


def state_file(spec: str, shard: Shard | None) -> str:
    """The file name of the partial state of `spec` over `shard` (None: the whole corpus).

    >>> state_file("minilm", None), state_file("minilm", Shard(2, 8))
    ('minilm.npz', 'minilm.shard-2-of-8.npz')
    """
    stem = spec_stem(spec)
    return f"{stem}.npz" if shard is None else f"{stem}.shard-{shard.index}-of-{shard.count}.npz"


def kept_states(states, *, part: bool) -> dict | None:
    """What a run's output keeps beside its tables for `headscan merge`, which needs each model's replicates and
    power sums: ``state/SPEC.npz`` per (spec, state) of `states` when the run is a `part` (a shard, or a part of
    the layers), else nothing."""
    return {f"state/{state_file(spec, None)}": state.save for spec, state in states} if part else None


def check_resumable(state: PartialState, expected: dict, shard: Shard | None, source: str | Path, spec: str) -> None:
    """Refuse a saved `state` (read from `source`) whose fingerprint is not `expected` or whose shard is not
    `shard`, naming what differs."""
    differences = fingerprint_differences(state.fingerprint, expected)
    if state.shard != shard:
        differences.append(f"shard: {state.shard} != {shard}")
    if differences:
        raise TablesError(f"{source}: a stopped sweep of {spec} with other inputs ({'; '.join(differences[:3])}); "
                          f"rerun that sweep to finish it, or pass --restart to discard it")


@contextlib.contextmanager
def stop_requests():
    """SIGINT and SIGTERM become a request to stop, which the sweep acts on between two batches; yields the
    function that says whether one came."""
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested.is_set  # signals reach only the main thread; nothing to install
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        if requested.is_set():  # a second Ctrl-C: stop now, whatever is lost
            signal.signal(signum, previous[signum])
            raise KeyboardInterrupt
        requested.set()

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield requested.is_set
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def check_models(models, example: str = "--model minilm") -> list[str]:
    """`models` (one spec or several) as a list, each named once and each one found (`check_spec`: an installed
    alias, a checkpoint, a cached Hugging Face id), or one clear error naming the model. Loads nothing, and
    imports no torch."""
    from ..models.specs import check_spec

    models = [models] if isinstance(models, str) else list(models)
    if not models:
        raise ConfigError(f"models: none named; pass --model (for example {example})", setting="models")
    if len(set(models)) != len(models):
        twice = sorted({m for m in models if models.count(m) > 1})
        raise ConfigError(f"models: {', '.join(twice)} named twice; name each model once (their rows would "
                          f"collide)", setting="models")
    for spec in models:
        check_spec(spec)
    return models


def checked_call(models, config, kind: type, settings: dict, out, overwrite: bool):
    """A run's models as a list and its config (`config`, or `kind`'s defaults, with `settings` in place), each
    model named once and each spec and `out` checked, before anything is loaded (``headscan retrieval`` and
    ``headscan patch``)."""
    from ..tables import check_out

    config = with_settings(config or kind(), settings) if settings else config or kind()
    models = check_models(models, example="--model smollm2")
    if out is not None:
        check_out(out, overwrite=overwrite)
    return models, config
