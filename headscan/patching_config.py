"""How ``headscan patch`` runs contrastive patching: the settings of `PatchConfig`, checked when it is made.

Kept beside `headscan.config` (whose `option` declares each setting's command-line option) rather than in it,
so that each config module stays one concept."""

from __future__ import annotations

import dataclasses
import re
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
    option,
)
from .errors import ConfigError
from .setting_values import check_whole

__all__ = ["PatchConfig", "parse_path"]

_PATH = re.compile(r"^L(\d+)H(\d+)>L(\d+)H(\d+)(?::([qkv]))?$")


def parse_path(text: str) -> list[tuple[tuple[int, int], tuple[int, int], str]]:
    """The (sender, receiver, path) triples one ``--path`` names: ``L0H0>L1H0`` (through q, k and v) or
    ``L0H0>L1H0:k``; 0-indexed labels.

    >>> parse_path("L0H0>L1H0:k")
    [((0, 0), (1, 0), 'k')]
    >>> parse_path("L3H1>L2H0")
    Traceback (most recent call last):
    ...
    headscan.errors.ConfigError: paths: L3H1>L2H0 runs from layer 3 to layer 2; a receiver must sit in a later layer than its sender
    """
    found = _PATH.match(text.strip())
    if found is None:
        raise ConfigError(f"paths: {text!r} is not SENDER>RECEIVER[:q|k|v] with 0-indexed labels, e.g. L0H0>L1H0:k",
                          setting="paths")
    sl, sh, rl, rh = (int(found.group(i)) for i in range(1, 5))
    if rl <= sl:
        raise ConfigError(f"paths: {text} runs from layer {sl} to layer {rl}; a receiver must sit in a later layer "
                          f"than its sender", setting="paths")
    kinds = [found.group(5)] if found.group(5) else ["q", "k", "v"]
    return [((sl, sh), (rl, rh), kind) for kind in kinds]


@dataclass(frozen=True)
class PatchConfig:
    """How ``headscan patch`` patches heads and paths between clean and corrupted prompts.

    >>> PatchConfig(path_top=2).path_top
    2
    >>> PatchConfig(batch_size=0)
    Traceback (most recent call last):
    ...
    headscan.errors.ConfigError: batch_size must be a whole number >= 1, got 0
    """

    command: ClassVar[str] = "patch"  # the command whose options these fields are, in this order
    batch_size: int = option(8, "model", "Pairs per forward pass.")
    by_position: bool = option(False, "scores", "Also patch each head at each position alone (pairs must all have "
                               "the same number of tokens; one pass per head and position).")
    position_top: int = option(0, "scores", "Also patch the N heads that restore the most (exact denoising over "
                               "every pair) at each position alone (pairs of one length; 2 passes per head, position "
                               "and batch; 0: none).", metavar="N")
    attribution: bool = option(True, "scores", "Estimate every head's effect by attribution patching (AtP), beside "
                               "the exact patches, with its recall of their top heads.")
    path_top: int = option(0, "scores", "Path patching between the N heads that restore the most (exact "
                           "denoising) as senders and as receivers, through queries, keys and values (0: none).",
                           metavar="N")
    paths: tuple[str, ...] = option((), "scores", "Patch this path too: SENDER>RECEIVER[:q|k|v], 0-indexed "
                                    "(L0H0>L1H0:k); repeat for several.", metavar="PATH")
    # not fingerprinted (a kept step is reused across them): the bootstrap and where the model runs only read or
    # make the patches' numbers, which do not depend on them
    seed: int = option(0, "intervals", "Seed of the bootstrap over pairs.", fingerprint=False)
    bootstrap: int = option(200, BOOTSTRAP, fingerprint=False)  # over pairs, the bootstrap unit of patching
    interval: IntervalMethod = option("studentized_symmetric", INTERVAL, fingerprint=False)
    device: Device = option("auto", DEVICE, fingerprint=False)
    dtype: DType = option("float32", DTYPE)

    def __post_init__(self):
        for name, low in (("batch_size", 1), ("path_top", 0), ("position_top", 0), ("seed", 0), ("bootstrap", 0)):
            check_whole(name, getattr(self, name), low)
        if 0 < self.bootstrap < MIN_BOOTSTRAP:
            raise ConfigError(f"bootstrap must be 0 (no intervals) or at least {MIN_BOOTSTRAP}, got {self.bootstrap}",
                              setting="bootstrap")
        for name in ("by_position", "attribution"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}", setting=name)
        if self.by_position and self.position_top:
            raise ConfigError("position_top: --by-position already patches every head at each position; use one of "
                              "them", setting="position_top")
        if not isinstance(self.paths, tuple):
            raise ConfigError(f"paths must be a tuple of SENDER>RECEIVER strings, got {self.paths!r}", setting="paths")
        for text in self.paths:
            parse_path(text)

    def named_paths(self) -> list[tuple[tuple[int, int], tuple[int, int], str]]:
        return [triple for text in self.paths for triple in parse_path(text)]

    def to_json(self) -> dict:
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in dataclasses.asdict(self).items()}
