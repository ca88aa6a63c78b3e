"""Published retrieval-head scores as a headscan run: ``headscan import-scores``.

The Retrieval_Head repository (Wu et al. 2024) publishes each model's scores as ``head_score/MODEL.json``: one JSON
object whose keys are ``"layer-head"`` (0-indexed, as headscan's ``L{layer}H{head}``) and whose values list the
head's retrieval score in each needle-in-a-haystack trial that passed their answer gate (ROUGE recall above 50),
every head over the same trials in the same order. `import_scores` turns such a file into the ``retrieval.parquet``
a ``headscan retrieval`` run writes: per head the mean over trials (``value``, ``sum``, ``count`` = trials), and
an interval over trials bootstrapped exactly as headscan's own (`headscan.scan.trials.over_trials`: each trial one
unit, the same draws), so a published model's retrieval heads stand beside a model headscan scored, trial counts
side by side. There is no ``retrieval_trials.parquet``: the file holds no prompts, answers or failed trials.

What the file cannot say is left undefined, never guessed: ``chance`` (it needs each trial's haystack length) is
NaN; ``kv_group`` is the head itself (the file does not say which heads share keys and values); the rows are the
gated score, ``retrieval`` (the file holds only trials that passed), and no ``retrieval_ungated`` rows.

>>> import json, tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "tiny.json"
>>> _ = path.write_text(json.dumps({"0-0": [1.0, 0.0], "0-1": [0.5, 0.5], "1-0": [0.0, 0.0], "1-1": [0.25, 0.75]}))
>>> run = import_scores(path)
>>> run["retrieval"][["label", "value", "count"]].to_dict("list")
{'label': ['L0H0', 'L0H1', 'L1H0', 'L1H1'], 'value': [0.5, 0.5, 0.0, 0.5], 'count': [2, 2, 2, 2]}
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import TablesError
from ..retrieval_config import ImportConfig, RetrievalConfig
from ..tables import IMPORTED, TABLES, CorpusProvenance, ModelProvenance, SweepTables, head_columns
from .jobs import Job, JobInput, ModelDone, register_job
from .kept_trials import over_trials
from .runner import run_job
from .trials import TRIAL_UNIT

__all__ = ["import_scores", "PUBLISHED_FORMATS", "IMPORT_SCORES"]

# the formats import_scores reads, and what each is
PUBLISHED_FORMATS = {"retrieval-head": "Retrieval_Head's head_score/MODEL.json (Wu et al. 2024): "
                                       '{"layer-head": [score of each trial that passed the gate]}'}
_KEY = re.compile(r"(\d+)-(\d+)")


def _read(path: Path) -> dict[tuple[int, int], list[float]]:
    """The file's scores by (layer, head), checked: every key ``layer-head``, every value a list of numbers in
    [0, 1], every head over the same number of trials."""
    shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TablesError(f"{shown}: cannot be read ({error})") from error
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise TablesError(f"{shown}: not JSON at line {error.lineno}, column {error.colno} ({error.msg}); "
                          f"expected {PUBLISHED_FORMATS['retrieval-head']}") from error
    if not isinstance(data, dict) or not data:
        raise TablesError(f"{shown}: holds {type(data).__name__ if data else 'nothing'}, not an object of heads; "
                          f"expected {PUBLISHED_FORMATS['retrieval-head']}")
    scores: dict[tuple[int, int], list[float]] = {}
    for key, values in data.items():
        found = _KEY.fullmatch(str(key))
        if not found:
            raise TablesError(f"{shown}: key {key!r} is not 'layer-head' (such as '16-19', 0-indexed)")
        if not isinstance(values, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1
                for v in values):
            raise TablesError(f"{shown}: head {key!r} must hold a list of per-trial scores between 0 and 1; got "
                              f"{str(values)[:80]}")
        scores[int(found.group(1)), int(found.group(2))] = [float(v) for v in values]
    counts = {len(v) for v in scores.values()}
    if len(counts) > 1:
        lengths = pd.Series({f"{layer}-{head}": len(v) for (layer, head), v in scores.items()})
        raise TablesError(f"{shown}: heads hold different numbers of trials ({lengths.min()} to {lengths.max()}, "
                          f"for example '{lengths.idxmin()}' and '{lengths.idxmax()}'); in this format every head "
                          "lists the same trials in the same order, so the trials cannot be matched")
    if counts == {0}:
        raise TablesError(f"{shown}: no trial is listed for any head (no trial passed the gate)")
    n_layers = 1 + max(layer for layer, _ in scores)
    n_heads = 1 + max(head for _, head in scores)
    missing = [f"{layer}-{head}" for layer in range(n_layers) for head in range(n_heads) if (layer, head) not in scores]
    if missing:
        raise TablesError(f"{shown}: {len(missing)} of the {n_layers} x {n_heads} heads are missing (first "
                          f"{missing[0]!r}); a published file lists every head")
    return scores


def _read_input(path: str | os.PathLike, config: ImportConfig) -> JobInput:
    """The score file, read and checked (`_read`) before anything is written: the job's input."""
    path = Path(path)
    scores = _read(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    trials = len(next(iter(scores.values())))
    imported = {"format": PUBLISHED_FORMATS["retrieval-head"], "file": str(path), "sha256": digest, "trials": trials,
                "gate": "the publishers' own: a trial is in the file only when its answer passed their gate",
                "undefined": "chance (the file holds no haystack lengths), retrieval_ungated and retrieval_trials "
                             "(the file holds no failed trials, prompts or answers), kv_group (set to the head)"}
    return JobInput((path, scores, digest),
                    CorpusProvenance(source=str(path), kind="published scores", sha256=digest),
                    {"imported": imported})


def _retrieval_table(name: str, given: JobInput, config: ImportConfig, kept) -> ModelDone:
    """The retrieval rows of the file's heads under the model name `name`, intervals over its trials (the file is
    read whole, so there is nothing to stop at or keep part way)."""
    path, scores, digest = given.data
    n_layers = 1 + max(layer for layer, _ in scores)
    n_heads = 1 + max(head for _, head in scores)
    trials = len(next(iter(scores.values())))
    grid = np.empty((trials, n_layers, n_heads))  # (trial, layer, head)
    for (layer, head), values in scores.items():
        grid[:, layer, head] = values
    values = over_trials(grid, np.full((trials, n_layers), np.nan), np.arange(trials), config)
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    rows = pd.DataFrame(head_columns(name, "causal", layer.ravel(), head.ravel(), head.ravel())
                        | {"metric": "retrieval"} | {k: v.ravel() for k, v in values.items()})
    described = ModelProvenance(name, source=IMPORTED, id=str(path), revision=digest, family="causal",
                                n_layers=n_layers, n_heads=n_heads,
                                extra={"trials": trials, "format": "retrieval-head"})
    return ModelDone({"retrieval": TABLES["retrieval"].conform(rows)}, described)


IMPORT_SCORES = register_job(Job(
    "import-scores", "Read a published retrieval-head score file (Retrieval_Head's JSON) as a retrieval run.",
    ImportConfig, ("retrieval",), read=_read_input, work=_retrieval_table, unit=TRIAL_UNIT, specs=False,
    input_help=f"The score file: {PUBLISHED_FORMATS['retrieval-head']}.",
    example="headscan import-scores head_score/llama-2-7b-80k.json --out out/llama-published"))


def import_scores(path: str | os.PathLike, out: str | os.PathLike | None = None, *, model: str | None = None,
                  config: RetrievalConfig | ImportConfig | None = None, overwrite: bool = False,
                  command: str | None = None, **settings) -> SweepTables:
    """Read a published retrieval-head score file (`PUBLISHED_FORMATS`) as a retrieval run; write it to `out` if
    given. `model` names the model (default: the file's name without ``.json``); `config`'s (or the keywords')
    ``bootstrap``, ``interval`` and ``seed`` make the intervals over trials, as in ``headscan retrieval``. The
    job `IMPORT_SCORES`, run by `headscan.scan.runner.run_job`.

    Example: ``headscan.import_scores("head_score/llama-2-7b-80k.json", "out/llama-retrieval")``
    """
    name = model or Path(path).name.removesuffix(".json")
    return run_job(IMPORT_SCORES, [name], path, out, ImportConfig.of(config), overwrite=overwrite,
                   command=command or f"headscan.import_scores({str(path)!r})", **settings)
