#!/usr/bin/env python
"""How often a true null row gets p <= 0.05 and p <= 0.01, for `t_p_value` and `bootstrap_t_p_value`.

Each corpus: 200 heads, `units` units each, a unit's count 20 + Poisson(30) queries and its ratio drawn from
Beta(20 share, 20 (1 - share)), so every head's true value is `share`, the null it is tested against on the high
side. Prints, per cell, the two rates for each p-value and the KS test of uniformity; the table in
`headscan.intervals.pvalues` comes from these lines (a few seconds a cell on 2 cores).

    python benchmarks/discoveries_calibration.py
    python benchmarks/discoveries_calibration.py --cells 0.9:30 --corpora 50 --replicates 1000
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats

from headscan.intervals import bootstrap_weights, replicate_moments, standard_error, unit_moments, variance_df
from headscan.intervals.pvalues import bootstrap_t_p_value, t_p_value


def null_heads(seed: int, share, units: int, heads: int = 200, replicates: int = 200, concentration=20.0):
    """One simulated corpus of `heads` heads whose true value is `share` (a number, or one per head):
    (value, se, df, replicate arrays, moments)."""
    rng = np.random.default_rng(seed)
    counts = (20 + rng.poisson(30, (units, heads))).astype(float)
    share = np.broadcast_to(np.asarray(share, dtype=np.float64), (heads,))
    sums = counts * rng.beta(share * concentration, (1 - share) * concentration, counts.shape)
    moments = unit_moments(sums, counts)
    value = sums.sum(0) / counts.sum(0)
    weights = bootstrap_weights(range(units), replicates, seed=seed)
    replicate_sums, replicate_counts = weights @ sums, weights @ counts
    power = replicate_moments(weights, sums, counts)
    df = variance_df(replicate_sums, replicate_counts, power)
    return value, standard_error(value, moments), df, (replicate_sums, replicate_counts, power), moments


def cell(share: float, units: int, corpora: int, replicates: int) -> dict[str, np.ndarray]:
    """The null rows' p-values of both kinds over `corpora` corpora."""
    t_based, boot = [], []
    for seed in range(corpora):
        value, se, df, replicated, moments = null_heads(seed, share, units, replicates=replicates)
        t_based.append(t_p_value(value, se, df, share))
        boot.append(bootstrap_t_p_value(value, *replicated, moments, share))
    return {"t": np.concatenate(t_based), "bootstrap-t": np.concatenate(boot)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="*", default=["0.5:30", "0.1:30", "0.9:30", "0.9:100", "0.9:318"],
                        help="share:units pairs")
    parser.add_argument("--corpora", type=int, default=20)
    parser.add_argument("--replicates", type=int, default=1000)
    args = parser.parse_args()
    for spec in args.cells:
        share, units = float(spec.split(":")[0]), int(spec.split(":")[1])
        for name, p in cell(share, units, args.corpora, args.replicates).items():
            print(f"share {share}, {units} units, {name}: P(p <= 0.05) {np.mean(p <= 0.05):.3f}, "
                  f"P(p <= 0.01) {np.mean(p <= 0.01):.3f}, KS p {stats.kstest(p, 'uniform').pvalue:.3g}")


if __name__ == "__main__":
    main()
