"""A pass added from outside `headscan.scan`: registered here, it runs in a sweep, writes its own table, resumes
from a stopped sweep's saved state and merges across shards, with no edit under headscan/scan/.

The pass counts each segment's real tokens (the tokens the model reads, padding excluded) into a table
segment_tokens, one row per (model, layer, head, segment); the counts are checked against the tokenizer itself.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import headscan
from headscan.errors import ConfigError, SweepInterrupted, TablesError
from headscan.scan.passes import PASSES, Pass, PassRun, register_pass
from headscan.tables import TABLES, register_table

TEXTS = ["The cat sat on the mat.", "It slept all day long, and then it woke.", "Dogs bark.",
         "A bird sang in the tall tree by the river.", "Rain fell.", "We went home after the long walk in the park."]
SETTINGS = dict(device="cpu", window=2, batch_size=2, bootstrap=20, bootstrap_unit="segment", max_len=64)


@dataclass
class TokensState:
    counts: dict = field(default_factory=dict)  # corpus index of a segment -> its real tokens


class _Counting(PassRun):
    def __init__(self, state: TokensState):
        self.state = state

    def begin_window(self) -> None:
        self.window = {}

    def after_batch(self, step) -> None:
        real = step.batch.attention_mask.sum(-1).tolist()  # (batch,)
        for row, sequence in enumerate(step.batch.index.tolist()):
            segment = step.segments[step.encoded.segment_of(sequence)]
            self.window[segment] = self.window.get(segment, 0) + int(real[row])

    def end_window(self) -> None:  # a window stopped halfway adds nothing
        self.state.counts.update(self.window)


class TokensPass(Pass):
    name = "segment_tokens"
    tables = ("segment_tokens",)

    def empty(self, plan, model):
        return TokensState()

    def open(self, run, state):
        return _Counting(state)

    def merge(self, states, names):
        return TokensState({k: v for state in states for k, v in state.counts.items()})  # disjoint segments

    def save(self, state):
        segments = sorted(state.counts)
        return {}, {"segments": np.array(segments, dtype=np.int64),
                    "counts": np.array([state.counts[s] for s in segments], dtype=np.int64)}

    def load(self, header, arrays):
        return TokensState(dict(zip(arrays["segments"].tolist(), arrays["counts"].tolist())))

    def frames(self, state, per_head):
        segments = np.array(sorted(state.counts), dtype=np.int64)
        counts = np.array([state.counts[s] for s in segments], dtype=float)
        n_heads = len(per_head["layer"])
        head = {name: column if column is None or isinstance(column, str) else np.repeat(np.asarray(column),
                                                                                          len(segments))
                for name, column in per_head.items()}
        nan = float("nan")
        frame = pd.DataFrame(head | {"segment": np.tile(segments, n_heads), "value": np.tile(counts, n_heads),
                                     "sum": np.tile(counts, n_heads), "count": 1.0, "ci_low": nan, "ci_high": nan})
        return {"segment_tokens": TABLES["segment_tokens"].conform(frame)}

    def notes(self, state):
        return {"segment_tokens": f"{len(state.counts)} segments counted"}


@pytest.fixture(scope="module", autouse=True)
def tokens_pass():
    register_table("segment_tokens", {"segment": "int64"}, "one row per (model, layer, head, segment): its tokens")
    one = register_pass(TokensPass())
    yield one
    del PASSES["segment_tokens"], TABLES["segment_tokens"]  # other test modules see the registries as shipped


@pytest.fixture(scope="module")
def expected(tiny_bert):
    """Each text's tokens by the tokenizer itself: [CLS] and [SEP] around the word pieces, as the sweep feeds them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    return {index: len(tokenizer(text)["input_ids"]) for index, text in enumerate(TEXTS)}


def _table_counts(tables) -> dict:
    frame = tables.frames["segment_tokens"]
    per_head = frame.groupby(["layer", "head"])["value"].apply(list)
    assert all(values == per_head.iloc[0] for values in per_head)  # every head's rows are the segments' counts
    first = frame[(frame["layer"] == 0) & (frame["head"] == 0)]
    return dict(zip(first["segment"].tolist(), first["value"].tolist()))


def test_a_registered_pass_writes_its_table_into_the_sweep_output(tiny_bert, expected, tmp_path):
    out = tmp_path / "out"
    headscan.sweep(str(tiny_bert), TEXTS, out, **SETTINGS)
    tables = headscan.load(out)
    assert _table_counts(tables) == expected
    frame = tables.frames["segment_tokens"]
    n_heads = tables.frames["heads"].groupby(["layer", "head"]).ngroups
    assert len(frame) == n_heads * len(TEXTS)
    assert tables.provenance.models[0].extra["segment_tokens"] == f"{len(TEXTS)} segments counted"


def test_a_stopped_sweep_resumes_the_pass_exactly(tiny_bert, expected, tmp_path):
    from headscan.models import load_model
    from headscan.scan import PartialState, accumulate

    model = load_model(str(tiny_bert), device="cpu")
    corpus = headscan.corpus.texts_corpus(TEXTS, None)
    config = headscan.SweepConfig(**SETTINGS | {"batch_size": 1})  # two batches a window
    path, checks = tmp_path / "state.npz", iter(range(100))
    with pytest.raises(SweepInterrupted):  # stopped in the second window: its first batch is dropped
        accumulate(model, corpus, config, save=lambda s: s.save(path), save_every=0,
                   should_stop=lambda: next(checks) >= 3)
    saved = PartialState.load(path)
    assert saved.windows_done == 1 and saved.passes["segment_tokens"].counts == {0: expected[0], 1: expected[1]}
    resumed = accumulate(model, corpus, config, state=saved)
    assert resumed.passes["segment_tokens"].counts == expected
    assert np.array_equal(resumed.sums, accumulate(model, corpus, config).sums)


def test_shards_of_a_sweep_with_the_pass_merge_into_its_table(tiny_bert, expected, tmp_path):
    outs = [tmp_path / f"shard{k}" for k in range(2)]
    for k, out in enumerate(outs):
        headscan.sweep(str(tiny_bert), TEXTS, out, shard=f"{k}/2", **SETTINGS)
        assert set(_table_counts(headscan.load(out))) == {i for i in range(len(TEXTS)) if i % 2 == k}
    merged = headscan.merge(outs, tmp_path / "merged")
    assert _table_counts(merged) == expected


def test_a_state_saved_without_the_pass_does_not_resume_into_a_sweep_with_it(tiny_bert, tmp_path):
    """Its counts would miss the windows swept before: the fingerprint names the passes a sweep runs."""
    from headscan.scan import partial_folder
    from headscan.scan.resume import state_file

    out = tmp_path / "out"
    del PASSES["segment_tokens"]
    try:
        with pytest.raises(SweepInterrupted):
            _stop_after_first_window(str(tiny_bert), out)
    finally:
        PASSES["segment_tokens"] = TokensPass()
    assert (partial_folder(out) / state_file(str(tiny_bert), None)).is_file()
    with pytest.raises(TablesError, match=r"a stopped sweep of .* with other inputs \(passes: \['weights', 'composition', 'examples'\] != "
                                          r"\['weights', 'composition', 'examples', 'segment_tokens'\]\); rerun that sweep to finish it, or "
                                          r"pass --restart to discard it"):
        headscan.sweep(str(tiny_bert), TEXTS, out, **SETTINGS)


def _stop_after_first_window(spec: str, out: Path) -> None:
    """A sweep into `out` stopped (as by Ctrl-C) once its first window was saved."""
    from unittest import mock

    from headscan.scan import run

    calls = iter(range(100))
    with mock.patch.object(run, "stop_requests") as stop:
        stop.return_value.__enter__.return_value = lambda: next(calls) >= 2
        headscan.sweep(spec, TEXTS, out, save_every=0, **SETTINGS)


def test_a_pass_name_is_registered_once():
    with pytest.raises(ConfigError, match=r"^pass 'segment_tokens' is registered twice; pick another name"):
        register_pass(TokensPass())


def test_the_pass_lives_outside_the_scan_package():
    scan = Path(headscan.__file__).parent / "scan"
    assert not any("segment_tokens" in path.read_text() for path in scan.rglob("*.py"))
