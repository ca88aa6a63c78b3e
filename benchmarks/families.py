#!/usr/bin/env python
"""Head families' clustering (`headscan.analysis.families.average_linkage`) over N heads, in seconds.

Random divergence matrices shaped like a run's (heads in loose families, a mean JS divergence of a few tenths of
a nat, the two directions of a pair not quite equal), cut at `CLUSTER_CUT`; the report clusters every model's
heads this way, so the time grows with the largest model's heads. `--check` also clusters each matrix with a plain UPGMA (the
textbook Lance-Williams update in numpy, a closest pair at a time: tens of seconds at 2,048 heads) and says whether
the partitions are the same.

    python benchmarks/families.py 1024 2048
    python benchmarks/families.py 2048 --check
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from headscan.analysis.families import CLUSTER_CUT, average_linkage


def divergence_matrix(n: int, seed: int = 0) -> np.ndarray:
    """(n, n) divergences: squared distances between heads drawn around 40 family centres, scaled to nats."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(40, 8))
    points = centres[rng.integers(0, 40, n)] + rng.normal(scale=0.5, size=(n, 8))
    d = np.linalg.norm(points[:, None] - points[None], axis=-1) ** 2 / 60  # (n, n)
    d += rng.uniform(0, 1e-3, d.shape)
    np.fill_diagonal(d, 0.0)
    return d


def plain_upgma(divergence: np.ndarray, cut: float) -> list[int]:
    """Average linkage by the textbook update: merge the closest pair of clusters (the first in row-major order on
    a tie) while it is at most `cut`, the merged row the size-weighted mean of the two; clusters numbered by their
    first head. Symmetrised as `average_linkage` reads the matrix."""
    dist = (divergence + divergence.T) / 2
    n = len(dist)
    np.fill_diagonal(dist, np.inf)
    size = np.ones(n)
    members = {i: [i] for i in range(n)}
    while len(members) > 1:
        a, b = divmod(int(np.argmin(dist)), n)
        if not dist[a, b] <= cut:
            break
        a, b = min(a, b), max(a, b)
        merged = (size[a] * dist[a] + size[b] * dist[b]) / (size[a] + size[b])
        dist[a, :], dist[:, a] = merged, merged
        dist[a, a] = np.inf
        dist[b, :], dist[:, b] = np.inf, np.inf
        size[a] += size[b]
        members[a] += members.pop(b)
    number = {i: k for k, c in enumerate(sorted(members.values(), key=min)) for i in c}
    return [number[i] for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[1024, 2048])
    parser.add_argument("--cut", type=float, default=CLUSTER_CUT)
    parser.add_argument("--check", action="store_true", help="compare each partition with a plain UPGMA's")
    args = parser.parse_args()
    for n in args.sizes:
        d = divergence_matrix(n, seed=n)
        start = time.perf_counter()
        clusters = average_linkage(d, args.cut)
        seconds = time.perf_counter() - start
        same = f", the same partition as a plain UPGMA: {clusters.tolist() == plain_upgma(d, args.cut)}" if args.check else ""
        print(f"{n:6,} heads: {seconds:7.3f} s, {clusters.max() + 1} clusters at a cut of {args.cut:g} nats{same}")


if __name__ == "__main__":
    main()
