"""The sweep: run a corpus through hooked models and reduce every layer's attention pattern as it is produced.

`sweep` is also ``headscan.sweep`` (this module is `headscan.scan`, so the two names cannot clash).

One forward pass per batch. A hook on each ``blocks.{L}.attn.hook_pattern`` hands that layer's pattern, the
padding mask and the token ids to every registered metric, which reduces it at once to per-segment sums and
counts; the pattern is then dropped. No activation cache is kept, so peak memory does not grow with the
corpus. Totals are exact sums over segments; a Poisson bootstrap over segments (a fixed number of seeded
resampling weights per segment) gives 95% intervals in the same single pass.

This module does not draw anything or parse command lines.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import __version__
from .config import SweepConfig
from .corpus import Corpus, Segment, batches, encode, read_corpus
from .errors import ConfigError
from .metrics import METRICS, AttentionBatch, Metric
from .models import DEFAULT_MODELS, HookedModel, load_model, resolve_device
from .provenance import CorpusProvenance, ModelProvenance, RunProvenance
from .tables import TABLES, SweepTables, concat, head_label, write

__all__ = ["SweepConfig", "sweep", "sweep_model", "example_attention"]


Column = tuple[Metric, tuple]  # a metric and one position of its axis (() for a metric without one)


def _columns(config: SweepConfig) -> list[Column]:
    """The score columns of one head, in registry order: each metric once per position of its axis."""
    return [(metric, key) for metric in METRICS.values() for key in (metric.axis.values(config) if metric.axis else [()])]


class _Accumulator:
    """Running per-head sums and counts for every score column, and their bootstrap replicates."""

    def __init__(self, n_layers: int, n_heads: int, n_columns: int, n_replicates: int):
        shape = (n_layers, n_heads, n_columns)
        self.sums = torch.zeros(shape, dtype=torch.float64)
        self.counts = torch.zeros(shape, dtype=torch.float64)
        self.replicate_sums = torch.zeros((n_replicates, *shape), dtype=torch.float64)
        self.replicate_counts = torch.zeros((n_replicates, *shape), dtype=torch.float64)

    def add(self, layer: int, sums: torch.Tensor, counts: torch.Tensor, weights: torch.Tensor) -> None:
        # sums, counts: (batch, head, column); weights: (replicate, batch)
        sums, counts = sums.double().cpu(), counts.double().cpu()
        self.sums[layer] += sums.sum(0)
        self.counts[layer] += counts.sum(0)
        if weights.shape[0]:
            # (replicate, batch) @ (batch, head * column): a plain matrix product, the fastest form here
            self.replicate_sums[:, layer] += (weights @ sums.flatten(1)).view_as(self.replicate_sums[:, layer])
            self.replicate_counts[:, layer] += (weights @ counts.flatten(1)).view_as(self.replicate_counts[:, layer])

    def values(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """value, sum, count, ci_low, ci_high; each (layer, head, column); NaN where undefined."""
        sums, counts = self.sums.numpy(), self.counts.numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            value = np.where(counts > 0, sums / counts, np.nan)
            if self.replicate_sums.shape[0]:
                replicates = self.replicate_sums.numpy() / self.replicate_counts.numpy()
                low, high = _nan_percentiles(replicates)
            else:
                low = high = np.full_like(value, np.nan)
        undefined = counts <= 0
        low[undefined] = high[undefined] = np.nan
        return value, sums, counts, low, high


def _nan_percentiles(replicates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2.5% and 97.5% points over the replicate axis, skipping replicates that drew no query (NaN).

    Linear interpolation as np.nanpercentile, vectorised: NaNs sort last, so each column's finite
    replicates are its first n.
    """
    ordered = np.sort(replicates, axis=0)
    n = np.isfinite(replicates).sum(0)  # finite replicates per column
    points = []
    for fraction in (0.025, 0.975):
        position = fraction * np.maximum(n - 1, 0)
        below = np.floor(position).astype(int)
        above = np.minimum(below + 1, np.maximum(n - 1, 0))
        low_value = np.take_along_axis(ordered, below[None], 0)[0]
        high_value = np.take_along_axis(ordered, above[None], 0)[0]
        point = low_value + (high_value - low_value) * (position - below)
        points.append(np.where(n > 0, point, np.nan))
    return points[0], points[1]


def _bootstrap_weights(index: torch.Tensor, n_replicates: int, seed: int) -> torch.Tensor:
    """(replicate, batch) Poisson(1) resampling weights, drawn per segment from (seed, segment index).

    Keyed by the segment, not the batch, so intervals do not depend on batch size or order.
    """
    columns = [np.random.default_rng([seed, int(i)]).poisson(1.0, n_replicates) for i in index]
    return torch.tensor(np.stack(columns, axis=1), dtype=torch.float64)


def _special_mask(tokens: torch.Tensor, model: HookedModel) -> torch.Tensor:
    ids = [i for i in model.special_token_ids.values() if i is not None]
    ids += list(getattr(model.tokenizer, "all_special_ids", []) or [])
    return torch.isin(tokens, torch.tensor(sorted(set(ids)), dtype=tokens.dtype, device=tokens.device))


def _attention_batch(pattern: torch.Tensor, input_ids: torch.Tensor, real: torch.Tensor, model: HookedModel, config: SweepConfig) -> AttentionBatch:
    pattern = pattern.float()  # (batch, head, q, k); a new tensor for half precision, the same one otherwise
    counts = real
    if config.specials == "exclude":
        counts = real & ~_special_mask(input_ids, model)
        # Renormalise each query's attention over the keys that count: a new tensor, never written in place.
        kept = pattern * counts[:, None, None, :].to(pattern.dtype)
        pattern = kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(pattern.dtype).tiny)
    sep = model.special_token_ids["sep"]
    sep_mask = input_ids == sep if sep is not None else torch.zeros_like(real)
    return AttentionBatch(pattern, counts, counts, input_ids, sep_mask, model.causal, config.max_offset)


def _score(batch: AttentionBatch, columns: list[tuple[Metric, int | None]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every metric on one layer: per-segment sums and counts, (batch, head, column)."""
    sums, counts = [], []
    for metric in dict.fromkeys(m for m, _ in columns):
        s, c = metric.function(batch)  # (batch, head) or (batch, head, offset)
        sums.append(s if s.dim() == 3 else s[..., None])
        counts.append(c if c.dim() == 3 else c[..., None])
    return torch.cat(sums, -1), torch.cat(counts, -1)


def sweep_model(model: HookedModel, corpus: Corpus, config: SweepConfig = SweepConfig(), *, progress: bool = False) -> SweepTables:
    """Score every head of `model` over `corpus`: its tables, with a provenance of this one model."""
    started = time.perf_counter()
    encoded = encode(corpus, model, config.max_len)
    columns = _columns(config)
    accumulator = _Accumulator(model.n_layers, model.n_heads, len(columns), config.bootstrap)
    device = model.device
    pad = model.special_token_ids["pad"]
    pad = pad if pad is not None else 0  # masked out, so any id will do (GPT-2 has no pad token)
    state = {}

    def reduce_layer(layer: int):
        def hook(pattern, hook):
            batch = _attention_batch(pattern, state["ids"], state["real"], model, config)
            sums, counts = _score(batch, columns)
            accumulator.add(layer, sums, counts, state["weights"])
            return None  # the pattern goes on unchanged

        return hook

    hooks = {layer: reduce_layer(layer) for layer in range(model.n_layers)}
    bar = _progress_bar(len(encoded.token_ids), model.name, progress)
    n_tokens = 0
    try:
        with model.pattern_forward(hooks) as forward:
            for batch in batches(encoded, config.batch_size, pad):
                ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
                weights = _bootstrap_weights(batch.index, config.bootstrap, config.seed)
                state.update(ids=ids, real=mask.bool(), weights=weights)
                forward(ids, mask)
                n_tokens += batch.n_tokens
                if bar is not None:
                    bar.update(len(batch.index))
                    bar.set_postfix(tok_s=f"{n_tokens / max(time.perf_counter() - started, 1e-9):.0f}")
    finally:
        if bar is not None:
            bar.close()
    described = ModelProvenance.from_json(model.provenance() | {
        "n_segments": len(encoded.token_ids),
        "n_tokens": n_tokens,
        "n_truncated": encoded.n_truncated,
        "max_len": encoded.max_len,
        "seconds": round(time.perf_counter() - started, 3),
    })
    return SweepTables(_frames(model, accumulator, columns), _run_provenance(corpus, config, [described]))


def _progress_bar(total: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"sweep {name}", unit="seg", file=sys.stderr, dynamic_ncols=True)


def _frames(model: HookedModel, accumulator: _Accumulator, columns: list[Column]) -> dict[str, pd.DataFrame]:
    """One DataFrame per table: each score column's rows go to its metric's table."""
    value, sums, counts, low, high = accumulator.values()  # (layer, head, column)
    n_layers, n_heads, _ = value.shape
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")  # (layer, head)
    per_head = {
        "model": model.name,
        "family": model.family,
        "layer": layer.ravel(),
        "head": head.ravel(),
        "label": [head_label(l, h) for l, h in zip(layer.ravel(), head.ravel())],
        "kv_group": model.kv_group(head.ravel()),
    }
    parts: dict[str, list[pd.DataFrame]] = {}
    for index, (metric, key) in enumerate(columns):
        table = TABLES[metric.table]
        keys = dict(zip(metric.axis.columns, key)) if metric.axis else {}
        if "metric" in table.keys:
            keys["metric"] = metric.name
        values = {"value": value, "sum": sums, "count": counts, "ci_low": low, "ci_high": high}
        part = pd.DataFrame(per_head | keys | {name: array[..., index].ravel() for name, array in values.items()})
        parts.setdefault(table.name, []).append(part)
    # Rows of a table: by metric (registry order), then layer, head and the metric's axis.
    frames = {}
    for name, pieces in parts.items():
        frame = pd.concat(pieces, ignore_index=True)
        keys = list(TABLES[name].keys)
        order = ["metric"] * ("metric" in keys) + ["layer", "head"] + [k for k in keys if k != "metric"]
        frame = frame.sort_values(order, key=_registry_order, kind="stable")
        frames[name] = TABLES[name].conform(frame)
    return frames


def _registry_order(column: pd.Series) -> pd.Series:
    if column.name == "metric":
        order = {name: i for i, name in enumerate(METRICS)}
        return column.map(order)
    return column


def _git_revision() -> str | None:
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        result = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def _versions() -> dict:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version(), "headscan": __version__}
    for package in ("torch", "transformers", "transformer-lens", "numpy", "pandas"):
        try:
            versions[package.replace("-", "_")] = version(package)
        except PackageNotFoundError:
            versions[package.replace("-", "_")] = None
    return versions


def _run_provenance(corpus: Corpus, config: SweepConfig, models: list[ModelProvenance], *, command: str | None = None,
                    started: datetime | None = None) -> RunProvenance:
    return RunProvenance(
        headscan_version=__version__,
        git_revision=_git_revision(),
        command=command,
        started=started.isoformat(timespec="seconds") if started else None,
        finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        corpus=CorpusProvenance.from_json(corpus.provenance()),
        config=config.to_json() | {"device": resolve_device(config.device)},
        versions=_versions(),
        models=tuple(models),
    )


def sweep(
    models: str | list[str] | tuple[str, ...] = DEFAULT_MODELS,
    corpus: str | Path | list[str] | Corpus = "builtin",
    out: str | Path | None = None,
    config: SweepConfig | None = None,
    *,
    progress: bool = False,
    command: str | None = None,
    **settings,
) -> SweepTables:
    """Sweep every head of every layer of `models` over `corpus`; write the tables into `out` if given.

    Parameters
    ----------
    models
        One spec or several: an embedded alias (``minilm``, ``smollm2``), a local checkpoint folder, a
        ``.gguf`` file or a Hugging Face id. Default: both embedded models.
    corpus
        A file path (``.txt``, ``.jsonl``, ``.conllu``), ``"builtin"``, ``"repeat-random[:n=50,...]"``, a list
        of strings (one segment each) or a `headscan.corpus.Corpus`.
    out
        A folder to write heads.parquet, offsets.parquet and run.json into; None writes nothing.
    config, **settings
        A `SweepConfig`, or its fields as keywords (``max_len=64``); keywords override `config`.
    command
        How the sweep was called, for provenance; by default the Python call itself.

    Models are loaded one at a time and released before the next, so memory holds one model at most.
    Nothing is written until every model has been swept: a failure leaves `out` as it was.

    Example (a notebook): ``tables = headscan.sweep("minilm", ["The cat sat.", "It slept."], max_len=32)``
    """
    models = [models] if isinstance(models, str) else list(models)
    if settings:
        try:
            config = dataclasses.replace(config or SweepConfig(), **settings)
        except TypeError:
            unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(SweepConfig)})
            raise ConfigError(f"unknown setting(s) {unknown}; SweepConfig has "
                              f"{', '.join(f.name for f in dataclasses.fields(SweepConfig))}") from None
    config = config or SweepConfig()
    if not models:
        raise ConfigError("no models to sweep; pass --model (for example --model minilm)", setting="models")
    if len(set(models)) != len(models):
        raise ConfigError(f"a model is named twice in {models}; each model's rows would collide", setting="models")
    if command is None:
        command = _python_call(models, corpus, out, config)
    started = datetime.now(timezone.utc)
    if isinstance(corpus, Corpus):
        text = corpus
    elif isinstance(corpus, (list, tuple)):
        text = _texts_corpus(list(corpus), config.limit)
    else:
        text = read_corpus(corpus, limit=config.limit)
    parts = []
    for spec in models:
        model = load_model(spec, device=config.device, dtype=config.dtype, prepend_bos=config.prepend_bos)
        try:
            parts.append(sweep_model(model, text, config, progress=progress))
        finally:
            del model
            gc.collect()
    described = [m for part in parts for m in part.provenance.models]
    tables = concat(parts, _run_provenance(text, config, described, command=command, started=started))
    if out is not None:
        tables.path = write(tables, out)
    return tables


def _texts_corpus(texts: list[str], limit: int | None) -> Corpus:
    """A corpus of the given strings, one segment each (a notebook's list of sentences)."""
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise ConfigError(f"corpus: item {bad[0]} of the list is a {type(texts[bad[0]]).__name__}, not a string",
                          setting="corpus")
    kept = [t.strip() for t in texts if t.strip()][:limit]
    segments = tuple(Segment(text, i + 1, document=i) for i, text in enumerate(kept))
    if not segments:
        raise ConfigError("corpus: the list holds no text (every item is empty)", setting="corpus")
    digest = hashlib.sha256(json.dumps(texts).encode()).hexdigest()
    return Corpus(f"<list of {len(texts)} texts>", "list", digest, segments, documents="none: each text is its own document")


def _python_call(models: list[str], corpus, out, config: SweepConfig) -> str:
    """The call as a notebook user would write it, for provenance (lists of texts are summarised)."""
    shown = f"<{len(corpus)} texts>" if isinstance(corpus, (list, tuple)) else repr(str(corpus))
    changed = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
               if getattr(config, f.name) != f.default}
    arguments = [repr(models), shown] + ([f"out={str(out)!r}"] if out is not None else [])
    arguments += [f"{name}={value!r}" for name, value in changed.items()]
    return f"headscan.sweep({', '.join(arguments)})"


def example_attention(model: HookedModel, text: str, layer: int) -> tuple[list[str], np.ndarray]:
    """The tokens of `text` and layer `layer`'s attention pattern on it, (head, q, k), as the sweep sees them."""
    if not 0 <= layer < model.n_layers:
        raise ConfigError(f"layer {layer} is out of range for {model.name} (0..{model.n_layers - 1})")
    corpus = Corpus("example", "text", "", (Segment(text, 0),))
    encoded = encode(corpus, model, model.max_context)
    ids = torch.tensor([encoded.token_ids[0]], dtype=torch.long)
    device = model.device
    captured = {}

    def hook(pattern, hook):
        captured["pattern"] = pattern[0].detach().float().cpu().numpy()  # (head, q, k)

    with model.pattern_forward({layer: hook}) as forward:
        forward(ids.to(device), torch.ones_like(ids).to(device))
    # decode one id at a time: readable labels ("cat", not byte-level BPE's "Ġcat"), whitespace shown quoted
    words = [model.tokenizer.decode([token]) for token in encoded.token_ids[0]]
    return [word.strip() or repr(word) for word in words], captured["pattern"]
