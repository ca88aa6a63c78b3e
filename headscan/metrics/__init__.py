"""Head metrics: pure, vectorised functions of one layer's attention, each registered once with its definition.

Importing this package imports every built-in metric module (`attention`, `streaming`, `values`, `output_norm`,
`sink_ratio`, `attended_logit`, `syntax`, `retrieval`, `importance`, in that order: the registry's order), so
the registry is complete however it is reached. `importance` scores a model's output with a head removed rather than an attention pattern. `batch` is
the metrics' view of a layer's attention, `registry` the registry itself.
"""

# Each module registers its metrics as it is imported; the registry's order is the order of the tables' rows, so
# these imports keep their order.
from . import attention, streaming, values, output_norm, sink_ratio, attended_logit  # noqa: F401  # isort: skip
from . import syntax, retrieval, importance  # noqa: F401  # isort: skip
from .attention import buckets
from .batch import AttentionBatch, mean_over_queries, offset_range
from .registry import (
    CAPTURED,
    CONDITIONS,
    DECODED,
    METRICS,
    Axis,
    Metric,
    definitions_markdown,
    describe,
    get_metric,
    metric_names,
    register,
)

__all__ = ["AttentionBatch", "Axis", "Metric", "METRICS", "CONDITIONS", "CAPTURED", "DECODED", "register", "get_metric",
           "metric_names", "describe", "offset_range", "mean_over_queries", "buckets", "definitions_markdown"]
