"""Settings: frozen dataclasses that check every setting once, so nothing downstream checks again.

`SweepConfig` holds a sweep's settings (`headscan.retrieval_config.RetrievalConfig`, declared the same way, those of the
needle-in-a-haystack trials of ``headscan retrieval``). Each setting is declared once, as its field
(`headscan.setting.option`): its command-line option (a `Setting`: group and help) and whether it enters the
fingerprint. The command line builds its options, in the fields' order, their choices and defaults from them, and
turns a `ConfigError` naming a setting (``max_len``) into one naming the flag (``--max-len``); the sweep's
fingerprint holds the settings declared to enter it. A setting of your own: `headscan.register_setting`. Inner
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
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args, get_type_hints

from .errors import ConfigError
from .setting import GROUPS, Setting, fill_added, option, settings
from .setting_values import check_whole, format_layers, parse_layers

__all__ = ["SweepConfig", "DEVICES", "DTYPES", "SPECIALS", "TEMPLATES", "CONTROLS", "MIN_BOOTSTRAP",
           "IMPORTANCE_METHODS", "IMPORTANCE_TARGETS", "GROUPS", "Setting", "choices", "settings", "control_name",
           "split_control", "control_number", "hf_offline", "option", "check_whole"]

Device = Literal["auto", "cpu", "cuda", "mps"]
DType = Literal["float32", "float16", "bfloat16", "float64"]
Specials = Literal["keep", "exclude"]
BootstrapUnit = Literal["auto", "segment", "document"]
Long = Literal["truncate", "split"]
IntervalMethod = Literal["studentized", "studentized_symmetric", "bca", "percentile", "delta"]  # intervals.METHODS
Attention = Literal["auto", "eager", "chunked"]
Pack = Literal["none", "sentences", "documents"]
Importance = Literal["off", "atp", "ablate"]
Composition = Literal["auto", "on", "off"]
Template = Literal["raw", "chat"]
DEVICES: tuple[str, ...] = get_args(Device)
DTYPES: tuple[str, ...] = get_args(DType)
SPECIALS: tuple[str, ...] = get_args(Specials)
BOOTSTRAP_UNITS: tuple[str, ...] = get_args(BootstrapUnit)
INTERVAL_METHODS: tuple[str, ...] = get_args(IntervalMethod)
# Control models swept beside each model: the same architecture with weights drawn from its config's
# own initialiser, and the trained model over the corpus with each segment's words permuted.
Control = Literal["random-init", "shuffled-words"]
CONTROLS: tuple[str, ...] = get_args(Control)

# Head importance (headscan.metrics.importance): how a head's removal is measured, and on what. "atp" estimates
# both ablations to first order from one backward pass; "ablate" also runs them exactly.
IMPORTANCE_METHODS = ("atp_mean", "atp_zero", "mean_ablation", "zero_ablation", "resample_ablation")
IMPORTANCE_TARGETS = ("next_token_loss", "masked_loss", "hidden_change")  # causal LM, trained MLM head, other encoders
TEMPLATES: tuple[str, ...] = get_args(Template)

# Fewer replicates than this cannot place a 2.5% point: with 19 the lowest replicate is already the 5% point.
MIN_BOOTSTRAP = 20


# Declared once for both configs: the command line shares these options between sweep and retrieval.
DEVICE = Setting("model", "Where the model runs: auto takes a GPU (cuda, then mps) where torch sees one.")
DTYPE = Setting("model", "Weights and activations (scores and sums stay float32 or float64).")
BOOTSTRAP = Setting("intervals", "Bootstrap replicates for the 95% intervals (0: none; else at least 20).")
INTERVAL = Setting("intervals", "How bootstrap replicates become a 95% interval.")


@dataclass(frozen=True)
class SweepConfig:
    """How a sweep reads the corpus and scores heads. Every field is checked when the config is made, and carries
    its command-line option (``settings(SweepConfig)["max_len"]``) and whether it enters the fingerprint
    (`headscan.setting.fingerprinted`). ``fingerprint=False`` marks a setting that changes no number a sweep's
    state holds, with why in a comment."""

    command: ClassVar[str] = "sweep"  # the command whose options these fields are, in this order
    max_len: int = option(128, "input", "Tokens per segment; longer ones are truncated.")
    long: Long = option("truncate", "input", "A segment longer than --max-len: 'truncate' cuts it, 'split' feeds it as "
                        "consecutive windows of --max-len tokens, each with the model's special tokens.")
    # not fingerprinted: scores do not depend on it (a test of test_sweep.py)
    batch_size: int = option(16, "model", "Segments per forward pass (scores do not depend on it).",
                             fingerprint=False)
    limit: int | None = option(None, "input", "Read at most this many segments.")
    device: Device = option("auto", DEVICE, fingerprint=False)  # where the model runs
    dtype: DType = option("float32", DTYPE)
    device_map: str | None = option(  # not fingerprinted: where the model's layers run
        None, "model", "Spread a model too large for one device over several: a Hugging Face device map name such "
        "as 'auto' (needs accelerate; replaces --device for the model's layers).", metavar="MAP", fingerprint=False)
    specials: Specials = option("keep", "input", "'exclude': special tokens ([CLS], [SEP], BOS) count neither as "
                                "queries nor keys, and each query's attention is renormalised over the keys left.")
    # causal models: None follows TransformerLens' default per model (the command line's 'auto')
    prepend_bos: bool | None = option(None, "input", "Causal models: put BOS before each segment ('auto' follows "
                                      "TransformerLens' default).", flag="--bos")
    max_offset: int = option(8, "scores", "K of the offset profile (offsets -K..K).")
    bootstrap: int = option(200, BOOTSTRAP)
    # seeds the bootstrap weights and nothing else: the forward pass is deterministic
    seed: int = option(0, "intervals", "Seed of the bootstrap.")
    # the sweep resolves "auto" and records why: headscan.scan.plan.resolve_unit
    bootstrap_unit: BootstrapUnit = option(
        "auto", "intervals", "What the bootstrap resamples: segments, or whole documents (CoNLL-U '# newdoc', a "
        "JSONL --document-field, blank-line paragraphs), whose sentences are not independent; 'auto': documents "
        "where the corpus has documents of several segments, else segments.")
    document_field: str | None = option(
        None, "input", "A .jsonl or hf: corpus: the field whose value marks each line's document (consecutive lines "
        "with equal values are one document; rows of an hf: corpus alike).", metavar="FIELD")
    # not fingerprinted: applied when the tables are finished, from the states' replicates
    interval: IntervalMethod = option("studentized_symmetric", INTERVAL, fingerprint=False)
    # not fingerprinted: applied when the tables are published, over every model of the run (headscan.metrics.nulls)
    fdr: float = option(0.05, "intervals", "False-discovery rate of the findings: Benjamini-Hochberg over every "
                        "tested row of heads, value and syntax, one family per model (headscan.metrics.nulls).",
                        metavar="Q", fingerprint=False)
    window: int = option(256, "run", "Segments added up per window: the unit of resuming (state is saved at "
                         "window ends).")
    pack: Pack = option("none", "input", "Long inputs: 'sentences' joins consecutive segments until each holds "
                        "--max-len words (so it fills --max-len tokens); 'documents' makes each document one segment "
                        "(use --long split).")
    attention: Attention = option(
        "auto", "model", "'eager' reads each layer's attention pattern from the model; 'chunked' lets the model run "
        "its fast attention and recomputes the pattern from queries and keys, --query-chunk rows at a time (long "
        "contexts); 'auto' goes chunked once one layer's patterns pass 32 MiB or would pass --attention-budget.")
    # None: as many as keep a block's weights within 8 MiB, at least 64 (headscan.models.chunked.block_rows): a
    # whole layer at ordinary lengths, 64 queries of a 4k-token smollm2 segment (a quarter of eager's memory,
    # faster than 512, whose temporaries are faulted in anew)
    query_chunk: int | None = option(None, "model", "Queries per block in chunked mode (scores do not depend on "
                                     "it). Default: as many as keep a block within 8 MiB, at least 64.")
    # not fingerprinted: it only chooses eager or chunked; the choice itself is the fingerprinted `attention`
    attention_budget: int | None = option(
        None, "model", "Memory one layer's eager attention (its patterns and the metrics' temporaries) may take "
        "before --attention auto goes chunked (default: by device).", metavar="MIB", fingerprint=False)
    values: bool = option(True, "scores", "Also score every head on value-weighted attention (value.parquet) and, "
                          "for causal models, its direct logit attribution (dla), in the same pass; --no-values "
                          "leaves both out.")
    # not fingerprinted: it adds models, each control swept as a model of its own, fingerprinted as model.control
    control: tuple[Control, ...] = option(
        (), "scores", "Also sweep a control beside each model, as a model of its own: 'random-init' (the same "
        "architecture and tokenizer, weights drawn from its config's initialiser; named 'MODEL [random init]') or "
        "'shuffled-words' (the model over the corpus with each segment's words permuted; 'MODEL [shuffled "
        "words]'). Repeat for both; each doubles the sweep's time.", fingerprint=False)
    # not fingerprinted: the controls' seed, fingerprinted per control model as model.control_seed
    control_seed: int | None = option(None, "scores", "Seed of the controls' weights and word orders (default: "
                                      "--seed).", metavar="SEED", fingerprint=False)
    # one random-init control is one draw of what an untrained network scores: the findings' null is the range
    # of several draws' heads, and with two or more each draw is checked against the others (held out). Not
    # fingerprinted: it adds random-init controls, each fingerprinted per control model as model.control_seed
    control_seeds: int = option(1, "scores", "How many random-init controls, seeds --control-seed, +1, ... (named "
                                "'MODEL [random init]', 'MODEL [random init 2]', ...). Their heads at each layer are "
                                "the null of every finding; with 2 or more, each control is tested against the "
                                "others. 5 is a good number.", metavar="N", fingerprint=False)
    importance: Importance = option(
        "off", "scores", "Does each head matter (importance.parquet): 'atp' estimates, for every head, the change of "
        "the model's loss when its output is replaced by its mean or by 0, from one backward pass per batch; "
        "'ablate' also replaces each head's output exactly, one head at a time (slow: two passes per head).")
    # names as given to --model: a control's name is refused, and a model's controls get no importance with it.
    # Not fingerprinted: resolved per model before fingerprinting (`for_swept`): a named model's fingerprint carries
    # --importance, every other model's that of a sweep without it (tests/test_importance_models.py)
    importance_models: tuple[str, ...] = option(
        (), "scores", "Measure --importance only for this model (as named by --model); repeat for several. Every "
        "other model of the sweep, and every control (random init, shuffled words), the named models' own "
        "included, is swept without importance. Default: every model and control.", metavar="MODEL",
        flag="--importance-model", fingerprint=False)
    ablate_top: int | None = option(None, "scores", "With --importance ablate: only the N heads of largest |AtP| "
                                    "(on the importance sample).", metavar="N")
    # the first position (BOS, [CLS]) is where many heads park attention: replacing it there measures that sink
    ablate_first: bool = option(False, "scores", "Importance: also replace a head's output at each segment's first "
                                "position (BOS, [CLS]); by default it is left alone and the mean a head is replaced "
                                "with is taken over the other positions.")
    importance_sample: int | None = option(
        None, "scores", "Measure importance on a seeded sample of N segments (default: all); each head's mean output "
        "comes from the same sample. The other tables still cover the whole corpus.", metavar="N")
    mask_rate: float = option(0.15, "scores", "Encoders with a trained masked-LM head: share of tokens masked for "
                              "the importance target (80% [MASK], 10% random, 10% kept, seeded per segment).")
    composition: Composition = option(
        "auto", "scores", "Composition scores (composition.parquet): how much each head's output feeds each later "
        "head's queries, keys and values, from the weights (Elhage et al. 2021), against random matrices of the same "
        "shapes. 'auto': for models of at most 144 heads (GPT-2 small's); 'on': any model; 'off'.")
    similarity_sample: int | None = option(
        None, "scores", "Head families (similarity.parquet): the mean Jensen-Shannon divergence between every pair "
        "of heads' attention over the queries of a seeded sample of N segments (Clark et al. 2019; default: off).",
        metavar="N")
    sink: int = option(64, "scores", "streaming: the first tokens a sink-and-window cache keeps (DuoAttention's "
                       "deployment value).")
    recent: int = option(256, "scores", "streaming: the last tokens it keeps, the query's own included "
                         "(DuoAttention's recent window).")
    examples: int = option(5, "scores", "Keep each head's K highest- and K lowest-scoring units (segments or "
                           "documents) of every heads.parquet metric, with their text, in examples.parquet (0: none).",
                           metavar="K")
    # read, hashed and executed once per process (`headscan.metrics.custom`): their metrics are swept like headscan's.
    # Not fingerprinted: it adds metrics, each fingerprinted by its columns and its text's sha256 (custom_metrics)
    metric_modules: tuple[str, ...] = option(
        (), "scores", "A Python file (or dotted module) of your own metrics, made with @headscan.pattern or "
        "@headscan.metric: swept like headscan's own, with chance, null and intervals, its text's sha256 in run.json. "
        "Repeat for several.", metavar="FILE", flag="--metric-module",
        fingerprint=False)
    # None: every layer. "0,5-7" is parsed here; the layer count is checked at planning, where the model is known
    layers: tuple[int, ...] | None = option(
        None, "model", "Sweep only these layers (from 0), e.g. '0,5-7': hooks and scores only there, so a large "
        "model costs less; `headscan merge` joins it with a sweep of the other layers into the whole model's "
        "tables (docs/distributed.md). Not with --importance or --similarity-sample, which need every layer.",
        metavar="LIST")
    # the values of the settings added from outside (`headscan.register_setting`), by name, every one filled in;
    # read as attributes (``config.my_setting``); no option of its own
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self):
        fill_added(self)
        for name, values in choices().items():
            if getattr(self, name) not in values:
                raise ConfigError(f"{name} must be one of {', '.join(values)}; got {getattr(self, name)!r}", setting=name)
        for name, low in (("max_len", 4), ("batch_size", 1), ("max_offset", 1), ("seed", 0), ("window", 1),
                          ("sink", 0), ("recent", 1)):
            check_whole(name, getattr(self, name), low)
        if self.query_chunk is not None:
            check_whole("query_chunk", self.query_chunk, 1)
        if self.limit is not None:
            check_whole("limit", self.limit, 1)
        if self.attention_budget is not None:
            check_whole("attention_budget", self.attention_budget, 1)
        if self.importance_sample is not None:
            check_whole("importance_sample", self.importance_sample, 1)
        if self.similarity_sample is not None:
            check_whole("similarity_sample", self.similarity_sample, 1)
        if self.ablate_top is not None:
            check_whole("ablate_top", self.ablate_top, 1)
            if self.importance != "ablate":
                raise ConfigError(f"ablate_top {self.ablate_top} picks the heads to ablate exactly, so it needs "
                                  f"importance 'ablate' (--importance ablate); got {self.importance!r}",
                                  setting="ablate_top")
        self._check_importance_models()
        if isinstance(self.mask_rate, bool) or not isinstance(self.mask_rate, (int, float)) \
                or not 0 < self.mask_rate < 1:
            raise ConfigError(f"mask_rate must be a share between 0 and 1 (BERT's is 0.15), got {self.mask_rate!r}",
                              setting="mask_rate")
        check_whole("bootstrap", self.bootstrap, 0)
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
        check_whole("examples", self.examples, 0)
        modules = (self.metric_modules,) if isinstance(self.metric_modules, str) else self.metric_modules
        if not isinstance(modules, (tuple, list)) or not all(isinstance(m, str) and m.strip() for m in modules):
            raise ConfigError(f"metric_modules must be file paths or module names, got {self.metric_modules!r}",
                              setting="metric_modules")
        object.__setattr__(self, "metric_modules", tuple(modules))
        if self.control_seed is not None:
            check_whole("control_seed", self.control_seed, 0)
        check_whole("control_seeds", self.control_seeds, 1)
        if isinstance(self.fdr, bool) or not isinstance(self.fdr, (int, float)) or not 0 < self.fdr < 1:
            raise ConfigError(f"fdr must be a rate between 0 and 1 (0.05 for 5%), got {self.fdr!r}", setting="fdr")
        if self.control_seeds > 1 and "random-init" not in self.control:
            raise ConfigError(f"control_seeds {self.control_seeds} counts random-init controls, so it needs "
                              "control 'random-init' (--control random-init)", setting="control_seeds")
        if self.document_field is not None and (not isinstance(self.document_field, str) or not self.document_field):
            raise ConfigError(f"document_field must be None or the name of a JSONL field, got {self.document_field!r}",
                              setting="document_field")
        if not isinstance(self.ablate_first, bool):
            raise ConfigError(f"ablate_first must be True or False, got {self.ablate_first!r}", setting="ablate_first")
        if not isinstance(self.values, bool):
            raise ConfigError(f"values must be True or False, got {self.values!r}", setting="values")
        if self.prepend_bos not in (None, True, False):
            raise ConfigError(f"prepend_bos must be None, True or False, got {self.prepend_bos!r}", setting="prepend_bos")
        if self.layers is not None:
            object.__setattr__(self, "layers", parse_layers(self.layers))
            # both rank or compare heads across every layer: a part of the layers cannot give its share of them
            for name, off, why in (("importance", "off", "ranks and ablates heads across the whole model"),
                                   ("similarity_sample", None, "compares every pair of heads, across layers")):
                if getattr(self, name) != off:
                    raise ConfigError(f"layers {format_layers(self.layers)}: {name} {why}, so it cannot be swept on "
                                      f"a part of the layers; sweep it without --layers", setting="layers")

    def _check_importance_models(self) -> None:
        names = (self.importance_models,) if isinstance(self.importance_models, str) else self.importance_models
        if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) and n.strip() for n in names):
            raise ConfigError(f"importance_models must be model names, got {self.importance_models!r}",
                              setting="importance_models")
        object.__setattr__(self, "importance_models", tuple(dict.fromkeys(names)))  # a list read back from run.json
        if names and self.importance == "off":
            raise ConfigError(f"importance_models {', '.join(self.importance_models)} names the models whose "
                              "importance is measured, but importance is off; add --importance atp or --importance "
                              "ablate", setting="importance_models")
        for name in names:
            model, control = split_control(name)
            if control is not None:
                raise ConfigError(f"importance_models: {name!r} is a control, and controls get no importance when "
                                  f"importance_models is given; name the trained model ({model!r}), or leave "
                                  "importance_models out to measure every model and control",
                                  setting="importance_models")

    def for_swept(self, name: str) -> SweepConfig:
        """This config as the swept model `name` (a model or a control: `control_name`) is swept with it. With
        `importance_models`, a model it does not name (every control among them) is swept without importance,
        the importance settings back at their defaults, so that its state is that of a sweep without importance.

        >>> config = SweepConfig(importance="ablate", importance_sample=8, importance_models=("minilm",))
        >>> config.for_swept("minilm").importance, config.for_swept("minilm [random init]").importance
        ('ablate', 'off')
        >>> config.for_swept("smollm2").importance_sample is None
        True
        """
        if not self.importance_models or name in self.importance_models:
            return self
        fields = ("importance", "ablate_top", "ablate_first", "importance_sample", "mask_rate", "importance_models")
        return dataclasses.replace(self, **{field: default(field) for field in fields})

    def to_json(self) -> dict:
        """The settings as run.json keeps them (``extra`` only where settings were added from outside)."""
        own = dataclasses.asdict(self) | {"control": list(self.control), "metric_modules": list(self.metric_modules),
                                          "layers": None if self.layers is None else list(self.layers),
                                          "importance_models": list(self.importance_models)}
        return own if self.extra else {k: v for k, v in own.items() if k != "extra"}

    def __getattr__(self, name: str):
        """An added setting's value (`headscan.register_setting`), as a field's would be read."""
        extra = vars(self).get("extra") or {}
        if name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def controls_seed(self) -> int:
        """The seed the controls use: `control_seed`, else `seed`."""
        return self.seed if self.control_seed is None else self.control_seed


def control_name(model: str, control: str | None, number: int = 1) -> str:
    """The name a control of `model` is swept under (its rows' ``model``); `model` itself for None. `number`
    counts random-init controls of different seeds (`SweepConfig.control_seeds`); the first has none in its name.

    >>> control_name("minilm", "random-init"), control_name("minilm", "shuffled-words"), control_name("gpt2", None)
    ('minilm [random init]', 'minilm [shuffled words]', 'gpt2')
    >>> control_name("minilm", "random-init", 3)
    'minilm [random init 3]'
    """
    if control is None:
        return model
    return f"{model} [{control.replace('-', ' ')}{'' if number == 1 else f' {number}'}]"


_CONTROL_SUFFIX = re.compile(r" \[(" + "|".join(c.replace("-", " ") for c in CONTROLS) + r")(?: ([2-9]|[1-9][0-9]+))?\]$")


def split_control(name: str) -> tuple[str, str | None]:
    """The model and the control (None for a trained model) a swept model's name stands for.

    >>> split_control("minilm [random init]"), split_control("path/to/gpt2"), split_control("m [random init 2]")
    (('minilm', 'random-init'), ('path/to/gpt2', None), ('m', 'random-init'))
    """
    found = _CONTROL_SUFFIX.search(name)
    if found is None:
        return name, None
    return name[: found.start()], found.group(1).replace(" ", "-")


def control_number(name: str) -> int:
    """Which of a model's random-init controls `name` is (1 for the first, and for any other name).

    >>> control_number("minilm [random init]"), control_number("minilm [random init 4]"), control_number("gpt2")
    (1, 4, 1)
    """
    found = _CONTROL_SUFFIX.search(name)
    return int(found.group(2)) if found is not None and found.group(2) else 1


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
