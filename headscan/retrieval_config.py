"""The settings of ``headscan retrieval``: how needle-in-a-haystack trials are built and decoded (Wu et al. 2024),
and the masking test beside them. Declared like `headscan.config.SweepConfig`'s, each field once with its option.

This module imports no torch: ``headscan --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .config import (
    BOOTSTRAP,
    DEVICE,
    DTYPE,
    INTERVAL,
    MIN_BOOTSTRAP,
    Device,
    DType,
    IntervalMethod,
    Template,
    choices,
    option,
)
from .errors import ConfigError
from .setting_values import check_whole

__all__ = ["RetrievalConfig", "ImportConfig"]


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

    command: ClassVar[str] = "retrieval"  # the command whose options these fields are, in this order
    lengths: tuple[int, ...] = option((1024, 2048), "trials", "Prompt lengths in tokens (template and question "
                                      "included).", metavar="N,N")
    depths: tuple[float, ...] = option(tuple(i / 10 for i in range(11)), "trials", "Needle depths: 0 opens the "
                                       "haystack, 1 closes it.", metavar="D,D")
    template: Template = option("raw", "trials", "'raw': haystack then question (Wu et al. on base models); 'chat': "
                                "the tokenizer's chat template.")
    max_new_tokens: int = option(50, "trials", "Greedy steps at most.")  # Wu et al.: 50
    gate: float = option(0.5, "trials", "A trial counts when the answer's ROUGE-1 recall is above this.")  # Wu et al.
    seed: int = option(0, "intervals", "Seed of the haystacks' starts and the bootstrap.")
    # not fingerprinted (a kept trial is reused across them): the bootstrap only reads the trials, and where the
    # model runs changes none
    bootstrap: int = option(200, BOOTSTRAP, fingerprint=False)  # over trials, the bootstrap unit of retrieval
    interval: IntervalMethod = option("studentized_symmetric", INTERVAL, fingerprint=False)
    device: Device = option("auto", DEVICE, fingerprint=False)
    dtype: DType = option("float32", DTYPE)
    prepend_bos: bool | None = option(None, "input", "Raw template: put BOS before the prompt ('auto' follows the "
                                      "model's sweep default).", flag="--bos")
    # 128: less memory than 256 at 8k tokens (benchmarks/long_context.py --task retrieval)
    query_chunk: int = option(128, "model", "Queries per block of the chunked prefill (scores do not depend on it).",
                              fingerprint=False)
    # the masking test (Wu et al.'s needle_in_haystack_with_mask.py): off unless one of the two counts is set. Not
    # in the unmasked trials' fingerprint, as they change none: the masked trials' own (headscan.scan.masking)
    mask_top: int = option(0, "trials", "Also decode every trial with the top K retrieval heads masked (their "
                           "output z zeroed at every position, prefill and decoding); 0: no masking test.",
                           metavar="K", fingerprint=False)
    mask_random: int = option(0, "trials", "Also decode every trial with K random heads masked, one from the layer of "
                              "each of the top K retrieval heads, never a top head; 0: none.", metavar="K",
                              fingerprint=False)
    mask_draws: int = option(20, "trials", "Seeded draws of --mask-random heads, each decoding every masked trial "
                             "once; the top set's drop is ranked among theirs, so N draws allow a p-value down to "
                             "1/(N+1) (19: 0.05).", fingerprint=False)
    mask_from: str | None = option(None, "trials", "Rank the heads to mask by the retrieval scores of this earlier "
                                   "headscan retrieval output folder, run on other needles, and mask every trial "
                                   "(default: rank on this run's even needles, mask its odd ones' trials).",
                                   metavar="FOLDER", fingerprint=False)

    def __post_init__(self):
        for name, values in choices(RetrievalConfig).items():
            if getattr(self, name) not in values:
                raise ConfigError(f"{name} must be one of {', '.join(values)}; got {getattr(self, name)!r}", setting=name)
        for name in ("lengths", "depths"):
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise ConfigError(f"{name} must be a non-empty tuple, got {getattr(self, name)!r}", setting=name)
        for length in self.lengths:
            check_whole("lengths", length, 64)
        if len(set(self.lengths)) != len(self.lengths) or len(set(self.depths)) != len(self.depths):
            raise ConfigError("lengths and depths must not repeat a value: each trial would be run twice",
                              setting="lengths")
        for depth in self.depths:
            if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
                raise ConfigError(f"depths must lie between 0 and 1 (0: the needle opens the haystack, 1: it closes "
                                  f"it); got {depth!r}", setting="depths")
        for name, low in (("max_new_tokens", 1), ("seed", 0), ("query_chunk", 1)):
            check_whole(name, getattr(self, name), low)
        if isinstance(self.gate, bool) or not isinstance(self.gate, (int, float)) or not 0 <= self.gate < 1:
            raise ConfigError(f"gate must be a recall in [0, 1), got {self.gate!r}", setting="gate")
        check_whole("bootstrap", self.bootstrap, 0)
        if 0 < self.bootstrap < MIN_BOOTSTRAP:
            raise ConfigError(f"bootstrap must be 0 (no intervals) or at least {MIN_BOOTSTRAP}, got {self.bootstrap}",
                              setting="bootstrap")
        if self.prepend_bos not in (None, True, False):
            raise ConfigError(f"prepend_bos must be None, True or False, got {self.prepend_bos!r}", setting="prepend_bos")
        self._check_masking()

    def _check_masking(self) -> None:
        for name, low in (("mask_top", 0), ("mask_random", 0), ("mask_draws", 1)):
            check_whole(name, getattr(self, name), low)
        if self.mask_from is not None and not (isinstance(self.mask_from, str) and self.mask_from):
            raise ConfigError(f"mask_from must be a folder, got {self.mask_from!r}", setting="mask_from")
        if self.mask_from is not None and not self.masking:
            raise ConfigError("mask_from names the scores to rank heads by, but nothing is masked; add --mask-top K "
                              "or --mask-random K", setting="mask_from")

    @property
    def masking(self) -> bool:
        """Whether the run adds the masking test (`headscan.scan.masking`)."""
        return self.mask_top > 0 or self.mask_random > 0

    def to_json(self) -> dict:
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class ImportConfig:
    """The settings of ``headscan import-scores``: the bootstrap over a published file's trials, made as
    ``headscan retrieval`` makes its own (`headscan.scan.published`).

    >>> ImportConfig(bootstrap=50).to_json()
    {'bootstrap': 50, 'interval': 'studentized_symmetric', 'seed': 0}
    """

    command: ClassVar[str] = "import-scores"
    seed: int = option(0, "intervals", "Seed of the bootstrap over trials.")
    # not fingerprinted: the bootstrap only reads the file's trials
    bootstrap: int = option(200, BOOTSTRAP, fingerprint=False)
    interval: IntervalMethod = option("studentized_symmetric", INTERVAL, fingerprint=False)

    def __post_init__(self):
        if self.interval not in choices(ImportConfig)["interval"]:
            raise ConfigError(f"interval must be one of {', '.join(choices(ImportConfig)['interval'])}; got "
                              f"{self.interval!r}", setting="interval")
        check_whole("seed", self.seed, 0)
        check_whole("bootstrap", self.bootstrap, 0)
        if 0 < self.bootstrap < MIN_BOOTSTRAP:
            raise ConfigError(f"bootstrap must be 0 (no intervals) or at least {MIN_BOOTSTRAP}, got {self.bootstrap}",
                              setting="bootstrap")

    @classmethod
    def of(cls, config: RetrievalConfig | ImportConfig | None) -> ImportConfig:
        """The import settings of `config` (a retrieval run's bootstrap, interval and seed), or the defaults."""
        if config is None or isinstance(config, ImportConfig):
            return config or cls()
        return cls(seed=config.seed, bootstrap=config.bootstrap, interval=config.interval)

    def to_json(self) -> dict:
        """As run.json keeps them (the order import-scores has always written)."""
        return {name: getattr(self, name) for name in ("bootstrap", "interval", "seed")}
