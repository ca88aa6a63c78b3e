"""What a sweep holds: an eager sweep frees each layer's pattern as soon as it is scored (no reference cycle keeps
it for the garbage collector), and ``attention="auto"`` goes chunked where eager mode would hold a large layer."""

import gc
import weakref

import pytest
from test_metrics import make_batch

from headscan import SweepConfig
from headscan.corpus import texts_corpus
from headscan.metrics import METRICS
from headscan.scan import budget, layers, sweep_model


@pytest.fixture
def no_collector():
    """The cyclic garbage collector off, so that only reference counts free memory (as between its runs)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def test_a_scored_batch_is_freed_by_reference_counting(no_collector):
    batch = make_batch([7, 5], causal=True)
    for metric in METRICS.values():  # every chance the null head takes part in
        if not metric.needs and metric.table not in ("syntax", "importance"):
            metric.function(batch)
            metric.chance_sums(batch)
    pattern, batch_ref = weakref.ref(batch.pattern), weakref.ref(batch)
    del batch
    assert batch_ref() is None and pattern() is None


def test_an_eager_sweep_holds_one_layer_at_a_time(tiny_models, monkeypatch, no_collector):
    model = tiny_models["gpt2"]
    monkeypatch.setattr(layers, "STACK_BYTES", 1)  # no layers waiting to be stacked: each is scored at once
    handed, alive_at = [], []
    scored = layers.LayerHooks.pattern

    def pattern(self, layer, pattern, hook):
        alive_at.append([n for n, ref in enumerate(handed) if ref() is not None])  # before this one's
        handed.append(weakref.ref(pattern))
        return scored(self, layer, pattern, hook)

    monkeypatch.setattr(layers.LayerHooks, "pattern", pattern)
    corpus = texts_corpus(["The quick brown fox jumps over the lazy dog.", "A short one, and another one."], None)
    sweep_model(model, corpus, SweepConfig(device="cpu", batch_size=1, attention="eager", bootstrap=0))
    assert len(handed) == 2 * model.n_layers
    # each pattern is gone by the time the next layer's comes (the forward pass holds only its own layer's)
    assert all(alive == [] for alive in alive_at), alive_at


def test_auto_goes_chunked_where_one_layer_passes_32_mib():
    big = 8 * 2**30  # a budget that never decides
    # smollm2's 9 heads, one segment: 4 * 9 * n^2 bytes against 32 MiB = 33,554,432
    # (n = 965: 33,524,100; n = 966: 33,593,616)
    assert budget.auto_mode(9, 1, 965, big) == "eager"
    assert budget.auto_mode(9, 1, 966, big) == "chunked"
    assert budget.auto_mode(9, 1, 4096, big) == "chunked"
    assert budget.auto_mode(9, 1, 4096, big, chunked_runs=False) == "eager"
    assert budget.auto_mode(12, 16, 128, big) == "eager"  # minilm's defaults: 12.6 MB a layer
    assert budget.auto_mode(12, 16, 128, 2**20) == "chunked"  # past a budget of 1 MiB
