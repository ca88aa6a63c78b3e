"""The work of ``headscan patch`` in steps a stopped run keeps and resumes between, and the split that chooses path
candidates on pairs it does not estimate them on.

A step is one batch's clean and corrupted runs (their logit differences, and AtP and AtP* of every head), one
head's exact patches over one batch (both directions), or one sender's paths over one batch. Each
finished step is a line of ``OUT.partial/patch-SPEC.jsonl`` (`headscan.scan.kept_trials`, the machinery that
keeps retrieval's trials): the file opens with the run's fingerprint, a step's numbers are float64 written as
JSON (which reads back to the same bits), and a run stopped by SIGINT or SIGTERM (`headscan.scan.resume.
stop_requests`) raises `SweepInterrupted` between two steps, saying how many are kept. A resumed run reads the
kept steps instead of computing them, and an uninterrupted one goes through the same records, so both make the
same tables to the bit.

Path candidates (`split_pairs`): with ``path_top`` the top heads are chosen by exact denoising summed over the odd
lines of the pairs file (pairs 1, 3, 5, ...) and the paths between them estimated on the even lines (2, 4, 6,
...); or, with a file of selection pairs, chosen on that file and estimated on every pair. Named paths
(``--paths``) are estimated on the same pairs as the chosen ones, so the paths table rests on one set of pairs.

This module does not read pairs files, build tables or draw.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .. import __version__
from ..errors import SweepInterrupted
from ..models.patching import attributions, pair_runs, patch_layer, patch_sender
from ..setting import fingerprinted
from .kept_trials import keep_trial, kept_trials

__all__ = ["KeptSteps", "head_effects", "position_effects", "path_effects", "split_pairs", "top_heads", "patch_fingerprint", "SPLIT_RULE"]

SPLIT_RULE = ("path candidates: the top heads by exact denoising summed over the pairs on odd lines of the pairs file "
              "(1, 3, 5, ...); their paths estimated on the pairs on even lines (2, 4, 6, ...); with a file of "
              "selection pairs, chosen on its pairs and estimated on every pair of the pairs file")


def patch_fingerprint(model, pairs_sha256: str, select_sha256: str | None, config) -> dict:
    """What a kept step must share with this run to be reused: all that changes a patch's numbers or which patches
    are made (not the bootstrap, which only reads them)."""
    kept = fingerprinted(type(config))  # the settings declared to enter it (headscan.patching_config)
    settings = {k: v for k, v in config.to_json().items() if k in kept}
    return {"headscan": __version__, "model": {"name": model.name, "id": model.id, "revision": model.revision},
            "pairs": pairs_sha256, "select_pairs": select_sha256, "settings": settings}


class KeptSteps:
    """The steps of one model's run: each computed once and kept in `path` (None: kept in memory only), or read
    back from a stopped run with the same fingerprint; a progress bar counts patches (a head or a path patched on
    one pair) as they are made."""

    def __init__(self, path: Path | None, expected: dict, spec: str, should_stop: Callable[[], bool],
                 progress: bool = False, restarted: bool = False):
        self.path, self.expected, self.spec, self.should_stop = path, expected, spec, should_stop
        self.again = "the same command again" + (" without --restart" if restarted else "")
        self.done = kept_trials(path, expected, spec, key=lambda record: record["step"])
        self.kept_before = len(self.done)
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=0, desc=f"patch {spec}", unit="patch", file=sys.stderr, dynamic_ncols=True)

    def expect(self, patches: int) -> None:
        """`patches` more patches to make (or read back)."""
        if self.bar is not None:
            self.bar.total += patches
            self.bar.refresh()

    def advance(self, patches: int) -> None:
        if self.bar is not None:
            self.bar.update(patches)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)

    def __call__(self, key: str, compute: Callable[[], dict], patches: int = 0) -> dict:
        """The record of step `key`: kept, or `compute()` (which advances the bar by `patches` as it goes)."""
        if key in self.done:
            self.advance(patches)
            return self.done[key]
        if self.should_stop():
            kept = len(self.done)
            where = (f"{kept} steps kept in {self.path.parent}; run {self.again} to resume"
                     if self.path is not None else "nothing was kept (no out)")
            raise SweepInterrupted(f"stopped while patching {self.spec}: {where}")
        record = {"step": key} | compute()
        if self.path is not None:
            keep_trial(self.path, record, self.expected)
        self.done[key] = record
        return record

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Once:
    """A batch's runs, made the first time a step needs them (a resumed batch whose steps are all kept makes none)."""

    def __init__(self, make: Callable):
        self.make, self.value = make, None

    def __call__(self):
        if self.value is None:
            self.value = self.make()
        return self.value


def _lists(tensors: dict[str, torch.Tensor]) -> dict[str, list]:
    return {name: tensor.double().cpu().tolist() for name, tensor in tensors.items()}


def head_effects(surgery, batches: list, steps: KeptSteps, *, n_heads: int, by_position: bool, attribution: bool,
                 methods: tuple[str, ...] = ("denoise", "noise"), prefix: str = "heads") -> dict[str, np.ndarray]:
    """Every head's exact patches over every batch (and AtP, AtP* with `attribution`), as `patch_heads` returns
    them but joined over batches: ``clean`` and ``corrupted`` (pair,), each method (layer, pair, head[, position]);
    float64."""
    n_layers = len(surgery.cut.modules)
    steps.expect(sum(len(b.last) for b in batches) * n_layers * n_heads)
    per_batch = []
    for b, batch in enumerate(batches):
        runs = _Once(lambda batch=batch: pair_runs(surgery, batch, grad=attribution))

        def first(runs=runs, batch=batch, b=b):
            steps.note(f"batch {b + 1}/{len(batches)}: clean and corrupted runs" + (", AtP, AtP*" if attribution else ""))
            made = runs()
            lds = {"clean": made.ld_clean, "corrupted": made.ld_corrupted}
            return _lists(lds | (attributions(surgery, made, batch, n_heads) if attribution else {}))

        record = dict(steps(f"{prefix}/{b}/runs", first))
        width = batch.clean.shape[1]
        shapes = {f"{method}{suffix}": (n_layers, len(batch.last), n_heads) + ((width,) if suffix else ())
                  for method in methods for suffix in ("", "_position")[: 1 + by_position]}
        record |= {name: np.zeros(shape) for name, shape in shapes.items()}  # (layer, pair, head[, position])
        for layer in range(n_layers):
            for head in range(n_heads):
                def one(runs=runs, batch=batch, layer=layer, head=head, b=b):
                    steps.note(f"batch {b + 1}/{len(batches)}, L{layer}H{head}")
                    made = patch_layer(surgery, runs(), batch, layer, heads=[head], n_heads=n_heads,
                                       by_position=by_position, methods=methods, step=steps.advance)
                    return _lists({name: effect[:, head] for name, effect in made.items()})
                kept = steps(f"{prefix}/{b}/L{layer}H{head}", one, patches=len(batch.last))
                for name in shapes:
                    record[name][layer, :, head] = np.asarray(kept[name], dtype=np.float64)
        per_batch.append(record)
    joined = {}
    for name in per_batch[0]:
        if name == "step":
            continue
        parts = [np.asarray(r[name], dtype=np.float64) for r in per_batch]
        joined[name] = np.concatenate(parts, axis=0 if name in ("clean", "corrupted") else 1)
    return joined


def position_effects(surgery, batches: list, steps: KeptSteps, heads: list[tuple[int, int]], *,
                     n_heads: int) -> dict[str, np.ndarray]:
    """The (layer, head) of `heads` patched at each position alone, both directions: ``denoise_position`` and
    ``noise_position`` (layer, pair, head, position), 0 for a head not patched; ``position_heads`` (layer, head)
    True where patched."""
    n_layers = len(surgery.cut.modules)
    steps.expect(sum(len(b.last) for b in batches) * len(heads))
    per_batch = []
    for b, batch in enumerate(batches):
        runs = _Once(lambda batch=batch: pair_runs(surgery, batch))
        seq = batch.clean.shape[1]
        out = {name: np.zeros((n_layers, len(batch.last), n_heads, seq)) for name in ("denoise_position",
                                                                                    "noise_position")}
        for layer, head in heads:
            def one(runs=runs, batch=batch, layer=layer, head=head, b=b):
                steps.note(f"by position: batch {b + 1}/{len(batches)}, L{layer}H{head}")
                with torch.no_grad():
                    made = runs()
                return _lists(patch_layer(surgery, made, batch, layer, heads=[head], n_heads=n_heads,
                                          by_position=True, whole=False, step=steps.advance))
            record = steps(f"positions/{b}/L{layer}H{head}", one, patches=len(batch.last))
            for name in out:
                out[name][layer, :, head] = np.asarray(record[name], dtype=np.float64)[:, head]
        per_batch.append(out)
    joined = {name: np.concatenate([part[name] for part in per_batch], axis=1) for name in per_batch[0]}
    patched = np.zeros((n_layers, n_heads), dtype=bool)
    patched[tuple(np.array(heads).T)] = True
    return joined | {"position_heads": patched}


def split_pairs(n_pairs: int, selecting: bool, has_select_file: bool) -> tuple[np.ndarray, np.ndarray]:
    """(indices that choose path candidates, indices the paths are estimated on), 0-indexed into the pairs file:
    the file's odd lines choose and its even lines estimate where the candidates come from its own pairs
    (`selecting` without a selection file); otherwise every pair estimates (and none of the file chooses).

    >>> [part.tolist() for part in split_pairs(5, True, False)]
    [[0, 2, 4], [1, 3]]
    >>> [part.tolist() for part in split_pairs(3, True, True)]
    [[], [0, 1, 2]]
    """
    every = np.arange(n_pairs)
    if selecting and not has_select_file:
        return every[0::2], every[1::2]
    return every[:0], every


def top_heads(restored: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The `k` (layer, head) with the largest `restored` (layer, pair, head) summed over pairs, in layer order
    (ties to the earlier head).

    >>> top_heads(np.array([[[1.0, 3.0]], [[2.0, 0.0]]]), 2)
    [(0, 1), (1, 0)]
    """
    total = restored.sum(1)  # (layer, head)
    order = np.argsort(-total.ravel(), kind="stable")[:k]
    return sorted((int(i) // total.shape[1], int(i) % total.shape[1]) for i in order)


def path_effects(surgery, projections, batches: list, paths: list, kv_group, steps: KeptSteps) -> dict:
    """Every path's effect per pair over `batches`: {(sender, receiver, kind): (pair,)}, with ``clean`` and
    ``corrupted`` LDs (pair,); float64."""
    senders = sorted({sender for sender, _, _ in paths})
    steps.expect(sum(len(b.last) for b in batches) * len(paths))
    parts = []
    for b, batch in enumerate(batches):
        runs = _Once(lambda batch=batch: pair_runs(surgery, batch))

        def first(runs=runs):
            with torch.no_grad():
                made = runs()
            return _lists({"clean": made.ld_clean, "corrupted": made.ld_corrupted})

        out = {name: np.asarray(v, dtype=np.float64) for name, v in steps(f"paths/{b}/runs", first).items()
               if name != "step"}
        for sender in senders:
            mine = [(receiver, kind) for s, receiver, kind in paths if s == sender]

            def one(runs=runs, batch=batch, sender=sender, mine=mine, b=b):
                steps.note(f"paths: batch {b + 1}/{len(batches)}, sender L{sender[0]}H{sender[1]}")
                with torch.no_grad():
                    made = runs()
                effects = patch_sender(surgery, projections, made, batch, sender, mine, kv_group, step=steps.advance)
                return {"effects": [[list(r), kind, effects[(tuple(sender), tuple(r), kind)].tolist()]
                                    for r, kind in mine]}

            record = steps(f"paths/{b}/L{sender[0]}H{sender[1]}", one, patches=len(batch.last) * len(mine))
            for receiver, kind, values in record["effects"]:
                out[(tuple(sender), tuple(receiver), kind)] = np.asarray(values, dtype=np.float64)
        parts.append(out)
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
