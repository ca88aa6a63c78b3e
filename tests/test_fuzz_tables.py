"""Fuzzing the readers of a run's files: whatever lies in a run folder, `headscan.load` (and `PartialState.load`)
either reads it or raises `headscan.errors.HeadscanError` (a `TablesError`, one line), never anything else.

One real run is made once (a tiny BERT swept as shard 0 of 2, so it holds a partial state too). Each example
puts one damaged file into a scratch copy of it, reads it, and puts the real file back: random bytes; the real file cut short or with bytes
flipped; for parquet files the real table with a column's values or its provenance metadata replaced; for
run.json the real provenance with one field's value replaced by random JSON, or text that is not JSON; for a
partial state the real .npz with its JSON header replaced. Any exception other than HeadscanError fails.
"""

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from headscan.errors import HeadscanError, TablesError
from headscan.scan import PartialState
from headscan.tables import HEAD_COLUMNS, TABLES, VALUE_COLUMNS, load

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])
TABLE_FILES = ("heads.parquet", "offsets.parquet")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, tiny_bert) -> Path:
    from headscan.scan import sweep

    out = tmp_path_factory.mktemp("fuzz-tables") / "run"
    sweep(str(tiny_bert), "builtin", out, shard="0/2", limit=4, device="cpu", bootstrap=20)
    return out


@pytest.fixture(scope="module")
def run(real_run, tmp_path_factory) -> Path:
    """A scratch copy of the real run: each example damages one file and puts it back."""
    copy = tmp_path_factory.mktemp("fuzz-scratch") / "run"
    shutil.copytree(real_run, copy)
    return copy


@pytest.fixture(scope="module")
def state_file(real_run) -> Path:
    (path,) = (real_run / "state").iterdir()
    return path


def sound(tables, run: Path) -> None:
    """What any run that loads holds: the tables the folder has, each with exactly the registry's columns, in order
    and with their dtypes, one row per key, and each head's label (one flipped byte must not load a table whose
    rows repeat a key)."""
    assert set(tables.frames) == {p.name.removesuffix(".parquet") for p in run.glob("*.parquet")}
    for name, frame in tables.frames.items():
        table = TABLES[name]
        assert list(frame.columns) == list(table.columns), name
        assert {c: str(t) for c, t in frame.dtypes.items()} == {c: str(pd.Series(dtype=t).dtype)
                                                                for c, t in table.columns.items()}, name
        assert not frame.duplicated(table.row_key).any(), name
        assert (frame["label"] == "L" + frame["layer"].astype(str) + "H" + frame["head"].astype(str)).all(), name


def read_with(run: Path, name: str, data: bytes, *, drop_run_json: bool = False):
    """Write `data` as the file `name` of `run` (a scratch copy), load it, and put the real file back: the tables
    (checked to be `sound`), or None for a HeadscanError."""
    path = run / name
    original = path.read_bytes()
    path.write_bytes(data)
    if drop_run_json:
        (run / "run.json").rename(run / "run.json.away")
    try:
        tables = load(run)
    except HeadscanError as error:
        assert "\n" not in str(error), str(error)
        event(f"{type(error).__name__}: {str(error).split(': ', 2)[-1][:40]}")
        return None
    else:
        sound(tables, run)
    finally:
        path.write_bytes(original)
        if drop_run_json:
            (run / "run.json.away").rename(run / "run.json")
    event("loaded")
    return tables


def read_state(path: Path, data: bytes):
    path.write_bytes(data)
    try:
        state = PartialState.load(path)
    except HeadscanError as error:
        assert isinstance(error, TablesError) and "\n" not in str(error)
        event(f"TablesError: {str(error).split(': ', 1)[-1][:40]}")
        return None
    event("loaded")
    return state


def damaged(original: bytes):
    """The original bytes cut short, or with a few bytes overwritten, or random bytes."""
    cut = st.integers(0, max(len(original) - 1, 0)).map(lambda n: original[:n])
    flipped = st.lists(st.tuples(st.integers(0, len(original) - 1), st.integers(0, 255)), min_size=1, max_size=4).map(
        lambda changes: _flip(original, changes))
    return st.one_of(cut, flipped, st.binary(max_size=2000))


def _flip(data: bytes, changes) -> bytes:
    out = bytearray(data)
    for where, value in changes:
        out[where] = value
    return bytes(out)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _paths(value, prefix=()):
    """Every key path into nested dicts and lists."""
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, prefix + (key,))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths(inner, prefix + (index,))


def _replace(value, path, new):
    if not path:
        return new
    value = json.loads(json.dumps(value))  # a deep copy
    inner = value
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = new
    return value


@st.composite
def mutated_json(draw, original: dict, keep: tuple = ()):
    """`original` with the value at one key path replaced by random JSON (keys in `keep` are left alone)."""
    paths = [p for p in _paths(original) if not (p and p[0] in keep) and p]
    path = draw(st.sampled_from(paths))
    return _replace(original, path, draw(JSON))


# --- parquet tables ----------------------------------------------------------------------------------------------


@FUZZ
@given(data=st.data(), name=st.sampled_from(TABLE_FILES))
def test_damaged_parquet_files(run, data, name):
    read_with(run, name, data.draw(damaged((run / name).read_bytes())))


@FUZZ
@example(name="heads.parquet", column="layer", values=2**63)
@given(name=st.sampled_from(TABLE_FILES), column=st.sampled_from([*HEAD_COLUMNS, *VALUE_COLUMNS]),
       values=st.one_of(st.text(max_size=5), st.floats(), st.integers(-2**70, 2**70), st.none(), st.booleans()))
def test_parquet_tables_with_a_column_of_other_values(run, name, column, values):
    table = pq.read_table(run / name)
    try:
        replaced = pa.array([values] * table.num_rows)
    except (pa.ArrowException, OverflowError):
        replaced = pa.array([str(values)] * table.num_rows)
    table = table.set_column(table.column_names.index(column), column, replaced)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    loaded = read_with(run, name, buffer.getvalue())
    if loaded is not None:  # the one value written, in every row, and the other columns untouched
        frame, before = loaded[name.removesuffix(".parquet")], load(run)[name.removesuffix(".parquet")]
        assert frame[column].nunique(dropna=False) == 1 and len(frame) == len(before)
        if column in VALUE_COLUMNS and isinstance(values, (int, float)) and not isinstance(values, bool):
            np.testing.assert_array_equal(frame[column], np.full(len(frame), float(values)))
        pd.testing.assert_frame_equal(frame.drop(columns=column), before.drop(columns=column))


def _with_metadata(path: Path, stamp: bytes) -> bytes:
    table = pq.read_table(path)
    metadata = dict(table.schema.metadata or {})
    metadata[b"headscan"] = stamp
    buffer = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(metadata), buffer)
    return buffer.getvalue()


@FUZZ
@example(stamp=[1], name="heads.parquet", drop_run_json=False)
@given(stamp=JSON, name=st.sampled_from(TABLE_FILES), drop_run_json=st.booleans())
def test_parquet_tables_with_other_provenance_metadata(run, stamp, name, drop_run_json):
    read_with(run, name, _with_metadata(run / name, json.dumps(stamp).encode()), drop_run_json=drop_run_json)


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


@FUZZ
@given(stamp=st.binary(max_size=50).filter(lambda b: not _is_json(b)), name=st.sampled_from(TABLE_FILES))
def test_parquet_tables_with_provenance_metadata_that_is_not_json(run, stamp, name):
    read_with(run, name, _with_metadata(run / name, stamp))


# --- run.json ----------------------------------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_damaged_run_json(run, data):
    read_with(run, "run.json", data.draw(damaged((run / "run.json").read_bytes())))


@FUZZ
@given(text=st.text(max_size=200) | JSON.map(json.dumps))
def test_run_json_that_is_other_text_or_other_json(run, text):
    read_with(run, "run.json", text.encode("utf-8", "surrogatepass"))


@FUZZ
@example(path=("corpus",), value=5)
@given(path=st.sampled_from([("corpus",), ("models",), ("models", 0), ("config",), ("extra",), ("versions",),
                             ("corpus", "extra"), ("models", 0, "extra"), ("models", 0, "special_token_ids")]),
       value=JSON)
def test_run_json_with_a_field_of_another_type(run, path, value):
    recorded = json.loads((run / "run.json").read_text())
    read_with(run, "run.json", json.dumps(_replace(recorded, path, value)).encode())


@FUZZ
@given(data=st.data())
def test_run_json_with_any_field_replaced(run, data):
    """Any field but the run id (which must match the tables' to get past the first check) and the fields of
    the test above, which are known to fail."""
    recorded = json.loads((run / "run.json").read_text())
    known_bad = ("run_id", "corpus", "models", "config", "extra", "versions")
    written = data.draw(mutated_json(recorded, keep=known_bad))
    loaded = read_with(run, "run.json", json.dumps(written).encode())
    if loaded is not None:  # the provenance holds what the file holds, the field that was replaced included
        assert json.dumps(loaded.provenance.to_json(), sort_keys=True) == json.dumps(written, sort_keys=True)


# --- partial state ------------------------------------------------------------------------------------------------


def _npz_with_header(state_file: Path, header) -> bytes:
    with np.load(state_file) as data:
        arrays = {name: data[name] for name in data.files}
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_the_real_state_reads(state_file):
    state = PartialState.load(state_file)
    assert state.finished and state.shard.index == 0 and state.shard.count == 2


@FUZZ
@example(cut=100, flips=[])
@given(cut=st.integers(0, 10_000), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3))
def test_damaged_partial_states(state_file, tmp_path, cut, flips):
    original = state_file.read_bytes()
    data = original[: cut % len(original)] if cut else original
    if data:
        data = _flip(data, [(where % len(data), value) for where, value in flips])
    read_state(tmp_path / "state.npz", data)


@FUZZ
@given(data=st.binary(max_size=2000))
def test_random_bytes_as_a_partial_state(tmp_path, data):
    read_state(tmp_path / "state.npz", data)


@FUZZ
@example(header=[1])
@example(header={"state_version": 1})
@given(header=JSON)
def test_partial_states_with_another_header(state_file, tmp_path, header):
    read_state(tmp_path / "state.npz", _npz_with_header(state_file, header))


@FUZZ
@example(field="shard", value=5)
@given(field=st.sampled_from(["fingerprint", "shard", "windows_done", "finished", "model", "n_segments", "n_tokens",
                              "n_truncated", "seconds"]), value=JSON)
def test_partial_states_with_a_header_field_of_another_type(state_file, tmp_path, field, value):
    with np.load(state_file) as data:
        header = json.loads(data["header"].tobytes())
    read_state(tmp_path / "state.npz", _npz_with_header(state_file, header | {field: value}))
