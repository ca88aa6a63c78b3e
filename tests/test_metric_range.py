"""Every interval a sweep writes lies inside what its metric can be: shares in [0, 1], entropy in [0, ln keys],
distance in [0, keys - 1], with keys the most any query of the sweep saw (its max_len)."""

import math
import sys

import numpy as np

from headscan import SweepConfig, intervals
from headscan.corpus import Corpus, Segment
from headscan.metrics import METRICS, get_metric
from headscan.scan.plan import columns_of
from headscan.scan.reduce import accumulate

MAX_LEN = 16
CONFIG = SweepConfig(device="cpu", bootstrap=200, max_len=MAX_LEN, interval="studentized_symmetric")


def _demo_entropy_units(n: int = 80, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-segment entropy sums and query counts like the demo's smollm2 L18H8 (a sink head): one segment holds
    99.4% of the sum, the other 79 next to nothing."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(8, 25, n).astype(float)
    sums = counts * 1e-5 * rng.random(n)
    sums[7] = 0.994 * 0.009 * counts.sum()
    return sums, counts


def test_the_ceiling_is_ln_keys_for_entropy_and_keys_minus_one_for_distance():
    # by hand: uniform attention over 128 keys has entropy ln 128 = 4.852 nats, the most 128 keys allow
    assert get_metric("entropy").bounds(keys=128) == (0.0, math.log(128))
    assert get_metric("distance").bounds(keys=128) == (0.0, 127.0)
    assert get_metric("distance_by_position").bounds(keys=128) == (0.0, 127.0)
    for name in ("prev_token", "first_token", "entropy_norm", "positional_prev"):  # shares: [0, 1] whatever the keys
        assert get_metric(name).bounds(keys=128) == (0.0, 1.0) == get_metric(name).bounds()
    assert get_metric("entropy").bounds() == (0.0, np.inf)  # without the keys only the floor is known


def test_one_segment_holding_the_sum_gives_a_studentized_interval_past_ln_keys():
    """Why the demo printed 0.009 [0.000, 14.010] nats: the replicates that leave the one heavy segment out (about
    e^-1 of them) have a ratio near 0 and a near-zero SE of their own, so their t = (R* - R) / SE* runs to the
    thousands, and R + t SE, with SE about R, lands far past ln 128."""
    sums, counts = _demo_entropy_units()
    weights = intervals.bootstrap_weights(range(len(sums)), 200, seed=0)
    s, c = sums[:, None], counts[:, None]
    moments = intervals.unit_moments(s, c)
    value = np.array([sums.sum() / counts.sum()])
    low, high = intervals.interval(value, weights @ s, weights @ c, moments, method="studentized_symmetric",
                                   replicate_power=intervals.replicate_moments(weights, s, c))
    assert high[0] > math.log(128)
    # the t of a replicate without the heavy segment, by hand from its own units
    left_out = weights[:, 7] == 0
    b = int(np.argmax(left_out))
    w = weights[b]
    ratio = (w @ sums) / (w @ counts)
    se_b = math.sqrt(float(w @ (sums - ratio * counts) ** 2)) / (w @ counts)
    assert left_out.mean() > 0.25 and abs(ratio - value[0]) / se_b > 100


def test_a_sweeps_entropy_interval_is_clipped_at_ln_max_len(tiny_models):
    """The demo's units written into a tiny sweep's state, every head: the tables' entropy ends lie within
    [0, ln max_len], distance's within [0, max_len - 1], and where the unclipped end was past it, the end is it."""
    finish = sys.modules["headscan.scan.finish"].finish
    corpus = Corpus("test", "text", "", tuple(Segment(t, i + 1) for i, t in enumerate(
        ["the old man walked down to the river", "a dog ran", "then it rained all day long"])))
    state = accumulate(tiny_models["gpt2"], corpus, CONFIG)
    names = [metric.name for metric, _, _ in columns_of(CONFIG, causal=True)]  # the tiny GPT-2's
    column = names.index("entropy")
    sums, counts = _demo_entropy_units()
    weights = intervals.bootstrap_weights(range(len(sums)), CONFIG.bootstrap, seed=0)
    s, c = sums[:, None], counts[:, None]
    state.sums[..., column], state.counts[..., column] = sums.sum(), counts.sum()
    state.replicate_sums[..., column] = (weights @ s)[:, :, None]
    state.replicate_counts[..., column] = (weights @ c)[:, :, None]
    state.moments[..., column] = intervals.unit_moments(s, c)[:, :, None]
    state.replicate_power[..., column] = intervals.replicate_moments(weights, s, c)[..., None]
    heads = finish(state, CONFIG)["heads"]
    ceiling = math.log(MAX_LEN)  # every segment holds at most max_len tokens, so no query sees more keys
    entropy = heads[heads["metric"] == "entropy"]
    assert (entropy["ci_high"] == ceiling).all() and (entropy["joint_high"] == ceiling).all()
    assert (entropy["ci_low"] >= 0).all() and entropy["thin"].all()
    for name, metric in METRICS.items():
        rows = heads[(heads["metric"] == name) & heads["ci_low"].notna()]
        if rows.empty:
            continue
        floor, top = metric.bounds(keys=MAX_LEN)
        for end in ("ci_low", "ci_high", "joint_low", "joint_high"):
            assert rows[end].between(floor, top).all(), (name, end)
