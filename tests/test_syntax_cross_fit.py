"""The syntax table's cross-fit: each half of the units (by index parity) scored with the best offset and the best
head of the other half, against plain loops over units; a planted noise relation shows the winner's curse it
removes; the report's best heads rest on it, with the in-sample numbers beside."""

import math

import numpy as np
import pandas as pd
import pytest

from headscan.analysis.syntax import best_heads, syntax_display, syntax_findings
from headscan.metrics.syntax import BASELINE_OFFSETS, PLAIN_COLUMNS, visible_offsets
from headscan.scan.passes.baseline import BaselinePass, BaselineState, cross_fit

Z = 1.959963984540054  # the normal's 97.5% quantile: the delta method's 95% interval


# --- plain loops ---------------------------------------------------------------------------------------------


def choose_offset(hits: dict, total: int, causal: bool = False) -> int | None:
    """The offset with the most hits (`hits`: offset -> hits over `total` dependents), ties to the larger offset;
    None where there is no dependent."""
    if total == 0:
        return None
    best = None
    for d in BASELINE_OFFSETS:
        if causal and d > 0:
            continue
        if best is None or hits[d] >= hits[best]:
            best = d
    return best


def delta(d: list, c: list) -> tuple[float, float, float]:
    """The ratio sum d / sum c and its delta-method 95% interval over the units, clipped to [-1, 1]."""
    d, c = np.asarray(d, dtype=float), np.asarray(c, dtype=float)
    mean = d.sum() / c.sum()
    se = math.sqrt(len(d) / (len(d) - 1) * ((d - mean * c) ** 2).sum()) / c.sum()
    return mean, max(-1.0, mean - Z * se), min(1.0, mean + Z * se)


def plain_cross_fit(head_hits: dict, base_hits: dict, totals: dict, units: list, heads: list, causal=False):
    """The cross-fit by loops over units, for one column: `head_hits[unit][head]`, `base_hits[unit][offset]`,
    `totals[unit]` dependents. On the units of each half (index parity), the offset and head chosen on the other.

    Returns the offsets and heads each half chose, per head (row) the held-out baseline and (vs, low, high), and
    the best head's held-out accuracy and (vs, low, high)."""
    halves = {h: [u for u in units if u % 2 == h] for h in (0, 1)}
    offset, pick = {}, {}
    for h, mine in halves.items():
        total = sum(totals[u] for u in mine)
        offset[h] = choose_offset({d: sum(base_hits[u][d] for u in mine) for d in BASELINE_OFFSETS}, total, causal)
        best = None
        for head in heads:  # in (layer, head) order: ties to the first
            hits = sum(head_hits[u][head] for u in mine)
            if best is None or hits > best[0]:
                best = (hits, head)
        pick[h] = best[1] if total else None
    other = {u: 1 - u % 2 for u in units}
    c = [totals[u] for u in units]
    baseline = sum(base_hits[u][offset[other[u]]] for u in units) / sum(c)
    rows = {head: delta([head_hits[u][head] - base_hits[u][offset[other[u]]] for u in units], c) for head in heads}
    best_accuracy = sum(head_hits[u][pick[other[u]]] for u in units) / sum(c)
    best = delta([head_hits[u][pick[other[u]]] - base_hits[u][offset[other[u]]] for u in units], c)
    return offset, pick, baseline, rows, best_accuracy, best


# --- a noise relation planted in a state ---------------------------------------------------------------------

DET = PLAIN_COLUMNS.index(("det", "dependent_to_head"))


def noise_units(seed: int, n_units=120, n_layers=6, n_heads=12, rate=0.4):
    """Per unit, the hits of every head and every offset on det (dependent to head), each an independent draw at
    the same `rate`: a relation no head and no offset knows anything about."""
    rng = np.random.default_rng(seed)
    c = rng.integers(5, 15, n_units)
    heads = rng.binomial(c[:, None, None], rate, (n_units, n_layers, n_heads))
    offsets = rng.binomial(c[:, None], rate, (n_units, len(BASELINE_OFFSETS)))
    return heads, offsets, c


def state_of(heads: np.ndarray, offsets: np.ndarray, c: np.ndarray, index=None) -> BaselineState:
    """The pass's state of per-unit hits on the det column alone (the power sums its docstring defines), written
    out here from the units (their indices `index`, by default 0, 1, ...): whole corpus and each half of the
    units (index parity). A bidirectional model's columns: the plain directions alone."""
    n_units, n_layers, n_heads = heads.shape
    index = np.arange(n_units) if index is None else np.asarray(index)
    n_offsets, n_columns = len(BASELINE_OFFSETS), len(PLAIN_COLUMNS)

    def sums(units):  # every column but det has no dependent: zeros
        h, b, count = heads[units].astype(float), offsets[units].astype(float), c[units].astype(float)
        difference = h[:, None] - b[:, :, None, None]  # (unit, offset, layer, head)
        base, paired = np.zeros((2, n_offsets, n_columns)), np.zeros((2, n_offsets, n_layers, n_heads, n_columns))
        power, hits = np.zeros((2, n_columns)), np.zeros((n_layers, n_heads, n_columns))
        base[0, :, DET], base[1, :, DET] = b.sum(0), count.sum()
        paired[0, ..., DET] = (difference ** 2).sum(0)
        paired[1, ..., DET] = (difference * count[:, None, None, None]).sum(0)
        power[0, DET], power[1] = (count ** 2).sum(), len(units)
        hits[..., DET] = h.sum(0)
        return base, paired, power, hits

    every = np.arange(n_units)
    whole = sums(every)
    halves = [sums(every[index % 2 == h]) for h in (0, 1)]
    return BaselineState(whole[0], whole[1], whole[2], np.stack([x[0] for x in halves]),
                         np.stack([x[3] for x in halves]), np.stack([x[1] for x in halves]),
                         np.stack([x[2] for x in halves]))


def frame_of(heads: np.ndarray, c: np.ndarray, state: BaselineState) -> pd.DataFrame:
    """The syntax table's det rows of every head, shaped by the baseline pass as a sweep shapes them."""
    _, n_layers, n_heads = heads.shape
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    hits = heads.sum(0).reshape(-1).astype(float)
    value = hits / c.sum()
    frame = pd.DataFrame({"model": "m", "family": "bidirectional", "layer": layer, "head": head,
                          "label": [f"L{a}H{b}" for a, b in zip(layer, head)], "relation": "det",
                          "direction": "dependent_to_head", "value": value, "sum": hits, "count": float(c.sum()),
                          "ci_low": value - 0.01, "ci_high": value + 0.01, "units": float(len(c)),
                          "top_unit_share": 0.02, "chance": 0.1})
    return BaselinePass().shape_frame(state, "syntax", frame, "bidirectional")


def loops_of(heads: np.ndarray, offsets: np.ndarray, c: np.ndarray):
    _, n_layers, n_heads = heads.shape
    names = [(a, b) for a in range(n_layers) for b in range(n_heads)]
    units = list(range(len(c)))
    head_hits = {u: {(a, b): int(heads[u, a, b]) for a, b in names} for u in units}
    base_hits = {u: {d: int(offsets[u, k]) for k, d in enumerate(BASELINE_OFFSETS)} for u in units}
    return plain_cross_fit(head_hits, base_hits, {u: int(c[u]) for u in units}, units, names)


def test_the_cross_fit_of_a_noise_relation_equals_a_plain_loop_over_units():
    heads, offsets, c = noise_units(0)
    frame = frame_of(heads, c, noise := state_of(heads, offsets, c))
    offset, pick, baseline, rows, best_accuracy, best = loops_of(heads, offsets, c)
    assert frame["baseline_offset_even"].iloc[0] == offset[0] and frame["baseline_offset_odd"].iloc[0] == offset[1]
    np.testing.assert_allclose(frame["baseline"], baseline, rtol=0, atol=1e-12)
    for row in frame.itertuples():
        assert (row.vs_baseline, row.vs_baseline_low, row.vs_baseline_high) == pytest.approx(
            rows[(row.layer, row.head)], abs=1e-12)
        assert row.vs_baseline == pytest.approx(row.value - row.baseline, abs=1e-12)
        assert bool(row.best_even) == ((row.layer, row.head) == pick[0])
        assert bool(row.best_odd) == ((row.layer, row.head) == pick[1])
        assert row.best_held_out == pytest.approx(best_accuracy, abs=1e-12)
        assert (row.best_vs_baseline, row.best_vs_baseline_low, row.best_vs_baseline_high) == pytest.approx(
            best, abs=1e-12)
    # cross_fit alone reads each row's own column: one row handed over gets what it gets among the others
    one = cross_fit(frame.iloc[[5]], noise)
    assert one["vs_baseline"][0] == pytest.approx(frame["vs_baseline"].iloc[5], abs=1e-15)


def test_a_noise_relation_beats_its_offset_in_sample_and_not_held_out():
    """No head and no offset knows det here: every one hits at the same rate. Chosen and scored on the same units
    the best of 72 heads beats the best of six offsets (the winner's curse); cross-fitted it does not, on
    average over 30 draws, and the held-out baseline and best head are never above the in-sample ones (a choice
    made on the other half cannot beat the best on the whole, half by half)."""
    in_sample, held_out = [], []
    for seed in range(30):
        heads, offsets, c = noise_units(seed)
        frame = frame_of(heads, c, state_of(heads, offsets, c))
        best = frame.loc[frame["value"].idxmax()]
        assert (frame["baseline"] <= frame["baseline_in_sample"] + 1e-12).all()
        assert best["best_held_out"] <= best["value"] + 1e-12
        in_sample.append(best["vs_baseline_in_sample"])
        held_out.append(best["best_vs_baseline"])
    in_sample, held_out = np.array(in_sample), np.array(held_out)
    se = held_out.std(ddof=1) / math.sqrt(len(held_out))
    assert in_sample.mean() > 3 * in_sample.std(ddof=1) / math.sqrt(len(in_sample))  # the curse: a margin over nothing
    assert abs(held_out.mean()) < 3 * se  # held out: about 0
    assert (in_sample - held_out).mean() > 3 * (in_sample - held_out).std(ddof=1) / math.sqrt(len(held_out))


def test_the_report_rests_on_the_held_out_difference_with_the_in_sample_one_beside():
    heads, offsets, c = noise_units(3)
    frame = frame_of(heads, c, state_of(heads, offsets, c))
    best = best_heads(frame)
    assert len(best) == 1
    row = best.iloc[0]
    named = frame.loc[frame["value"].idxmax()]
    assert row["label"] == named["label"] and row["held_out"]
    assert row["vs_baseline"] == named["best_vs_baseline"] and row["margin"] == named["best_vs_baseline_low"]
    assert row["beats"] == (named["best_vs_baseline_low"] > 0)
    assert row["vs_baseline_in_sample"] == named["vs_baseline_in_sample"]
    assert row["baseline_in_sample"] == named["baseline_in_sample"]
    assert row["accuracy_held_out"] == named["best_held_out"]
    even = frame.loc[frame["best_even"].astype(bool), "label"].iloc[0]
    odd = frame.loc[frame["best_odd"].astype(bool), "label"].iloc[0]
    assert row["halves"] == (even if even == odd else f"{even} / {odd}")
    cells = syntax_display(best).iloc[0]
    assert cells["in-sample vs baseline"] == f"{named['vs_baseline_in_sample']:+.3f}"
    assert cells["held-out vs baseline"] == f"{named['best_vs_baseline']:+.3f}"
    assert cells["held-out accuracy"] == f"{named['best_held_out']:.3f}"
    assert cells["in-sample baseline"] == f"{named['baseline_in_sample']:.3f}"
    # a finding's sentence says it is held out and what in sample said
    said = syntax_findings(best.assign(beats=True))["m"][0]
    assert "held out" in said and f"{100 * named['vs_baseline_in_sample']:+.1f} in sample" in said


def test_a_table_written_before_the_cross_fit_is_judged_in_sample_and_says_so():
    heads, offsets, c = noise_units(4)
    frame = frame_of(heads, c, state_of(heads, offsets, c))
    old = frame.drop(columns=[col for col in frame.columns if col.startswith("best_") or "in_sample" in col
                              or col.startswith("baseline_offset_")])
    old = old.assign(baseline=frame["baseline_in_sample"], vs_baseline=frame["vs_baseline_in_sample"],
                     vs_baseline_low=frame["vs_baseline_in_sample_low"],
                     vs_baseline_high=frame["vs_baseline_in_sample_high"])
    row = best_heads(old).iloc[0]
    named = frame.loc[frame["value"].idxmax()]
    assert not row["held_out"] and row["halves"] == "" and np.isnan(row["accuracy_held_out"])
    assert row["margin"] == named["vs_baseline_in_sample_low"]
    assert row["vs_baseline_in_sample"] == row["vs_baseline"] == named["vs_baseline_in_sample"]


def test_a_column_with_no_dependent_in_one_half_has_no_cross_fit():
    heads, offsets, c = noise_units(5, n_units=9)
    odd = np.arange(len(c)) % 2 == 1
    heads, offsets, c = heads * ~odd[:, None, None], offsets * ~odd[:, None], c * ~odd  # the odd units: none
    frame = frame_of(heads, c, state_of(heads, offsets, c))
    for column in ("baseline", "vs_baseline", "vs_baseline_low", "best_held_out", "best_vs_baseline"):
        assert frame[column].isna().all(), column
    assert frame["baseline_offset_odd"].isna().all() and frame["best_odd"].isna().all()
    assert frame["baseline_offset_even"].notna().all() and frame["vs_baseline_in_sample"].notna().all()
    assert not best_heads(frame)["beats"].any()


def test_the_halves_are_saved_merged_and_loaded_and_an_older_state_leaves_the_cross_fit_nan():
    heads, offsets, c = noise_units(6, n_units=10)
    whole = state_of(heads, offsets, c)
    one = BaselinePass()
    back = one.load(*one.save(whole))
    for name in ("half_sums", "half_heads", "half_paired", "half_units"):
        np.testing.assert_array_equal(getattr(back, name), getattr(whole, name))
    # two shards of disjoint units add up to the whole, halves and all (the halves are of unit indices)
    first, second = (state_of(heads[part], offsets[part], c[part], index=part) for part in (np.arange(4),
                                                                                         np.arange(4, 10)))
    merged = one.merge([first, second], ["a", "b"])
    np.testing.assert_allclose(merged.half_units, whole.half_units, rtol=0, atol=0)
    np.testing.assert_allclose(merged.half_paired, whole.half_paired, rtol=0, atol=1e-9)
    np.testing.assert_allclose(merged.half_heads, whole.half_heads, rtol=0, atol=1e-9)
    header, arrays = one.save(whole)
    older = one.load(header, {k: v for k, v in arrays.items() if not k.startswith("half_")})
    assert not older.has_halves and one.notes(older)["syntax_cross_fit"].startswith("none")
    frame = frame_of(heads, c, older)
    assert frame["vs_baseline"].isna().all() and frame["vs_baseline_in_sample"].notna().all()
    with pytest.raises(ValueError, match="do not fit"):
        one.load(header, arrays | {"half_heads": arrays["half_heads"][:, :1]})


def test_a_causal_models_halves_choose_among_the_offsets_its_queries_see():
    heads, offsets, c = noise_units(7)
    offsets[:, BASELINE_OFFSETS.index(2)] = c  # +2 always right: a causal query cannot look there
    state = state_of(heads, offsets, c)
    frame = frame_of(heads, c, state)
    causal = cross_fit(frame, state, causal=True)
    assert set(causal["baseline_offset_even"]) <= set(visible_offsets(True))
    assert (frame["baseline_offset_even"] == 2).all()  # bidirectional: +2


# --- the sweep, against Hugging Face's attentions looped over documents ---------------------------------------


def test_the_sweeps_cross_fit_equals_a_plain_loop_over_documents(tiny_bert, tmp_path):
    """A tiny random BERT over 24 sentences in 12 documents: every row's cross-fitted baseline and difference, and
    each relation's cross-fitted best head, equal the loops of `plain_cross_fit` over Hugging Face's attentions
    (the documents split by index parity)."""
    from conftest import treebank_corpus
    from test_syntax import corpus_loop_accuracy
    from transformers import AutoModel, AutoTokenizer

    import headscan
    from headscan.corpus import read_corpus

    path = treebank_corpus(tmp_path, 24, per_document=2)
    syntax = headscan.sweep(str(tiny_bert), path, device="cpu", bootstrap=0, attention="eager")["syntax"]
    model = AutoModel.from_pretrained(tiny_bert, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    relations = ["all", "nsubj", "det"]
    segments = read_corpus(path).segments
    units = sorted({segment.document for segment in segments})
    assert len(units) == 12
    head_hits = {u: {} for u in units}  # unit -> {(layer, head, relation, direction): hits}
    totals = {u: {} for u in units}  # unit -> {(relation, direction): dependents}
    base_hits = {u: {} for u in units}  # unit -> {(offset, relation, direction): hits}
    for segment in segments:
        u = segment.document
        for key, (hits, total) in corpus_loop_accuracy(model, tokenizer, [segment], relations).items():
            head_hits[u][key] = head_hits[u].get(key, 0) + hits
            if key[:2] == (0, 0):  # every head counts the same dependents: add them once
                totals[u][key[2:]] = totals[u].get(key[2:], 0) + total
        for direction in syntax["direction"].unique():
            plain = direction.removesuffix("_visible")
            for relation in relations:
                for d in BASELINE_OFFSETS:
                    hits = sum((head - 1 == i + d) if plain == "dependent_to_head" else (i == head - 1 + d)
                               for i, (head, deprel) in enumerate(zip(segment.heads, segment.deprels))
                               if head != 0 and relation in ("all", "all_nonroot", deprel.split(":")[0]))
                    key = (d, relation, direction)
                    base_hits[u][key] = base_hits[u].get(key, 0) + hits
    names = sorted({(int(a), int(b)) for a, b in zip(syntax["layer"], syntax["head"])})
    checked, differ = 0, 0
    for (relation, direction), rows in syntax[syntax["relation"].isin(relations)].groupby(["relation", "direction"]):
        total = {u: totals[u].get((relation, direction), 0) for u in units}
        if min(sum(total[u] for u in units if u % 2 == h) for h in (0, 1)) == 0:
            assert rows["vs_baseline"].isna().all()
            continue
        offset, pick, baseline, per_head, best_accuracy, best = plain_cross_fit(
            {u: {n: head_hits[u].get((*n, relation, direction), 0) for n in names} for u in units},
            {u: {d: base_hits[u][(d, relation, direction)] for d in BASELINE_OFFSETS} for u in units},
            total, units, names)
        differ += offset[0] != offset[1] or pick[0] != pick[1]
        for row in rows.itertuples():
            assert (row.baseline_offset_even, row.baseline_offset_odd) == (offset[0], offset[1])
            assert row.baseline == pytest.approx(baseline, abs=1e-12)
            assert (row.vs_baseline, row.vs_baseline_low, row.vs_baseline_high) == pytest.approx(
                per_head[(row.layer, row.head)], abs=1e-9)
            assert (bool(row.best_even), bool(row.best_odd)) == ((row.layer, row.head) == pick[0],
                                                                 (row.layer, row.head) == pick[1])
            assert row.best_held_out == pytest.approx(best_accuracy, abs=1e-12)
            assert (row.best_vs_baseline, row.best_vs_baseline_low, row.best_vs_baseline_high) == pytest.approx(
                best, abs=1e-9)
            checked += 1
    assert set(syntax["direction"]) == {"dependent_to_head", "head_to_dependent"}  # bidirectional: no _visible rows
    assert checked >= 3 * 2 * len(names) and differ > 0  # some choice differs between the halves


def test_show_prints_held_out_numbers_that_add_up_and_a_row_without_them_in_sample():
    """det is cross-fitted; amod has no dependent in the odd units, so no held-out estimate: show prints det's
    held-out accuracy and baseline beside their difference, and says amod's in-sample comparison under the table,
    with no verdict. Expected numbers are read off each frame's own row."""
    from headscan.analysis.show import top_heads_text
    from headscan.tables import SweepTables

    heads, offsets, c = noise_units(3)
    det = frame_of(heads, c, state_of(heads, offsets, c))
    heads, offsets, c = noise_units(5, n_units=9)
    odd = np.arange(len(c)) % 2 == 1
    heads, offsets, c = heads * ~odd[:, None, None], offsets * ~odd[:, None], c * ~odd
    amod = frame_of(heads, c, state_of(heads, offsets, c)).assign(relation="amod")
    printed = top_heads_text(SweepTables({"syntax": pd.concat([det, amod], ignore_index=True)}), "syntax", 3)
    lines = printed.splitlines()
    header = lines[0].split()
    cells = {fields[1]: dict(zip(header, fields)) for fields in (line.split() for line in lines[1:3])}
    named = det.loc[det["value"].idxmax()]
    assert cells["det"]["label"] == named["label"] and cells["det"]["accuracy"] == f"{named['value']:.3f}"
    assert cells["det"]["accuracy_held_out"] == f"{named['best_held_out']:.3f}"
    assert cells["det"]["baseline_held_out"] == f"{named['baseline']:.3f}"
    assert cells["det"]["vs_baseline"] == f"{named['best_held_out'] - named['baseline']:.3f}"
    assert cells["det"]["vs_low"] == f"{named['best_vs_baseline_low']:.3f}"
    other = amod.loc[amod["value"].idxmax()]
    assert [cells["amod"][c] for c in ("accuracy_held_out", "baseline_held_out", "vs_baseline", "beats")] == \
        ["NaN", "NaN", "NaN", "False"]
    assert (f"m amod dependent_to_head {other['label']}: no held-out estimate (a half of the units holds none of its "
            f"dependents); in sample {other['value']:.3f} - {other['baseline_in_sample']:.3f} = "
            f"{other['value'] - other['baseline_in_sample']:+.3f} [{other['vs_baseline_in_sample_low']:+.3f}, "
            f"{other['vs_baseline_in_sample_high']:+.3f}], which carries no verdict") in lines
