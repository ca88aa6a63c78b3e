"""Helpers to build checkpoints with known answers, for tests and for users who want to check headscan
(or their own metrics) against planted heads."""

from headscan.testing.checkpoints import build_tiny_checkpoint
from headscan.testing.planted import build_planted_checkpoint

__all__ = ["build_tiny_checkpoint", "build_planted_checkpoint"]
