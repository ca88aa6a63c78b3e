"""Confidence intervals for ratio metrics: bootstrap weights, one-pass moments, interval methods, support.

Every head metric is a ratio estimator. Over resampling units u (segments, or documents) the sweep gets a sum
s_u and a count c_u per head and score column, and the value is R = S / C = sum_u s_u / sum_u c_u. In the
same single pass it accumulates

- replicate totals S*_b = sum_u w_bu s_u and C*_b = sum_u w_bu c_u, with Poisson(1) weights w_bu from
  `bootstrap_weights` (a Poisson bootstrap: each unit enters replicate b w_bu times);
- each replicate's power sums sum_u w_bu s_u^2, w_bu s_u c_u and w_bu c_u^2 (`replicate_moments`), which give
  every replicate its own linearised variance: what a studentized interval needs;
- power sums of (s_u, c_u) from `unit_moments`, merged across batches or shards with `combine_moments`.

All of them are sums over units (or a maximum), so shards and windows add up to the whole exactly. `interval`
turns them into (low, high); `effective_units`, `variance_df` and `thin` say whether to trust it (`support` and
`thin_support`: a simpler rule on units and the largest unit's share, for tables without `thin`).

Which method should you use? ``"studentized_symmetric"`` (`DEFAULT_METHOD`), with `thin`: on parts of 30 whole
EWT documents it held the truth on 0.96 (dev) and 0.94 (test) of the rows `thin` trusts, where BCa held it on
0.89 and 0.87 of all rows. The other methods (``"studentized"``, ``"bca"``, ``"percentile"``, ``"delta"``), the
coverage measured per metric, what no method here can do and the references are in docs/intervals.md.

This module does not run models or know about heads: it takes arrays whose trailing axes are anything
(the sweep's are (layer, head, column)).
"""

from __future__ import annotations

from .discoveries import DISCOVERY_COLUMNS, add_discoveries, q_values
from .joint import joint_interval
from .methods import (
                      DEFAULT_METHOD,
                      METHODS,
                      interval,
                      nan_percentile,
                      order_quantile,
                      replicate_variances,
                      standard_error,
)
from .moments import (
                      MOMENT_TERMS,
                      REPLICATE_TERMS,
                      add_product,
                      bootstrap_weights,
                      combine_moments,
                      replicate_moments,
                      unit_moments,
)
from .pvalues import interval_se, t_p_value
from .support import (
                      MIN_EFFECTIVE_UNITS,
                      MIN_SPARSE_EVENNESS,
                      MIN_VARIANCE_DF,
                      THIN_MAX_SHARE,
                      THIN_MIN_UNITS,
                      at_bound,
                      effective_units,
                      support,
                      thin,
                      thin_support,
                      variance_df,
)

__all__ = [
    "MOMENT_TERMS",
    "REPLICATE_TERMS",
    "METHODS",
    "DEFAULT_METHOD",
    "THIN_MIN_UNITS",
    "THIN_MAX_SHARE",
    "MIN_EFFECTIVE_UNITS",
    "MIN_VARIANCE_DF",
    "MIN_SPARSE_EVENNESS",
    "bootstrap_weights",
    "unit_moments",
    "combine_moments",
    "replicate_moments",
    "add_product",
    "nan_percentile",
    "interval",
    "support",
    "effective_units",
    "variance_df",
    "thin",
    "thin_support",
    "at_bound",
    "order_quantile",
    "replicate_variances",
    "standard_error",
    "DISCOVERY_COLUMNS",
    "q_values",
    "add_discoveries",
    "interval_se",
    "t_p_value",
    "joint_interval",
]
