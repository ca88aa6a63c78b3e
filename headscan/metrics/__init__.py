"""Head metrics: pure, vectorised functions of one layer's attention, registered once by name.

Importing this package imports every built-in metric module, so the registry is complete however it is reached.
"""

from . import attention, syntax, values  # noqa: F401  (each registers its metrics)
from .attention import (METRICS, AttentionBatch, Axis, Metric, buckets, definitions_markdown, get_metric, metric_names,
                        offset_range, register)

__all__ = ["AttentionBatch", "Axis", "Metric", "METRICS", "register", "get_metric", "metric_names", "offset_range",
           "buckets", "definitions_markdown"]
