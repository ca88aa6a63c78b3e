"""Moved to `headscan.report.examples`; kept so that ``from headscan.examples import compute_examples`` works."""

from .report.examples import *  # noqa: F401,F403
from .report.examples import __all__  # noqa: F401
