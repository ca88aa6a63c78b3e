"""Ground truth: heads planted by construction are found, first, through the public sweep."""

import pytest

from headscan.sweep import SweepConfig, sweep
from headscan.testing import build_planted_checkpoint

CORPORA = ["builtin", "repeat-random:n=20,count=16,seed=4"]


@pytest.fixture(scope="module", params=["gpt2", "bert"])
def planted(request, tmp_path_factory):
    path, heads = build_planted_checkpoint(tmp_path_factory.mktemp(f"planted-{request.param}"), request.param)
    return request.param, path, heads


@pytest.mark.parametrize("corpus", CORPORA)
def test_planted_heads_rank_first_with_a_high_score(planted, corpus, tmp_path):
    arch, path, planted_heads = planted
    tables = sweep([str(path)], corpus, None, SweepConfig(device="cpu", limit=40, bootstrap=50))
    heads, offsets = tables.heads, tables.offsets
    for metric, (layer, head) in planted_heads.items():
        if metric.startswith("offset_"):
            rows = offsets[offsets["offset"] == int(metric.removeprefix("offset_"))]
        else:
            rows = heads[heads["metric"] == metric]
        best = rows.sort_values("value", ascending=False).iloc[0]
        assert (best["layer"], best["head"]) == (layer, head), f"{arch} {metric}: found {best['label']}"
        assert best["value"] > 0.95 and best["ci_low"] > 0.95, f"{arch} {metric}: {best['value']:.3f}"


def test_random_heads_score_near_chance(planted):
    arch, path, planted_heads = planted
    heads = sweep([str(path)], "builtin", None, SweepConfig(device="cpu", limit=40, bootstrap=0)).heads
    planted_labels = {f"L{layer}H{head}" for layer, head in planted_heads.values()}
    random_heads = heads[~heads["label"].isin(planted_labels)]
    for metric in ("prev_token", "first_token", "next_token"):
        if arch == "gpt2" and metric == "next_token":
            continue
        values = random_heads.loc[random_heads["metric"] == metric, "value"]
        # chance is about 1 / (keys a query sees): well under 0.3 for segments of ~20 tokens
        assert values.max() < 0.3, f"{arch} {metric}: a random head scores {values.max():.3f}"
