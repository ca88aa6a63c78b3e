"""The masking test of retrieval heads (Wu et al. 2024, ``needle_in_haystack_with_mask.py``): does needle
accuracy fall when the top retrieval heads are removed, more than when as many other heads are?

``headscan retrieval --mask-top K --mask-random K --mask-draws N`` decodes trials of the run again with heads
masked: the top K retrieval heads (condition ``top``), and N seeded draws of K random heads (``random``, 20 by
default), each drawn from the layer of one top head and never a top head, so that the random heads sit where the
top heads do. A masked head's output z (the attention-weighted values, before the output projection) is 0 at every
position, in the prefill and in every decoding step (`headscan.models.ablation.zeroed_heads`). Accuracy is the
answer's ROUGE-1 recall, the number the answer gate reads; the unmasked trials of the run are condition ``none``,
so every condition decodes the same prompts, and each drop is paired: the mean over trials of the masked trial's
recall minus the same trial's unmasked one. Intervals resample needles, not trials (`NEEDLE_UNIT`): the trials of
one needle at several depths and lengths share its words, so they are not independent. The top set's drop is
ranked among the N random draws' drops: its permutation p-value is (1 + #draws whose drop is at least as large) /
(N + 1) (`headscan.intervals.rank_p_value`), so N draws allow p down to 1 / (N + 1): 19 for 0.05, 99 for 0.01.
The random draws are also pooled per trial (the mean over draws; draw <NA>).

The heads are never chosen on the trials that test them. By default the run's needles are split by index
(`SPLIT_RULE`): the even ones rank the heads (by the gated ``retrieval`` score of their trials, or the ungated one
where none passed the gate; ties to the lower layer, then head) and only the odd ones' trials are masked. With
``--mask-from FOLDER`` the heads are ranked by an earlier run's ``retrieval.parquet`` and every trial is masked; that
run must have used other needles (it is refused when its needles file is this run's). What differs from the
reference code, on purpose: Wu et al. mask only while decoding (their prefill runs unmasked) and draw random heads
uniformly over the model; here the mask holds in the prefill too, and the random heads match the top heads' layers.

Each masked trial is kept in ``OUT.partial/masking-MODEL.jsonl`` under a fingerprint that holds the trials' own,
the mask settings and the heads chosen, so a stopped run resumes. This module does not draw or parse command lines.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..corpus.needles import build_prompt
from ..corpus.rouge import rouge1_recall
from ..errors import ConfigError, ModelLoadError, SweepInterrupted
from ..intervals.pvalues import rank_p_value
from ..models.ablation import head_cut, zeroed_heads
from ..models.decode import greedy_decode, language_model
from ..retrieval_config import RetrievalConfig
from ..tables import TABLES, head_label, load
from .kept_trials import keep_trial, kept_trials, over_trials

__all__ = ["MASK_RULE", "RANDOM_RULE", "SPLIT_RULE", "NEEDLE_UNIT", "OVERLAP_NOTE", "ranked_heads", "split_scores",
           "random_heads", "masking_test", "masking_tables"]

MASK_RULE = ("a masked head's output z (before the output projection) is set to 0 at every position, in the prefill "
             "and in every decoding step (a forward pre-hook on the output projection)")
RANDOM_RULE = ("draw d: for each of the top K heads, one head of the same layer, never one of the top heads, without "
               "repeats, drawn by numpy default_rng([seed, d])")
SPLIT_RULE = ("the run's needles split by index: the even ones (0, 2, ...) rank the heads by the retrieval scores of "
              "their trials, and only the odd ones' (1, 3, ...) trials are decoded again with heads masked, so no head "
              "is chosen on a trial that tests it")
NEEDLE_UNIT = ("needle: the trials of one needle (its depths and lengths) are one bootstrap unit, since they share its "
               "words")
OVERLAP_NOTE = ("a retrieval run scores no sink or induction metric, so their overlap with the masked heads is not "
                "measured here; headscan report states it when a sweep of the same model is reported beside the run")


# --- which heads --------------------------------------------------------------------------------------------


def ranked_heads(retrieval: pd.DataFrame, model_name: str, n_layers: int, n_heads: int,
                 source: str = "this run") -> tuple[list[tuple[int, int, float]], str]:
    """(layer, head, score) of every head of `model_name` with a score in the retrieval table, highest first, ties
    to the lower layer, then head; and the score ranked by: the gated ``retrieval`` where any trial passed the
    gate, else ``retrieval_ungated`` (as the report does)."""
    mine = retrieval[retrieval["model"] == model_name]
    gated = mine["metric"] == "retrieval"
    metric = "retrieval" if mine.loc[gated, "value"].notna().any() else "retrieval_ungated"
    part = mine[mine["metric"] == metric]
    if part.empty:
        there = ", ".join(dict.fromkeys(retrieval["model"])) or "none"
        raise ConfigError(f"mask_from: {source} has no retrieval scores of {model_name} (its models: {there}); "
                          f"rank by this run's own trials (drop --mask-from)", setting="mask_from")
    if int(part["layer"].max()) >= n_layers or int(part["head"].max()) >= n_heads:
        raise ConfigError(f"mask_from: {source} scores heads of {model_name} beyond its {n_layers} layers x {n_heads} "
                          f"heads: another model of that name", setting="mask_from")
    part = part[part["value"].notna()].sort_values(["layer", "head"]).sort_values("value", ascending=False,
                                                                                  kind="stable")
    return [(int(r.layer), int(r.head), float(r.value)) for r in part.itertuples()], metric


def split_scores(records: list[dict], model_name: str, n_layers: int, n_heads: int, needles) -> pd.DataFrame:
    """Rows like retrieval.parquet's (model, layer, head, metric, value) over the trials of `needles` alone: per head,
    the mean over trials whose answer span was found of the share of the answer it copied, over the trials that
    passed the gate (``retrieval``) and over all of them (``retrieval_ungated``); NaN where no trial counts."""
    chosen = [r for r in records if r["needle"] in set(needles) and r["answer"]]
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    hits = np.array([r["hits"] for r in chosen], dtype=np.float64).reshape(len(chosen), n_layers, n_heads)
    length = np.array([r["answer"][1] - r["answer"][0] for r in chosen], dtype=np.float64)
    score = hits / length[:, None, None]  # (trial, layer, head)
    passed = np.array([r["passed"] for r in chosen], dtype=bool)
    rows = []
    for metric, keep in (("retrieval", passed), ("retrieval_ungated", np.ones(len(chosen), dtype=bool))):
        value = score[keep].mean(0) if keep.any() else np.full((n_layers, n_heads), np.nan)
        rows.append(pd.DataFrame({"model": model_name, "layer": layer.ravel(), "head": head.ravel(), "metric": metric,
                                  "value": value.ravel()}))
    return pd.concat(rows, ignore_index=True)


def random_heads(top: list[tuple[int, int]], excluded: set, n_heads: int, seed: int, draw: int) -> list[tuple[int, int]]:
    """One draw of random heads: for each head of `top`, a head of its layer, none of `excluded`, no repeats.

    >>> random_heads([(2, 0), (2, 1), (5, 3)], {(2, 0), (2, 1), (5, 3)}, 4, 0, 0)
    [(2, 2), (2, 3), (5, 1)]
    """
    rng = np.random.default_rng([seed, draw])
    layers = {}
    for layer, _ in top:
        layers[layer] = layers.get(layer, 0) + 1
    chosen = []
    for layer, count in sorted(layers.items()):
        others = [h for h in range(n_heads) if (layer, h) not in excluded]
        if len(others) < count:
            raise ConfigError(f"mask_random: layer {layer} holds {count} of the top heads and only {len(others)} "
                              f"other heads to draw from; use a smaller --mask-random", setting="mask_random")
        chosen += [(layer, int(h)) for h in sorted(rng.choice(others, size=count, replace=False))]
    return chosen


def _conditions(ranked, n_heads: int, config: RetrievalConfig) -> list[tuple[str, int | None, list]]:
    """(condition, draw, heads) of every masked decoding of a trial, in the order they run."""
    wanted = max(config.mask_top, config.mask_random)
    if len(ranked) < wanted:
        raise ConfigError(f"mask_top: {wanted} heads asked for, but only {len(ranked)} heads have a retrieval score "
                          f"(a score needs a trial whose answer span was found); use fewer heads, more trials, or "
                          f"--mask-from an earlier run", setting="mask_top")
    heads = [(layer, head) for layer, head, _ in ranked]
    conditions = [("top", None, heads[:config.mask_top])] if config.mask_top else []
    if config.mask_random:
        excluded = set(heads[:wanted])
        conditions += [("random", d, random_heads(heads[:config.mask_random], excluded, n_heads, config.seed, d))
                       for d in range(config.mask_draws)]
    return conditions


def _ranking(model, config: RetrievalConfig, retrieval: pd.DataFrame, records: list[dict],
             needles_sha: str) -> tuple[list, dict, list | None]:
    """The ranked heads, where their scores come from (provenance and fingerprint), and the needles whose trials are
    masked (None: every trial; `SPLIT_RULE` where the run ranks its own heads)."""
    if config.mask_from is None:
        needles = sorted({r["needle"] for r in records})
        if len(needles) < 2:
            raise ConfigError(f"mask_top: the masking test chooses heads on half the needles and masks the other half, "
                              f"and this run has {len(needles)} needle; give at least 2 (--needles), or --mask-from a "
                              f"retrieval run on other needles", setting="mask_top")
        choose, held = needles[0::2], needles[1::2]
        scores = split_scores(records, model.name, model.n_layers, model.n_heads, choose)
        ranked, metric = ranked_heads(scores, model.name, model.n_layers, model.n_heads)
        return ranked, {"ranked_by": f"{metric} of this run's trials on needles {choose}", "split": SPLIT_RULE,
                        "choose_needles": choose, "mask_needles": held}, held
    folder = Path(config.mask_from)
    other = load(folder)
    if "retrieval" not in other.frames:
        raise ConfigError(f"mask_from: {folder} holds no retrieval.parquet; name a headscan retrieval output folder",
                          setting="mask_from")
    if (other.provenance.extra.get("needles") or {}).get("sha256") == needles_sha:
        raise ConfigError(f"mask_from: {folder} ran on this run's needles, so its heads were chosen on the needles "
                          f"this run would mask; run it on other needles (--needles), or drop --mask-from to choose on "
                          f"half of this run's needles and mask the other half", setting="mask_from")
    digest = hashlib.sha256((folder / TABLES["retrieval"].file).read_bytes()).hexdigest()
    ranked, metric = ranked_heads(other["retrieval"], model.name, model.n_layers, model.n_heads, source=str(folder))
    return ranked, {"ranked_by": f"{metric} of {folder} (other needles)", "run_id": other.provenance.run_id,
                    "sha256": digest}, None


# --- the masked trials --------------------------------------------------------------------------------------


def masking_test(model, corpus, needles, plans, records: list[dict], retrieval: pd.DataFrame, config: RetrievalConfig,
                 path: Path | None, expected: dict, should_stop, progress: bool, bos, stop) -> tuple[dict, dict]:
    """Decode every trial of `plans` under each masked condition; return the masking tables and the provenance of
    the test. `records` are the run's unmasked trials (condition none), `retrieval` its retrieval table; masked
    trials are kept in `path` (None: not kept) under `expected` (the trials' fingerprint) and the mask settings."""
    ranked, source, held = _ranking(model, config, retrieval, records, expected["needles"])
    if held is not None:  # only the held-out needles' trials are masked, and compared
        kept = [i for i, plan in enumerate(plans) if plan.needle in set(held)]
        plans, records = [plans[i] for i in kept], [records[i] for i in kept]
    conditions = _conditions(ranked, model.n_heads, config)
    labels = {(c, d): [head_label(layer, head) for layer, head in heads] for c, d, heads in conditions}
    fingerprint = expected | {"masking": {"top": config.mask_top, "random": config.mask_random,
                                          "draws": config.mask_draws, "from": source.get("sha256"),
                                          "masked_needles": held,
                                          "heads": {f"{c}:{d}": v for (c, d), v in labels.items()}}}
    done = kept_trials(path, fingerprint, model.name, key=lambda r: (r["trial"], r["condition"], r["draw"]))
    cut, within = head_cut(model), language_model(model)
    bar = _progress_bar(len(plans) * len(conditions), len(done), model.name, progress)
    for plan in plans:
        for condition, draw, heads in conditions:
            if (plan.index, condition, draw) in done:
                continue
            if should_stop():
                raise SweepInterrupted(f"stopped while masking heads of {model.name}: " + (
                    f"{len(done)} masked trials kept in {path.parent}; run the same command again to resume"
                    if path is not None else "nothing was kept (no out)"))
            record = _masked_trial(model, corpus, needles[plan.needle], plan, config, bos, stop, heads, cut, within)
            record |= {"condition": condition, "draw": draw}
            done[plan.index, condition, draw] = record
            if path is not None:
                keep_trial(path, record, fingerprint)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    scores = {head_label(layer, head): score for layer, head, score in ranked[:max(config.mask_top, config.mask_random)]}
    about = source | {"rule": MASK_RULE, "random": RANDOM_RULE, "k_top": config.mask_top,
                      "k_random": config.mask_random, "draws": config.mask_draws, "scores": scores,
                      "heads": {f"{c}" + ("" if d is None else f" {d}"): v for (c, d), v in labels.items()},
                      "unit": NEEDLE_UNIT, "sink_induction_overlap": OVERLAP_NOTE,
                      "seconds": round(sum(r["seconds"] for r in done.values()), 3)}
    return masking_tables(model.name, model.family, plans, records, done, labels, config), about


def _masked_trial(model, corpus, needle, plan, config: RetrievalConfig, bos, stop, heads, cut, within) -> dict:
    """One trial decoded with `heads` masked: its answer and recall."""
    started = time.perf_counter()
    prompt = build_prompt(corpus, needle, plan, model.tokenizer, template=config.template, bos=bos)
    with zeroed_heads(model, cut, heads, within=within) as fired:
        generated = greedy_decode(model, prompt.ids, lambda step: None, max_new_tokens=config.max_new_tokens,
                                  stop=stop, query_chunk=config.query_chunk)
    missed = sorted({layer for layer, _ in heads} - fired)
    if missed:
        raise ModelLoadError(f"model {model.name!r}: the mask of layers {missed} did not reach the decoding pass, so "
                             f"its heads cannot be masked there")
    response = model.tokenizer.decode(generated, skip_special_tokens=True).strip()
    recall = rouge1_recall(needle.answer, response)
    return {"trial": plan.index, "generated": generated, "response": response, "recall": recall,
            "passed": recall > config.gate, "seconds": round(time.perf_counter() - started, 3)}


def _progress_bar(total: int, done: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=f"masking {name}", unit="trial", file=sys.stderr, dynamic_ncols=True)


# --- tables -------------------------------------------------------------------------------------------------


def masking_tables(model: str, family: str, plans, records: list[dict], masked: dict, labels: dict,
                   config: RetrievalConfig) -> dict[str, pd.DataFrame]:
    """``retrieval_masking`` and ``retrieval_masking_trials`` from the unmasked `records` and the `masked` trials
    keyed (trial, condition, draw); `labels` maps (condition, draw) to the heads masked. Intervals resample needles
    (`NEEDLE_UNIT`); each top row's ``p_value`` ranks its drop among the random draws' drops on the same trials."""
    columns = [("none", None, [])] + [(c, d, v) for (c, d), v in labels.items()]
    recall = np.array([[r["recall"] for r in records]] + [[masked[p.index, c, d]["recall"] for p in plans]
                                                          for c, d, _ in columns[1:]]).T  # (trial, column)
    passed = recall > config.gate
    draws = [i for i, (c, _, _) in enumerate(columns) if c == "random"]
    if draws:  # the draws pooled per trial (draw <NA>)
        columns.append(("random", None, []))
        recall = np.concatenate([recall, recall[:, draws].mean(1, keepdims=True)], 1)
        passed = np.concatenate([passed, passed[:, draws].mean(1, keepdims=True)], 1)
    top = [i for i, (c, _, _) in enumerate(columns) if c == "top"]
    lengths, depths = np.array([p.length for p in plans]), np.array([p.depth for p in plans])
    groups = [(length, depth, (lengths == length) & (depths == depth)) for length in dict.fromkeys(lengths.tolist())
              for depth in dict.fromkeys(depths.tolist())] + [(pd.NA, float("nan"), np.ones(len(plans), bool))]
    needles = np.array([p.needle for p in plans])
    units = np.unique(needles)
    member = (needles[:, None] == units[None, :]).astype(np.float64)  # (trial, needle)
    rows = []
    for length, depth, chosen in groups:
        if not chosen.any():
            continue
        inside = member[chosen]
        present = inside.sum(0) > 0
        inside = inside[:, present]  # (trial, needle) of the needles with a trial here
        counts = np.broadcast_to(inside.sum(0)[:, None, None], (inside.shape[1], 1, recall.shape[1]))
        sums = (inside.T @ recall[chosen])[:, None, :]  # (needle, 1, column)
        differences = (inside.T @ (recall - recall[:, :1])[chosen])[:, None, :]
        zeros = np.zeros((inside.shape[1], 1))
        accuracy = over_trials(sums, zeros, units[present], config, counts=counts)
        drop = over_trials(differences, zeros, units[present], config, bounds=(-1.0, 1.0), counts=counts)
        p_value = float("nan")
        if top and draws:  # (1 + #draws at least as large a drop) / (draws + 1): a drop is negative
            p_value = float(rank_p_value(drop["value"][0, top], drop["value"][0, draws], side="low")[0])
        for i, (condition, draw, heads) in enumerate(columns):
            row = {name: accuracy[name][0, i] for name in accuracy if name in TABLES["retrieval_masking"].columns}
            paired = condition != "none"
            rows.append(row | {
                "model": model, "family": family, "condition": condition, "draw": draw if draw is not None else pd.NA,
                "length": length, "depth": depth, "chance": float("nan"), "k": len(heads) or _k(condition, config),
                "heads": " ".join(heads), "passed": float(passed[chosen][:, i].mean()),
                "drop": drop["value"][0, i] if paired else float("nan"),
                "drop_low": drop["ci_low"][0, i] if paired else float("nan"),
                "drop_high": drop["ci_high"][0, i] if paired else float("nan"),
                "p_value": p_value if condition == "top" else float("nan")})
    return {"retrieval_masking": TABLES["retrieval_masking"].conform(pd.DataFrame(rows)),
            "retrieval_masking_trials": _trial_rows(model, family, plans, records, masked, labels)}


def _k(condition: str, config: RetrievalConfig) -> int:
    return {"none": 0, "top": config.mask_top, "random": config.mask_random}[condition]


def _trial_rows(model: str, family: str, plans, records: list[dict], masked: dict, labels: dict) -> pd.DataFrame:
    nan = float("nan")
    rows = []
    for plan, record in zip(plans, records):
        each = [("none", None, [], record)] + [(c, d, v, masked[plan.index, c, d]) for (c, d), v in labels.items()]
        for condition, draw, heads, trial in each:
            rows.append({"model": model, "family": family, "trial": plan.index, "condition": condition,
                         "draw": draw if draw is not None else pd.NA, "value": trial["recall"], "sum": trial["recall"],
                         "count": 1, "ci_low": nan, "ci_high": nan, "units": 1, "top_unit_share": 1.0, "chance": nan,
                         "length": plan.length, "depth": plan.depth, "needle": plan.needle, "k": len(heads),
                         "heads": " ".join(heads), "steps": len(trial["generated"]), "response": trial["response"],
                         "passed": bool(trial["passed"])})
    return TABLES["retrieval_masking_trials"].conform(pd.DataFrame(rows))
