"""Sweep jobs: several models over one corpus (or one shard of it), that survive being stopped, and merging shards.

`sweep` (``headscan.sweep``, the ``headscan sweep`` command) checks everything it can before the first forward
pass (settings, model specs, the corpus, the output folder), then sweeps one model at a time. With an output
folder ``OUT`` it keeps each model's partial state in ``OUT.partial/``, as of the last window's end (a window
is ``--window`` segments), saved at a window's end every ``--save-every`` seconds and when the sweep is stopped
(Ctrl-C or SIGTERM). Running the same sweep again resumes from there; the stop message says at which segment,
and how many segments swept in the unfinished window are swept again. The finished tables are bit for bit those
of an uninterrupted run. The tables are published as one set (see
`headscan.tables.write`), and ``OUT.partial/`` is removed.

With ``shard=Shard(K, N)`` a sweep covers the documents whose index is K modulo N, and its output keeps each
model's state in ``OUT/state/``; `merge` adds the N shards' states into exactly the unsharded tables,
intervals included.

This module does not score heads (`headscan.scan.reduce`) or read files other than partial states.
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

from ..config import SweepConfig, control_name
from ..corpus import Corpus, pack_corpus, read_corpus, texts_corpus
from ..errors import ConfigError, HeadscanError, ModelLoadError, SweepInterrupted, TablesError
from ..metrics.custom import check_custom, load_metric_modules
from ..models import DEFAULT_MODELS
from ..setting import added, with_settings
from ..setting_values import format_layers
from ..tables import SweepTables, check_out, load
from ..tables.folders import holding_out
from .controls import corpus_for, load_swept, swept_names
from .finish import publish, run_provenance
from .inputs import check_sweep
from .plan import plan_sweep, resolve_unit
from .reduce import accumulate
from .resume import SAVE_EVERY, check_resumable, kept_states, partial_folder, state_file, stop_requests
from .state import PartialState, Shard, join_layers, merge_states

__all__ = ["sweep", "merge", "SweepInterrupted"]


def _resolve_settings(config: SweepConfig | None, settings: dict) -> SweepConfig:
    """`config` (default: the defaults) with `settings`, its fields' or those added from outside, in place."""
    return with_settings(config or SweepConfig(), settings) if settings else config or SweepConfig()


@holding_out
def sweep(
    models: str | list[str] | tuple[str, ...] = DEFAULT_MODELS,
    corpus: str | Path | list[str] | Corpus = "builtin",
    out: str | Path | None = None,
    config: SweepConfig | None = None,
    *,
    shard: Shard | str | None = None,
    overwrite: bool = False,
    restart: bool = False,
    progress: bool = False,
    command: str | None = None,
    save_every: float = SAVE_EVERY,
    ray: str | bool | None = None,
    **settings,
) -> SweepTables:
    """Sweep every head of every layer of `models` over `corpus`; publish the tables into `out` if given.

    Parameters
    ----------
    models
        One spec or several: an embedded alias (``minilm``, ``smollm2``), a local checkpoint folder, a
        ``.gguf`` file or a Hugging Face id. Default: both embedded models.
    corpus
        A file path (``.txt``, ``.jsonl``, ``.conllu``), ``"builtin"``, ``"repeat-random[:n=50,...]"``, a list
        of strings (one segment each) or a `headscan.corpus.Corpus`.
    out
        The folder to publish heads.parquet, offsets.parquet and run.json into; None writes nothing (and
        keeps no partial state). An existing folder with files is replaced only with `overwrite`.
    config, **settings
        A `SweepConfig`, or its fields as keywords (``max_len=64``); keywords override `config`.
        ``control=("random-init", "shuffled-words")`` also sweeps each model's controls, as models of their own
        (`headscan.scan.controls`); each doubles the sweep's time.
    shard
        ``"K/N"`` or a `Shard`: sweep only the documents whose index is K modulo N (K from 0); the output
        keeps the partial states that `merge` needs.
    restart
        Discard partial states left by an earlier, stopped sweep into `out` instead of resuming from them.
    ray
        Run the sweep on a Ray cluster (`headscan.scan.cluster`): True for a local instance, or its address
        (``"auto"``, ``"HOST:6379"``, ``"ray://HOST:10001"``).
    command
        How the sweep was called, for provenance; by default the Python call itself.

    Models are loaded one at a time and released before the next, so memory holds one model at most.
    Nothing is published until every model has been swept: a failure leaves `out` as it was.

    Example (a notebook): ``tables = headscan.sweep("minilm", ["The cat sat.", "It slept."], max_len=32)``
    """
    config = _resolve_settings(config, settings)
    models, shard = check_sweep(models, corpus, out, config, overwrite=overwrite, save_every=save_every, shard=shard)
    if command is None:
        command = _python_call(models, corpus, out, config, shard)
    load_metric_modules(config.metric_modules)  # the user's own metrics, registered before anything is planned
    text = _read(corpus, config)
    config, unit_why = resolve_unit(text, config)  # the unit used, everywhere from here on: the fingerprint too
    if shard is not None and shard.count > text.n_documents:
        raise ConfigError(f"shard: {shard.count} shards of {text.n_documents} documents would leave some empty; "
                          f"use at most {text.n_documents}", setting="shard")
    partial = partial_folder(out) if out is not None else None
    if partial is not None and restart:
        shutil.rmtree(partial, ignore_errors=True)
    names = swept_names(models, config)  # each model, then its controls
    _check_layers(models, config)
    if "shuffled-words" in config.control:
        corpus_for(control_name(models[0], "shuffled-words"), text, config)  # refuses a corpus without words
    if ray not in (None, False):  # (model, shard) tasks on a Ray cluster, after the same checks
        from .cluster import sweep_on_ray

        return sweep_on_ray(names, text, out, config, address=ray, shard=shard, overwrite=overwrite, progress=progress,
                            command=command, save_every=save_every, unit_why=unit_why)

    started = datetime.now(timezone.utc)
    again = "run the same command without --restart" if restart else "run the same command again"
    states, skipped = _sweep_each(names, text, config, unit_why, shard, partial, progress, save_every, again)
    provenance = run_provenance(text, config, command=command, started=started, shard=shard, unit_why=unit_why)
    if skipped:
        provenance = dataclasses.replace(provenance, extra=provenance.extra | {"skipped": skipped})
    extra = kept_states(states.items(), part=shard is not None or config.layers is not None)
    return publish(list(states.values()), config, provenance, out, overwrite=overwrite, extra=extra, partial=partial)


def _check_layers(models: list[str], config: SweepConfig) -> None:
    """Refuse `config.layers` where a model's config (read alone, nothing loaded) has fewer layers, before the first
    model is swept; a config that cannot be read so is checked when its model is loaded (`plan_sweep`)."""
    if config.layers is None:
        return
    from ..setting_values import check_layers
    from .ray_cluster import model_config

    for spec in models:
        try:
            found = model_config(spec)
        except (HeadscanError, OSError, ValueError, KeyError, ImportError):  # checked once loaded instead
            continue
        n_layers = getattr(found, "num_hidden_layers", None) or getattr(found, "n_layer", None)
        if isinstance(n_layers, int):
            check_layers(config.layers, n_layers, spec)


def _sweep_each(names: list[str], corpus: Corpus, config: SweepConfig, unit_why: str, shard: Shard | None,
                partial: Path | None, progress: bool, save_every: float,
                again: str) -> tuple[dict[str, PartialState], dict]:
    """Each model's finished state, one model at a time, and the models skipped (name -> why); `again` is how a
    stopped sweep is resumed (never with --restart, which would discard what it kept)."""
    states: dict[str, PartialState] = {}
    skipped: dict[str, str] = {}
    with stop_requests() as should_stop:
        for name in names:
            try:
                states[name] = _sweep_one(name, corpus, config, unit_why, shard, partial, should_stop, progress,
                                          save_every, again)
            except ModelLoadError as error:  # one model that cannot be hooked does not cost the others
                if len(names) == 1:
                    raise
                skipped[name] = str(error)
                print(f"skipped {name}: {error}", file=sys.stderr)
    if not states:
        raise ModelLoadError(f"no model could be swept: {'; '.join(skipped.values())}")
    return states, skipped


def _read(corpus, config: SweepConfig) -> Corpus:
    """The corpus, read and packed (`headscan.scan.inputs.check_sweep` has checked what a look can)."""
    if isinstance(corpus, Corpus):
        text = corpus
    elif isinstance(corpus, (list, tuple)):
        text = texts_corpus(list(corpus), config.limit)
    else:
        text = read_corpus(corpus, limit=config.limit, document_field=config.document_field)
    return pack_corpus(text, config.pack, config.max_len)


def _sweep_one(spec: str, corpus: Corpus, config: SweepConfig, unit_why: str, shard: Shard | None,
               partial: Path | None, should_stop, progress: bool, save_every: float, again: str) -> PartialState:
    """One model's finished state (a control's: `headscan.scan.controls`), resumed from `partial` where a matching
    state was saved there."""
    model = load_swept(spec, config)
    corpus = corpus_for(spec, corpus, config)
    try:
        plan = plan_sweep(model, corpus, config, shard, unit_why=unit_why)
        path = partial / state_file(spec, shard) if partial is not None else None
        state = None
        if path is not None and path.is_file():
            state = PartialState.load(path)
            check_resumable(state, plan.fingerprint, shard, path, spec)
            if state.finished:
                return state
            if progress:
                print(f"resuming {spec} at segment {_kept(plan.windows, state.windows_done):,} of "
                      f"{_kept(plan.windows):,} (from {path}, {state.windows_done} of {len(plan.windows)} windows "
                      f"done)", file=sys.stderr)
        kept = {"windows": state.windows_done if state is not None else 0}

        def save(state: PartialState) -> None:
            state.save(path)
            kept["windows"] = state.windows_done

        try:
            return accumulate(model, corpus, plan, state=state, progress=progress,
                              save=save if path is not None else None, save_every=save_every,
                              should_stop=should_stop)
        except SweepInterrupted as error:
            where = (_stopped_at(plan.windows, kept["windows"], getattr(error, "redo", 0), config.window, partial,
                                 again) if path else "nothing was saved (no out)")
            raise SweepInterrupted(f"stopped while sweeping {spec}{where}") from None
    finally:
        del model
        gc.collect()


def _kept(windows: list[list[int]], done: int | None = None) -> int:
    """The segments of the first `done` windows (all of them: None)."""
    return sum(len(window) for window in windows[:done])


def _stopped_at(windows: list[list[int]], done: int, redo: int, window: int, partial: Path, again: str) -> str:
    """Where a sweep stopped, what it kept and what resuming it sweeps again, for the stop message.

    >>> _stopped_at([[0, 1, 2], [3, 4, 5], [6]], 1, 2, 3, Path("out.partial"), "run the same command again")
    ' at segment 5 of 7: the 3 segments of its 1 finished window (of 3) are kept in out.partial; run the same command again to resume from segment 3 (the 2 segments swept since are swept again: state is kept as each window of --window 3 segments ends)'
    >>> _stopped_at([[0, 1, 2], [3]], 0, 2, 3, Path("out.partial"), "run the same command again")
    ' at segment 2 of 4, before its first window of --window 3 segments ended; run the same command again to resume from segment 0 (the 2 segments swept so far are swept again)'
    """
    kept, total = _kept(windows, done), _kept(windows)
    at = f" at segment {kept + redo:,} of {total:,}"
    if done == 0:  # a pass's own work before the windows (importance's mean pass) may be kept: not said either way
        return (f"{at}, before its first window of --window {window} segments ended; {again} to resume from "
                f"segment 0" + (f" (the {redo:,} segments swept so far are swept again)" if redo else ""))
    return (f"{at}: the {kept:,} segments of its {done} finished window{'s' if done > 1 else ''} (of {len(windows)}) "
            f"are kept in {partial}; {again} to resume from segment {kept:,}"
            + (f" (the {redo:,} segments swept since are swept again: state is kept as each window of --window "
               f"{window} segments ends)" if redo else ""))


def _python_call(models: list[str], corpus, out, config: SweepConfig, shard: Shard | None) -> str:
    """The call as a notebook user would write it, for provenance (lists of texts are summarised)."""
    shown = f"<{len(corpus)} texts>" if isinstance(corpus, (list, tuple)) else repr(str(corpus))
    changed = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
               if f.name != "extra" and getattr(config, f.name) != f.default}
    changed |= {name: value for name, value in config.extra.items() if value != added("sweep")[name].default}
    arguments = [repr(models), shown] + ([f"out={str(out)!r}"] if out is not None else [])
    arguments += [f"{name}={value!r}" for name, value in changed.items()]
    arguments += [f"shard={str(shard)!r}"] if shard is not None else []
    return f"headscan.sweep({', '.join(arguments)})"


@holding_out
def merge(outs: list[str | Path], out: str | Path | None = None, *, overwrite: bool = False,
          command: str | None = None) -> SweepTables:
    """Merge the outputs of the N shards of one sweep into exactly the unsharded tables, intervals included; and
    sweeps of disjoint layers of the same models (``layers``, each whole or in shards) into exactly the tables of
    their layers swept together (every layer's: the whole model's), findings recomputed over the merged family.

    Each output must hold the partial states a sharded or layer sweep keeps (``OUT/state/``). Refuses outputs of
    different sweeps (naming what differs), a shard given twice, a missing shard, and two runs that sweep the
    same layer (naming the runs and the layers). This is ``headscan.merge`` (the ``headscan merge`` command).

    Example: ``headscan.merge(["out/part-0", "out/part-1"], "out/all")``
    """
    if not outs:
        raise ConfigError("merge needs the output folders of the shards (headscan sweep --shard K/N --out ...)")
    if out is not None:
        check_out(out, overwrite=overwrite)
    runs = [load(path) for path in outs]
    models = runs[0].models
    for path, run in zip(outs, runs):
        if run.models != models:
            raise TablesError(f"{path}: has models {run.models}, but {outs[0]} has {models}; merge shards of one sweep")
    config = SweepConfig(**{k: v for k, v in runs[0].provenance.config.items()
                            if k in {f.name for f in dataclasses.fields(SweepConfig)} and k != "device"})
    # the shards' own metrics, registered as they were swept (the states' fingerprints hold their hashes)
    check_custom(load_metric_modules(config.metric_modules), runs[0].provenance.extra.get("custom_metrics", {}),
                 str(outs[0]))
    totals = []
    for name in models:
        states = []
        for path in outs:
            file = Path(path) / "state" / state_file(name, None)
            if not file.is_file():
                raise TablesError(f"{path}: has no partial state for {name} ({file}); sweep it with --shard K/N")
            states.append(PartialState.load(file))
        totals.append(_combine(states, [str(p) for p in outs]))
    layers = totals[0].fingerprint["settings"].get("layers")  # those of every part together; None: all of them
    config = dataclasses.replace(config, layers=None if layers is None else tuple(layers))
    first = runs[0].provenance
    provenance = dataclasses.replace(
        first, run_id=None, command=command or f"headscan.merge({[str(p) for p in outs]!r})",
        finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        config=first.config | {"layers": config.to_json()["layers"]},
        extra={k: v for k, v in first.extra.items() if k != "shard"} | {"merged_from": [str(p) for p in outs]},
    )
    return publish(totals, config, provenance, out, overwrite=overwrite)


def _combine(states: list[PartialState], names: list[str]) -> PartialState:
    """One model's state from its runs: the shards of each set of layers added up (`merge_states`), then the sets
    of layers joined (`join_layers`). Runs of one set of layers must be its shards; a set swept whole is one run."""
    groups: dict[tuple | None, list[int]] = {}
    for index, state in enumerate(states):
        given = state.fingerprint.get("settings", {}).get("layers")
        groups.setdefault(None if given is None else tuple(given), []).append(index)
    if len(groups) == 1:
        return merge_states(states, names)
    parts, part_names = [], []
    for indices in groups.values():
        group, group_names = [states[i] for i in indices], [names[i] for i in indices]
        if len(group) == 1 and group[0].shard is None:
            parts.append(group[0])
        elif all(state.shard is not None for state in group):
            parts.append(merge_states(group, group_names))
        else:
            swept = format_layers(group[0].layers)
            raise TablesError(f"{', '.join(group_names)}: each swept layers {swept} of the whole corpus; give one "
                              f"run per set of layers, or all the shards of one")
        part_names.append(" + ".join(group_names))
    return join_layers(parts, part_names)
