"""The sweep's 95% intervals recomputed independently, end to end, from each segment's own sums.

A tiny GPT-2 is swept over 12 lines in 5 blank-line paragraphs (documents) with the percentile interval.
Each segment is then swept alone, which gives its own sums and counts for every row of every table (one
segment per forward pass in both sweeps, so these are the very numbers the full sweep added up); prev_token's
are also checked against the attentions of the Hugging Face model itself. From those sums this file draws the
Poisson weights with numpy, ``default_rng([seed, unit]).poisson(1.0, B)``, forms each replicate's ratio in a
plain loop, and takes ``np.percentile(ratios, [2.5, 97.5])``: the table's interval must be exactly that,
resampling segments and resampling documents. A 50% interval (the 25% and 75% points) must fail the check.
"""

import json

import numpy as np
import pandas as pd
import pytest

from headscan.config import SweepConfig
from headscan.corpus import Corpus, read_corpus
from headscan.metrics.nulls import CALIBRATION_COLUMNS
from headscan.scan import PartialState, sweep, sweep_model

B = 60
SEED = 7
PARAGRAPHS = [
    ["The old man walked down to the river.", "He looked at the boats for a long time.", "Then he went home."],
    ["A dog ran after the red car."],
    ["She wrote a letter to her father.", "It was long.", "He read it twice, and then he read it again.",
     "The letter said that the farm was sold."],
    ["Numbers like 1, 2, 3 and 42 appear too.", "the the the the"],
    ["I think the children will play by the sea.", "We can go there in the morning before the rain."],
]
LINES = [line for paragraph in PARAGRAPHS for line in paragraph]
DOCUMENT_OF = [d for d, paragraph in enumerate(PARAGRAPHS) for _ in paragraph]  # (segment,)
VALUES = ["value", "sum", "count", "ci_low", "ci_high", "units", "top_unit_share"]
# columns that differ from one segment's sweep to another's but are not resampled: the row's chance and support,
# and what is read off the interval (the test, its calibrated interval, whose factor depends on the units, and verdict)
NOT_KEYS = VALUES + ["chance", "n_eff", "variance_df", "thin", "null_kind", "null_low", "null_high", "p_value",
                     "q_value", "finding", "joint_low", "joint_high", *CALIBRATION_COLUMNS]


def settings(unit: str) -> SweepConfig:
    # one segment per forward pass, so each segment's attention is computed exactly as when it is swept alone;
    # windows of 5 segments, so the replicate totals are added up over several windows
    return SweepConfig(device="cpu", bootstrap=B, seed=SEED, interval="percentile", bootstrap_unit=unit,
                       batch_size=1, window=5)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bootstrap") / "paragraphs.txt"
    path.write_text("\n\n".join("\n".join(paragraph) for paragraph in PARAGRAPHS) + "\n")
    return path


@pytest.fixture(scope="module")
def swept(tiny_gpt2, corpus_file):
    """The sweep of the whole file, resampling segments and resampling documents."""
    return {unit: sweep(str(tiny_gpt2), corpus_file, config=settings(unit)) for unit in ("segment", "document")}


@pytest.fixture(scope="module")
def own_sums(tiny_models, corpus_file):
    """Each segment's own sums and counts for every row of each table: (segment, row) arrays."""
    corpus = read_corpus(corpus_file)
    assert [s.text for s in corpus.segments] == LINES
    alone = [sweep_model(tiny_models["gpt2"], Corpus("one", "text", "", (segment,)), SweepConfig(device="cpu", bootstrap=0))
             for segment in corpus.segments]
    out = {}
    for name in alone[0].frames:
        if name in ("weights", "composition", "examples"):
            continue  # read off the weights, or a table of units rather than sums over them: nothing to resample
        keys = [c for c in alone[0][name].columns if c not in NOT_KEYS]
        for part in alone[1:]:
            pd.testing.assert_frame_equal(part[name][keys], alone[0][name][keys])
        out[name] = (alone[0][name][keys], np.stack([part[name]["sum"].to_numpy() for part in alone]),
                     np.stack([part[name]["count"].to_numpy() for part in alone]))
    return out


def expected(sums: np.ndarray, counts: np.ndarray, unit_of: list[int], levels=(2.5, 97.5)) -> dict[str, np.ndarray]:
    """Value, interval and support of each row, from the segments' own sums: a plain loop over replicates."""
    n_units, n_rows = max(unit_of) + 1, sums.shape[1]
    unit_sums, unit_counts = np.zeros((n_units, n_rows)), np.zeros((n_units, n_rows))
    for segment, unit in enumerate(unit_of):
        unit_sums[unit] += sums[segment]
        unit_counts[unit] += counts[segment]
    weights = [np.random.default_rng([SEED, unit]).poisson(1.0, B) for unit in range(n_units)]
    low, high = np.full(n_rows, np.nan), np.full(n_rows, np.nan)
    for row in range(n_rows):
        if unit_counts[:, row].sum() == 0:
            continue  # undefined: NaN
        ratios = []
        for b in range(B):
            s = sum(weights[unit][b] * unit_sums[unit, row] for unit in range(n_units))
            c = sum(weights[unit][b] * unit_counts[unit, row] for unit in range(n_units))
            if c > 0:  # a replicate that drew no unit with a count has no ratio
                ratios.append(s / c)
        low[row], high[row] = np.percentile(ratios, levels)
    total_s, total_c = unit_sums.sum(0), unit_counts.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.abs(unit_sums).max(0) / np.abs(unit_sums).sum(0)
    return {"sum": total_s, "count": total_c, "value": np.where(total_c > 0, total_s / np.where(total_c > 0, total_c, 1), np.nan),
            "ci_low": low, "ci_high": high, "units": (unit_counts > 0).sum(0).astype(float),
            "top_unit_share": np.where(total_c > 0, share, np.nan)}


def check_tables(tables, own_sums, unit_of, columns=VALUES) -> None:
    for name, (keys, sums, counts) in own_sums.items():
        table = tables[name]
        pd.testing.assert_frame_equal(table[keys.columns.tolist()], keys)  # the same rows in the same order
        wanted = expected(sums, counts, unit_of)
        for column in columns:
            np.testing.assert_allclose(table[column].to_numpy(), wanted[column], rtol=1e-9, atol=1e-9, equal_nan=True,
                                       err_msg=f"{name}.{column}")


def test_each_segment_s_prev_token_sums_are_those_of_the_hugging_face_attentions(own_sums, tiny_gpt2, swept):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2)
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2, attn_implementation="eager").eval()
    fed_bos = swept["segment"].provenance.models[0].prepend_bos
    keys, sums, counts = own_sums["heads"]
    rows = (keys["metric"] == "prev_token").to_numpy()
    layer, head = keys.loc[rows, "layer"].to_numpy(), keys.loc[rows, "head"].to_numpy()
    for segment, line in enumerate(LINES):
        ids = tokenizer(line)["input_ids"]
        if fed_bos and ids[0] != tokenizer.bos_token_id:
            ids = [tokenizer.bos_token_id, *ids]
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions  # layer: (1, head, q, k)
        pattern = torch.stack(attentions)[:, 0].double().numpy()  # (layer, head, q, k)
        n = len(ids)
        by_hand = pattern[:, :, np.arange(1, n), np.arange(0, n - 1)].sum(-1)  # sum over q of A[q, q-1]
        np.testing.assert_allclose(sums[segment, rows], by_hand[layer, head], atol=1e-5, err_msg=line)
        assert (counts[segment, rows] == n - 1).all()


@pytest.mark.parametrize("unit, unit_of", [("segment", list(range(len(LINES)))), ("document", DOCUMENT_OF)])
def test_intervals_are_the_percentiles_of_replicates_drawn_by_hand(swept, own_sums, unit, unit_of):
    tables = swept[unit]
    assert tables.provenance.corpus.extra["documents"] == "blank-line paragraphs"
    assert tables.provenance.config["bootstrap_unit"] == unit
    check_tables(tables, own_sums, unit_of)


@pytest.mark.parametrize("unit", ["segment", "document"])
def test_intervals_hold_the_value_where_it_is_defined_and_are_nan_where_it_is_not(swept, unit):
    for name, table in swept[unit].frames.items():
        if name in ("weights", "composition", "examples"):
            continue  # read off the weights, or each unit's own value: no interval
        defined = table["count"] > 0
        assert defined.any(), name
        if name == "heads":
            assert (~defined).any()  # GPT-2 has no [SEP]: sep's rows are undefined
        assert table.loc[~defined, ["value", "ci_low", "ci_high", "top_unit_share"]].isna().all().all(), name
        assert (table.loc[~defined, "units"] == 0).all()
        rows = table[defined]
        assert rows[["value", "ci_low", "ci_high"]].notna().all().all(), name
        assert (rows["ci_low"] <= rows["value"]).all() and (rows["value"] <= rows["ci_high"]).all(), name


def test_a_fifty_percent_interval_fails_the_check(tiny_gpt2, corpus_file, own_sums, monkeypatch):
    """The check above can fail: with the 25% and 75% points in place of 2.5% and 97.5% it does."""
    values = PartialState.values
    monkeypatch.setattr(PartialState, "values", lambda self, method, level=0.95, **options: values(self, method, level=0.5,
                                                                                                 **options))
    narrow = sweep(str(tiny_gpt2), corpus_file, config=settings("segment"))
    check_tables(narrow, own_sums, list(range(len(LINES))), columns=["value", "sum", "count", "units"])  # unchanged
    with pytest.raises(AssertionError, match="heads.ci_low"):
        check_tables(narrow, own_sums, list(range(len(LINES))))
    # and what the 50% interval is, is what the same loop gives at 25 and 75
    keys, sums, counts = own_sums["heads"]
    wanted = expected(sums, counts, list(range(len(LINES))), levels=(25, 75))
    np.testing.assert_allclose(narrow.heads["ci_low"], wanted["ci_low"], rtol=1e-9, atol=1e-9, equal_nan=True)


def test_a_run_records_the_unit_it_resampled(swept, tmp_path, tiny_gpt2, corpus_file):
    out = tmp_path / "out"
    sweep(str(tiny_gpt2), corpus_file, out, config=settings("document"))
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["bootstrap_unit"] == "document" and run["config"]["interval"] == "percentile"
    assert run["corpus"]["n_documents"] == len(PARAGRAPHS)
