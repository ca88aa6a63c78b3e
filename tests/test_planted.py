"""Ground truth: heads planted by construction are found, first, through the public sweep."""

import pytest
import torch

from headscan import SweepConfig
from headscan.corpus import read_corpus
from headscan.scan import sweep
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


def chance_levels(path, corpus, metrics):
    """Scores of a head attending uniformly to every key it can see, on the same segments."""
    from headscan.corpus import batches, encode
    from headscan.metrics import METRICS, AttentionBatch
    from headscan.models import load_model

    model = load_model(str(path), device="cpu")
    sums = dict.fromkeys(metrics, 0.0)
    counts = dict.fromkeys(metrics, 0.0)
    for batch in batches(encode(corpus, model, 128), 8, 0):
        real = batch.attention_mask.bool()  # (batch, k)
        allowed = real[:, None, :] & real[:, :, None]  # (batch, q, k)
        if model.causal:
            allowed = allowed & torch.ones(allowed.shape[-1], allowed.shape[-1], dtype=torch.bool).tril()
        uniform = allowed / allowed.sum(-1, keepdim=True).clamp_min(1)
        attention = AttentionBatch(uniform[:, None].double(), real, real, batch.input_ids, torch.zeros_like(real), model.causal)
        for metric in metrics:
            s, c = METRICS[metric].function(attention)
            sums[metric] += s.sum().item()
            counts[metric] += c.sum().item()
    return {metric: sums[metric] / counts[metric] for metric in metrics}


def test_random_heads_score_near_chance(planted):
    arch, path, planted_heads = planted
    corpus = read_corpus("builtin", limit=40)
    heads = sweep([str(path)], "builtin", None, SweepConfig(device="cpu", limit=40, bootstrap=0)).heads
    planted_labels = {f"L{layer}H{head}" for layer, head in planted_heads.values()}
    random_heads = heads[~heads["label"].isin(planted_labels)]
    metrics = ["prev_token", "first_token", "self"] + (["next_token"] if arch == "bert" else [])
    chance = chance_levels(path, corpus, metrics)
    for metric in metrics:
        values = random_heads.loc[random_heads["metric"] == metric, "value"]
        # random initialisation gives near-uniform attention: each score within 0.02 of the uniform head's
        assert (values - chance[metric]).abs().max() < 0.02, f"{arch} {metric}: {values.tolist()} vs chance {chance[metric]:.3f}"


# Natural text where token q-2 often equals token q (", x ," and "the x the"): an induction definition that
# counted q-1 as a target there would score a previous-token head as an induction head.
LISTS = [
    "We bought apples, pears, plums, figs, and a melon, and then we went home.",
    "He fed the cat the fish the dog the bone and the bird the seed.",
    "Red, green, blue, yellow, and white are colours, and so is black.",
]


def test_planted_previous_token_head_is_not_an_induction_head(planted, tmp_path):
    from headscan.corpus import batches, encode
    from headscan.models import load_model

    arch, path, planted_heads = planted
    layer, head = planted_heads["prev_token"]
    (tmp_path / "lists.txt").write_text("\n".join(LISTS) + "\n")
    corpus = read_corpus(tmp_path / "lists.txt")
    heads = sweep([str(path)], corpus, None, SweepConfig(device="cpu", bootstrap=0)).heads
    row = heads[(heads.metric == "induction") & (heads.layer == layer) & (heads["head"] == head)].iloc[0]
    # not vacuous: the text has queries whose token also sits two positions back
    batch = next(batches(encode(corpus, load_model(str(path), device="cpu"), 128), 8, 0))
    ids, real = batch.input_ids, batch.attention_mask.bool()
    assert bool(((ids[:, 2:] == ids[:, :-2]) & real[:, 2:]).any()), arch
    assert row["count"] > 0
    assert row["value"] < 1e-4  # only the planted head's leftover attention (< 1e-5 a key) off q-1
