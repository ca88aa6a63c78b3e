"""Values of settings that take a little parsing: whole numbers and lists of layers.

`headscan.config` and `headscan.patching_config` check their settings with these, and the sweep checks a list
of layers against a model once it knows the model's layer count. This module imports no torch.
"""

from __future__ import annotations

from .errors import ConfigError

__all__ = ["check_whole", "parse_layers", "format_layers", "check_layers"]


def parse_layers(spec) -> tuple[int, ...]:
    """Layers from a spec such as ``"0,5-7"`` (or a list of numbers, as run.json gives them back), in order;
    a malformed spec, or a layer named twice, is a `ConfigError` naming it.

    >>> parse_layers("0,5-7"), parse_layers([3, 1]), format_layers((0, 5, 6, 7, 9))
    ((0, 5, 6, 7), (1, 3), '0,5-7,9')
    """
    found, parts = [], spec.split(",") if isinstance(spec, str) else None
    for low, dash, high in (part.strip().partition("-") for part in parts or ()):
        if low.isdigit() and (high.isdigit() or not dash) and int(high or low) >= int(low):
            found += range(int(low), int(high or low) + 1)
        else:
            found = []
            break
    if parts is None and isinstance(spec, (list, tuple)) and all(type(x) is int and x >= 0 for x in spec):
        found = list(spec)
    twice = sorted({layer for layer in found if found.count(layer) > 1})
    if not found or twice:
        raise ConfigError(f"layers must be layer numbers from 0 and ranges A-B with A <= B, separated by commas "
                          f"(e.g. 0,5-7); got {spec!r}" + (f": layer {twice[0]} is named twice" if twice else ""),
                          setting="layers")
    return tuple(sorted(found))


def format_layers(layers) -> str:
    """Layers as a spec, ranges joined (the inverse of `parse_layers`)."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        runs[-1:] = [runs[-1] + [layer]] if runs and layer == runs[-1][-1] + 1 else [*runs[-1:], [layer]]
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def check_layers(layers: tuple[int, ...] | None, n_layers: int, model: str) -> tuple[int, ...]:
    """The layers a sweep of `model` (of `n_layers` layers) scores: `layers`, or all of them for None.

    >>> check_layers((0, 5, 6, 7), 6, "minilm")
    Traceback (most recent call last):
    ...
    headscan.errors.ConfigError: layers 0,5-7: minilm has 6 layers (0-5); layers 6-7 out of range
    """
    outside = [layer for layer in layers or () if layer >= n_layers]
    if outside:
        raise ConfigError(f"layers {format_layers(layers)}: {model} has {n_layers} layers (0-{n_layers - 1}); "
                          f"layer{'s' if len(outside) > 1 else ''} {format_layers(outside)} out of range",
                          setting="layers")
    return tuple(range(n_layers)) if layers is None else tuple(layers)


def check_whole(name: str, value, low: int) -> None:
    """Refuse anything but a whole number of at least `low` (a bool is not one), naming the setting."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be a whole number >= {low}, got {value!r}", setting=name)
