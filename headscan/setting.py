"""A setting declared once: the field of a config that holds it says everything else about it.

A config (`headscan.config.SweepConfig`, `headscan.retrieval_config.RetrievalConfig`,
`headscan.patching_config.PatchConfig`) is a frozen dataclass whose ``command`` names the command that takes its
settings. Each field is made by `option`, which records in the field's metadata

- its command-line option (a `Setting`: group, help, and a flag or metavar where not derived from the field), from
  which `headscan.cli_options` builds the command's option, its --help and docs/options.md;
- whether it enters the fingerprint (``fingerprint=False``: a setting that changes no number a run keeps), from
  which a sweep's saved states, and retrieval's and patching's kept trials, are fingerprinted (`fingerprinted`).

A setting added from outside the package (`headscan.register_setting`) is an `AddedSetting` here, in `ADDED`: the
config takes it as a keyword (`with_settings`), holds its value in ``config.extra`` and hands it out as an
attribute (``config.my_setting``), and it is an option of its command and part of the fingerprint like a field.

This module imports no torch and nothing of headscan but its errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from .errors import ConfigError

__all__ = ["GROUPS", "Setting", "option", "settings", "fingerprinted", "AddedSetting", "ADDED", "added",
           "fill_added", "with_settings"]

# The groups options are listed under in --help and docs/options.md, in this order.
GROUPS = ("input", "model", "scores", "intervals", "trials", "run")


@dataclass(frozen=True)
class Setting:
    """How a config field is offered on the command line and in docs/options.md: the group it is listed under,
    its help, and its flag and metavar where they are not derived from the field (``max_len``: ``--max-len``)."""

    group: str  # one of GROUPS
    help: str
    flag: str | None = None
    metavar: str | None = None

    def __post_init__(self):
        if self.group not in GROUPS:  # a typo in a declaration, caught when headscan is imported
            raise ValueError(f"group must be one of {', '.join(GROUPS)}, got {self.group!r}")


def option(default, setting: Setting | str, help: str = "", *, fingerprint: bool = True, **more):
    """A dataclass field that carries its command-line declaration (`setting`, or a group and help) and whether
    it enters the fingerprint (by default it does: a setting left out must say why it changes no number)."""
    if isinstance(setting, str):
        setting = Setting(setting, help, **more)
    return dataclasses.field(default=default, metadata={"setting": setting, "fingerprint": fingerprint})


@dataclass(frozen=True)
class AddedSetting:
    """A setting added to a command's config from outside the package (`headscan.register_setting`)."""

    name: str
    default: Any
    type: Any  # as a field's annotation: int, float, str, bool, bool | None, Literal[...], int | None, ...
    setting: Setting
    command: str  # the command whose config takes it ("sweep")
    fingerprint: bool = True
    check: Callable[[Any], None] | None = None  # raises ConfigError for a value it refuses

    def checked(self, value):
        """`value`, or a ConfigError naming the setting."""
        if get_origin(self.type) is Literal and value not in get_args(self.type):
            raise ConfigError(f"{self.name} must be one of {', '.join(map(str, get_args(self.type)))}; got "
                              f"{value!r}", setting=self.name)
        if self.check is not None:
            self.check(value)
        return value


# command -> name -> the settings added to that command's config, in the order they were registered
ADDED: dict[str, dict[str, AddedSetting]] = {}


def added(command: str) -> dict[str, AddedSetting]:
    """The settings added to `command`'s config, by name (empty when none were)."""
    return ADDED.get(command, {})


def settings(config: type) -> dict[str, Setting]:
    """Each field of `config` and its command-line declaration, in order (not those added from outside)."""
    return {field.name: field.metadata["setting"] for field in dataclasses.fields(config) if "setting" in field.metadata}


def fingerprinted(config: type) -> tuple[str, ...]:
    """The settings of `config` that enter its fingerprint, in order: its fields declared so, then those added to
    its command that are."""
    own = tuple(f.name for f in dataclasses.fields(config) if f.metadata.get("fingerprint"))
    return own + tuple(name for name, one in added(config.command).items() if one.fingerprint)


def fill_added(config) -> None:
    """Check ``config.extra`` (given values of added settings) and fill in the defaults of those not given; called
    by a config's ``__post_init__``."""
    given, known = dict(config.extra), added(config.command)
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not a setting of headscan {config.command}: none was registered "
                          f"under that name (import the module that calls headscan.register_setting first; "
                          f"registered: {', '.join(known) or 'none'})", setting=unknown[0])
    object.__setattr__(config, "extra", {name: one.checked(given[name]) if name in given else one.default
                                         for name, one in known.items()})


def with_settings(config, values: dict):
    """`config` with `values` (by the names of its fields or of settings added to its command) in place; a
    `ConfigError` for a name that is neither."""
    fields, extra = list(settings(type(config))), added(type(config).command)
    unknown = sorted(set(values) - set(fields) - set(extra))
    if unknown:
        raise ConfigError(f"unknown setting(s) {unknown}; {type(config).__name__} has {', '.join([*fields, *extra])}")
    changes = {name: value for name, value in values.items() if name in fields}
    if set(values) - set(fields):
        changes["extra"] = {**config.extra, **{name: values[name] for name in values if name in extra}}
    return dataclasses.replace(config, **changes)
