"""``headscan patch``: contrastive activation patching of every head, and path patching between heads, over a
file of prompt pairs (`headscan.corpus.pairs`), into ``patching.parquet`` and ``paths.parquet``.

Each pair is one bootstrap unit. For a head and method, a pair gives an effect s_u on the logit difference
(`headscan.models.patching`) and its own full difference c_u = LD(clean) - LD(corrupted); the table holds two
targets per (method, head): ``fraction``, sum_u s_u / sum_u c_u (the share of the clean-minus-corrupted logit
difference the head restores, denoising, or destroys, noising: the normalisation of Wang et al. 2022 over the
whole set of pairs), and ``logit_diff``, the mean of s_u (logits). Both have 95% intervals over pairs from the
same bootstrap as every other table (`headscan.intervals`). ``chance`` is 0: a head that carries none of the
difference. The run's provenance records how many pairs the model gets right (LD(clean) > 0), and AtP's recall of
the exact top heads beside Spearman's rank correlation.

This module does not draw or parse command lines.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import intervals
from ..corpus.pairs import Pair, generate_pairs, pairs_text, read_pairs, write_pairs
from ..errors import ConfigError, CorpusError, ModelLoadError
from ..models import check_spec, load_model
from ..models.ablation import Surgery, head_cut
from ..models.patching import PairBatch, Projections, patch_heads, patch_paths, projection_sites
from ..patching_config import PatchConfig
from ..tables import TABLES, ModelProvenance, SweepTables, head_columns, write
from ..tables.provenance import CorpusProvenance, RunProvenance
from .finish import _git_revision, _versions
from .resume import checked_call
from .state import PartialState

__all__ = ["patch", "encode_pairs", "unit_values", "recall_at", "write_generated_pairs", "PAIR_UNIT"]

PAIR_UNIT = "pair: each clean/corrupted prompt pair is one unit"
_METHODS = ("denoise", "noise", "atp_denoise", "atp_noise", "atp_star_denoise", "atp_star_noise")


def encode_pairs(model, pairs: list[Pair], batch_size: int) -> list[PairBatch]:
    """Token ids of every pair, in batches; a pair whose prompts differ in length, or whose answers share their
    first token, is refused in one line naming it."""
    clean, corrupted = model.token_ids([p.clean for p in pairs]), model.token_ids([p.corrupted for p in pairs])
    tokenizer = model.tokenizer
    first = lambda text: (tokenizer(text, add_special_tokens=False)["input_ids"] or [None])[0]  # noqa: E731
    rows = []
    for i, (pair, a, b) in enumerate(zip(pairs, clean, corrupted), start=1):
        if len(a) != len(b):
            raise CorpusError(f"pair {i} ({pair.clean!r}): its prompts have {len(a)} and {len(b)} tokens for "
                              f"{model.name}; patching head by head needs them token for token (use words that "
                              f"are one token each)")
        answer, wrong = first(pair.answer), first(pair.wrong)
        if answer is None or answer == wrong:
            raise CorpusError(f"pair {i} ({pair.clean!r}): {pair.answer!r} and {pair.wrong!r} start with the same "
                              f"token for {model.name}, so their logit difference is 0")
        rows.append((a, b, answer, wrong))
    batches = []
    for start in range(0, len(rows), batch_size):
        part = rows[start: start + batch_size]
        width = max(len(a) for a, *_ in part)
        pad = lambda ids, width=width: ids + [0] * (width - len(ids))  # noqa: E731  right padding, masked out
        batches.append(PairBatch(
            clean=torch.tensor([pad(a) for a, *_ in part]), corrupted=torch.tensor([pad(b) for _, b, *_ in part]),
            mask=torch.tensor([[1] * len(a) + [0] * (width - len(a)) for a, *_ in part]),
            last=torch.tensor([len(a) - 1 for a, *_ in part]), answer=torch.tensor([r[2] for r in part]),
            wrong=torch.tensor([r[3] for r in part])))
    return batches


def unit_values(sums: np.ndarray, counts: np.ndarray, config: PatchConfig) -> dict[str, np.ndarray]:
    """The value columns of sum_u s_u / sum_u c_u over units (axis 0 of `sums` and `counts`), each unit (a pair)
    weighted by bootstrap draws keyed on its index, as every table's intervals are."""
    weights = intervals.bootstrap_weights(list(range(len(sums))), config.bootstrap, config.seed)  # (replicate, unit)
    shape = sums.shape[1:]
    flat_s, flat_c = sums.reshape(len(sums), -1), counts.reshape(len(counts), -1)  # (unit, row)
    grid = (flat_s.shape[1], 1, 1)  # the state's (layer, head, column) axes; the rows all in the first
    state = PartialState({}, None, flat_s.sum(0).reshape(grid), flat_c.sum(0).reshape(grid),
                         (weights @ flat_s).reshape(-1, *grid), (weights @ flat_c).reshape(-1, *grid),
                         intervals.unit_moments(flat_s, flat_c).reshape(-1, *grid), np.zeros(grid),
                         intervals.replicate_moments(weights, flat_s, flat_c).reshape(3, -1, *grid))
    values = state.values(config.interval)
    # the max-t interval over every row of a run of pairs is not a claim this table makes
    return {k: v.reshape(shape) for k, v in values.items() if k not in ("joint_low", "joint_high")}


def recall_at(estimate: np.ndarray, exact: np.ndarray, k: int) -> int:
    """How many of the `k` heads with the largest `exact` value are among the `k` largest of `estimate`.

    >>> recall_at(np.array([3.0, 2.0, 1.0, 0.0]), np.array([0.0, 2.0, 3.0, 1.0]), 2)
    1
    """
    top = lambda v: set(np.argsort(-np.nan_to_num(v, nan=-np.inf), kind="stable")[:k].tolist())  # noqa: E731
    return len(top(estimate) & top(exact))


def patch(models: str | list[str], pairs: str | Path | list[Pair], out: str | Path | None = None,
          config: PatchConfig | None = None, *, overwrite: bool = False, progress: bool = False,
          command: str | None = None, **settings) -> SweepTables:
    """Patch every head of each causal model in `models` between the clean and corrupted prompts of `pairs` (a
    JSON-lines file or a list of `Pair`), and the paths `config` names; publish ``patching.parquet``,
    ``paths.parquet`` and ``run.json`` into `out` if given.

    Example: ``headscan.patch("gpt2", "pairs.jsonl", "out/patch", path_top=3)``
    """
    models, config = checked_call(models, config, PatchConfig, settings, out, overwrite)
    source = str(pairs) if not isinstance(pairs, list) else "pairs given in Python"
    pairs = read_pairs(pairs) if not isinstance(pairs, list) else pairs
    started = datetime.now(timezone.utc)
    frames: dict[str, list[pd.DataFrame]] = {}
    described = []
    for spec in models:
        tables, about = _one_model(spec, pairs, config, progress)
        for name, frame in tables.items():
            frames.setdefault(name, []).append(frame)
        described.append(about)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    digest = hashlib.sha256(pairs_text(pairs).encode()).hexdigest()
    provenance = RunProvenance(
        git_revision=_git_revision(), command=command or f"headscan.patch({models!r}, {source!r})",
        started=started.isoformat(timespec="seconds"), finished=now,
        corpus=CorpusProvenance(source=source, kind="prompt pairs", sha256=digest, n_segments=len(pairs)),
        config=config.to_json(), versions=dict(_versions()), models=tuple(described),
        extra={"bootstrap_unit": PAIR_UNIT, "patching": _rules()})
    provenance = dataclasses.replace(provenance, headscan_version=provenance.versions.get("headscan"))
    result = SweepTables({name: pd.concat(parts, ignore_index=True) for name, parts in frames.items()}, provenance)
    if out is not None:
        result.path = write(result, out, overwrite=overwrite)
    return result




def _rules() -> dict:
    return {
        "logit_difference": "logit(answer) - logit(wrong) at the prompt's last token, first token of each answer",
        "denoise": "corrupted run, the head's output at every position from the clean run: LD(patched) - LD(corrupted)",
        "noise": "clean run, the head's output from the corrupted run: LD(clean) - LD(patched)",
        "atp": "attribution patching: sum over positions of (z_other - z) . dLD/dz, one backward pass per run",
        "atp_star": "AtP* (Kramar et al. 2024) without the QK fix: GradDrop, the mean over dropped layers of |AtP with "
                    "that layer's gradient dropped|, a size per pair (headscan.models.atp_star)",
        "fraction": "sum over pairs of the effect / sum over pairs of LD(clean) - LD(corrupted)",
        "paths": "sender's clean output into the corrupted run, heads of later layers frozen at their corrupted "
                 "outputs (MLPs and norms recomputed); the receiver's q, k or v recorded, then put alone into the "
                 "corrupted run; a grouped-query receiver's k and v are its key/value head's",
    }


def _one_model(spec: str, pairs: list[Pair], config: PatchConfig, progress: bool):
    model = load_model(spec, device=config.device, dtype=config.dtype)
    try:
        if not model.causal:
            raise ModelLoadError(f"model {spec!r} is bidirectional: contrastive patching reads the next-token logits "
                                 f"at a prompt's last token; use a causal language model")
        batches = encode_pairs(model, pairs, config.batch_size)
        if config.by_position and len({int(b.mask.sum(1).max()) for b in batches} |
                                      {int(b.mask.sum(1).min()) for b in batches}) != 1:
            raise ConfigError("by_position: the pairs have different numbers of tokens, so a position means "
                              "different words in different pairs; patch by position pairs of one template",
                              setting="by_position")
        cut = head_cut(model)
        with Surgery(model, cut, "next_token_loss") as surgery:
            surgery.check()
            heads = _patch_all(surgery, batches, model.n_heads, config, progress)
            paths = _path_list(heads, config, model.n_layers)
            path_results = _paths(surgery, batches, paths, model) if paths else None
        tables = {"patching": _heads_table(model, heads, config)}
        if path_results is not None:
            tables["paths"] = _paths_table(model, path_results, config)
        clean, corrupted = heads["clean"], heads["corrupted"]
        extra = {"pairs": len(pairs), "clean_right": int((clean > 0).sum()), "corrupted_right": int((corrupted > 0).sum()),
                 "mean_logit_difference": {"clean": float(clean.mean()), "corrupted": float(corrupted.mean())},
                 "atp_recall": _recall(heads) if config.attribution else None, "paths": len(paths),
                 "ablation_passes": surgery.reuse_note}
        about = ModelProvenance.from_json(model.provenance() | {"patching": extra})
        return tables, about
    finally:
        del model
        gc.collect()


def _patch_all(surgery: Surgery, batches: list[PairBatch], n_heads: int, config: PatchConfig,
               progress: bool = False) -> dict:
    """Every batch's `patch_heads`, joined along the pair axis: methods (layer, pair, head[, position])."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(b.last) for b in batches), desc=f"patch {surgery.model.name}", unit="pair",
                   file=sys.stderr, dynamic_ncols=True)
    parts = []
    for batch in batches:
        parts.append(patch_heads(surgery, batch, n_heads=n_heads, by_position=config.by_position,
                                 attribution=config.attribution))
        if bar is not None:
            bar.update(len(batch.last))
    if bar is not None:
        bar.close()
    joined = {name: torch.cat([p[name] for p in parts], dim=0 if name in ("clean", "corrupted") else 1).numpy()
              for name in parts[0]}
    return joined


def _recall(heads: dict) -> dict:
    """AtP against the exact patches of the same direction: Spearman and recall of the exact top 10 and 20."""
    out = {}
    ranks = lambda v: pd.Series(v.ravel()).rank().to_numpy()  # noqa: E731
    for method in ("denoise", "noise"):
        exact = heads[method].sum(1)  # (layer, head) summed over pairs
        # AtP is signed, against the signed effect; AtP* is a size, against the effect's size
        for name, estimate, against in (("atp", heads[f"atp_{method}"].sum(1), exact),
                                        ("atp_star", heads.get(f"atp_star_{method}"), np.abs(exact))):
            if estimate is None:
                continue
            estimate = estimate.sum(1) if estimate.ndim == 3 else estimate
            key = method if name == "atp" else f"{name}_{method}"
            out[key] = {"spearman": float(np.corrcoef(ranks(against), ranks(estimate))[0, 1]),
                        **{f"top_{k}": f"{recall_at(estimate.ravel(), against.ravel(), k)} of {min(k, exact.size)}"
                           for k in (10, 20)}}
    return out


def _path_list(heads: dict, config: PatchConfig, n_layers: int) -> list:
    """The paths to patch: those `config` names, then (``path_top``) every path from one of the top-N heads by
    exact denoising to a later one of them, through q, k and v; each once, in order."""
    paths = config.named_paths()
    for (sender, receiver, _) in paths:
        if max(sender[0], receiver[0]) >= n_layers:
            raise ConfigError(f"paths: L{sender[0]}H{sender[1]}>L{receiver[0]}H{receiver[1]} names a layer the "
                              f"model has not (it has {n_layers})", setting="paths")
    if config.path_top:
        restored = heads["denoise"].sum(1)  # (layer, head) summed over pairs
        order = np.argsort(-restored.ravel(), kind="stable")[: config.path_top]
        top = sorted((int(i) // restored.shape[1], int(i) % restored.shape[1]) for i in order)
        paths += [(s, r, kind) for s in top for r in top if r[0] > s[0] for kind in ("q", "k", "v")]
    return list(dict.fromkeys(paths))


def _paths(surgery: Surgery, batches: list[PairBatch], paths: list, model) -> dict:
    """Every path's effect per pair, (pair,) arrays, with the clean and corrupted LDs."""
    projections = Projections(projection_sites(surgery), surgery.cut.d_head)
    with projections:
        parts = [patch_paths(surgery, projections, batch, paths, model.kv_group) for batch in batches]
    return {key: torch.cat([p[key] for p in parts]).numpy() for key in parts[0]}


def _differences(clean: np.ndarray, corrupted: np.ndarray, shape: tuple) -> dict[str, np.ndarray]:
    """Each target's count per pair, broadcast to `shape` (pair, ...): LD(clean) - LD(corrupted) for fraction,
    1 for logit_diff."""
    per_pair = (clean - corrupted).reshape(-1, *([1] * (len(shape) - 1)))
    return {"fraction": np.broadcast_to(per_pair, shape), "logit_diff": np.ones(shape)}


def _as_rows(values: dict, run: dict, shape: tuple) -> dict:
    """`unit_values`' columns as the tables hold them: ``count`` the pairs, ``full_difference`` the sum over pairs
    of LD(clean) - LD(corrupted), the fraction's denominator (a count must be a whole number)."""
    full = float((run["clean"] - run["corrupted"]).sum())
    return values | {"count": np.full(shape[1:], shape[0]), "full_difference": np.full(shape[1:], full)}


def _heads_table(model, heads: dict, config: PatchConfig) -> pd.DataFrame:
    rows = []
    for name in [m for m in _METHODS if m in heads] + [f"{m}_position" for m in ("denoise", "noise")
                                                        if f"{m}_position" in heads]:
        effect = np.moveaxis(heads[name], 1, 0)  # (pair, layer, head[, position])
        method = name.removesuffix("_position")
        for target, counts in _differences(heads["clean"], heads["corrupted"], effect.shape).items():
            values = _as_rows(unit_values(effect, np.ascontiguousarray(counts), config), heads, effect.shape)
            grid = np.meshgrid(*(np.arange(n) for n in effect.shape[1:]), indexing="ij")
            layer, head = grid[0].ravel(), grid[1].ravel()
            position = grid[2].ravel() if len(grid) > 2 else pd.array([pd.NA] * layer.size, dtype="Int64")
            rows.append(pd.DataFrame(head_columns(model.name, model.family, layer, head, model.kv_group(head))
                                     | {"method": method, "target": target, "position": position}
                                     | {k: v.ravel() for k, v in values.items()}))
    return TABLES["patching"].conform(pd.concat(rows, ignore_index=True))


def _paths_table(model, results: dict, config: PatchConfig) -> pd.DataFrame:
    keys = [k for k in results if isinstance(k, tuple)]
    effect = np.stack([results[k] for k in keys], axis=1)  # (pair, path)
    rows = []
    for target, counts in _differences(results["clean"], results["corrupted"], effect.shape).items():
        values = _as_rows(unit_values(effect, np.ascontiguousarray(counts), config), results, effect.shape)
        receivers = np.array([r for _, r, _ in keys])
        senders = np.array([s for s, _, _ in keys])
        rows.append(pd.DataFrame(
            head_columns(model.name, model.family, receivers[:, 0], receivers[:, 1], model.kv_group(receivers[:, 1]))
            | {"sender_layer": senders[:, 0], "sender_head": senders[:, 1],
               "sender_label": [f"L{a}H{b}" for a, b in senders], "path": [k for _, _, k in keys], "target": target}
            | {k: v for k, v in values.items()}))
    return TABLES["paths"].conform(pd.concat(rows, ignore_index=True))


def write_generated_pairs(kind: str, n: int, out: str | Path, *, seed: int = 0, model: str | None = None,
                          overwrite: bool = False) -> Path:
    """`generate_pairs` into the JSON-lines file `out`; with `model`, only words that are one token for it."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; pass --overwrite to replace it", setting="out")
    single = None
    if model is not None:
        check_spec(model)
        tokenizer = load_model(model, device="cpu").tokenizer
        single = lambda word: len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1  # noqa: E731
    return write_pairs(generate_pairs(kind, n, seed, single_token=single), out)
