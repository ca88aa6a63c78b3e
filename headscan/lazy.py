"""Lazy package names: a package's public names, each imported from its module on first use.

Importing the package (for ``--help``, or to check a spec) then does not load torch.

>>> import headscan.corpus
>>> "batches" in dir(headscan.corpus)
True
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable

__all__ = ["lazy_names"]


def lazy_names(package: str, modules: dict[str, str], public: Iterable[str]) -> tuple[Callable, Callable]:
    """The module-level ``__getattr__`` and ``__dir__`` of `package`: each name of `modules` ({name: module
    within the package}) is imported from its module when first asked for; `public` (its ``__all__``) is listed
    by ``dir`` beside what the package already holds."""
    public = list(public)

    def __getattr__(name: str):
        if name in modules:
            return getattr(importlib.import_module(f"{package}.{modules[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(public))

    return __getattr__, __dir__
