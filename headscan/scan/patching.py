"""``headscan patch``: contrastive activation patching of every head, and path patching between heads, over a
file of prompt pairs (`headscan.corpus.pairs`), into ``patching.parquet`` and ``paths.parquet``.

Each pair is one bootstrap unit. For a head and method, a pair gives an effect s_u on the logit difference
(`headscan.models.patching`) and its own full difference c_u = LD(clean) - LD(corrupted); the table holds two
targets per (method, head): ``fraction``, sum_u s_u / sum_u c_u (the share of the clean-minus-corrupted logit
difference the head restores, denoising: its sufficiency, or destroys, noising: its necessity; the
normalisation of Wang et al. 2022 over the whole set of pairs; heads' fractions do not add up to 1), and
``logit_diff``, the mean of s_u (logits). Both have 95% intervals over pairs from the same bootstrap as every
other table (`headscan.intervals`). ``chance`` is 0, no effect, which a head can score and still take part (a
backup under noising, a head that needs others under denoising). The run's provenance records how many pairs
the model gets right (LD(clean) > 0), and AtP's recall of the exact top heads beside Spearman's rank
correlation.

Path candidates are chosen on other pairs than those their paths are estimated on, and each path carries a
p-value and a Benjamini-Hochberg q-value over the paths tested (`headscan.scan.patch_steps`, which also keeps
the run's steps so a stopped run resumes).

This module does not draw or parse command lines.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import intervals
from ..corpus.pairs import Pair, generate_pairs, pairs_text, read_pairs, write_pairs
from ..errors import ConfigError, CorpusError, ModelLoadError
from ..models import check_spec, load_model
from ..models.ablation import Surgery, head_cut
from ..models.patching import PairBatch, Projections, projection_sites
from ..patching_config import PatchConfig
from ..setting import with_settings
from ..tables import TABLES, CorpusProvenance, ModelProvenance, SweepTables, head_columns
from .jobs import Job, JobInput, ModelDone, register_job
from .patch_steps import (
    SPLIT_RULE,
    KeptSteps,
    head_effects,
    patch_fingerprint,
    path_effects,
    position_effects,
    split_pairs,
    top_heads,
)
from .resume import spec_stem
from .runner import run_job
from .state import PartialState

__all__ = ["patch", "PATCH", "PatchInput", "encode_pairs", "unit_values", "recall_at", "write_generated_pairs", "PAIR_UNIT"]

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


def unit_values(sums: np.ndarray, counts: np.ndarray, config: PatchConfig, *,
                p_values: bool = False) -> dict[str, np.ndarray]:
    """The value columns of sum_u s_u / sum_u c_u over units (axis 0 of `sums` and `counts`), each unit (a pair)
    weighted by bootstrap draws keyed on its index, as every table's intervals are; with `p_values`, also
    ``p_value``, one-sided that the value is above 0 (Student's t of the value over its standard error on the
    bootstrap's degrees of freedom, `headscan.intervals.t_p_value`; NaN without a bootstrap)."""
    weights = intervals.bootstrap_weights(list(range(len(sums))), config.bootstrap, config.seed)  # (replicate, unit)
    shape = sums.shape[1:]
    flat_s, flat_c = sums.reshape(len(sums), -1), counts.reshape(len(counts), -1)  # (unit, row)
    grid = (flat_s.shape[1], 1, 1)  # the state's (layer, head, column) axes; the rows all in the first
    state = PartialState({}, None, flat_s.sum(0).reshape(grid), flat_c.sum(0).reshape(grid),
                         (weights @ flat_s).reshape(-1, *grid), (weights @ flat_c).reshape(-1, *grid),
                         intervals.unit_moments(flat_s, flat_c).reshape(-1, *grid), np.zeros(grid),
                         intervals.replicate_moments(weights, flat_s, flat_c).reshape(3, -1, *grid))
    values = state.values(config.interval)
    if p_values:
        se = intervals.standard_error(values["value"], state.moments)
        values["p_value"] = intervals.t_p_value(values["value"], se, values["variance_df"], 0.0)
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
          config: PatchConfig | None = None, *, select_pairs: str | Path | list[Pair] | None = None,
          overwrite: bool = False, restart: bool = False, progress: bool = False, command: str | None = None,
          **settings) -> SweepTables:
    """Patch every head of each causal model in `models` between the clean and corrupted prompts of `pairs` (a
    JSON-lines file or a list of `Pair`), and the paths `config` names; publish ``patching.parquet``,
    ``paths.parquet`` and ``run.json`` into `out` if given.

    With ``path_top`` the path candidates are chosen on pairs the paths are not estimated on: the odd lines of
    `pairs` choose and the even lines estimate, or `select_pairs` (another pairs file) chooses and every pair
    estimates. With `out`, each finished step is kept in ``OUT.partial/`` and the same call resumes a stopped
    run (`restart` discards it). The job `PATCH`, run by `headscan.scan.runner.run_job`.

    Example: ``headscan.patch("gpt2", "pairs.jsonl", "out/patch", path_top=3)``
    """
    config = with_settings(config or PatchConfig(), settings) if settings else config or PatchConfig()
    models = [models] if isinstance(models, str) else list(models)
    source = str(pairs) if not isinstance(pairs, list) else "pairs given in Python"
    return run_job(PATCH, models, PatchInput(pairs, select_pairs), out, config, overwrite=overwrite,
                   restart=restart, progress=progress,
                   command=command or _python_call(models, source, select_pairs, config))


@dataclasses.dataclass(frozen=True)
class PatchInput:
    """What ``headscan patch`` reads: the pairs, and the pairs that choose path candidates (None: half of them)."""

    pairs: str | Path | list[Pair]
    select_pairs: str | Path | list[Pair] | None = None


def _read_input(given: PatchInput, config: PatchConfig) -> JobInput:
    """The pairs (and selection pairs), read and checked before the first model."""
    if not isinstance(given, PatchInput):
        given = PatchInput(given)
    source = str(given.pairs) if not isinstance(given.pairs, list) else "pairs given in Python"
    pairs = read_pairs(given.pairs) if not isinstance(given.pairs, list) else given.pairs
    chooser = None
    if given.select_pairs is not None:
        chooser = read_pairs(given.select_pairs) if not isinstance(given.select_pairs, list) else given.select_pairs
        if not config.path_top:
            raise ConfigError("select_pairs: the selection pairs choose path candidates, which only --path-top "
                              "asks for; add --path-top N or drop --select-pairs", setting="select_pairs")
    extra = {"patching": _rules()}
    if chooser is not None:
        extra["select_pairs"] = {"source": str(given.select_pairs) if not isinstance(given.select_pairs, list)
                                 else "pairs given in Python", "sha256": _digest(chooser), "n": len(chooser)}
    return JobInput((pairs, chooser), CorpusProvenance(source=source, kind="prompt pairs", sha256=_digest(pairs),
                                                       n_segments=len(pairs)),
                    extra, {"select_pairs": _digest(chooser) if chooser is not None else None})


def _load_causal(spec: str, config: PatchConfig):
    model = load_model(spec, device=config.device, dtype=config.dtype)
    if not model.causal:
        raise ModelLoadError(f"model {spec!r} is bidirectional: contrastive patching reads the next-token logits "
                             f"at a prompt's last token; use a causal language model")
    return model


def _digest(pairs: list[Pair]) -> str:
    return hashlib.sha256(pairs_text(pairs).encode()).hexdigest()


def _python_call(models: list[str], source: str, select_pairs, config: PatchConfig) -> str:
    changed = [f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
               if getattr(config, f.name) != f.default]
    chooser = [f"select_pairs={str(select_pairs)!r}"] if select_pairs is not None else []
    return f"headscan.patch({', '.join([repr(models), repr(source), *changed, *chooser])})"


def _rules() -> dict:
    return {
        "logit_difference": "logit(answer) - logit(wrong) at the prompt's last token, first token of each answer",
        "denoise": "corrupted run, the head's output at every position from the clean run: LD(patched) - "
                   "LD(corrupted); what the head suffices to restore",
        "noise": "clean run, the head's output from the corrupted run: LD(clean) - LD(patched); what is lost "
                 "without the head's clean output (its necessity)",
        "atp": "attribution patching: sum over positions of (z_other - z) . dLD/dz, one backward pass per run",
        "atp_star": "AtP* (Kramar et al. 2024) without the QK fix: GradDrop, the mean over dropped layers of |AtP with "
                    "that layer's gradient dropped|, a size per pair (headscan.models.atp_star)",
        "fraction": "sum over pairs of the effect / sum over pairs of LD(clean) - LD(corrupted); heads' fractions "
                    "do not add up to 1 (heads overlap, back each other up, and interact)",
        "units": "pairs whose own LD(clean) - LD(corrupted) is not 0 (fraction), every pair (logit_diff)",
        "paths": "sender's clean output into the corrupted run, heads of later layers frozen at their corrupted "
                 "outputs (MLPs and norms recomputed); the receiver's q, k or v recorded, then put alone into the "
                 "corrupted run; a grouped-query receiver's k and v are its key/value head's (kv_group), which the "
                 "other query heads of that group read too",
        "path_selection": SPLIT_RULE,
        "path_p_value": "one-sided, that the path restores more than 0: Student's t of the value over its "
                        "standard error on the bootstrap's degrees of freedom (headscan.intervals.t_p_value)",
        "path_q_value": "Benjamini-Hochberg over the paths tested, per model and target (headscan.intervals.q_values)",
    }


def _patch_model(model, given: JobInput, config: PatchConfig, kept) -> ModelDone:
    """One model's patching (and paths) table; each step kept in ``OUT.partial/`` as it finishes (`KeptSteps`)."""
    (pairs, chooser), spec, partial = given.data, kept.spec, kept.partial
    batches = encode_pairs(model, pairs, config.batch_size)
    lengths = {int(b.mask.sum(1).max()) for b in batches} | {int(b.mask.sum(1).min()) for b in batches}
    for setting in ("by_position", "position_top"):
        if getattr(config, setting) and len(lengths) != 1:
            raise ConfigError(f"{setting}: the pairs have {min(lengths)} to {max(lengths)} tokens, so a position "
                              f"means different words in different pairs; patch by position pairs of one "
                              f"template", setting=setting)
    chosen_on, estimated_on = split_pairs(len(pairs), bool(config.path_top), chooser is not None)
    expected = patch_fingerprint(model, _digest(pairs), _digest(chooser) if chooser is not None else None, config)
    path = partial / f"patch-{spec_stem(spec)}.jsonl" if partial is not None else None
    steps = KeptSteps(path, expected, spec, kept.should_stop, kept.progress,
                      restarted=kept.again.endswith("without --restart"))
    cut = head_cut(model)
    try:
        with Surgery(model, cut, "next_token_loss") as surgery:
            surgery.check()
            heads = head_effects(surgery, batches, steps, n_heads=model.n_heads, by_position=config.by_position,
                                 attribution=config.attribution)
            if config.position_top:
                heads |= position_effects(surgery, batches, steps, top_heads(heads["denoise"], config.position_top),
                                          n_heads=model.n_heads)
            restored = heads["denoise"][:, chosen_on]
            if chooser is not None:
                restored = head_effects(surgery, encode_pairs(model, chooser, config.batch_size), steps,
                                        n_heads=model.n_heads, by_position=False, attribution=False,
                                        methods=("denoise",), prefix="select")["denoise"]
            candidates = top_heads(restored, config.path_top) if config.path_top else []
            paths = _path_list(candidates, config, model.n_layers)
            path_results = None
            if paths:
                estimating = encode_pairs(model, [pairs[i] for i in estimated_on], config.batch_size)
                with Projections(projection_sites(surgery), surgery.cut.d_head) as projections:
                    path_results = path_effects(surgery, projections, estimating, paths, model.kv_group, steps)
    finally:
        steps.close()
    tables = {"patching": _heads_table(model, heads, config)}
    if path_results is not None:
        tables["paths"] = _paths_table(model, path_results, config)
    clean, corrupted = heads["clean"], heads["corrupted"]
    selection = {"rule": SPLIT_RULE, "candidates": [f"L{a}H{b}" for a, b in candidates],
                 "chosen_on": "selection pairs file" if chooser is not None else _lines(chosen_on),
                 "estimated_on": _lines(estimated_on)} if config.path_top else None
    extra = {"pairs": len(pairs), "clean_right": int((clean > 0).sum()), "corrupted_right": int((corrupted > 0).sum()),
             "difference_not_positive": _lines(np.flatnonzero(clean - corrupted <= 0)),
             "mean_logit_difference": {"clean": float(clean.mean()), "corrupted": float(corrupted.mean())},
             "atp_recall": _recall(heads) if config.attribution else None, "paths": len(paths),
             "path_selection": selection, "ablation_passes": surgery.reuse_note,
             "steps_resumed": steps.kept_before}
    return ModelDone(tables, ModelProvenance.from_json(model.provenance() | {"patching": extra}))


PATCH = register_job(Job(
    "patch", "Patch every head (and paths between heads) between prompt pairs.", PatchConfig, ("patching", "paths"),
    read=_read_input, work=_patch_model, load=_load_causal, unit=PAIR_UNIT,
    input_help='JSONL of {"clean", "corrupted", "answer", "wrong"}, one pair a line (headscan pairs writes some).',
    example="headscan patch -m smollm2 --pairs pairs.jsonl --path-top 4 --out out/patch"))


def _lines(indices) -> str:
    """0-indexed pairs as the 1-indexed lines of the pairs file they are on, a run of even steps shortened.

    >>> _lines([0, 2, 4]), _lines(range(1, 64, 2)), _lines([])
    ('1, 3, 5 (3 pairs)', '2, 4, 6, ..., 64 (32 pairs)', 'none (0 pairs)')
    """
    lines = [int(i) + 1 for i in indices]
    steps = {b - a for a, b in zip(lines, lines[1:])}
    shown = lines if len(lines) <= 4 or len(steps) != 1 else [*lines[:3], "...", lines[-1]]
    return (", ".join(map(str, shown)) if lines else "none") + f" ({len(lines)} pairs)"


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


def _path_list(candidates: list[tuple[int, int]], config: PatchConfig, n_layers: int) -> list:
    """The paths to patch: those `config` names, then every path from one of the `candidates` (the top heads,
    chosen by `split_pairs`' rule) to a later one of them, through q, k and v; each once, in order."""
    paths = config.named_paths()
    for (sender, receiver, _) in paths:
        if max(sender[0], receiver[0]) >= n_layers:
            raise ConfigError(f"paths: L{sender[0]}H{sender[1]}>L{receiver[0]}H{receiver[1]} names a layer the "
                              f"model has not (it has {n_layers})", setting="paths")
    paths += [(s, r, kind) for s in candidates for r in candidates if r[0] > s[0] for kind in ("q", "k", "v")]
    return list(dict.fromkeys(paths))


def _differences(clean: np.ndarray, corrupted: np.ndarray, shape: tuple) -> dict[str, np.ndarray]:
    """Each target's count per pair, broadcast to `shape` (pair, ...): LD(clean) - LD(corrupted) for fraction,
    1 for logit_diff."""
    per_pair = (clean - corrupted).reshape(-1, *([1] * (len(shape) - 1)))
    return {"fraction": np.broadcast_to(per_pair, shape), "logit_diff": np.ones(shape)}


def _as_rows(values: dict, counts: np.ndarray, run: dict, shape: tuple) -> dict:
    """`unit_values`' columns as the tables hold them: ``count`` the pairs, ``full_difference`` the sum over pairs
    of LD(clean) - LD(corrupted), the fraction's denominator (a count must be a whole number), and ``units`` the
    pairs whose own denominator is not 0: a pair whose corrupted prompt has the larger difference has a negative
    one, and counts in the ratio like any other (the intervals' `support` counts only positive ones)."""
    full = float((run["clean"] - run["corrupted"]).sum())
    return values | {"count": np.full(shape[1:], shape[0]), "full_difference": np.full(shape[1:], full),
                     "units": (counts != 0).sum(0)}


def _heads_table(model, heads: dict, config: PatchConfig) -> pd.DataFrame:
    rows = []
    for name in [m for m in _METHODS if m in heads] + [f"{m}_position" for m in ("denoise", "noise")
                                                        if f"{m}_position" in heads]:
        effect = np.moveaxis(heads[name], 1, 0)  # (pair, layer, head[, position])
        method = name.removesuffix("_position")
        patched = heads.get("position_heads") if name.endswith("_position") else None
        if patched is not None:  # position_top: only the top heads were patched by position
            effect = effect[:, patched]  # (pair, patched head, position), in (layer, head) order
        for target, counts in _differences(heads["clean"], heads["corrupted"], effect.shape).items():
            values = _as_rows(unit_values(effect, np.ascontiguousarray(counts), config), counts, heads, effect.shape)
            grid = np.meshgrid(*(np.arange(n) for n in effect.shape[1:]), indexing="ij")
            if patched is not None:
                layer, head = (axis[grid[0]].ravel() for axis in np.nonzero(patched))
                position = grid[1].ravel()
            else:
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
        values = _as_rows(unit_values(effect, np.ascontiguousarray(counts), config, p_values=True), counts, results,
                          effect.shape)
        values["q_value"] = intervals.q_values(values["p_value"])  # over the paths tested, this model and target
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
    """`n` seeded prompt pairs of `kind` (``"ioi"``, ``"induction"`` or ``"capitals"``, `generate_pairs`) into the
    JSON-lines file `out`, which ``headscan.patch`` reads; with `model`, only words that are one token for it. This
    is ``headscan.pairs`` (the ``headscan pairs`` command); returns the file's path.

    >>> import tempfile, pathlib
    >>> path = write_generated_pairs("ioi", 4, pathlib.Path(tempfile.mkdtemp()) / "pairs.jsonl")
    >>> len(path.read_text().splitlines())
    4

    Example: ``headscan.pairs("ioi", 64, "pairs.jsonl", model="smollm2")``
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; pass --overwrite to replace it", setting="out")
    single = None
    if model is not None:
        check_spec(model)
        tokenizer = load_model(model, device="cpu").tokenizer
        single = lambda word: len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1  # noqa: E731
    return write_pairs(generate_pairs(kind, n, seed, single_token=single), out)
