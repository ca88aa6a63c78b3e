"""Partial states without a model: merging shards against numpy sums by hand, saving and loading, and finishing.

Random arrays stand in for a sweep's sums, so these run in a blink and check the arithmetic of
`headscan.scan.state` on its own: what `tests/test_jobs.py` checks end to end on tiny checkpoints.
"""

from pathlib import Path

import numpy as np
import pytest

from headscan.config import SweepConfig
from headscan.errors import ConfigError, TablesError
from headscan.intervals import MOMENT_TERMS, replicate_moments, unit_moments, variance_df
from headscan.scan.importance import ImportanceState
from headscan.scan.passes.baseline import BaselineState
from headscan.scan.passes.weights import WeightsState
from headscan.scan.resume import check_resumable
from headscan.scan.state import PartialState, Shard, fingerprint_differences, merge_states
from headscan.setting import fingerprinted

SHAPE = (2, 3, 4)  # (layer, head, column)
FINGERPRINT = {"headscan": "0.1.0", "model": {"name": "m", "id": "m", "revision": "r"},
               "corpus": {"source": "c.txt", "kind": "text", "sha256": "0" * 64},
               "settings": {name: None for name in fingerprinted(SweepConfig)}, "columns": [["prev_token", []]]}


def shard_state(index: int, count: int = 3, seed: int = 0, replicates: int = 5) -> PartialState:
    """A finished state of shard `index` with random sums over 4 units of its own."""
    rng = np.random.default_rng([seed, index])
    sums = rng.uniform(0, 3, (4, *SHAPE))  # (unit, layer, head, column)
    counts = rng.integers(0, 5, (4, *SHAPE)).astype(float)
    weights = rng.poisson(1.0, (replicates, 4)).astype(float)  # (replicate, unit)
    state = PartialState(dict(FINGERPRINT), Shard(index, count), sums.sum(0), counts.sum(0),
                         np.einsum("ru,u...->r...", weights, sums), np.einsum("ru,u...->r...", weights, counts),
                         unit_moments(sums, counts), 0.5 * counts.sum(0), replicate_moments(weights, sums, counts),
                         windows_done=index + 1, finished=True, model={"name": "m"},
                         n_segments=4 + index, n_tokens=40 + index, n_truncated=index, n_tokens_lost=2 * index,
                         seconds=1.5 + index,
                         passes={"weights": WeightsState(np.full((1, 2, 3), 0.25), "tied", "embedding tied"),
                                 "baseline": BaselineState(rng.uniform(0, 2, (2, 6, 5)))})
    state.units, state.draws = (sums, counts), weights  # kept for the hand computation below
    return state


def test_merged_shards_are_the_sums_by_hand():
    states = [shard_state(k) for k in (2, 0, 1)]  # in any order
    merged = merge_states(states, ["c", "a", "b"])
    sums = np.concatenate([s.units[0] for s in states])  # every unit of every shard: (unit, layer, head, column)
    counts = np.concatenate([s.units[1] for s in states])
    np.testing.assert_allclose(merged.sums, sums.sum(0), rtol=1e-12)
    np.testing.assert_allclose(merged.counts, counts.sum(0), rtol=1e-12)
    np.testing.assert_allclose(merged.replicate_sums, sum(s.replicate_sums for s in states), rtol=1e-12)
    np.testing.assert_allclose(merged.replicate_counts, sum(s.replicate_counts for s in states), rtol=1e-12)
    np.testing.assert_allclose(merged.moments, unit_moments(sums, counts), rtol=1e-12)  # max |s| by max
    power = sum(np.einsum("ru,u...->r...", s.draws, np.stack([u[0] ** 2, u[0] * u[1], u[1] ** 2]).swapaxes(0, 1))
                for s, u in ((s, s.units) for s in states))  # sum_u w_bu (s^2, sc, c^2) by hand, shard by shard
    np.testing.assert_allclose(merged.replicate_power, power.swapaxes(0, 1), rtol=1e-12)
    np.testing.assert_allclose(merged.chance, 0.5 * counts.sum(0), rtol=1e-12)
    np.testing.assert_allclose(merged.passes["baseline"].sums, sum(s.passes["baseline"].sums for s in states),
                               rtol=1e-12)
    # read off the weights: once, not summed
    np.testing.assert_array_equal(merged.passes["weights"].scores, states[0].passes["weights"].scores)
    assert (merged.n_segments, merged.n_tokens, merged.n_truncated, merged.n_tokens_lost) == (15, 123, 3, 6)
    assert merged.seconds == pytest.approx(1.5 * 3 + 3)
    assert merged.shard is None and merged.fingerprint["shard"] is None and merged.finished
    assert merged.passes["weights"].embedding == "tied" and merged.model == {"name": "m"}
    for state in states:  # the shards themselves are left as they were
        np.testing.assert_array_equal(state.sums, state.units[0].sum(0))


def test_a_merge_refuses_what_is_not_every_shard_of_one_sweep():
    a, b, c = (shard_state(k) for k in range(3))
    with pytest.raises(TablesError, match=r"^merge needs at least one shard$"):
        merge_states([], [])
    with pytest.raises(TablesError, match=r"^shards 2/3 are missing; merge needs all 3$"):
        merge_states([a, b], ["a", "b"])
    with pytest.raises(TablesError, match=r"^shard 1/3 is given twice \(b and b2\); each shard must be merged once$"):
        merge_states([a, b, shard_state(1), c], ["a", "b", "b2", "c"])
    other = shard_state(2, count=4)
    with pytest.raises(TablesError, match=r"^c: shard 2/4 is one of 4, but a is one of 3$"):
        merge_states([a, b, other], ["a", "b", "c"])
    whole = shard_state(0)
    whole.shard = None
    with pytest.raises(TablesError, match=r"^w: was not swept with --shard"):
        merge_states([whole], ["w"])
    c.finished = False
    with pytest.raises(TablesError, match=r"^c: shard 2/3 did not finish \(3 windows done\); rerun its command"):
        merge_states([a, b, c], ["a", "b", "c"])
    c.finished = True
    c.fingerprint = dict(FINGERPRINT, settings=dict(FINGERPRINT["settings"], seed=1))
    with pytest.raises(TablesError, match=r"^c: not a shard of the same sweep as a: settings.seed: None != 1$"):
        merge_states([a, b, c], ["a", "b", "c"])


def test_the_order_of_a_fingerprint_s_keys_changes_nothing():
    """A saved state's fingerprint is compared key by key, never hashed: one written with its settings in another
    order (a state saved when the settings were listed otherwise) still matches."""
    ordered = {**FINGERPRINT, "settings": {name: i for i, name in enumerate(FINGERPRINT["settings"])}}
    turned = {**ordered, "settings": dict(reversed(ordered["settings"].items()))}
    assert list(turned["settings"]) != list(ordered["settings"])
    assert fingerprint_differences(turned, ordered) == []
    state = PartialState.empty(turned, None, SHAPE, 0)
    check_resumable(state, ordered, None, "state.npz", "m")  # refuses nothing


def test_fingerprint_differences_name_each_key_and_the_columns_last():
    other = dict(FINGERPRINT, model=dict(FINGERPRINT["model"], id="x"), columns=[["a", []], ["b", []]])
    assert fingerprint_differences(FINGERPRINT, other) == [
        "model.id: 'm' != 'x'",
        "columns: 1 != 2 score columns (1 only on the left, such as prev_token; 2 only on the right, such as a; "
        "metrics or their axes differ)"]
    assert fingerprint_differences(FINGERPRINT, dict(FINGERPRINT)) == []


def test_a_saved_state_loads_back_field_by_field(tmp_path):
    state = shard_state(1)
    state.passes["importance"] = ImportanceState(np.random.default_rng(2).normal(size=(2, 3, 4)),  # (layer, head, d)
                                                 {"target": "next_token_loss", "ablated": [[0, 1], [1, 2]], "sample": 7},
                                                 "from the ablated layer on")
    path = tmp_path / "s" / "x.npz"
    state.save(path)
    back = PartialState.load(path)
    for name in ("sums", "counts", "replicate_sums", "replicate_counts", "moments"):
        np.testing.assert_array_equal(getattr(back, name), getattr(state, name), err_msg=name)
    for name in ("fingerprint", "shard", "windows_done", "finished", "model", "n_segments", "n_tokens", "n_truncated",
                 "n_tokens_lost", "seconds"):
        assert getattr(back, name) == getattr(state, name), name
    assert list(back.passes) == ["weights", "baseline", "importance"]  # registry order, whatever order they came in
    for name, own in state.passes.items():  # each pass's dataclass, field by field
        for key, value in vars(own).items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(getattr(back.passes[name], key), value, err_msg=f"{name}.{key}")
            else:
                assert getattr(back.passes[name], key) == value, f"{name}.{key}"
    assert [p.name for p in path.parent.iterdir()] == ["x.npz"]  # no temporary file left beside it


def test_values_are_ratios_with_nan_where_nothing_counts():
    state = shard_state(0)
    state.counts[0, 0, 0] = 0.0
    found = state.values("percentile")
    with np.errstate(invalid="ignore", divide="ignore"):
        want = state.sums / state.counts
    want[0, 0, 0] = np.nan
    np.testing.assert_array_equal(found["value"], want)
    assert np.isnan(found["ci_low"][0, 0, 0]) and np.isnan(found["ci_high"][0, 0, 0])
    np.testing.assert_array_equal(found["sum"], state.sums)
    np.testing.assert_array_equal(found["count"], state.counts)
    contributing = (state.units[1] > 0).sum(0)
    np.testing.assert_array_equal(found["units"], contributing)
    defined = state.counts > 0
    assert np.all(found["ci_low"][defined & np.isfinite(found["ci_low"])] <= found["ci_high"][defined & np.isfinite(found["ci_low"])])
    empty = PartialState.empty(FINGERPRINT, None, SHAPE, 0)  # no replicates: no interval
    assert np.isnan(empty.values("bca")["ci_low"]).all()
    assert empty.moments.shape == (len(MOMENT_TERMS), *SHAPE) and not empty.moments.any()


def test_shards_hold_their_documents():
    assert [d for d in range(10) if Shard(1, 3).holds(d)] == [1, 4, 7]
    assert str(Shard.parse(" 2/5")) == "2/5"
    for text in ("3/3", "-1/3", "a/3", "1", "1/0"):
        with pytest.raises(ConfigError, match="shard must be K/N"):
            Shard.parse(text)


# --- saving atomically, and refusing damaged files with the reason ------------------------------------------------


def test_saving_writes_beside_the_file_and_replaces_it(tmp_path, monkeypatch):
    import os

    path = tmp_path / "a" / "b" / "x.npz"  # folders that do not exist yet
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (replaced.append(Path(src)), real_replace(src, dst)))
    shard_state(0).save(path)
    shard_state(1).save(path)  # again, over it
    assert PartialState.load(path).shard == Shard(1, 3)
    # a hidden temporary file in the same folder, renamed onto the file: a reader never sees half of one
    assert [p.parent for p in replaced] == [path.parent] * 2
    assert all(p.name.startswith(".x.npz.") and p.name.endswith(".tmp") for p in replaced)
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.npz"]


def test_a_save_that_fails_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(np, "savez", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        shard_state(0).save(tmp_path / "x.npz")
    assert list(tmp_path.iterdir()) == []


def test_variance_df_is_read_off_the_replicates_power_sums_and_nan_without_them():
    state = shard_state(0)
    defined = state.counts > 0
    found = state.values("percentile")["variance_df"]
    # the degrees of freedom themselves are checked against their definition in test_intervals.py: here, that a
    # state with power sums reports them and one without reports none
    want = variance_df(state.replicate_sums, state.replicate_counts, state.replicate_power)
    np.testing.assert_array_equal(found[defined], want[defined])
    assert np.isfinite(found[defined]).sum() > defined.sum() // 2 and np.isnan(found[~defined]).all()
    state.replicate_power = np.zeros((0,))  # an older state: no power sums
    assert np.isnan(state.values("percentile")["variance_df"]).all()


def test_an_unsharded_state_and_one_without_passes_load(tmp_path):
    state = shard_state(0)
    state.shard = None
    state.save(tmp_path / "whole.npz")
    assert PartialState.load(tmp_path / "whole.npz").shard is None
    state.passes = {}
    state.save(tmp_path / "bare.npz")
    assert PartialState.load(tmp_path / "bare.npz").passes == {}


def test_a_state_with_a_pass_this_headscan_lacks_is_refused_in_one_line(tmp_path):
    import json

    path = tmp_path / "x.npz"
    shard_state(0).save(path)
    data = dict(np.load(path))
    header = json.loads(data["header"].tobytes())
    header["passes"]["tokens"] = {}
    data["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(path, **data)
    with pytest.raises(TablesError, match=rf"^{path}: holds the state of a pass 'tokens' this headscan does not have "
                                          r"\(it has weights, composition, baseline, importance, similarity, examples\); register that pass, "
                                          r"or delete the state \(or pass --restart\) to start that part again$"):
        PartialState.load(path)


def _resaved(tmp_path, header=None, **arrays) -> Path:
    """A saved state with its header or some arrays replaced."""
    import json

    state = shard_state(0)
    state.save(tmp_path / "x.npz")
    data = dict(np.load(tmp_path / "x.npz"))
    if header is not None:
        data["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    data.update(arrays)
    path = tmp_path / "damaged.npz"
    np.savez(path, **data)
    return path


@pytest.mark.parametrize("shard, ok", [(None, True), ([1, 3], True), ([1, True], False), ("1/3", False),
                                       ([1, 2, 3], False), ([1.0, 3], False)])
def test_the_header_shard_must_be_two_whole_numbers(tmp_path, shard, ok):
    path = _resaved(tmp_path, header=shard_state(0).header() | {"shard": shard})
    if ok:
        assert PartialState.load(path).shard == (Shard(*shard) if shard else None)
    else:
        with pytest.raises(TablesError, match=r"not a readable headscan partial state \(bad or missing shard in its "
                                              r"header\); delete it to start that part again$"):
            PartialState.load(path)


@pytest.mark.parametrize("field", ["windows_done", "n_tokens", "fingerprint"])
def test_a_header_field_of_the_wrong_type_is_named(tmp_path, field):
    path = _resaved(tmp_path, header=shard_state(0).header() | {field: "x", "finished": "yes"})
    with pytest.raises(TablesError, match=rf"\(bad or missing finished, {field} in its header\)|"
                                          rf"\(bad or missing {field}, finished in its header\)"):
        PartialState.load(path)


def test_damaged_states_say_why(tmp_path):
    def refused(path, why):
        with pytest.raises(TablesError, match=rf"^{path}: not a readable headscan partial state \({why}\); delete it"):
            PartialState.load(path)

    refused(_resaved(tmp_path, header=[1, 2]), "its header is not a JSON object")
    refused(_resaved(tmp_path, counts=np.zeros((1, 1, 1))), "its arrays do not fit together")
    refused(_resaved(tmp_path, replicate_counts=np.zeros((1, 1, 1, 1))), "its arrays do not fit together")
    refused(_resaved(tmp_path, **{"baseline.sums": np.zeros((2, 3))}), "pass baseline: its arrays do not fit together")
    refused(_resaved(tmp_path, **{"baseline.sums": np.zeros((3, 6, 5))}), "pass baseline: its arrays do not fit "
                                                                           "together")
    refused(_resaved(tmp_path, **{"weights.scores": np.full((1, 2, 3), "x")}), "pass weights: <U1 not numbers")
    refused(_resaved(tmp_path, sums=np.array([{"a": 1}], dtype=object)), "ValueError")  # never unpickled
    (tmp_path / "cut.npz").write_bytes((tmp_path / "x.npz").read_bytes()[:100])
    refused(tmp_path / "cut.npz", "BadZipFile")



def test_a_state_saved_by_hand_in_another_layout_loads_as_the_sweep_adds_into_it(tmp_path):
    # float32, Fortran order or whole numbers load as C-ordered float64: a resumed sweep adds into them in place
    import torch

    from headscan import intervals

    state = shard_state(0)
    path = _resaved(tmp_path, replicate_sums=np.asfortranarray(state.replicate_sums.astype(np.float32)),
                    counts=state.counts.astype(np.int64),
                    **{"baseline.sums": np.asfortranarray(state.passes["baseline"].sums)})
    loaded = PartialState.load(path)
    state.baseline, loaded.baseline = state.passes["baseline"].sums, loaded.passes["baseline"].sums
    for name in ("replicate_sums", "counts", "baseline", "sums", "replicate_power"):
        array = getattr(loaded, name)
        assert array.dtype == np.float64 and array.flags.c_contiguous, name
        np.testing.assert_allclose(array, getattr(state, name), rtol=1e-6)
    totals = torch.from_numpy(loaded.replicate_sums)
    units = torch.ones((1, totals[0].numel()), dtype=torch.float64)
    intervals.add_product(totals, torch.ones((totals.shape[0], 1), dtype=torch.float64), units)  # no error
    np.testing.assert_allclose(loaded.replicate_sums, state.replicate_sums + 1, rtol=1e-6)
    with pytest.raises(TablesError, match=r"\(sums \(<U1\) not numbers\); delete it"):
        PartialState.load(_resaved(tmp_path, sums=np.full(state.sums.shape, "x")))

def test_an_empty_state_is_zeros_of_its_shape_for_its_shard():
    state = PartialState.empty(FINGERPRINT, Shard(1, 2), SHAPE, 7)
    assert state.shard == Shard(1, 2) and state.fingerprint == FINGERPRINT and not state.finished
    assert state.sums.shape == state.counts.shape == SHAPE and state.replicate_sums.shape == (7, *SHAPE)
    assert state.replicate_counts.shape == (7, *SHAPE) and state.moments.shape == (len(MOMENT_TERMS), *SHAPE)
    assert not (state.sums.any() or state.counts.any() or state.replicate_sums.any() or state.moments.any())
    state.sums += 1  # its arrays are its own
    assert not state.counts.any()
    assert Shard.parse("0/2") == Shard(0, 2)  # K counts from 0


def test_a_state_of_an_older_version_is_refused_with_what_it_lacks(tmp_path):
    import json

    path = tmp_path / "old.npz"
    shard_state(0).save(path)
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    header = json.loads(arrays["header"].tobytes()) | {"state_version": 2}
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    del arrays["replicate_power"]
    np.savez(path, **arrays)
    with pytest.raises(TablesError, match=r"version 2, this headscan reads 4 \(version 3 added the replicates' power "
                                          r"sums.*\); delete it, or pass --restart"):
        PartialState.load(path)


def test_a_query_chunk_from_before_its_default_changed_is_named_with_the_flag_that_matches_it():
    old, new = {"settings": {"query_chunk": 64, "seed": 0}}, {"settings": {"query_chunk": None, "seed": 0}}
    assert fingerprint_differences(old, new) == [
        "settings.query_chunk: 64 != None (pass --query-chunk 64 to match the other run)"]
    assert fingerprint_differences(new, old)[0].endswith("(pass --query-chunk 64 to match the other run)")
    assert fingerprint_differences({"settings": {"query_chunk": 8}}, {"settings": {"query_chunk": 16}}) == [
        "settings.query_chunk: 8 != 16"]


def test_a_state_saved_in_the_layout_before_passes_is_refused_in_one_line(tmp_path):
    """Version 3 kept the weights, baseline, importance and similarity as arrays and header keys of the state
    itself; such a file is refused with what it lacks and how to go on, never a traceback."""
    import json

    state = shard_state(0)
    header = {k: v for k, v in state.header().items() if k != "passes"}
    header |= {"state_version": 3, "embedding": "tied", "importance": {}}
    path = tmp_path / "v3.npz"
    np.savez(path, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
             **{name: getattr(state, name) for name in ("sums", "counts", "replicate_sums", "replicate_counts",
                                                        "moments", "chance", "replicate_power")},
             baseline=state.passes["baseline"].sums, weights=state.passes["weights"].scores,
             head_means=np.zeros((0, 0, 0)), similarity=np.zeros((2, 0, 0)))
    with pytest.raises(TablesError) as refused:
        PartialState.load(path)
    assert str(refused.value) == (f"{path}: partial state version 3, this headscan reads 4 (version 4 added each "
                                  f"pass's state under its own name, which an older state cannot supply); delete it, "
                                  f"or pass --restart, to start that part again")
