"""headscan: score every attention head of hooked transformers into tidy parquet tables.

The public API is small:

- ``headscan.sweep(models, corpus, out=None, **settings)`` scores every head (the `headscan sweep` command);
- ``headscan.retrieval(models, haystack, out=None, **settings)`` finds retrieval heads by needle-in-a-haystack
  decoding (the `headscan retrieval` command); ``headscan.import_scores(file, out=None)`` reads published
  retrieval-head scores (Retrieval_Head's JSON) as such a run (`headscan import-scores`);
- ``headscan.patch(models, pairs, out=None, **settings)`` patches every head, and paths between heads, between
  clean and corrupted prompts (the `headscan patch` command);
- ``headscan.merge(outs, out=None)`` adds the shards of one sweep, or sweeps of disjoint layers (`headscan merge`);
- ``headscan.pairs(kind, n, out)`` writes prompt pairs for patching (`headscan pairs`);
- ``headscan.load(out)`` reads a sweep's tables back (``pd.read_parquet`` works too);
- ``headscan.show(run, metric)`` is the text of a run's top heads (`headscan show`);
- ``headscan.export(run, out)`` writes a run as a Hugging Face dataset folder (`headscan export`);
- ``headscan.describe_models(specs)`` says how each spec would be hooked (`headscan models`);
- ``headscan.report(runs, out=None, **settings)`` writes the report of one or more sweeps (the `headscan report`
  command, without the example attention unless given ``models=True``);
- ``headscan.METRICS`` and ``headscan.TABLES`` are the metric and table registries;
- ``headscan.pattern(name)`` and ``headscan.metric(name)`` register your own head scores (decorators;
  `headscan.metrics.custom`), swept like headscan's own;
- ``headscan.register_setting(name, default, type, group, help)`` adds a sweep setting of your own: an option of
  ``headscan sweep`` and a keyword of ``headscan.sweep``, in the fingerprint and docs/options.md, read from the
  config as ``config.name`` (`headscan.cli_options.register_setting`);
- ``headscan.SweepConfig`` holds the settings, ``headscan.load_model`` loads one hooked model.

A job registered with ``headscan.scan.jobs.register_job`` (from outside the package too) is a command,
``headscan NAME``, and ``headscan.NAME``, both running it through `headscan.scan.runner.run_job`.

Each ``headscan COMMAND`` calls exactly one of these (`headscan.cli_options.ENTRY_POINTS`; docs/options.md lists
them). Importing headscan imports neither torch nor transformers; the first sweep does.

>>> import headscan
>>> list(headscan.METRICS)[:3]
['prev_token', 'next_token', 'self']
>>> list(headscan.TABLES)  # doctest: +NORMALIZE_WHITESPACE
['heads', 'offsets', 'positions', 'syntax', 'value', 'weights', 'composition', 'importance', 'patching', 'paths',
 'similarity', 'similarity_across', 'examples', 'retrieval', 'retrieval_trials', 'retrieval_masking',
 'retrieval_masking_trials']
"""

import importlib

__version__ = "0.1.0"

from .config import SweepConfig
from .errors import HeadscanError
from .retrieval_config import RetrievalConfig
from .tables import TABLES, SweepTables, load

__all__ = ["__version__", "HeadscanError", "METRICS", "TABLES", "SweepTables", "SweepConfig", "RetrievalConfig", "load",
           "describe_models", "export", "import_scores", "load_model", "merge", "metric", "pairs", "patch", "pattern",
           "register_setting", "report", "retrieval", "show", "sweep"]

# Loaded on first use (most import torch and transformers): name -> (module, its name there).
_LAZY = {"sweep": ("headscan.scan", "sweep"), "merge": ("headscan.scan", "merge"),
         "retrieval": ("headscan.scan", "retrieval"), "import_scores": ("headscan.scan.published", "import_scores"),
         "patch": ("headscan.scan.patching", "patch"), "pairs": ("headscan.scan.patching", "write_generated_pairs"),
         "export": ("headscan.tables", "export_dataset"), "show": ("headscan.analysis.show", "show"),
         "describe_models": ("headscan.models.specs", "describe_models"), "load_model": ("headscan.models", "load_model"),
         "METRICS": ("headscan.metrics", "METRICS"), "pattern": ("headscan.metrics.custom", "pattern"),
         "metric": ("headscan.metrics.custom", "metric"),
         "register_setting": ("headscan.cli_options", "register_setting")}


def __getattr__(name):
    if name == "report":  # the package headscan.report, callable as write_report (it imports matplotlib)
        return importlib.import_module("headscan.report")
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    jobs = importlib.import_module("headscan.scan.jobs").JOBS  # a job registered from outside: headscan.NAME
    job = next((job for job in jobs.values() if job.python_name == name), None)
    if job is not None:
        return importlib.import_module("headscan.scan.runner").job_function(job)
    raise AttributeError(f"module 'headscan' has no attribute {name!r}")
