"""Coverage of headscan's 95% intervals on simulated corpora whose true ratio is known.

    python experiments/interval_simulation.py                    # about a minute on 2 cores
    python experiments/interval_simulation.py --datasets 500     # a quick look
    python experiments/interval_simulation.py --replicates 1000  # how much of the shortfall is B = 200

Each scenario draws per-unit sums and counts (s_u, c_u) from a known population, so the population ratio
E[s] / E[c] is known exactly. For every simulated corpus this runs the code the sweep runs:
`bootstrap_weights` for the units, replicate totals ``weights @ sums`` (50 corpora share one weight draw, as
the heads of one sweep do), `unit_moments`, then `interval` for each method and `thin_support`. It prints
the share of intervals that hold the true ratio, overall and among the intervals *not* flagged by
`thin_support`, then coverage by contributing units and by the largest unit's share pooled over the
scenarios whose problem the sample can show (the evidence for thin_support's thresholds).

Scenarios (sizes are numbers of segments; ``unit`` is what is resampled):

- ``light``: every segment has 10-30 queries and a Beta(4, 6) share: smooth metrics such as prev_token.
- ``few``: only 8% of segments have any query (1-30 of them): a column few segments reach.
- ``sparse``: 45% of segments have queries, counts heavy-tailed (1 + negative binomial, mean 6.9); a fifth of
  those have a high share (Beta(6, 2)), the rest a low one (Beta(1, 15)): duplicate_token-like.
- ``rare``: as sparse, but the high-share segments are rare (0.4% of all) and long (30 + NB, mean 55) with
  share Beta(30, 2), carrying ~45% of the sum: fitted to minilm's induction heads on EWT dev sentences,
  where 8 of 2,001 sentences hold ~half the sum (resampling those sentences, the percentile interval
  covered 0.51 at 100 and 0.84 at 400 sentences; here 0.48 and 0.79).
- ``clustered``: documents of 1 + Poisson(5.3) sentences (EWT dev: 2,001 in 318), a document-level share
  Beta(3.2, 4.8) around which its sentences vary (Beta(20 m, 20 (1 - m))); resampled by ``segment`` (wrong:
  sentences of a document are not independent) and by ``document``.

This script does not run models; it only imports headscan.intervals.
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from headscan.intervals import (
    METHODS,
    MOMENT_TERMS,
    bootstrap_weights,
    effective_units,
    interval,
    replicate_moments,
    support,
    thin,
    thin_support,
    unit_moments,
    variance_df,
)

SIZES = (100, 400, 2000)
BATCH = 50  # simulated corpora per weight draw, like the heads of one sweep
_S, _C = MOMENT_TERMS.index("s"), MOMENT_TERMS.index("c")


@dataclass(frozen=True)
class Scenario:
    """A population of units and how the simulation resamples it."""

    name: str
    draw: Callable  # (rng, n_segments, k) -> sums (n, k), counts (n, k), document of each segment or None
    truth: float  # E[s] / E[c] of the population
    by_document: bool = False  # resample documents (their segments summed) instead of segments
    visible: bool = True  # whether a failure shows in the sample itself (False: thin_support cannot see it)
    sizes: tuple = (100, 400, 2000)  # corpus sizes it is run at (rows drawn: segments, or documents for heavy)
    sparse: bool = False  # modelled on a metric `thin` treats as sparse (duplicate_token, induction)


def _negative_binomial(rng, r: float, mean: float, size):
    return rng.negative_binomial(r, r / (r + mean), size=size)


def light() -> Scenario:
    def draw(rng, n, k):
        counts = rng.integers(10, 31, size=(n, k)).astype(float)
        return counts * rng.beta(4, 6, size=(n, k)), counts, None

    return Scenario("light", draw, truth=0.4)


def few(p_contributing: float = 0.08) -> Scenario:
    def draw(rng, n, k):
        counts = rng.integers(1, 31, size=(n, k)) * (rng.random((n, k)) < p_contributing)
        return counts * rng.beta(2, 3, size=(n, k)), counts.astype(float), None

    return Scenario("few", draw, truth=0.4)


def _mixture(name: str, p_positive: float, p_high: float, high_count: tuple, high_share: tuple, low_share: tuple,
             visible: bool) -> Scenario:
    """Segments with a query w.p. p_positive; of all segments a share p_high are high-share ones.

    Low-share segments have 1 + NB(1.2, mean 5.9) queries; high-share ones base + NB(2, mean); shares are Beta.
    Counts and shares are independent within each kind, so the true ratio follows from the means.
    """
    base, mean = high_count

    def draw(rng, n, k):
        u = rng.random((n, k))
        high, positive = u < p_high, u < p_positive
        high_counts = base + _negative_binomial(rng, 2.0, mean, (n, k))
        counts = np.where(high, high_counts, 1 + _negative_binomial(rng, 1.2, 5.9, (n, k)))
        counts = counts * positive
        share = np.where(high, rng.beta(*high_share, size=(n, k)), rng.beta(*low_share, size=(n, k)))
        return counts * share, counts.astype(float), None

    q = p_high / p_positive  # of the segments with a query
    low_c, high_c = 6.9, base + mean
    low_p, high_p = low_share[0] / sum(low_share), high_share[0] / sum(high_share)
    truth = ((1 - q) * low_c * low_p + q * high_c * high_p) / ((1 - q) * low_c + q * high_c)
    return Scenario(name, draw, truth=truth, visible=visible, sparse=True)


def sparse() -> Scenario:
    return _mixture("sparse", 0.45, 0.45 * 0.2, (1, 15.0), (6, 2), (1, 15), visible=True)


def rare() -> Scenario:
    return _mixture("rare", 0.45, 0.004, (30, 25.0), (30, 2), (0.5, 6), visible=False)


def clustered(by_document: bool) -> Scenario:
    def draw(rng, n, k):
        sizes = []
        while sum(sizes) < n:
            sizes.append(1 + rng.poisson(5.3))
        sizes[-1] -= sum(sizes) - n
        document = np.repeat(np.arange(len(sizes)), sizes)
        level = rng.beta(0.4 * 8, 0.6 * 8, size=(len(sizes), k))[document]
        counts = rng.integers(10, 31, size=(n, k)).astype(float)
        return counts * rng.beta(20 * level, 20 * (1 - level)), counts, document

    unit = "document" if by_document else "segment"
    return Scenario(f"clustered/{unit}", draw, truth=0.4, by_document=by_document, visible=by_document)


def _heavy_sizes(rng, shape, sigma: float):
    return 1 + np.floor(rng.lognormal(np.log(3.5), sigma, size=shape)).astype(int)


def heavy(slope: float = 0.0, sigma: float = 1.0) -> Scenario:
    """Whole documents of heavy-tailed length: 1 + floor(LogNormal(log 3.5, sigma)) sentences (sigma = 1: median 4,
    90th percentile 13, 99th 37 sentences; EWT dev: 4, 12 and 51), 10-30 queries each. A document's level m is
    logistic(logit 0.4 + slope (log sentences - log 3.5) + N(0, 0.7^2)), and its sentences' shares are
    Beta(20 m, 20 (1 - m)). With slope > 0 the long documents have higher shares, so a sample that misses them
    is low. Each row drawn is one document (the unit); sizes are numbers of documents.

    The truth, E[sentences m] / E[sentences], is computed exactly: the distribution of the sentences is summed
    term by term and m's normal part integrated by Gauss-Hermite quadrature.
    """
    def draw(rng, n, k):
        sizes = _heavy_sizes(rng, (n, k), sigma)
        logit = np.log(0.4 / 0.6) + slope * (np.log(sizes) - np.log(3.5)) + rng.normal(0, 0.7, size=(n, k))
        level = 1 / (1 + np.exp(-logit))
        owner = np.repeat(np.arange(n * k), sizes.ravel())  # the document (flattened) of each sentence
        queries = rng.integers(10, 31, size=owner.size).astype(float)
        level_of = level.ravel()[owner]
        shares = rng.beta(20 * level_of, 20 * (1 - level_of))
        counts = np.bincount(owner, weights=queries, minlength=n * k).reshape(n, k)
        sums = np.bincount(owner, weights=queries * shares, minlength=n * k).reshape(n, k)
        return sums, counts, None

    name = "heavy" if slope == 0 else f"heavy/slope={slope:g}"
    return Scenario(name, draw, truth=_heavy_truth(slope, sigma), sizes=(10, 30, 100))


@functools.cache
def _heavy_truth(slope: float, sigma: float) -> float:
    k = np.arange(0, 20_000)  # floor(L) = k with probability P(k <= L < k + 1); beyond 20,000: below 1e-17
    z = (np.log(np.maximum(np.arange(0, 20_001), 1e-300)) - np.log(3.5)) / sigma
    edges = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    edges[0] = 0.0
    p = np.diff(edges)
    sizes = 1.0 + k
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)  # E over Z ~ N(0, 1)
    weights = weights / weights.sum()
    logits = np.log(0.4 / 0.6) + slope * (np.log(sizes) - np.log(3.5))
    mean_level = (weights / (1 + np.exp(-(logits[:, None] + 0.7 * nodes)))).sum(1)
    return float((p * sizes * mean_level).sum() / (p * sizes).sum())


def scenarios() -> list[Scenario]:
    return [light(), few(), sparse(), rare(), clustered(by_document=False), clustered(by_document=True), heavy(),
            heavy(slope=0.5)]


class Simulation(NamedTuple):
    """One scenario at one size: per simulated corpus, whether each method covered the truth, and support."""

    covered: dict  # method -> bool (dataset,)
    above: dict  # method -> bool (dataset,): the truth lay above the interval
    flagged: np.ndarray  # bool (dataset,): thin (the support rule of the studentized interval)
    flagged_old: np.ndarray  # bool (dataset,): thin_support (the previous rule, made for BCa)
    contributing: np.ndarray  # (dataset,)
    share: np.ndarray  # (dataset,)
    units: np.ndarray  # (dataset,): resampled units (documents when by_document)
    n_eff: np.ndarray  # (dataset,): effective_units
    df: np.ndarray  # (dataset,): variance_df


def simulate(scenario: Scenario, n_segments: int, n_datasets: int, *, replicates: int = 200, seed: int = 0,
             level: float = 0.95, methods=METHODS) -> Simulation:
    """Draw `n_datasets` corpora of `n_segments` and check each method's interval against the truth."""
    covered = {m: [] for m in methods}
    above = {m: [] for m in methods}
    flagged, flagged_old, contributing, share, units, n_eff, df = [], [], [], [], [], [], []
    for batch in range(-(-n_datasets // BATCH)):
        k = min(BATCH, n_datasets - batch * BATCH)
        rng = np.random.default_rng([seed, n_segments, batch, 7])
        sums, counts, document = scenario.draw(rng, n_segments, k)  # (segment, dataset)
        if scenario.by_document:
            # one row per document: a unit's moments need its own totals
            sums = np.stack([np.bincount(document, weights=sums[:, j]) for j in range(k)], 1)
            counts = np.stack([np.bincount(document, weights=counts[:, j]) for j in range(k)], 1)
        weights = bootstrap_weights(np.arange(len(sums)), replicates, seed=seed * 100_003 + batch)
        moments = unit_moments(sums, counts)
        with np.errstate(invalid="ignore", divide="ignore"):
            value = moments[_S] / moments[_C]
        replicate_sums, replicate_counts = weights @ sums, weights @ counts
        power = replicate_moments(weights, sums, counts)
        for method in methods:
            low, high = interval(value, replicate_sums, replicate_counts, moments, method=method, level=level,
                                 replicate_power=power)
            covered[method].append((low <= scenario.truth) & (scenario.truth <= high))
            above[method].append(~(scenario.truth <= high))
        n_contributing, largest = support(moments)
        effective, degrees = effective_units(moments), variance_df(replicate_sums, replicate_counts, power)
        flagged.append(thin(effective, degrees, n_contributing, sparse=scenario.sparse))
        flagged_old.append(thin_support(moments))
        contributing.append(n_contributing)
        share.append(largest)
        units.append(np.full(k, len(sums)))
        n_eff.append(effective)
        df.append(degrees)
    join = np.concatenate
    return Simulation({m: join(v) for m, v in covered.items()}, {m: join(v) for m, v in above.items()},
                      join(flagged), join(flagged_old), join(contributing), join(share), join(units), join(n_eff),
                      join(df))


class CoverageCheck(NamedTuple):
    ok: bool
    coverage: float
    n: int
    message: str


def coverage_check(covered: np.ndarray, *, nominal: float = 0.95, tolerance: float = 0.03) -> CoverageCheck:
    """Whether the share of intervals that covered is within `tolerance` of `nominal` (either side).

    The tolerance should exceed about three binomial standard errors, sqrt(p (1 - p) / n): 0.027 for 600
    intervals at 95%. Fewer than 50 intervals is not a check: it fails.
    """
    covered = np.asarray(covered, dtype=bool)
    n = int(covered.size)
    coverage = float(covered.mean()) if n else float("nan")
    ok = n >= 50 and abs(coverage - nominal) <= tolerance
    message = f"coverage {coverage:.3f} over {n} intervals, nominal {nominal:.2f} +- {tolerance:.3f}"
    return CoverageCheck(ok, coverage, n, message)


def _cell(values: np.ndarray) -> str:
    return f"{values.mean():.3f}" if values.size else "-"


def _binned(results: list[tuple[Scenario, int, Simulation]], key: str, edges, method: str) -> list[str]:
    values = np.concatenate([getattr(sim, key) for s, _, sim in results if s.visible])
    covered = np.concatenate([sim.covered[method] for s, _, sim in results if s.visible])
    lines = [f"| {key} | intervals | {method} coverage |", "|---|---|---|"]
    for low, high in zip(edges[:-1], edges[1:]):
        inside = (values >= low) & (values < high)
        if inside.any():
            lines.append(f"| [{low:g}, {high:g}) | {inside.sum()} | {covered[inside].mean():.3f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=2000, help="simulated corpora per scenario and size")
    parser.add_argument("--replicates", type=int, default=200, help="bootstrap replicates (the sweep's default)")
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="rows per corpus (default: each scenario's own, documents for heavy)")
    parser.add_argument("--scenarios", nargs="+", default=None, help="names of the scenarios to run (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    results = []
    header = ("| scenario | size | units | truth | thin | thin_support | studentized all | studentized trusted | "
              "symmetric all | symmetric trusted | bca all | bca trusted (thin_support) | percentile all | delta all | "
              "studentized: truth above |")
    print(f"Coverage of 95% intervals, {args.datasets} corpora per row, {args.replicates} replicates. 'thin' and "
          "'thin_support': the share each rule flags; 'trusted': coverage among the intervals not flagged by thin "
          "(bca: by thin_support, the rule it came with).\n")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    chosen = [s for s in scenarios() if args.scenarios is None or s.name in args.scenarios]
    for scenario in chosen:
        for n in args.sizes or scenario.sizes:
            sim = simulate(scenario, n, args.datasets, replicates=args.replicates, seed=args.seed)
            results.append((scenario, n, sim))
            ok, ok_old = ~sim.flagged, ~sim.flagged_old
            c = sim.covered
            print(f"| {scenario.name} | {n} | {np.median(sim.units):.0f} | {scenario.truth:.4f} | "
                  f"{sim.flagged.mean():.2f} | {sim.flagged_old.mean():.2f} | "
                  f"{_cell(c['studentized'])} | {_cell(c['studentized'][ok])} | "
                  f"{_cell(c['studentized_symmetric'])} | {_cell(c['studentized_symmetric'][ok])} | "
                  f"{_cell(c['bca'])} | {_cell(c['bca'][ok_old])} | {_cell(c['percentile'])} | {_cell(c['delta'])} | "
                  f"{sim.above['studentized'].mean():.3f} |")
    hidden = ", ".join(s.name for s in chosen if not s.visible)
    print(f"\nThe evidence for thin, pooled over every scenario but {hidden} (whose failure the sample cannot show), "
          "studentized:\n")
    print("\n".join(_binned(results, "n_eff", [0, 3, 5, 8, 15, 30, np.inf], "studentized")))
    print()
    print("\n".join(_binned(results, "df", [0, 2, 3, 4, 6, 10, np.inf], "studentized")))
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
