"""The sweep: run a corpus through hooked models and reduce every layer's attention pattern as it is produced.

One forward pass per batch. A hook on each ``blocks.{L}.attn.hook_pattern`` hands that layer's pattern, the
padding mask and the token ids to every registered metric, which reduces it at once to per-segment sums and
counts; the pattern is then dropped. No activation cache is kept, so peak memory does not grow with the
corpus. Totals are exact sums over segments; a Poisson bootstrap over segments (a fixed number of seeded
resampling weights per segment) gives 95% intervals in the same single pass.

This module does not draw anything or parse command lines.
"""

from __future__ import annotations

import contextlib
import gc
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformer_lens.model_bridge.exceptions import StopAtLayerException

from . import __version__
from .corpus import Corpus, Segment, batches, encode, read_corpus
from .errors import ConfigError
from .metrics import METRICS, AttentionBatch, Metric
from .models import DEFAULT_MODELS, HookedModel, load_model, resolve_device
from .tables import HEADS_COLUMNS, OFFSETS_COLUMNS, SweepTables, conform, head_label, write

__all__ = ["SweepConfig", "sweep", "sweep_model", "example_attention"]

SPECIALS = ("keep", "exclude")


@dataclass(frozen=True)
class SweepConfig:
    """How a sweep reads the corpus and scores heads."""

    max_len: int = 128  # tokens per segment, special tokens included; longer segments are truncated
    batch_size: int = 16  # segments per forward pass; scores do not depend on it
    limit: int | None = None  # read at most this many segments
    device: str = "auto"  # auto, cpu, cuda or mps
    dtype: str = "float32"  # model weights and activations
    specials: str = "keep"  # "exclude": special tokens neither count as queries nor as keys (see README)
    max_offset: int = 8  # K of the offset profile, offsets -K..K
    bootstrap: int = 200  # resampling weights per segment for the 95% intervals; 0 turns intervals off
    seed: int = 0  # seed of the bootstrap weights (and of nothing else: the forward pass is deterministic)
    prepend_bos: bool | None = None  # causal models: None follows TransformerLens' default per model

    def __post_init__(self):
        if self.specials not in SPECIALS:
            raise ConfigError(f"--specials {self.specials!r} is not one of {', '.join(SPECIALS)}")
        for name, low in (("max_len", 4), ("batch_size", 1), ("max_offset", 1), ("bootstrap", 0), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"--{name.replace('_', '-')} must be a whole number >= {low}, got {value!r}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be at least 1, got {self.limit}")


def _columns(max_offset: int) -> list[tuple[Metric, int | None]]:
    """The score columns of one head: each heads metric, then each offset of the offsets metric."""
    columns = []
    for metric in METRICS.values():
        if metric.table == "heads":
            columns.append((metric, None))
        else:
            columns.extend((metric, d) for d in range(-max_offset, max_offset + 1))
    return columns


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


def _stop_after_last_block(residual, hook):
    # TransformerBridge.forward catches this (it is how its own stop_at_layer works) and returns early.
    raise StopAtLayerException(residual)


@contextlib.contextmanager
def _pattern_hooks(model: HookedModel, hooks: list):
    """Attach `hooks` for a whole loop of forward passes that only read attention patterns.

    Two things make the bridge as fast as a plain Hugging Face forward (benchmarks/bridge_overhead.py):
    no autograd graph (inference mode), and no output head: the forward stops after the last block,
    since the vocabulary projection alone is about half of minilm's forward and a fifth of smollm2's.
    """
    stop = (f"blocks.{model.n_layers - 1}.hook_out", _stop_after_last_block)
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=[*hooks, stop]):
        yield lambda input_ids, attention_mask: model.bridge(input_ids, attention_mask=attention_mask)


def sweep_model(model: HookedModel, corpus: Corpus, config: SweepConfig = SweepConfig(), *, progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Score every head of `model` over `corpus`: (heads rows, offsets rows, the model's provenance)."""
    started = time.perf_counter()
    encoded = encode(corpus, model, config.max_len)
    columns = _columns(config.max_offset)
    accumulator = _Accumulator(model.n_layers, model.n_heads, len(columns), config.bootstrap)
    device = next(model.bridge.original_model.parameters()).device
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

    hooks = [(f"blocks.{layer}.attn.hook_pattern", reduce_layer(layer)) for layer in range(model.n_layers)]
    bar = _progress_bar(len(encoded.token_ids), model.name, progress)
    n_tokens = 0
    try:
        with _pattern_hooks(model, hooks) as forward:
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
    heads, offsets = _frames(model, accumulator, columns)
    provenance = model.provenance() | {
        "n_segments": len(encoded.token_ids),
        "n_tokens": n_tokens,
        "n_truncated": encoded.n_truncated,
        "max_len": encoded.max_len,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return heads, offsets, provenance


def _progress_bar(total: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"sweep {name}", unit="seg", file=sys.stderr, dynamic_ncols=True)


def _frames(model: HookedModel, accumulator: _Accumulator, columns) -> tuple[pd.DataFrame, pd.DataFrame]:
    value, sums, counts, low, high = accumulator.values()  # (layer, head, column)
    n_layers, n_heads, n_columns = value.shape
    layer, head, column = np.meshgrid(np.arange(n_layers), np.arange(n_heads), np.arange(n_columns), indexing="ij")
    frame = pd.DataFrame(
        {
            "model": model.name,
            "family": model.family,
            "layer": layer.ravel(),
            "head": head.ravel(),
            "label": np.array([head_label(l, h) for l in range(n_layers) for h in range(n_heads)])[
                layer.ravel() * n_heads + head.ravel()
            ],
            "kv_group": model.kv_group(head.ravel()),
            "metric": np.array([metric.name for metric, _ in columns])[column.ravel()],
            "offset": np.array([np.nan if d is None else d for _, d in columns])[column.ravel()],
            "value": value.ravel(),
            "sum": sums.ravel(),
            "count": counts.ravel(),
            "ci_low": low.ravel(),
            "ci_high": high.ravel(),
        }
    )
    is_offset = frame["offset"].notna()
    heads = frame[~is_offset].sort_values(["metric", "layer", "head"], key=_registry_order, kind="stable")
    offsets = frame[is_offset].sort_values(["layer", "head", "offset"], kind="stable")
    return conform(heads, HEADS_COLUMNS), conform(offsets.astype({"offset": "int64"}), OFFSETS_COLUMNS)


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


def sweep(
    models: list[str] | tuple[str, ...] = DEFAULT_MODELS,
    corpus: str | Path = "builtin",
    out: str | Path | None = None,
    config: SweepConfig = SweepConfig(),
    *,
    progress: bool = False,
    command: str | None = None,
) -> SweepTables:
    """Sweep every head of every layer of `models` over `corpus`; write the tables into `out` if given.

    Models are loaded one at a time and released before the next, so memory holds one model at most.
    Nothing is written until every model has been swept: a failure leaves `out` as it was.
    """
    if not models:
        raise ConfigError("no models to sweep; pass --model (for example --model minilm)")
    if len(set(models)) != len(models):
        raise ConfigError(f"a model is named twice in {list(models)}; each model's rows would collide")
    started = datetime.now(timezone.utc)
    text = read_corpus(corpus, limit=config.limit)
    heads, offsets, described = [], [], []
    for spec in models:
        model = load_model(spec, device=config.device, dtype=config.dtype, prepend_bos=config.prepend_bos)
        try:
            h, o, p = sweep_model(model, text, config, progress=progress)
        finally:
            del model
            gc.collect()
        heads.append(h)
        offsets.append(o)
        described.append(p)
    provenance = {
        "headscan_version": __version__,
        "git_revision": _git_revision(),
        "command": command if command is not None else " ".join(sys.argv),
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "corpus": text.provenance(),
        "config": asdict(config) | {"device": resolve_device(config.device)},
        "versions": _versions(),
        "models": described,
    }
    tables = SweepTables(pd.concat(heads, ignore_index=True), pd.concat(offsets, ignore_index=True), provenance)
    if out is not None:
        tables.path = write(tables, out)
    return tables


def example_attention(model: HookedModel, text: str, layer: int) -> tuple[list[str], np.ndarray]:
    """The tokens of `text` and layer `layer`'s attention pattern on it, (head, q, k), as the sweep sees them."""
    if not 0 <= layer < model.n_layers:
        raise ConfigError(f"layer {layer} is out of range for {model.name} (0..{model.n_layers - 1})")
    corpus = Corpus("example", "text", "", (Segment(text, 0),))
    encoded = encode(corpus, model, model.max_context)
    ids = torch.tensor([encoded.token_ids[0]], dtype=torch.long)
    device = next(model.bridge.original_model.parameters()).device
    captured = {}

    def hook(pattern, hook):
        captured["pattern"] = pattern[0].detach().float().cpu().numpy()  # (head, q, k)

    with _pattern_hooks(model, [(f"blocks.{layer}.attn.hook_pattern", hook)]) as forward:
        forward(ids.to(device), torch.ones_like(ids).to(device))
    # decode one id at a time: readable labels ("cat", not byte-level BPE's "Ġcat"), whitespace shown quoted
    words = [model.tokenizer.decode([token]) for token in encoded.token_ids[0]]
    return [word.strip() or repr(word) for word in words], captured["pattern"]
