"""Moved to `headscan.scan` (`headscan.scan.run`); kept so that ``from headscan.jobs import sweep, merge`` works."""

from .scan import merge, partial_folder, sweep  # noqa: F401
from .errors import SweepInterrupted  # noqa: F401
