"""The report's sections as registered objects: each has a name, says when it is shown and builds its part.

A section is a `Section`: its `name` (the progress line ``report: NAME`` and its key in `SECTIONS`), its
`order` on the page, `shown(comparison)` (whether the runs hold what it draws) and `build(context)`, which
returns document blocks (`headscan.report.document`: each renders to both the HTML page and the Markdown) and
adds its figures to ``context.pngs``. `headscan.report.build.build_report` builds every shown section in order.

Each module of this package registers one section; a user (or a test) registers another the same way, without
editing headscan::

    >>> from headscan.report.document import Heading, Text
    >>> from headscan.report.sections import SECTIONS, register_section
    >>> @register_section("token counts", order=900, shown=lambda comparison: "offsets" in comparison.frames)
    ... def token_counts(context):
    ...     return [Heading(2, "Token counts"), Text(f"{len(context.comparison.models)} models.")]
    >>> SECTIONS["token counts"].order
    900
    >>> del SECTIONS["token counts"]

This package holds the registry only; the sections' own modules are imported by `headscan.report.build`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...errors import ConfigError

if TYPE_CHECKING:  # the report only reads what headscan.report.examples computed; it never imports the models
    from ...analysis.runs import Comparison
    from ..examples import Examples
    from ..figures import Pngs

__all__ = ["Context", "Section", "SECTIONS", "register_section", "shown_sections"]

LAST = 1000  # the order of the runs, models and definitions, which end the report
DEFAULT_ORDER = 900  # a section registered without an order comes after the built-in ones, before the provenance


@dataclass(frozen=True)
class Context:
    """What every section is built from: the runs side by side and the report's settings."""

    comparison: Comparison
    pngs: Pngs  # figure file name -> PNG bytes; a section adds its figures here
    palette: dict = field(default_factory=dict)  # model name -> colour, the same in every figure
    top: int = 10  # heads listed per metric and model
    examples: Examples | None = None  # the example attention, computed beforehand (headscan.report.examples)
    title: str = "headscan report"


def _always(comparison: Comparison) -> bool:
    return True


@dataclass(frozen=True)
class Section:
    """One part of the report: `build(context)` returns its document blocks and adds its figures to
    ``context.pngs``; it is built only where `shown(comparison)` is true."""

    name: str
    build: Callable[[Context], list]
    order: float = DEFAULT_ORDER
    shown: Callable[[Comparison], bool] = _always


SECTIONS: dict[str, Section] = {}  # name -> section, in the order registered (the report sorts them by `order`)


def register_section(name: str, *, order: float = DEFAULT_ORDER,
                     shown: Callable[[Comparison], bool] | None = None):
    """Register the decorated function, ``build(context) -> list of blocks``, as the report section `name`.

    Parameters
    ----------
    name : str
        The section's name: the progress line ``report: NAME`` and its key in `SECTIONS`.
    order : float, default 900
        Where it goes: sections are built in increasing order (the atlas 10, the figure sections 30 to 150, the
        runs and definitions 1000); equal orders keep the order of registration.
    shown : callable, optional
        ``shown(comparison) -> bool``: whether the runs hold what the section draws; by default always.

    Raises
    ------
    ConfigError
        `name` is registered already.
    """
    if name in SECTIONS:
        raise ConfigError(f"report section {name!r} is registered already (by {SECTIONS[name].build.__module__}); "
                          "choose another name, or delete SECTIONS[name] first to replace it")

    def register(build: Callable[[Context], list]) -> Callable[[Context], list]:
        SECTIONS[name] = Section(name, build, order, shown or _always)
        return build

    return register


def shown_sections(comparison: Comparison) -> list[Section]:
    """The registered sections that `comparison` has, in their order."""
    return [s for s in sorted(SECTIONS.values(), key=lambda s: s.order) if s.shown(comparison)]
