"""Settings: frozen dataclasses that check every setting once, so nothing downstream checks again.

`SweepConfig` holds a sweep's settings, `RetrievalConfig` those of the needle-in-a-haystack trials of
``headscan retrieval``. The command line builds its options, choices and defaults from them and the constants
here, and turns a `ConfigError` naming a setting (``max_len``) into one naming the flag (``--max-len``). Inner
functions trust a config they are handed.

This module imports no torch: ``headscan --help`` stays fast.

>>> SweepConfig(max_len=64).max_len
64
>>> SweepConfig(control=["random-init"]).control  # as run.json gives it back
('random-init',)
>>> SweepConfig(specials="drop")
Traceback (most recent call last):
...
headscan.errors.ConfigError: specials must be one of keep, exclude; got 'drop'
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Literal, get_args, get_type_hints

from .errors import ConfigError

__all__ = ["SweepConfig", "RetrievalConfig", "DEVICES", "DTYPES", "SPECIALS", "TEMPLATES", "CONTROLS", "MIN_BOOTSTRAP",
           "IMPORTANCE_METHODS", "IMPORTANCE_TARGETS", "choices", "control_name", "split_control", "hf_offline"]

Device = Literal["auto", "cpu", "cuda", "mps"]
DType = Literal["float32", "float16", "bfloat16", "float64"]
Specials = Literal["keep", "exclude"]
BootstrapUnit = Literal["auto", "segment", "document"]
Long = Literal["truncate", "split"]
IntervalMethod = Literal["studentized", "studentized_symmetric", "bca", "percentile", "delta"]  # intervals.METHODS
Attention = Literal["auto", "eager", "chunked"]
Pack = Literal["none", "sentences", "documents"]
Importance = Literal["off", "atp", "ablate"]
Template = Literal["raw", "chat"]
DEVICES: tuple[str, ...] = get_args(Device)
DTYPES: tuple[str, ...] = get_args(DType)
SPECIALS: tuple[str, ...] = get_args(Specials)
BOOTSTRAP_UNITS: tuple[str, ...] = get_args(BootstrapUnit)
INTERVAL_METHODS: tuple[str, ...] = get_args(IntervalMethod)
# Control models swept beside each model (issue 19): the same architecture with weights drawn from its config's
# own initialiser, and the trained model over the corpus with each segment's words permuted.
Control = Literal["random-init", "shuffled-words"]
CONTROLS: tuple[str, ...] = get_args(Control)

# Head importance (headscan.metrics.importance): how a head's removal is measured, and on what. "atp" estimates
# both ablations to first order from one backward pass; "ablate" also runs them exactly.
IMPORTANCE_METHODS = ("atp_mean", "atp_zero", "mean_ablation", "zero_ablation")
IMPORTANCE_TARGETS = ("next_token_loss", "masked_loss", "hidden_change")  # causal LM, trained MLM head, other encoders
TEMPLATES: tuple[str, ...] = get_args(Template)

# Fewer replicates than this cannot place a 2.5% point: with 19 the lowest replicate is already the 5% point.
MIN_BOOTSTRAP = 20


@dataclass(frozen=True)
class SweepConfig:
    """How a sweep reads the corpus and scores heads. Every field is checked when the config is made."""

    max_len: int = 128  # tokens per sequence fed to the model, special tokens included
    long: Long = "truncate"  # a longer segment: cut to max_len, or split into consecutive windows of max_len
    batch_size: int = 16  # segments per forward pass; scores do not depend on it
    limit: int | None = None  # read at most this many segments
    device: Device = "auto"  # where the model runs
    device_map: str | None = None  # e.g. "auto": spread a model too large for one device over several (accelerate)
    dtype: DType = "float32"  # model weights and activations; metrics and sums stay float32/float64
    specials: Specials = "keep"  # "exclude": special tokens neither count as queries nor as keys (see README)
    max_offset: int = 8  # K of the offset profile, offsets -K..K
    bootstrap: int = 200  # resampling weights per unit for the 95% intervals; 0 turns intervals off
    seed: int = 0  # seed of the bootstrap weights (and of nothing else: the forward pass is deterministic)
    prepend_bos: bool | None = None  # causal models: None follows TransformerLens' default per model
    # what the bootstrap resamples: segments, or whole documents; "auto": documents where the corpus has documents
    # of several segments, else segments (the sweep resolves it and records why: headscan.scan.plan.resolve_unit)
    bootstrap_unit: BootstrapUnit = "auto"
    interval: IntervalMethod = "studentized_symmetric"  # how replicates become a 95% interval (headscan.intervals)
    window: int = 256  # segments added up per window; state is saved, and units closed, at window ends
    attention: Attention = "auto"  # eager: the model's own pattern; chunked: recomputed in blocks of queries
    # queries per block in chunked mode; scores do not depend on it. None: as many as keep a block's weights within
    # 8 MiB, at least 64 (headscan.models.chunked.block_rows): a whole layer at ordinary lengths, 64 queries of a
    # 4k-token smollm2 segment (a quarter of eager's memory, faster than 512, whose temporaries are faulted in anew)
    query_chunk: int | None = None
    attention_budget: int | None = None  # MiB an eager batch's patterns may take before auto goes chunked (None: by device)
    pack: Pack = "none"  # long inputs: consecutive sentences (or whole documents) packed into max_len-token segments
    values: bool = True  # also value-weighted attention (value.parquet) and direct logit attribution (dla), same pass
    document_field: str | None = None  # JSONL corpora: the field whose value marks each line's document
    control: tuple[Control, ...] = ()  # controls swept beside each model, under its name + " [random init]" etc.
    control_seed: int | None = None  # seed of the controls' weights and permutations (None: `seed`)
    importance: Importance = "off"  # does each head matter (importance.parquet): off, atp (attribution), ablate (exact)
    ablate_top: int | None = None  # ablate: only the N heads of largest |AtP| on the mean sample (None: every head)
    importance_sample: int | None = None  # importance on a seeded sample of this many segments (None: all); means from it
    mask_rate: float = 0.15  # masked-LM target: share of real non-special tokens masked (80% [MASK], 10% random, 10% kept)
    similarity_sample: int | None = None  # head similarity (similarity.parquet) on a seeded sample of this many segments (None: off)
    sink: int = 64  # streaming: the first tokens a streaming head keeps (DuoAttention's deployment sink)
    recent: int = 256  # streaming: the last tokens it keeps, the query's own included (DuoAttention's recent window)

    def __post_init__(self):
        for name, values in choices().items():
            if getattr(self, name) not in values:
                raise ConfigError(f"{name} must be one of {', '.join(values)}; got {getattr(self, name)!r}", setting=name)
        for name, low in (("max_len", 4), ("batch_size", 1), ("max_offset", 1), ("seed", 0), ("window", 1),
                          ("sink", 0), ("recent", 1)):
            _whole(name, getattr(self, name), low)
        if self.query_chunk is not None:
            _whole("query_chunk", self.query_chunk, 1)
        if self.limit is not None:
            _whole("limit", self.limit, 1)
        if self.attention_budget is not None:
            _whole("attention_budget", self.attention_budget, 1)
        if self.importance_sample is not None:
            _whole("importance_sample", self.importance_sample, 1)
        if self.similarity_sample is not None:
            _whole("similarity_sample", self.similarity_sample, 1)
        if self.ablate_top is not None:
            _whole("ablate_top", self.ablate_top, 1)
            if self.importance != "ablate":
                raise ConfigError(f"ablate_top {self.ablate_top} picks the heads to ablate exactly, so it needs "
                                  f"importance 'ablate' (--importance ablate); got {self.importance!r}",
                                  setting="ablate_top")
        if isinstance(self.mask_rate, bool) or not isinstance(self.mask_rate, (int, float)) \
                or not 0 < self.mask_rate < 1:
            raise ConfigError(f"mask_rate must be a share between 0 and 1 (BERT's is 0.15), got {self.mask_rate!r}",
                              setting="mask_rate")
        _whole("bootstrap", self.bootstrap, 0)
        if 0 < self.bootstrap < MIN_BOOTSTRAP:
            raise ConfigError(f"bootstrap must be 0 (no intervals) or at least {MIN_BOOTSTRAP}, got {self.bootstrap}: "
                              f"fewer replicates cannot place the 2.5% and 97.5% points", setting="bootstrap")
        if self.device_map is not None and (not isinstance(self.device_map, str) or not self.device_map.strip()):
            raise ConfigError(f"device_map must be None or a Hugging Face device map name such as 'auto', got "
                              f"{self.device_map!r}", setting="device_map")
        control = (self.control,) if isinstance(self.control, str) else self.control
        if not isinstance(control, (tuple, list)) or any(c not in CONTROLS for c in control) or len(set(control)) < len(control):
            raise ConfigError(f"control must be a set of {', '.join(CONTROLS)} (each at most once), got {self.control!r}",
                              setting="control")
        object.__setattr__(self, "control", tuple(control))  # a list read back from run.json, or one name
        if self.control_seed is not None:
            _whole("control_seed", self.control_seed, 0)
        if self.document_field is not None and (not isinstance(self.document_field, str) or not self.document_field):
            raise ConfigError(f"document_field must be None or the name of a JSONL field, got {self.document_field!r}",
                              setting="document_field")
        if not isinstance(self.values, bool):
            raise ConfigError(f"values must be True or False, got {self.values!r}", setting="values")
        if self.prepend_bos not in (None, True, False):
            raise ConfigError(f"prepend_bos must be None, True or False, got {self.prepend_bos!r}", setting="prepend_bos")

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"control": list(self.control)}

    @property
    def controls_seed(self) -> int:
        """The seed the controls use: `control_seed`, else `seed`."""
        return self.seed if self.control_seed is None else self.control_seed


def control_name(model: str, control: str | None) -> str:
    """The name a control of `model` is swept under (its rows' ``model``); `model` itself for None.

    >>> control_name("minilm", "random-init"), control_name("minilm", "shuffled-words"), control_name("gpt2", None)
    ('minilm [random init]', 'minilm [shuffled words]', 'gpt2')
    """
    return model if control is None else f"{model} [{control.replace('-', ' ')}]"


def split_control(name: str) -> tuple[str, str | None]:
    """The model and the control (None for a trained model) a swept model's name stands for.

    >>> split_control("minilm [random init]"), split_control("path/to/gpt2")
    (('minilm', 'random-init'), ('path/to/gpt2', None))
    """
    for control in CONTROLS:
        suffix = f" [{control.replace('-', ' ')}]"
        if name.endswith(suffix):
            return name[: -len(suffix)], control
    return name, None


@dataclass(frozen=True)
class RetrievalConfig:
    """How ``headscan retrieval`` builds needle-in-a-haystack trials and decodes them (Wu et al. 2024).

    One trial per (length, depth, needle). Every field is checked when the config is made.

    >>> RetrievalConfig(lengths=(1024,), depths=(0.0, 0.5, 1.0)).lengths
    (1024,)
    >>> RetrievalConfig(depths=(1.5,))
    Traceback (most recent call last):
    ...
    headscan.errors.ConfigError: depths must lie between 0 and 1 (0: the needle opens the haystack, 1: it closes it); got 1.5
    """

    lengths: tuple[int, ...] = (1024, 2048)  # prompt lengths in tokens, template and question included (at most)
    depths: tuple[float, ...] = tuple(i / 10 for i in range(11))  # where the needle goes: 0 first, 1 last
    template: Template = "raw"  # "raw": haystack, then the question (Wu et al. on base models); "chat": chat template
    max_new_tokens: int = 50  # greedy decoding steps at most (Wu et al.: 50)
    gate: float = 0.5  # a trial counts when the answer's ROUGE-1 recall is above this (Wu et al.: 0.5)
    seed: int = 0  # where each trial's haystack starts in the corpus, and the bootstrap over trials
    bootstrap: int = 200  # resampling weights per trial for the 95% intervals; 0 turns intervals off
    interval: IntervalMethod = "studentized_symmetric"  # how replicates become a 95% interval
    device: Device = "auto"
    dtype: DType = "float32"
    prepend_bos: bool | None = None  # raw template: BOS before the prompt (None: the model's default, as a sweep)
    query_chunk: int = 128  # queries per block of the chunked prefill; scores do not depend on it (128: less
    # memory than 256 at 8k tokens, benchmarks/long_context.py --task retrieval)

    def __post_init__(self):
        for name, values in choices(RetrievalConfig).items():
            if getattr(self, name) not in values:
                raise ConfigError(f"{name} must be one of {', '.join(values)}; got {getattr(self, name)!r}", setting=name)
        for name in ("lengths", "depths"):
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise ConfigError(f"{name} must be a non-empty tuple, got {getattr(self, name)!r}", setting=name)
        for length in self.lengths:
            _whole("lengths", length, 64)
        if len(set(self.lengths)) != len(self.lengths) or len(set(self.depths)) != len(self.depths):
            raise ConfigError("lengths and depths must not repeat a value: each trial would be run twice",
                              setting="lengths")
        for depth in self.depths:
            if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
                raise ConfigError(f"depths must lie between 0 and 1 (0: the needle opens the haystack, 1: it closes "
                                  f"it); got {depth!r}", setting="depths")
        for name, low in (("max_new_tokens", 1), ("seed", 0), ("query_chunk", 1)):
            _whole(name, getattr(self, name), low)
        if isinstance(self.gate, bool) or not isinstance(self.gate, (int, float)) or not 0 <= self.gate < 1:
            raise ConfigError(f"gate must be a recall in [0, 1), got {self.gate!r}", setting="gate")
        _whole("bootstrap", self.bootstrap, 0)
        if 0 < self.bootstrap < MIN_BOOTSTRAP:
            raise ConfigError(f"bootstrap must be 0 (no intervals) or at least {MIN_BOOTSTRAP}, got {self.bootstrap}",
                              setting="bootstrap")
        if self.prepend_bos not in (None, True, False):
            raise ConfigError(f"prepend_bos must be None, True or False, got {self.prepend_bos!r}", setting="prepend_bos")

    def to_json(self) -> dict:
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in dataclasses.asdict(self).items()}


def _whole(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be a whole number >= {low}, got {value!r}", setting=name)


def choices(config: type = SweepConfig) -> dict[str, tuple[str, ...]]:
    """The settings of `config` (`SweepConfig` or `RetrievalConfig`) with a closed set of values, read from their
    `Literal` types.

    >>> choices()["specials"]
    ('keep', 'exclude')
    """
    hints = get_type_hints(config)
    return {name: get_args(hint) for name, hint in hints.items() if getattr(hint, "__origin__", None) is Literal}


def default(name: str, config: type = SweepConfig):
    """The default of setting `name` of `config`, for the command line's options."""
    field = next(f for f in dataclasses.fields(config) if f.name == name)
    return field.default


def hf_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` tells Hugging Face libraries not to reach the Hub (models and datasets alike)."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"}
