"""Retrieval heads over needle-in-a-haystack trials: ``headscan retrieval``, Wu et al.'s (2024) rule without its traps.

For each model and each trial (`headscan.corpus.needles`: a needle planted at a depth of a haystack cut from
any corpus, at each length), the prompt is prefilled with chunked attention and the answer decoded greedily
(`headscan.models.decode`); each decoding step's attention rows are scored by the ``retrieval`` metric
(`headscan.metrics.retrieval`), and the decoded answer by the gate (`headscan.corpus.rouge`). The tables:

- ``retrieval_trials.parquet``: every trial of every head, failed ones included (``passed``, ``span_found``);
- ``retrieval.parquet``: per head, ``retrieval`` (the mean over trials that pass the gate, Wu et al.'s number)
  and ``retrieval_ungated`` (over every trial whose answer span was found), each with a bootstrap interval
  over trials and the score a head attending uniformly would get (``chance``);
- with ``mask_top`` or ``mask_random``, ``retrieval_masking.parquet`` and ``retrieval_masking_trials.parquet``:
  needle accuracy with the top retrieval heads masked, and random heads of their layers
  (`headscan.scan.masking`).

What differs from the reference code, on purpose: trials that fail the gate are counted and kept, never
dropped without a trace; a run writes a new output folder (never appends to old scores) and writes it whole,
even when no trial passes (the gated rows are then NaN, the ungated ones are not); each finished trial is
kept in ``OUT.partial/`` so a stopped run resumes; the template, BOS, lengths, depths, seed, stop rule and
library versions are in the provenance.

This module does not draw or parse command lines.
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import __version__
from ..corpus import read_corpus
from ..corpus.needles import SENTENCE_RULE, SPAN_RULE, TEMPLATES, build_prompt, plan_trials, read_needles
from ..corpus.rouge import GATE_RULE, rouge1_recall
from ..errors import ConfigError, ModelLoadError, SweepInterrupted
from ..metrics import METRICS, AttentionBatch
from ..metrics.retrieval import chance_steps
from ..models import load_model
from ..models.decode import PREFILL_CHUNK, greedy_decode
from ..models.forward import chunked_refusal, refused
from ..retrieval_config import RetrievalConfig
from ..setting import fingerprinted
from ..tables import TABLES, ModelProvenance, SweepTables, head_columns, write
from ..tables.folders import holding_out
from .finish import run_provenance
from .kept_trials import keep_trial, kept_trials, over_trials
from .masking import MASK_RULE, masking_test
from .resume import checked_call, partial_folder, spec_stem, stop_requests

__all__ = ["retrieval", "STOP_RULE", "METRICS_BY_TRIALS"]

STOP_RULE = ("greedy (argmax, ties to the lowest id), at most max_new_tokens steps; stops after a step whose token is "
             "a special token (end of text or turn) or decodes to text holding a newline; that step is scored")
# What the bootstrap resamples, said in the run's provenance where a sweep says which unit it resolved.
TRIAL_UNIT = "trial: each needle-in-a-haystack trial is one unit (its own prompt and decoding)"
# Which trials each row of retrieval.parquet averages over.
METRICS_BY_TRIALS = {"retrieval": "passed the gate, answer span found", "retrieval_ungated": "answer span found"}


@holding_out
def retrieval(models: str | list[str], haystack: str | Path, out: str | Path | None = None,
              config: RetrievalConfig | None = None, *, needles: str | Path | None = None, overwrite: bool = False,
              restart: bool = False, progress: bool = False, command: str | None = None, **settings) -> SweepTables:
    """Score every head of each causal model in `models` on retrieval (Wu et al. 2024) over needle-in-a-haystack
    trials cut from the corpus `haystack`; publish ``retrieval.parquet``, ``retrieval_trials.parquet`` and
    ``run.json`` into `out` if given.

    `needles` is a JSONL file of ``{"needle", "question", "answer"}`` (None: headscan's own); `config` a
    `RetrievalConfig`, or its fields as keywords (``lengths=(1024,)``). With `out`, each finished trial is kept
    in ``OUT.partial/`` and the same call resumes a stopped run (`restart` discards it).

    Example: ``headscan.retrieval("smollm2", "en_ewt-ud-dev.conllu", "out/retrieval", lengths=(1024, 2048))``
    """
    models, config = checked_call(models, config, RetrievalConfig, settings, out, overwrite)
    corpus = read_corpus(haystack)
    needle_list, about = read_needles(needles)
    plans = plan_trials(corpus, len(needle_list), config.lengths, config.depths, config.seed)
    partial = partial_folder(out) if out is not None else None
    if partial is not None and restart:
        shutil.rmtree(partial, ignore_errors=True)
    started = datetime.now(timezone.utc)
    frames: dict[str, list[pd.DataFrame]] = {}
    described, skipped = [], {}
    with stop_requests() as should_stop:
        for spec in models:
            try:
                tables, provenance = _one_model(spec, corpus, needle_list, about, plans, config, partial,
                                                should_stop, progress)
            except ModelLoadError as error:
                if len(models) == 1:
                    raise
                skipped[spec] = str(error)
                print(f"skipped {spec}: {error}", file=sys.stderr)
                continue
            for name, frame in tables.items():
                frames.setdefault(name, []).append(frame)
            described.append(provenance)
    if not described:
        raise ModelLoadError(f"no model could be scored: {'; '.join(skipped.values())}")
    provenance = run_provenance(corpus, config, described, command=command or _python_call(models, haystack, config),
                                started=started, unit_why=TRIAL_UNIT)
    extra = {"retrieval": _rules(config), "needles": about} | ({"skipped": skipped} if skipped else {})
    provenance = dataclasses.replace(provenance, extra=provenance.extra | extra)
    result = SweepTables({name: pd.concat(parts, ignore_index=True) for name, parts in frames.items()}, provenance)
    if out is not None:
        result.path = write(result, out, overwrite=overwrite)
        shutil.rmtree(partial, ignore_errors=True)
    return result


def _rules(config: RetrievalConfig) -> dict:
    """Every rule that changes which heads come out, as the provenance records it."""
    return {
        "score": METRICS["retrieval"].definition.split("\n\n")[0],
        "gate": f"{GATE_RULE}; a trial passes when it is above {config.gate}",
        "answer_span": SPAN_RULE,
        "placement": f"between two haystack sentences ({SENTENCE_RULE}), at the last boundary at or before the depth "
                     f"in tokens; each haystack starts at a corpus segment drawn by numpy default_rng({config.seed})",
        "template": TEMPLATES[config.template] + (" (the user's turn of the tokenizer's chat template, with its "
                                                  "generation prompt)" if config.template == "chat" else ""),
        "decoding": f"{STOP_RULE}; prefill of every prompt token but the last with chunked attention, then a step "
                    f"that feeds the last; attention rows in float32, argmax ties to the earliest key",
        "trials": METRICS_BY_TRIALS,
    } | ({"masking": f"{MASK_RULE}; accuracy: the answer's ROUGE-1 recall, the mean over trials; drops paired with "
                     f"the unmasked decoding of the same trial"} if config.masking else {})


def _python_call(models: list[str], haystack, config: RetrievalConfig) -> str:
    changed = [f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
               if getattr(config, f.name) != f.default]
    return f"headscan.retrieval({', '.join([repr(models), repr(str(haystack)), *changed])})"


# --- one model --------------------------------------------------------------------------------------------


def _one_model(spec, corpus, needles, about, plans, config, partial, should_stop, progress):
    """One model's tables and provenance, resumed from its finished trials in `partial` where they match."""
    model = load_model(spec, device=config.device, dtype=config.dtype, prepend_bos=config.prepend_bos)
    try:
        if not model.causal:
            raise ModelLoadError(f"model {spec!r} is bidirectional: retrieval heads are read while a model decodes its "
                                 f"answer, and an encoder decodes none; use a causal model")
        reason = chunked_refusal(model)
        if reason is not None:  # no --attention eager here: retrieval decodes with chunked attention only
            raise refused(model, reason, instead="; headscan retrieval decodes with chunked attention only, so "
                          + ("try --dtype float32" if config.dtype != "float32" else "use another model"))
        # the answer's tokens follow the prompt: the last one decoded sits at position length + max_new_tokens - 2
        room = model.max_context - config.max_new_tokens + 1
        if max(config.lengths) > room:
            raise ConfigError(f"lengths: {max(config.lengths)} tokens and --max-new-tokens {config.max_new_tokens} "
                              f"pass {spec}'s context ({model.max_context} tokens); use --lengths of at most {room} "
                              f"(or fewer --max-new-tokens)", setting="lengths")
        bos = model.special_token_ids["bos"] if config.template == "raw" and model.prepend_bos else None
        expected = _fingerprint(model, corpus, about, config)
        path = partial / f"retrieval-{spec_stem(spec)}.jsonl" if partial is not None else None
        done = kept_trials(path, expected, spec)
        specials = set(getattr(model.tokenizer, "all_special_ids", []) or [])
        bar = _progress_bar(len(plans), len(done), spec, progress)
        for plan in plans:
            if plan.index in done:
                continue
            if should_stop():
                raise SweepInterrupted(f"stopped while scoring {spec}: " + (
                    f"{len(done)} trials kept in {partial}; run the same command again to resume" if path else
                    "nothing was kept (no out)"))
            done[plan.index] = _trial(model, corpus, needles[plan.needle], plan, config, bos, specials)
            if path is not None:
                keep_trial(path, done[plan.index], expected)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        records = [done[plan.index] for plan in plans]
        tables, summary = _tables(model, records, config), _summary(records, config, bos is not None)
        if config.masking:
            path = partial / f"masking-{spec_stem(spec)}.jsonl" if partial is not None else None
            masked, summary["masking"] = masking_test(model, corpus, needles, plans, records, tables["retrieval"],
                                                      config, path, expected, should_stop, progress, bos,
                                                      _answer_ends(model, specials))
            tables |= masked
        return tables, ModelProvenance.from_json(model.provenance() | summary)
    finally:
        del model
        gc.collect()


def _trial(model, corpus, needle, plan, config: RetrievalConfig, bos, specials: set) -> dict:
    """Run one trial: its prompt, decoded answer, gate, and each head's copying steps."""
    started = time.perf_counter()
    prompt = build_prompt(corpus, needle, plan, model.tokenizer, template=config.template, bos=bos)
    tokens = list(prompt.ids)
    span = prompt.answer or (0, 0)  # no span found: no key is a needle key, and the trial is left out of the scores
    hits = torch.zeros((model.n_layers, model.n_heads), dtype=torch.float64)
    chance = np.zeros(model.n_layers)  # (layer,): a sliding-window layer's null head sees only its window
    windows = {}  # window -> the layers that have it
    for layer in range(model.n_layers):
        windows.setdefault(model.window(layer), []).append(layer)
    retrieval = METRICS["retrieval"].function

    def each(step) -> None:
        n_keys = step.position + 1
        rows = torch.cat([step.rows[layer] for layer in range(model.n_layers)])  # (layer, head, 1, k): layers as batch
        ids = torch.tensor(tokens[:n_keys], device=rows.device)  # (k,): the prompt and the tokens fed since
        needle_keys = torch.zeros(n_keys, dtype=torch.bool, device=rows.device)
        needle_keys[span[0]:span[1]] = True
        layers, every = model.n_layers, torch.ones((model.n_layers, n_keys), dtype=torch.bool, device=rows.device)
        batch = AttentionBatch(rows, every[:, -1:], every, ids.expand(layers, -1), ~every, True, query_start=step.position,
                               needle=needle_keys.expand(layers, -1),
                               generated=torch.tensor([step.token], device=rows.device).expand(layers))
        hits.add_(retrieval(batch)[0].double().cpu())  # (layer, head)
        for window, layers_of in windows.items():  # one null head per window, not per layer
            chance[layers_of] += float(chance_steps(dataclasses.replace(batch, window=window))[0])
        tokens.append(step.token)

    generated = greedy_decode(model, prompt.ids, each, max_new_tokens=config.max_new_tokens,
                              stop=_answer_ends(model, specials), query_chunk=config.query_chunk)
    response = model.tokenizer.decode(generated, skip_special_tokens=True).strip()
    recall = rouge1_recall(needle.answer, response)
    return {"trial": plan.index, "length": plan.length, "depth": plan.depth, "needle": plan.needle, "start": plan.start,
            "tokens": len(prompt.ids), "sentences": prompt.sentences,
            "answer": list(prompt.answer) if prompt.answer else None, "generated": generated, "response": response,
            "recall": recall, "passed": recall > config.gate, "hits": hits.to(torch.int64).tolist(),
            "chance": chance.tolist(), "seconds": round(time.perf_counter() - started, 3)}


def _answer_ends(model, specials: set):
    """The stop rule (`STOP_RULE`): whether a generated token ends the answer."""
    def stop(token: int) -> bool:
        return token in specials or "\n" in model.tokenizer.decode([token])

    return stop


def _summary(records: list[dict], config: RetrievalConfig, bos: bool) -> dict:
    """What the model's provenance says about its trials."""
    found = [r for r in records if r["answer"] is not None]
    return {"trials": len(records), "passed": sum(r["passed"] for r in found),
            "failed_gate": sum(not r["passed"] for r in found), "span_missing": len(records) - len(found),
            "template": config.template, "bos": bos, "prompt_tokens": [min(r["tokens"] for r in records),
                                                                        max(r["tokens"] for r in records)],
            "seconds": round(sum(r["seconds"] for r in records), 3), "attention": "chunked",
            "query_chunk": config.query_chunk, "prefill_chunk": PREFILL_CHUNK}


# --- tables -----------------------------------------------------------------------------------------------


def _tables(model, records: list[dict], config: RetrievalConfig) -> dict[str, pd.DataFrame]:
    n_layers, n_heads = model.n_layers, model.n_heads
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    per_head = head_columns(model.name, model.family, layer.ravel(), head.ravel(), model.kv_group(head.ravel()))
    hits = np.array([r["hits"] for r in records], dtype=np.float64)  # (trial, layer, head)
    length = np.array([r["answer"][1] - r["answer"][0] if r["answer"] else 0 for r in records], dtype=np.float64)
    found = length > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        score = hits / length[:, None, None]  # (trial, layer, head); NaN where no span was found
        # (trial, layer); a trial kept from a run before chance was per layer holds one number for all
        chance = np.array([np.broadcast_to(np.asarray(r["chance"], dtype=np.float64), (n_layers,)) for r in records])
        chance = chance / length[:, None]
    nan = float("nan")
    trials = []
    for i, record in enumerate(records):
        trials.append(pd.DataFrame(per_head | {
            "trial": record["trial"], "value": score[i].ravel(), "sum": hits[i].ravel(), "count": length[i],
            "ci_low": nan, "ci_high": nan, "units": nan, "top_unit_share": nan, "length": record["length"],
            "depth": record["depth"], "needle": record["needle"], "tokens": record["tokens"],
            "needle_position": record["answer"][0] if record["answer"] else pd.NA, "steps": len(record["generated"]),
            "response": record["response"], "recall": record["recall"], "passed": record["passed"],
            "span_found": bool(found[i]), "chance": np.repeat(chance[i], n_heads)}))
    passed = np.array([r["passed"] for r in records]) & found
    ids = np.array([r["trial"] for r in records])
    rows = []
    for metric, chosen in (("retrieval", passed), ("retrieval_ungated", found)):
        values = over_trials(score[chosen], chance[chosen], ids[chosen], config)
        rows.append(pd.DataFrame(per_head | {"metric": metric} | {k: v.ravel() for k, v in values.items()}))
    return {"retrieval": TABLES["retrieval"].conform(pd.concat(rows, ignore_index=True)),
            "retrieval_trials": TABLES["retrieval_trials"].conform(pd.concat(trials, ignore_index=True))}


# --- resuming ---------------------------------------------------------------------------------------------


def _fingerprint(model, corpus, about: dict, config: RetrievalConfig) -> dict:
    """What a kept trial must share with this run to be reused: all that changes a trial's prompt or decoding."""
    # the settings declared to enter it (headscan.retrieval_config); the mask settings change no unmasked trial:
    # they are in the masked trials' fingerprint (headscan.scan.masking)
    kept = fingerprinted(RetrievalConfig)
    settings = {k: v for k, v in config.to_json().items() if k in kept}
    # windows: a trial decoded before sliding windows were read misplaced their rows; it is not reused
    return {"headscan": __version__, "model": {"name": model.name, "id": model.id, "revision": model.revision,
                                               **({"windows": list(model.windows)} if model.windows else {})},
            "corpus": {"source": corpus.source, "sha256": corpus.sha256}, "needles": about["sha256"],
            "settings": settings}


def _progress_bar(total: int, done: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=f"retrieval {name}", unit="trial", file=sys.stderr, dynamic_ncols=True)
