"""`run_job`: the one lifecycle of a registered job (`headscan.scan.jobs.Job`), and its Python entry point.

Before the first model: the settings (the config checks itself when made), the models (each named once; a spec
found without loading it), the output folder (`headscan.tables.check_out`, and ``OUT.partial/``:
`headscan.scan.resume.partial_folder`) and the input (`Job.read`). Then one model at a time: a model kept
finished by a stopped run is read back, not run again; one that fails to load is skipped with why (the run fails
only if none is left); the work is handed the partial state a stopped run kept for it (`Kept`). SIGINT and SIGTERM
become a stop request (`headscan.scan.resume.stop_requests`) that the work acts on at its next checkpoint, and
the runner between two models: what is done is kept in ``OUT.partial/`` and the same call resumes from there,
to tables equal to the bit to those of an uninterrupted run. A line per model says how far the run is. Last, the
run's provenance (`headscan.scan.finish.run_provenance`) and every table, published as one set
(`headscan.tables.write`); ``OUT.partial/`` is then removed.

This module reads and writes no model itself.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError, ModelLoadError, SweepInterrupted, TablesError
from ..setting import settings as config_settings
from ..setting import with_settings
from ..tables import TABLES, ModelProvenance, SweepTables, check_out, write
from ..tables.folders import holding_out
from .finish import run_provenance
from .jobs import Job, JobInput, ModelDone
from .resume import SAVE_EVERY, check_models, partial_folder, spec_stem, stop_requests
from .state import fingerprint_differences

__all__ = ["run_job", "Kept", "job_function", "job_fingerprint"]

AGAIN = "run the same command again"


def job_fingerprint(job: Job, spec: str, given: JobInput, config) -> dict:
    """What a model's partial state must match to be resumed: the job, the model, the input's bytes and the
    settings that enter the fingerprint (`Job.fingerprinted`), as JSON holds them."""
    settings = {name: getattr(config, name) for name in job.fingerprinted}
    return json.loads(json.dumps({"job": job.name, "model": {"name": spec}, "corpus": given.provenance.to_json(),
                                  "input": given.fingerprint, "settings": settings}, default=str))


class Kept:
    """One model's partial state in ``OUT.partial/``: the arrays a stopped run kept (`state`, None on a fresh
    start) and how far it got (`done`), and where the work says it may stop (`checkpoint`). Without an output
    folder nothing is kept, and a stop request still stops the run.

    A work that keeps its steps its own way (``headscan patch``: one JSON line per step) reads `partial` (the
    folder, None without one), `spec`, `should_stop`, `progress`, `restarted` and `again` (how its stop message
    says to resume) instead, and files of its own there must be named as `headscan.scan.resume` allows."""

    def __init__(self, partial: Path | None, job: Job, spec: str, fingerprint: dict, should_stop: Callable[[], bool],
                 *, save_every: float = SAVE_EVERY, progress: bool = False, restarted: bool = False):
        self.partial, self.job, self.spec, self.fingerprint = partial, job, spec, fingerprint
        self.should_stop, self.save_every, self.progress = should_stop, save_every, progress
        # how a stop message says to resume (never with --restart, which would discard what was kept)
        self.restarted, self.again = restarted, AGAIN + (" without --restart" if restarted else "")
        stem = f"job-{job.name}-{spec_stem(spec)}"
        self.path = partial / f"{stem}.npz" if partial is not None else None
        self.finished_path = partial / f"{stem}.json" if partial is not None else None
        self.state: dict[str, np.ndarray] | None = None
        self.done = 0
        self._saved = time.monotonic()
        if self.path is not None and self.path.is_file():
            with np.load(self.path) as arrays:
                header = json.loads(str(arrays["__header__"]))
                self._check(header["fingerprint"], self.path)
                self.state = {name: arrays[name] for name in arrays.files if name != "__header__"}
            self.done = int(header["done"])
            if progress:
                print(f"{job.name}: resuming {spec} at {self.done:,} of {header['total']:,} (from {self.path})",
                      file=sys.stderr)

    def _check(self, saved: dict, source: Path) -> None:
        differences = fingerprint_differences(saved, self.fingerprint)
        if differences:
            raise TablesError(f"{source}: kept by a stopped {self.job.name} run of {self.spec} with other inputs "
                              f"({'; '.join(differences[:3])}); rerun that command to finish it, or pass --restart "
                              f"to discard it")

    def checkpoint(self, state: dict[str, np.ndarray], done: int, total: int) -> None:
        """A point the work may stop at, with `done` of its `total` steps finished and `state` (arrays) all it
        needs to go on from there: kept when a stop was requested (then SweepInterrupted) or every
        `save_every` seconds."""
        stop = self.should_stop()
        if self.path is not None and (stop or time.monotonic() - self._saved >= self.save_every):
            self._save(state, done, total)
        if stop:
            where = (f"{done:,} of {total:,} steps are kept in {self.partial}; {self.again} to resume" if self.path
                     else "nothing was kept (no out)")
            raise SweepInterrupted(f"stopped while running {self.job.name} on {self.spec}: {where}")

    def _save(self, state: dict[str, np.ndarray], done: int, total: int) -> None:
        if "__header__" in state:
            raise ConfigError(f"{self.job.name}: a partial state may not hold an array named __header__")
        header = json.dumps({"fingerprint": self.fingerprint, "done": done, "total": total})
        self.partial.mkdir(parents=True, exist_ok=True)
        temporary = self.partial / f".{self.path.name}.tmp"
        with open(temporary, "wb") as handle:  # a handle: np.savez would add .npz to a name
            np.savez(handle, __header__=np.array(header), **state)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)  # a stop while saving leaves the last whole state
        self._saved = time.monotonic()

    def finished(self) -> ModelDone | None:
        """The tables and provenance of this model as a stopped run finished them, or None."""
        if self.finished_path is None or not self.finished_path.is_file():
            return None
        header = json.loads(self.finished_path.read_text(encoding="utf-8"))
        self._check(header["fingerprint"], self.finished_path)
        tables = {name: TABLES[name].conform(pd.read_parquet(self.partial / file))
                  for name, file in header["tables"].items()}
        return ModelDone(tables, ModelProvenance.from_json(header["model"]))

    def finish(self, done: ModelDone) -> None:
        """Keep this model's finished tables (the index file last, so that a stop while writing keeps none)."""
        if self.finished_path is None:
            return
        self.partial.mkdir(parents=True, exist_ok=True)
        files = {}
        for name, frame in done.tables.items():
            files[name] = f"{self.finished_path.stem}.{name}.parquet"
            temporary = self.partial / f".{files[name]}.tmp"
            frame.to_parquet(temporary, index=False)
            os.replace(temporary, self.partial / files[name])
        temporary = self.partial / f".{self.finished_path.name}.tmp"
        temporary.write_text(json.dumps({"fingerprint": self.fingerprint, "tables": files,
                                         "model": done.model.to_json()}, default=str))
        os.replace(temporary, self.finished_path)
        if self.path.is_file():
            self.path.unlink()


def _resolved(job: Job, config, settings: dict):
    """`config` (default: the job's defaults) with `settings`, its fields as keywords, in place."""
    if config is not None and not isinstance(config, job.config):
        raise ConfigError(f"{job.name}: config must be a {job.config.__name__}, got {type(config).__name__}")
    return with_settings(config or job.config(), settings) if settings else config or job.config()


def _models(job: Job, models) -> list[str]:
    if job.specs:
        return check_models(models)
    models = [models] if isinstance(models, str) else list(models)
    if not models or len(set(models)) != len(models):
        raise ConfigError(f"{job.name}: name each model once (got {models})", setting="models")
    return models


@holding_out
def run_job(job: Job, models: str | list[str], source, out: str | Path | None = None, config=None, *,
            overwrite: bool = False, restart: bool = False, progress: bool = False, command: str | None = None,
            save_every: float = SAVE_EVERY, **settings) -> SweepTables:
    """Run `job` on each of `models` over `source` (what `job.read` reads) with `config` (or its fields as
    keywords); publish its tables and run.json into `out` if given. A stopped run (SIGINT, SIGTERM) keeps what
    it did in ``OUT.partial/``, and the same call resumes from there (`restart` discards it).

    Example: ``run_job(JOBS["import-scores"], ["llama"], "head_score/llama.json", "out/llama")``
    """
    config = _resolved(job, config, settings)
    models = _models(job, models)
    if out is not None:
        check_out(out, overwrite=overwrite)
    partial = partial_folder(out) if out is not None else None
    if partial is not None and restart:
        shutil.rmtree(partial, ignore_errors=True)
    given = job.read(source, config)  # the input is checked before the first model
    started = datetime.now(timezone.utc)
    done: dict[str, ModelDone] = {}
    skipped: dict[str, str] = {}
    with stop_requests() as should_stop:
        for index, spec in enumerate(models, start=1):
            kept = Kept(partial, job, spec, job_fingerprint(job, spec, given, config), should_stop,
                        save_every=save_every, progress=progress, restarted=restart)
            clock = time.monotonic()
            if (finished := kept.finished()) is not None:
                done[spec] = finished
                how = f"kept from {kept.finished_path}"
            else:
                try:
                    model = job.load(spec, config) if job.load is not None else spec
                except ModelLoadError as error:  # one model that cannot be loaded does not cost the others
                    if len(models) == 1:
                        raise
                    skipped[spec] = str(error)
                    print(f"skipped {spec}: {error}", file=sys.stderr)
                    continue
                done[spec] = _one_model(job, spec, model, given, config, kept)
                del model  # the work released its own references: the next model is loaded alone
                gc.collect()
                kept.finish(done[spec])
                how = f"done in {time.monotonic() - clock:.1f} s"
            if progress:
                rows = sum(len(frame) for frame in done[spec].tables.values())
                print(f"{job.name}: model {index} of {len(models)}, {spec}: {how} ({rows:,} rows)", file=sys.stderr)
            if index < len(models) and should_stop():
                where = f"kept in {partial}; {kept.again} to resume" if partial is not None else "nothing was kept (no out)"
                raise SweepInterrupted(f"stopped after {spec}, {index} of {len(models)} models finished: {where}")
    if not done:
        raise ModelLoadError(f"{job.name}: no model could be run: {'; '.join(skipped.values())}")
    provenance = run_provenance(given.provenance, config, [one.model for one in done.values()],
                                command=command or python_call(job, models, source, config), started=started,
                                unit_why=job.unit)
    notes = given.extra | ({"skipped": skipped} if skipped else {})
    provenance = dataclasses.replace(provenance, extra=provenance.extra | notes)
    frames = {name: pd.concat([one.tables[name] for one in done.values() if name in one.tables], ignore_index=True)
              for name in job.tables if any(name in one.tables for one in done.values())}
    result = SweepTables(frames, provenance)
    if out is not None:
        result.path = write(result, out, overwrite=overwrite)
        shutil.rmtree(partial, ignore_errors=True)
    return result


def _one_model(job: Job, spec: str, model, given: JobInput, config, kept: Kept) -> ModelDone:
    """One model's tables (`Job.work`), checked: tables the job declares, each as its registry says."""
    try:
        finished = job.work(model, given, config, kept)
    finally:
        del model
        gc.collect()
    if not isinstance(finished, ModelDone) or set(finished.tables) - set(job.tables):
        raise TablesError(f"{job.name}: the work on {spec} must return a ModelDone of tables among {job.tables}, "
                          f"got {type(finished).__name__}"
                          + (f" with {sorted(finished.tables)}" if isinstance(finished, ModelDone) else ""))
    return ModelDone({name: TABLES[name].conform(frame) for name, frame in finished.tables.items()}, finished.model)


def python_call(job: Job, models: list[str], source, config) -> str:
    """The call as a notebook user would write it, for provenance: the settings that differ from the defaults.

    >>> from headscan.scan.jobs import JOBS
    >>> python_call(JOBS["import-scores"], ["llama"], "llama.json", JOBS["import-scores"].config(bootstrap=50))
    "headscan.import_scores(['llama'], 'llama.json', bootstrap=50)"
    """
    defaults = job.config()
    changed = [f"{name}={getattr(config, name)!r}" for name in config_settings(job.config)
               if getattr(config, name) != getattr(defaults, name)]
    shown = repr(str(source)) if isinstance(source, (str, os.PathLike)) else f"<{type(source).__name__}>"
    return f"headscan.{job.python_name}({', '.join([repr(models), shown, *changed])})"


def job_function(job: Job) -> Callable[..., SweepTables]:
    """``headscan.NAME`` of a registered job: `run_job` with the job given."""

    def run(models: str | list[str], source, out: str | Path | None = None, config=None, **keywords) -> SweepTables:
        return run_job(job, models, source, out, config, **keywords)

    run.__name__ = run.__qualname__ = job.python_name
    run.__doc__ = (f"{job.help}\n\n{job.description}\n\nRuns `headscan.scan.runner.run_job` with the job "
                   f"{job.name!r}: models, source, out=None, config=None, overwrite, restart, progress, command, "
                   f"and the fields of {job.config.__name__} as keywords.\n\n"
                   f"Example: ``headscan.{job.python_name}(models, source, 'out/{job.name}')``")
    return run
