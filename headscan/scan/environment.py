"""What every run records about where it ran: the installed versions of headscan and the libraries that decide its
numbers, and the git revision of a checkout. Shared by every run that writes provenance (sweep, patch,
import-scores); this module runs no model.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from .. import __version__

__all__ = ["git_revision", "versions"]


def git_revision() -> str | None:
    """The commit of the git checkout headscan runs from; None where it is not one (an installed package)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        result = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


@functools.cache  # installed versions do not change while a process runs; looking them up takes ~10 ms
def versions() -> dict:
    """Python's, headscan's and each library's installed version (None where one is not installed)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version(), "headscan": __version__}
    for package in ("torch", "transformers", "transformer-lens", "numpy", "pandas"):
        try:
            versions[package.replace("-", "_")] = version(package)
        except PackageNotFoundError:
            versions[package.replace("-", "_")] = None
    return versions
