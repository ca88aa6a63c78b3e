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
`thin_support` are the previous rule's).

Which method should you use?
----------------------------
``"studentized_symmetric"`` (`DEFAULT_METHOD`), with `thin`. Measured two ways (``experiments/``):

- Real attention, the issue-20 protocol (``interval_coverage.py``): parts of N whole EWT documents, the truth
  the whole split's value. On 200 random parts of 30 documents, minilm, rows of heads.parquet and
  offsets.parquet: BCa, the previous default, held the truth 0.89 (dev) and 0.87 (test) of the time, 0.55-0.60
  for induction and duplicate_token; the symmetric studentized interval 0.93 and 0.91, and 0.96 and 0.94 on the
  rows `thin` trusts (21% flagged; every natural-text induction and duplicate_token row among them). See
  ``reports/experiments/interval_coverage/coverage.md`` for every metric, both models, N = 10, 30, 100.
- Simulation (``interval_simulation.py``, 2,000 corpora a cell, 200 replicates): on 30 heavy-tailed documents
  (lengths like EWT's) 0.94 against 0.89 for BCa; 0.94-0.97 on the light, sparse and clustered scenarios.

The methods:

- ``"studentized_symmetric"``: the symmetric bootstrap-t (Hall 1988): R +- t SE, t the 95% point of |T*_b|,
  T*_b = (R*_b - R) / SE*_b with each replicate's own SE. A t-type interval widens where the SE itself is
  unsure (few effective units, a few long documents), which is what percentile intervals miss on small corpora
  of uneven documents; symmetric, its coverage error is an order smaller than the equal-tailed one's.
- ``"studentized"``: the equal-tailed bootstrap-t (Efron & Tibshirani 1993, 12.5). Better where the ratio is
  skewed (sparse metrics: 0.97 against 0.96 on the sparse scenario with 100 segments, 0.61 against 0.54 on the
  rare one), a point or so worse on heavy-tailed documents.
- ``"bca"``: the bias-corrected and accelerated percentile interval (Efron 1987), the default before issue 20.
  A percentile method: its width is the replicates' spread, which on 30 uneven documents is too narrow.
- ``"percentile"``: the 2.5% and 97.5% points of the replicate ratios.
- ``"delta"``: R +- z SE with the infinitesimal-jackknife SE and n/(n - 1); no replicates.

Replicate quantiles are read at position (B + 1) q (`order_quantile`) in the studentized methods; BCa and
percentile keep numpy's (B - 1) q + 1, which lies a whole replicate inside and costs about a point of coverage
at B = 200 (0.935 against 0.948 on the light scenario). More replicates buy little once that is done: 1,000
instead of 200 moved the studentized intervals by under a point on the heavy-tailed documents.

Candidates that lost (same protocol, minilm, parts of 30, no rule): BCa with the n/(n - 1) correction and t on
n - 1 units, 0.92 dev and 0.90 test; the delta method with t on n - 1, 0.89 and 0.87; the exact delete-one
jackknife and CR2 cluster-robust SEs with t (Bell-McCaffrey degrees of freedom), which need every unit's sums
(not one pass), 0.91-0.93 and 0.91.

What no method here can do
--------------------------
- Units must be independent, and sentences of one document are not. Resampling the sentences of clustered
  documents gave 0.58-0.61 coverage with every method; resample documents.
- A rare kind of unit that carries much of the population's sum is often missing from a small corpus, and the
  sample then looks *better* supported than one that holds it. On natural text this is induction and
  duplicate_token: a dozen of EWT dev's 318 documents hold most of the sum, a part of 30 documents lacks them
  a third of the time, and no statistic of the part's own sums tells it (its effective units, skewness and
  variance df all look better than when it holds one). `thin` therefore flags such *sparse* metrics unless their
  sum is spread evenly over the units, as on repeat-random. The same holds, milder, for smooth metrics when a
  few very long documents hold a different mixture: parts that miss them look light-tailed and are low.
- On 10 documents of EWT nothing holds: `thin` flags most rows, and the rest still cover about 0.9.

References
----------
Efron, B. (1987). Better bootstrap confidence intervals. JASA 82(397), 171-185.
Efron, B. & Tibshirani, R. J. (1993). An Introduction to the Bootstrap, ch. 12 (bootstrap-t), 14 (BCa) and
21 (the infinitesimal jackknife).
Hall, P. (1988). Theoretical comparison of bootstrap confidence intervals. Ann. Statist. 16(3), 927-953.
Hyndman, R. J. & Fan, Y. (1996). Sample quantiles in statistical packages. Amer. Statist. 50(4), 361-365.
Satterthwaite, F. E. (1946). An approximate distribution of estimates of variance components. Biometrics
Bulletin 2(6), 110-114.

This module does not run models or know about heads: it takes arrays whose trailing axes are anything
(the sweep's are (layer, head, column)).
"""

from __future__ import annotations

from .methods import DEFAULT_METHOD, METHODS, interval, nan_percentile, order_quantile, replicate_variances, standard_error
from .moments import (MOMENT_TERMS, REPLICATE_TERMS, add_product, bootstrap_weights, combine_moments, replicate_moments,
                      unit_moments)
from .support import (MIN_EFFECTIVE_UNITS, MIN_SPARSE_EVENNESS, MIN_VARIANCE_DF, THIN_MAX_SHARE, THIN_MIN_UNITS,
                      effective_units, support, thin, thin_support, variance_df)

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
]
