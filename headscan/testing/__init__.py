"""Checkpoints with known answers: planted heads, and a tiny checkpoint of every supported architecture.

For tests, and for users who want to check headscan (or their own metrics) against planted heads; the tiny
checkpoints of every supported architecture family (`ARCHITECTURES`) are the support matrix that
tests/test_architectures.py verifies.
"""

from headscan.testing.architectures import ARCHITECTURES, build_architecture_checkpoint, support_matrix_markdown
from headscan.testing.checkpoints import build_tiny_checkpoint
from headscan.testing.planted import build_planted_checkpoint, build_retrieval_checkpoint

__all__ = ["build_tiny_checkpoint", "build_planted_checkpoint", "build_retrieval_checkpoint",
           "build_architecture_checkpoint", "ARCHITECTURES", "support_matrix_markdown"]
