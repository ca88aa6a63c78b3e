#!/usr/bin/env python
"""Head families' clustering (`headscan.analysis.families.average_linkage`) over N heads, in seconds.

Random divergence matrices shaped like a run's (heads in loose families, a mean JS divergence of a few tenths of
a nat, the two directions of a pair not quite equal), cut at `CLUSTER_CUT`; the report clusters every model's
heads this way, so the time grows with the largest model's heads.

    python benchmarks/families.py 1024 2048
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[1024, 2048])
    parser.add_argument("--cut", type=float, default=CLUSTER_CUT)
    args = parser.parse_args()
    for n in args.sizes:
        d = divergence_matrix(n, seed=n)
        start = time.perf_counter()
        clusters = average_linkage(d, args.cut)
        seconds = time.perf_counter() - start
        print(f"{n:6,} heads: {seconds:7.3f} s, {clusters.max() + 1} clusters at a cut of {args.cut:g} nats")


if __name__ == "__main__":
    main()
