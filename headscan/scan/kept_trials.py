"""What the trial-based runs share (`headscan.scan.trials`, `headscan.scan.masking`): the trials they keep in
``OUT.partial/`` so a stopped run resumes, and the mean over trials with its bootstrap interval.

This module runs no model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .. import intervals
from ..errors import TablesError
from ..retrieval_config import RetrievalConfig
from .state import PartialState, fingerprint_differences

__all__ = ["over_trials", "kept_trials", "keep_trial"]


def over_trials(scores: np.ndarray, chance: np.ndarray, trial_ids: np.ndarray, config: RetrievalConfig, *,
                bounds=(0.0, 1.0), counts: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The value columns of the mean over trials of `scores` (trial, layer, head), each trial one bootstrap unit
    weighted by draws keyed on its index (`headscan.intervals`); `chance` (trial, layer) is each trial's chance
    level, the same for every head of a layer, averaged over the same trials. With `counts` (the shape of
    `scores`), each row is a unit holding that many trials and `scores` their sums (the masking test's needles)."""
    counts = np.ones_like(scores) if counts is None else counts
    chance_sums = np.broadcast_to(chance.sum(0)[:, None], scores.shape[1:]).copy()  # (layer, head)
    weights = intervals.bootstrap_weights(trial_ids.tolist(), config.bootstrap, config.seed)  # (replicate, trial)
    state = PartialState({}, None, scores.sum(0), counts.sum(0), np.einsum("rt,tlh->rlh", weights, scores),
                         np.einsum("rt,tlh->rlh", weights, counts), intervals.unit_moments(scores, counts),
                         chance_sums, intervals.replicate_moments(weights, scores, counts))
    return state.values(config.interval, bounds=bounds)


def kept_trials(path: Path | None, expected: dict, spec: str, key=lambda record: record["trial"]) -> dict:
    """The trials kept in `path` by a stopped run with the same fingerprint (a half-written last line is dropped),
    by `key` of each record."""
    if path is None or not path.is_file():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        header = json.loads(lines[0])
    except (ValueError, IndexError):
        return {}
    differences = fingerprint_differences(header.get("fingerprint", {}), expected)
    if differences:
        raise TablesError(f"{path}: trials of {spec} kept by a run with other inputs ({'; '.join(differences[:3])}); "
                          f"rerun that command to finish it, or pass --restart to discard them")
    done = {}
    for line in lines[1:]:
        try:
            record = json.loads(line)
        except ValueError:
            break  # the run stopped while writing this line
        done[key(record)] = record
    return done


def keep_trial(path: Path, record: dict, fingerprint: dict) -> None:
    """Keep one finished trial: a line of JSON, flushed to disk (the file opens with the run's fingerprint)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        if handle.tell() == 0:
            handle.write(json.dumps({"fingerprint": fingerprint}) + "\n")
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
