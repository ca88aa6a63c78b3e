"""Jobs: what a run does, declared once as a `Job`, and the registry the command line and ``headscan.NAME`` read.

A job is models run one at a time over one input into tables. Its description says what differs between jobs:
its name (the command, ``headscan NAME``; ``headscan.NAME`` with dashes as underscores in Python), its config (a
frozen dataclass whose fields are made by `headscan.setting.option`: the command's options and the fingerprint
are derived from them), the tables it publishes (registered in `headscan.tables.TABLES`), how its input is read
(`read`, once, before the first model), how a model is loaded (`load`) and the work done per model (`work`).
What every job shares, `headscan.scan.runner.run_job` does once: the checks before the first model, the loop,
skipping a model that fails to load, stop requests with a partial state per model that the next run resumes
from, a progress line, provenance and publishing every table as one set.

A job registered from outside the package (`register_job`; tests/test_added_job.py registers one) gets a
command, ``headscan.NAME``, resume, progress, provenance and a published folder, with no edit inside it.

This module imports no torch.

>>> job = registered_jobs()["import-scores"]
>>> job.python_name, job.tables, job.fingerprinted
('import_scores', ('retrieval',), ('seed',))
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..errors import ConfigError
from ..setting import fingerprinted
from ..tables import RUN_TABLES, TABLES, CorpusProvenance, ModelProvenance

__all__ = ["Job", "JobInput", "ModelDone", "JOBS", "register_job", "registered_jobs"]

_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
# The modules of headscan that register its own jobs, imported by `registered_jobs` (they import torch).
BUILTIN_JOB_MODULES = ("headscan.scan.published", "headscan.scan.patching")


@dataclass(frozen=True)
class JobInput:
    """A job's input as `Job.read` made it: what the work reads (`data`), what run.json says of it
    (`provenance`, which enters each model's fingerprint), notes for the run's provenance (`extra`) and any other
    fact of the input a kept state must share to be resumed (`fingerprint`: a second file's sha256, say)."""

    data: Any
    provenance: CorpusProvenance
    extra: dict = field(default_factory=dict)
    fingerprint: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModelDone:
    """What a job's work returns for one model: its tables (names of `Job.tables`) and its provenance."""

    tables: dict[str, pd.DataFrame]
    model: ModelProvenance


@dataclass(frozen=True)
class Job:
    """One kind of run, declared once.

    - `name`: the command (``headscan NAME``); ``headscan.NAME`` in Python, dashes as underscores;
    - `help`: one line, the command's short help; `description`: the rest of its help (may be empty);
    - `config`: a frozen dataclass whose fields are made by `headscan.setting.option`, with the class attribute
      ``command`` equal to `name`; its fields are the command's options, and those declared so enter the
      fingerprint (`headscan.setting.fingerprinted`);
    - `tables`: the names of the registered tables (`headscan.tables.register_table`) the job publishes, the
      first one in every run (`headscan.load` knows a run of the job by it);
    - `read(source, config) -> JobInput`: the input, read and checked once, before the first model;
    - `load(spec, config)`: one model, or `headscan.errors.ModelLoadError` (the model is then skipped, unless it is
      the only one); None: the work is handed the spec itself;
    - `work(model, input, config, kept) -> ModelDone`: one model's tables. `kept`
      (`headscan.scan.runner.Kept`) holds the arrays a stopped run kept for this model (``kept.state``, None on
      a fresh start) and takes new ones at each point the work may stop at (``kept.checkpoint``);
    - `unit`: what the bootstrap resamples, as run.json says it; `example`: a command line, ending the help;
    - `input_help`: the help of the command's input option; `specs`: whether the models are model specs,
      checked (found, installed) before anything is loaded.
    """

    name: str
    help: str
    config: type
    tables: tuple[str, ...]
    read: Callable[[Any, Any], JobInput]
    work: Callable[[Any, JobInput, Any, Any], ModelDone]
    load: Callable[[str, Any], Any] | None = None
    unit: str = "none: the job computes no interval"
    example: str = ""
    description: str = ""
    input_help: str = "The job's input."
    specs: bool = True

    @property
    def python_name(self) -> str:
        """The name of its Python entry point, ``headscan.NAME``."""
        return self.name.replace("-", "_")

    @property
    def fingerprinted(self) -> tuple[str, ...]:
        """The settings that enter each model's fingerprint: a kept partial state with other values is refused."""
        return fingerprinted(self.config)


# name -> the registered job, in registered order
JOBS: dict[str, Job] = {}


def register_job(job: Job) -> Job:
    """Add `job` to the registry, from which its command and ``headscan.NAME`` are made; a name (or Python
    name) already taken, a config that is no frozen dataclass of that command, or a table that is not registered,
    is refused naming it."""
    if not _NAME.fullmatch(job.name):
        raise ConfigError(f"register_job: a job's name is lower-case words joined by dashes (such as 'my-job'), "
                          f"got {job.name!r}")
    taken = {one.python_name: one.name for one in JOBS.values()}
    if job.name in JOBS or job.python_name in taken:
        raise ConfigError(f"register_job: a job named {job.name!r} is already registered "
                          f"({taken.get(job.python_name, job.name)!r}); pick another name")
    if not dataclasses.is_dataclass(job.config) or getattr(job.config, "command", None) != job.name:
        raise ConfigError(f"register_job: {job.name}: its config must be a dataclass with the class attribute "
                          f"command = {job.name!r} (its fields made by headscan.setting.option)")
    unknown = [name for name in job.tables if name not in TABLES]
    if unknown or not job.tables:
        raise ConfigError(f"register_job: {job.name}: tables {unknown or '()'} are not registered tables; declare "
                          f"each with headscan.tables.register_table first")
    if not job.help:
        raise ConfigError(f"register_job: {job.name}: needs a one-line help")
    JOBS[job.name] = job
    if job.tables[0] not in RUN_TABLES:  # its runs' folders are read back by headscan.load
        RUN_TABLES.append(job.tables[0])
    return job


def registered_jobs() -> dict[str, Job]:
    """Every registered job, headscan's own included (their modules imported first: they import torch)."""
    for module in BUILTIN_JOB_MODULES:
        importlib.import_module(module)
    return JOBS
