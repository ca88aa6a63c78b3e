"""How often a part of EWT dev's 95% interval holds the whole corpus's value: minilm, BCa, by bootstrap unit.

    python experiments/interval_coverage.py --check    # what made coverage.md: ~8-11 min forward + 2-4 min, 2 busy cores
    python experiments/interval_coverage.py --cache /tmp/ewt-minilm.npz                  # keep the forward pass ...
    python experiments/interval_coverage.py --cache /tmp/ewt-minilm.npz --draws 5 \\
        --out reports/experiments/interval_coverage/five-draws                           # ... and reuse it (8 min)

Claim (``reports/experiments/interval_coverage/``, pooled over 5 draws of 20 + 20 parts): on real attention
the intervals still fall short of 95%, and the rare-sentence metrics far short.

- Parts of 100 random sentences, BCa, either unit: 0.91-0.94 for the smooth metrics (prev_token, next_token,
  self, first_token, sep, entropy, entropy_norm, positional_prev, the offset profile), 0.83-0.84 for distance
  and positional_next, 0.54-0.56 for induction and duplicate_token. BCa gains at most 0.03 over the percentile
  interval anywhere.
- Parts of whole documents: resampling sentences covers 0.74-0.79 (0.45-0.47 for induction and
  duplicate_token); resampling documents 0.80-0.89 (0.51-0.53). With 4-28 documents per part `thin_support`
  flags 59-92% of the rows; the unflagged smooth rows cover 0.88-0.96.
- `thin_support` points the wrong way for induction and duplicate_token: unflagged rows cover 0.20-0.25, the
  flagged ones better. The parts that miss are those lacking the few sentences that carry those sums, and
  they look well supported.
- One draw of 20 parts is a noisy measure: a part's heads miss together, so a cell moves by 0.1 or more
  between draws (distance, random parts: 0.70-0.96).

The "truth" is minilm swept over all 2,001 sentences of the UD English EWT dev treebank. Parts of it:

- ``random``: 20 disjoint parts of 100 sentences drawn at random (kept in corpus order);
- ``documents``: the 318 documents (``# newdoc``) shuffled and dealt, each to the part that has the fewest
  sentences so far, into 20 disjoint parts of about 100 sentences made of whole documents.

Each part is swept with ``bootstrap_unit="segment"`` and ``"document"`` (the interval method is BCa, the
default; the percentile interval is computed too, to compare with issue 13's "before"). A part's document
is a document of the corpus: in a ``random`` part most documents hold one sentence. For each metric this
counts how often the part's interval contains the truth, among rows with count > 0, and among those rows
that `headscan.intervals.thin_support` does not flag.

One forward pass for everything. A segment's per-segment sums and counts do not depend on which other
segments share its corpus or on the bootstrap unit; only the weights do, and they are keyed by the unit's
index within the part (`headscan.intervals.bootstrap_weights`). So the corpus is swept once with
`headscan.scan.reduce.accumulate`, recording the per-segment sums that it adds into its state, and each
(part, unit) gets the state a sweep of that part would build: its units' sums (a document's segments added
up), Poisson weights keyed by each unit's index in the part, replicate totals and power sums
(`headscan.intervals.unit_moments`), finished into tables by `headscan.scan.finish.finish`. ``--check`` sweeps the
first part of each kind with `headscan.scan.sweep_model` under both units and reports the largest difference
from this reconstruction (float32 noise: a batch pads a segment differently).

Coverage is counted over heads, and the heads of one part miss together (a part short of long sentences
moves every head's ``distance``), so 20 parts are about 20 independent tries: a cell is known to about
+-0.05. ``--draws N`` repeats the whole design with N independent choices of the 20 + 20 parts (part seeds
``seed``, ``seed + 1``, ...) and pools them; the spread between draws is reported.

Writes ``coverage.csv`` (one row per metric, part kind, unit and interval method, pooled), ``parts.csv`` (the
same per part) and ``coverage.md`` (the tables) into ``--out`` (``reports/experiments/interval_coverage``),
and prints the Markdown.

This script draws nothing and changes no library code.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import headscan  # noqa: E402
from headscan import intervals
from headscan.scan import reduce as scan  # noqa: E402
from headscan.scan.finish import finish  # noqa: E402
from headscan.config import SweepConfig  # noqa: E402
from headscan.corpus import Corpus, read_corpus  # noqa: E402
from headscan.scan import PartialState  # noqa: E402
from headscan.tables import TABLES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EWT = ROOT.parent / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"
OUT = ROOT / "reports" / "experiments" / "interval_coverage"
PART_KINDS = ("random", "documents")
UNITS = ("segment", "document")
METHODS = ("bca", "percentile")


# --- one forward pass ----------------------------------------------------------------------------------------


def per_segment_sweep(model, corpus: Corpus, config: SweepConfig) -> tuple[PartialState, np.ndarray, np.ndarray]:
    """The whole corpus's state, and each segment's own sums and counts, (segment, layer, head, column).

    Records what `accumulate` adds into its state window by window (with ``bootstrap_unit="segment"`` a unit
    is a segment and its id is the segment's index), so the per-segment numbers are the sweep's own.
    """
    assert config.bootstrap_unit == "segment"
    recorded: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    add_window = scan._add_window

    def recording(totals, window, config):
        sums = window.sums.transpose(0, 1).cpu().numpy()  # (unit, layer, head, column)
        counts = window.counts.transpose(0, 1).cpu().numpy()
        for row, unit in enumerate(window.units):
            recorded[unit] = (sums[row].copy(), counts[row].copy())
        add_window(totals, window, config)

    scan._add_window = recording
    try:
        state = scan.accumulate(model, corpus, config, progress=True)
    finally:
        scan._add_window = add_window
    if sorted(recorded) != list(range(len(corpus.segments))):
        raise RuntimeError("the sweep did not add every segment exactly once")
    sums = np.stack([recorded[i][0] for i in range(len(corpus.segments))])
    counts = np.stack([recorded[i][1] for i in range(len(corpus.segments))])
    return state, sums, counts


def cached_sweep(model_spec: str, corpus: Corpus, config: SweepConfig, cache: Path | None):
    """`per_segment_sweep`, read from `cache` when it holds this corpus's, else computed (and saved there)."""
    if cache is not None and cache.is_file():
        with np.load(cache, allow_pickle=False) as data:
            if str(data["sha256"]) == corpus.sha256:
                print(f"per-segment sums from {cache}", file=sys.stderr)
                state = PartialState.load(cache.with_suffix(".state.npz"))
                return state, data["sums"], data["counts"]
    model = headscan.load_model(model_spec, device="cpu")
    state, sums, counts = per_segment_sweep(model, corpus, config)
    if cache is not None:
        state.save(cache.with_suffix(".state.npz"))
        np.savez(cache, sums=sums, counts=counts, sha256=np.array(corpus.sha256))
    return state, sums, counts


# --- parts ---------------------------------------------------------------------------------------------------


def random_parts(corpus: Corpus, n_parts: int, size: int, rng) -> list[list[int]]:
    order = rng.permutation(len(corpus.segments))
    return [sorted(order[k * size : (k + 1) * size].tolist()) for k in range(n_parts)]


def document_parts(corpus: Corpus, n_parts: int, rng) -> list[list[int]]:
    """Whole documents in random order, each dealt to the part with the fewest sentences so far."""
    members: dict[int, list[int]] = {}
    for index, segment in enumerate(corpus.segments):
        members.setdefault(segment.document, []).append(index)
    parts: list[list[int]] = [[] for _ in range(n_parts)]
    for document in rng.permutation(sorted(members)):
        smallest = min(range(n_parts), key=lambda k: (len(parts[k]), k))
        parts[smallest] += members[int(document)]
    return [sorted(part) for part in parts]


def part_corpus(corpus: Corpus, part: list[int]) -> Corpus:
    """The part as a corpus of its own, as a sweep of the part would read it: documents renumbered 0, 1, ..."""
    segments, renumber = [], {}
    for index in part:
        segment = corpus.segments[index]
        renumber.setdefault(segment.document, len(renumber))
        segments.append(dataclasses.replace(segment, document=renumber[segment.document]))
    return Corpus(f"{corpus.source} (part)", corpus.kind, corpus.sha256, tuple(segments), {}, corpus.documents)


def part_state(whole: PartialState, sums: np.ndarray, counts: np.ndarray, part: list[int], corpus: Corpus,
               config: SweepConfig) -> PartialState:
    """The state a sweep of `part` with `config` builds, from the segments' own sums and counts."""
    local = part_corpus(corpus, part)
    if config.bootstrap_unit == "document":
        unit_of = np.array([s.document for s in local.segments])
    else:
        unit_of = np.arange(len(part))
    n_units = int(unit_of.max()) + 1
    unit_sums = np.zeros((n_units, *sums.shape[1:]))
    unit_counts = np.zeros_like(unit_sums)
    np.add.at(unit_sums, unit_of, sums[part])
    np.add.at(unit_counts, unit_of, counts[part])
    weights = intervals.bootstrap_weights(range(n_units), config.bootstrap, config.seed)  # (replicate, unit)
    shape = unit_sums.shape[1:]
    return PartialState(
        {}, None, unit_sums.sum(0), unit_counts.sum(0),
        (weights @ unit_sums.reshape(n_units, -1)).reshape(config.bootstrap, *shape),
        (weights @ unit_counts.reshape(n_units, -1)).reshape(config.bootstrap, *shape),
        intervals.unit_moments(unit_sums, unit_counts), finished=True, model=whole.model, n_segments=len(part),
    )


# --- coverage ------------------------------------------------------------------------------------------------


def thin(rows: pd.DataFrame) -> np.ndarray:
    """`headscan.intervals.thin_support` on table rows.

    It takes power sums, (term, ...), and reads three of them: ``contributing`` (the table's ``units``), and
    ``max_abs_s`` over ``abs_s`` (the table's ``top_unit_share``, NaN where every unit's sum is 0). Those
    three are rebuilt from the columns; every other term is left 0.
    """
    moments = np.zeros((len(intervals.MOMENT_TERMS), len(rows)))
    share = rows["top_unit_share"].to_numpy(dtype=float)
    moments[intervals.MOMENT_TERMS.index("contributing")] = rows["units"].to_numpy(dtype=float)
    moments[intervals.MOMENT_TERMS.index("abs_s")] = np.where(np.isnan(share), 0.0, 1.0)
    moments[intervals.MOMENT_TERMS.index("max_abs_s")] = np.nan_to_num(share)
    return intervals.thin_support(moments)


def covered_rows(part: dict[str, pd.DataFrame], truth: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (table row with count > 0): metric, whether the interval holds the truth, whether thin."""
    out = []
    for name, frame in part.items():
        keys = TABLES[name].row_key
        joined = frame.merge(truth[name][keys + ["value"]].rename(columns={"value": "truth"}), on=keys, validate="1:1")
        joined = joined[joined["count"] > 0]
        metric = joined["metric"] if "metric" in joined else pd.Series("offsets", index=joined.index)
        out.append(pd.DataFrame({
            "metric": metric.astype(str).to_numpy(),
            "covered": ((joined["ci_low"] <= joined["truth"]) & (joined["truth"] <= joined["ci_high"])).to_numpy(),
            "thin": thin(joined),
        }))
    return pd.concat(out, ignore_index=True)


def coverage_table(rows: pd.DataFrame) -> pd.DataFrame:
    grouped = rows.groupby(["metric", "kind", "unit", "method"], sort=False)
    table = grouped.agg(rows=("covered", "size"), coverage=("covered", "mean"),
                        thin_share=("thin", "mean")).reset_index()
    unflagged = rows[~rows["thin"]].groupby(["metric", "kind", "unit", "method"], sort=False)["covered"]
    table = table.merge(unflagged.agg(rows_unflagged="size", coverage_unflagged="mean").reset_index(),
                        on=["metric", "kind", "unit", "method"], how="left")
    table["rows_unflagged"] = table["rows_unflagged"].fillna(0).astype(int)
    return table


def markdown(table: pd.DataFrame, method: str, order: list[str]) -> str:
    part = table[table["method"] == method]
    columns = [(kind, unit) for kind in PART_KINDS for unit in UNITS]
    header = "| metric | " + " | ".join(f"{kind} parts, {unit} unit" for kind, unit in columns) + " |"
    lines = [header, "|" + "---|" * (len(columns) + 1)]
    for metric in order:
        cells = []
        for kind, unit in columns:
            row = part[(part["metric"] == metric) & (part["kind"] == kind) & (part["unit"] == unit)]
            if row.empty:
                cells.append("–")
                continue
            r = row.iloc[0]
            unflagged = "–" if r["rows_unflagged"] == 0 else f"{r['coverage_unflagged']:.2f}"
            cells.append(f"{r['coverage']:.2f} ({unflagged}, {r['thin_share']:.0%} thin)")
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- the check against real sweeps -----------------------------------------------------------------------------


def check(model, corpus, whole, sums, counts, parts: dict[str, list[list[int]]], config: SweepConfig) -> str:
    lines = []
    for kind, chosen in parts.items():
        part = chosen[0]
        for unit in UNITS:
            settings = dataclasses.replace(config, bootstrap_unit=unit)
            real = scan.sweep_model(model, part_corpus(corpus, part), settings).frames
            rebuilt = finish(part_state(whole, sums, counts, part, corpus, settings), settings)
            worst = {}
            for name in real:
                for column in ("value", "ci_low", "ci_high", "units", "top_unit_share"):
                    a, b = real[name][column].to_numpy(), rebuilt[name][column].to_numpy()
                    if not np.array_equal(np.isnan(a), np.isnan(b)):
                        raise RuntimeError(f"{kind}/{unit}: {name}.{column} is NaN in different rows")
                    finite = ~np.isnan(a)
                    worst[column] = max(worst.get(column, 0.0), float(np.max(np.abs(a[finite] - b[finite]), initial=0)))
            lines.append(f"- {kind} part 0 ({len(part)} sentences), {unit} unit: largest |sweep - rebuilt| "
                         + ", ".join(f"{c} {v:.1e}" for c, v in worst.items()))
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=EWT)
    parser.add_argument("--parts", type=int, default=20)
    parser.add_argument("--size", type=int, default=100, help="sentences per random part")
    parser.add_argument("--seed", type=int, default=0, help="seed of the choice of parts")
    parser.add_argument("--draws", type=int, default=1, help="independent choices of the parts, pooled")
    parser.add_argument("--check", action="store_true", help="sweep the first part of each kind for real and compare")
    parser.add_argument("--cache", type=Path, default=None,
                        help="an .npz file to keep the per-segment sums in (67 MB; not in the repository)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    corpus = read_corpus(args.corpus)
    config = SweepConfig(device="cpu", bootstrap_unit="segment")  # bca, 200 replicates, seed 0: the defaults
    whole, sums, counts = cached_sweep("minilm", corpus, config, args.cache)
    truth = finish(whole, config)
    swept = time.perf_counter() - started
    print(f"{len(corpus.segments)} sentences ({corpus.n_documents} documents) in {swept:.0f} s", file=sys.stderr)

    rows, draws = [], []
    for draw in range(args.draws):
        rng = np.random.default_rng(args.seed + draw)
        parts = {"random": random_parts(corpus, args.parts, args.size, rng),
                 "documents": document_parts(corpus, args.parts, rng)}
        draws.append(parts)
        for kind, chosen in parts.items():
            for unit in UNITS:
                for method in METHODS:
                    settings = dataclasses.replace(config, bootstrap_unit=unit, interval=method)
                    for index, part in enumerate(chosen):
                        tables = finish(part_state(whole, sums, counts, part, corpus, settings), settings)
                        rows.append(covered_rows(tables, truth).assign(kind=kind, unit=unit, method=method,
                                                                       draw=draw, part=index))
    rows = pd.concat(rows, ignore_index=True)
    table = coverage_table(rows)
    per_part = (rows.groupby(["metric", "kind", "unit", "method", "draw", "part"], sort=False)
                .agg(rows=("covered", "size"), coverage=("covered", "mean"), thin_share=("thin", "mean")).reset_index())
    order = [m for m in headscan.METRICS if m in set(table["metric"])]  # the offset profile's rows are "offsets"
    sizes = [len(p) for parts in draws for p in parts["documents"]]
    units = {kind: [part_corpus(corpus, p).n_documents for parts in draws for p in parts[kind]] for kind in PART_KINDS}

    out = args.out.resolve()
    shown_out = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    command = "python experiments/interval_coverage.py" + "".join(
        f" {flag}" for flag, on in (("--check", args.check), (f"--draws {args.draws}", args.draws > 1),
                                    (f"--seed {args.seed}", args.seed != 0), (f"--out {shown_out}", out != OUT)) if on)
    report = [
        "# Interval coverage: minilm over EWT dev",
        "",
        f"Made by `{command}` (bootstrap: 200 replicates, seed 0).",
        "",
        f"Truth: minilm over all {len(corpus.segments):,} sentences ({corpus.n_documents} documents). "
        f"Parts{f' (each of {args.draws} draws)' if args.draws > 1 else ''}: {args.parts} of {args.size} random "
        f"sentences ({min(units['random'])}-{max(units['random'])} documents per part), and {args.parts} of "
        f"whole random documents ({min(sizes)}-{max(sizes)} sentences, "
        f"{min(units['documents'])}-{max(units['documents'])} documents per part).",
        "",
        "Each cell: share of intervals that hold the truth among rows with count > 0 (the same among rows that "
        "`thin_support` does not flag; share of rows flagged). Rows per cell: "
        f"{args.parts * args.draws} parts x 72 heads (x {2 * config.max_offset + 1} offsets for the offset "
        "profile), less those with count 0.",
        "",
        "## BCa (the default)",
        "",
        markdown(table, "bca", order),
        "",
        "## Percentile (issue 13's \"before\" used this, with the segment unit)",
        "",
        markdown(table, "percentile", order),
        "",
    ]
    if args.draws > 1:
        spread = (rows[rows["method"] == "bca"].groupby(["metric", "kind", "unit", "draw"])["covered"].mean()
                  .groupby(["metric", "kind", "unit"]).agg(["min", "max"]).reset_index())
        lines = ["| metric | " + " | ".join(f"{k} parts, {u} unit" for k in PART_KINDS for u in UNITS) + " |",
                 "|" + "---|" * 5]
        for metric in order:
            cells = []
            for kind in PART_KINDS:
                for unit in UNITS:
                    r = spread[(spread["metric"] == metric) & (spread["kind"] == kind) & (spread["unit"] == unit)].iloc[0]
                    cells.append(f"{r['min']:.2f}-{r['max']:.2f}")
            lines.append(f"| {metric} | " + " | ".join(cells) + " |")
        report += [f"## BCa: lowest and highest coverage among the {args.draws} draws", "", *lines, ""]
    if args.check:
        model = headscan.load_model("minilm", device="cpu")
        report += ["## Check: real sweeps of a part against the reconstruction", "",
                   check(model, corpus, whole, sums, counts, draws[0], config), ""]
    report.append(f"Took {time.perf_counter() - started:.0f} s ({swept:.0f} s for the per-segment sums).")
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "coverage.csv", index=False, float_format="%.4f")
    per_part.to_csv(args.out / "parts.csv", index=False, float_format="%.4f")
    (args.out / "coverage.md").write_text("\n".join(report) + "\n")
    print("\n".join(report))


if __name__ == "__main__":
    main()
