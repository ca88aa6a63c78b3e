"""How far the default 95% interval must widen to hold 95%, per metric family and size: fitted on one EWT split,
checked on the other.

    python experiments/unit_sums.py minilm ../shared/data/ud-english-ewt/en_ewt-ud-test.conllu out/unit_sums/minilm-test.npz
    python experiments/unit_sums.py minilm ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu out/unit_sums/minilm-dev.npz
    ...                                                       # and smollm2: one sweep each, ~5-90 min on 2 cores
    python experiments/interval_calibration.py --data out/unit_sums          # numpy only, a few minutes
    python experiments/interval_calibration.py --data out/unit_sums --package  # and write headscan/data/...csv

Induction and duplicate tokens are defined only at a query whose token came before, so on EWT the ``thin`` rule
trusts almost none of their rows and they cannot be measured there. They are measured on repeated random tokens
(every second-half query has them), fitted on two draws and checked on a third, none of them the committed
``repeat-random`` run's (seed 0), and put into the packaged table beside the EWT families (the output goes to its
own folder; about 25 minutes of unit sums on 2 loaded cores, 2 minutes of calibration):

    python experiments/unit_sums.py minilm repeat-random:count=318,seed=1 out/unit_sums/minilm-repeat1.npz
    ...                                                       # seeds 2 and 3, and smollm2
    python experiments/interval_calibration.py --data out/unit_sums --fit --check --sparse-fit repeat1 repeat2 \
        --sparse-check repeat3 --tables heads value --merge-into headscan/data/interval_calibration.csv \
        --out reports/experiments/interval_calibration/sparse --package

Protocol. As ``experiments/interval_coverage.py`` (whose parts, states and rows this reuses): a part is N whole
documents of a split, drawn at random (``--draws`` per N), and gets exactly the state a sweep of those documents
alone builds; the truth is the whole split's value. For every row the ``thin`` rule trusts (count > 0, not a
structural zero), the *ratio* is |part's value - truth| over the part's half-width (the wider half of the default
``studentized_symmetric`` interval, as `headscan.intervals.interval_se` reads it), divided by
sqrt((M - N) / (M - 1)) for a part of N of the split's M documents: the parts are drawn without replacement, so
their errors are that much smaller than those of a sample from an unending corpus, which is what a sweep's
interval is about.

- Fit (``--fit``, EWT test): per model, family (`headscan.intervals.calibration.family_of`: ``prev_token``,
  ``value:prev_token``, ``syntax``, ...) and N, the ratio's 95th percentile, at least 1; the factor of a family
  at N is the larger of the models' (a family measured on one model only keeps that one's), over families with at
  least 50 trusted rows there. A row whose interval has zero width (every unit of the part agrees, as a share
  at 0 or 1 does: 11% of smollm2's ``sink_ratio`` rows at N = 10) is left out: no factor widens it, and the
  sweep gives it the rule of three over its units instead (`headscan.intervals.calibration.zero_width_floor`),
  which the check applies too. (Kept in, their infinite ratios had made smollm2's quantile NaN, which the
  larger-of-the-models step then dropped without a word.)
- Check (``--check``, EWT dev, never seen by the fit): per model, family and N, the share of trusted rows whose
  calibrated interval (`headscan.intervals.calibration.calibrate` with the fitted table: interpolated, and the
  widest factor for a family the fit did not measure) holds the truth, beside the default interval's. An exact
  method's interval covers about 0.952, 0.955 and 0.981 of parts of 10, 30 and 100 of 318 documents, so the
  calibrated one should reach at least those less the Monte Carlo error (about 0.01 for 100 parts).

Writes ``calibration.csv`` (the fitted factors), ``check.csv`` (coverage on both splits, default and calibrated)
and ``calibration.md`` into ``--out`` (``reports/experiments/interval_calibration``); with ``--package``, the
factors into ``headscan/data/interval_calibration.csv``, which the sweep reads.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interval_coverage import SPARSE, load, part_state, parts_of  # noqa: E402

from headscan import intervals  # noqa: E402
from headscan.intervals.calibration import COVERAGE_TARGET, calibrate, zero_width_floor  # noqa: E402
from headscan.metrics import describe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "experiments" / "interval_calibration"
PACKAGED = ROOT / "headscan" / "data" / "interval_calibration.csv"
SIZES = (10, 30, 100)
MIN_TRUSTED = 50  # fewer trusted rows than this (over all parts) is no measurement of a family at that size
_S, _C = intervals.MOMENT_TERMS.index("s"), intervals.MOMENT_TERMS.index("c")


def ratios(sums, counts, metric, parts) -> pd.DataFrame:
    """One row per trusted (part, row): its family and its ratio (the module's protocol), and whether the default
    interval holds the truth."""
    with np.errstate(invalid="ignore", divide="ignore"):
        truth = sums.sum(0) / counts.sum(0)
    structural = ~(np.abs(sums).sum(0) > 0)
    sparse = np.isin([name.split(":", 1)[-1] for name in metric], SPARSE)
    names = np.unique(metric)
    ranges = {name: describe("importance" if name.startswith("importance:") else name.split(":", 1)[-1]
                             if name != "offsets" else "offsets").bounds() for name in names}
    bounds = tuple(np.array([ranges[name][end] for name in metric]) for end in (0, 1))
    n_docs = len(sums)
    out = []
    for part in parts:
        state = part_state(sums[part], counts[part])
        moments = state["moments"]
        with np.errstate(invalid="ignore", divide="ignore"):
            value = moments[_S] / moments[_C]
        low, high = intervals.interval(value, state["replicate_sums"], state["replicate_counts"], moments,
                                       method="studentized_symmetric", replicate_power=state["replicate_power"],
                                       bounds=bounds)
        contributing, _ = intervals.support(moments)
        thin = intervals.thin(intervals.effective_units(moments),
                              intervals.variance_df(state["replicate_sums"], state["replicate_counts"],
                                                    state["replicate_power"]),
                              contributing, sparse=sparse, value=value, low=low, high=high, bounds=bounds)
        keep = (moments[_C] > 0) & ~structural & np.isfinite(truth) & ~thin & np.isfinite(low) & np.isfinite(high)
        keep &= metric != "offsets"
        half = np.fmax(value - low, high - value)
        fpc = np.sqrt((n_docs - len(part)) / (n_docs - 1))
        error = np.abs(value - truth)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = error / (half * fpc)
            # a zero-width interval: no factor widens it, the rule of three does (zero_width_floor), so it is
            # checked against that and left out of the factor's fit
            floor = zero_width_floor(low, high, np.full(len(value), float(len(part))), bounds)
            raw = np.where(half > 0, error / half, np.where(error == 0, 0.0, error / floor))
        out.append(pd.DataFrame({"family": metric[keep], "ratio": ratio[keep], "raw": raw[keep],
                                 "zero_width": (half == 0)[keep], "units": len(part)}))
    return pd.concat(out, ignore_index=True)


def fit(per_row: pd.DataFrame) -> pd.DataFrame:
    """``family, N, factor, coverage, models, trusted``: the ratio's 95th percentile per model, the larger over
    models; ``coverage`` is the default interval's (the lower over models)."""
    per_row = per_row[~per_row["zero_width"]]  # the rule of three, not the factor, widens those
    grouped = per_row.groupby(["family", "N", "model"])
    per_model = pd.DataFrame({
        "factor": grouped["ratio"].quantile(COVERAGE_TARGET).clip(lower=1.0),
        "coverage": grouped["raw"].apply(lambda r: float((r <= 1).mean())),
        "trusted": grouped.size()}).reset_index()
    per_model = per_model[per_model["trusted"] >= MIN_TRUSTED]
    broken = per_model[~np.isfinite(per_model["factor"])]
    if len(broken):  # the larger-of-the-models step would drop a NaN without a word
        raise SystemExit("no finite factor for " + ", ".join(f"{r.family} {r.model} N={r.N}" for r in broken.itertuples()))
    by = per_model.groupby(["family", "N"])
    return pd.DataFrame({"factor": by["factor"].max().round(4), "coverage": by["coverage"].min().round(4),
                         "models": by["model"].agg(lambda m: " ".join(sorted(m))),
                         "trusted": by["trusted"].sum().astype(int)}).reset_index()


def coverage_factor(coverage, n, documents: int):
    """The factor a measured coverage implies under a normal error model: the default interval's half-width is
    z_0.975 SE, and it held the truth for `coverage` of parts of `n` of `documents` (whose errors are smaller by
    the finite-population correction), so the SE it needed was z_0.975 / (z_((1 + coverage) / 2) x correction)
    times its own; at least 1."""
    from scipy import stats

    fpc = np.sqrt((documents - np.asarray(n, float)) / (documents - 1))
    z = stats.norm.ppf((1 + np.asarray(coverage, float)) / 2)
    return np.maximum(1.0, stats.norm.ppf(0.975) / (z * fpc))


def with_coverage(table: pd.DataFrame, coverage: pd.DataFrame, models, documents: int) -> pd.DataFrame:
    """`table` with the factors `coverage_factor` gives `models`' measured coverage (interval_coverage.py's random
    parts, the default method and rule) taken in: the larger factor of a family and size wins."""
    rows = coverage[(coverage["design"] == "random") & (coverage["method"] == "studentized_symmetric")
                    & (coverage["rule"] == "thin") & coverage["model"].isin(models)
                    & (coverage["trusted"] >= MIN_TRUSTED) & ~coverage["metric"].isin(["all", "offsets"])]
    extra = pd.DataFrame({"family": rows["metric"], "N": rows["N"],
                          "factor": coverage_factor(rows["coverage"], rows["N"], documents).round(4),
                          "coverage": rows["coverage"].round(4), "models": rows["model"] + " (from coverage)",
                          "trusted": rows["trusted"].astype(int)})
    both = pd.concat([table, extra], ignore_index=True)
    by = both.groupby(["family", "N"])
    return pd.DataFrame({"factor": by["factor"].max(), "coverage": by["coverage"].min(),
                         "models": by["models"].agg(lambda m: " ".join(sorted(m))),
                         "trusted": by["trusted"].sum().astype(int)}).reset_index()


def only_sparse_from(per_row: pd.DataFrame, corpora) -> pd.DataFrame:
    """`per_row` without the rows of `corpora` outside the sparse families. On repeated random tokens induction and
    duplicate tokens are defined at every second-half query, where on EWT the ``thin`` rule trusts almost none
    of their rows; the other families are measured on EWT, and random tokens are no text to measure them on."""
    sparse = per_row["family"].str.removeprefix("value:").isin(SPARSE)
    return per_row[sparse | ~per_row["corpus"].isin(corpora)].reset_index(drop=True)


def merged(kept: pd.DataFrame, fitted: pd.DataFrame) -> pd.DataFrame:
    """`kept`'s factors with those of the families fitted here put in their place, in family and N order.

    >>> kept = pd.DataFrame({"family": ["prev_token", "induction"], "N": [10, 10], "factor": [1.5, 9.0]})
    >>> merged(kept, pd.DataFrame({"family": ["induction"], "N": [10], "factor": [1.2]}))[["family", "factor"]].values.tolist()
    [['induction', 1.2], ['prev_token', 1.5]]
    """
    both = pd.concat([kept[~kept["family"].isin(fitted["family"])], fitted], ignore_index=True)
    return both.sort_values(["family", "N"], kind="stable").reset_index(drop=True)


def check(per_row: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Per model, family and N: the share of trusted rows the default and the calibrated interval hold."""
    tables = np.where(per_row["family"].str.startswith("value:"), "value", "heads")
    metric = per_row["family"].str.removeprefix("value:").to_numpy(dtype=object)
    factor = np.empty(len(per_row))
    for name in ("heads", "value"):  # family_of prefixes value's metrics again
        mine = tables == name
        factor[mine], _ = calibrate(name, metric[mine], per_row["N"].to_numpy()[mine], table)
    syntax = per_row["family"].to_numpy() == "syntax"
    factor[syntax], _ = calibrate("syntax", metric[syntax], per_row["N"].to_numpy()[syntax], table)
    zero = per_row["zero_width"].to_numpy(dtype=bool)
    # raw of a zero-width row is its error over the rule-of-three floor, which the calibrated interval is at least
    rows = per_row.assign(default=np.where(zero, per_row["raw"] == 0, per_row["raw"] <= 1),
                          calibrated=np.where(zero, per_row["raw"] <= 1, per_row["raw"] <= factor), factor=factor)
    grouped = rows.groupby(["corpus", "model", "family", "N"])
    return pd.DataFrame({"trusted": grouped.size(), "default": grouped["default"].mean().round(4),
                         "calibrated": grouped["calibrated"].mean().round(4),
                         "factor": grouped["factor"].mean().round(3)}).reset_index()


def _coverage_cell(rows: pd.DataFrame) -> str:
    """One size's coverage, default → calibrated; a cell of too few trusted rows shows their number instead (a
    share of 5 rows is no coverage)."""
    if not len(rows):
        return "–"
    row = rows.iloc[0]
    if row["trusted"] < MIN_TRUSTED:
        return f"– ({row['trusted']} rows)"
    return f"{row['default']:.3f} → {row['calibrated']:.3f}"


def report(table: pd.DataFrame, checked: pd.DataFrame, args, seconds: float) -> str:
    fitted, checked_on = [*args.fit, *args.sparse_fit], [*args.check, *args.sparse_check]
    lines = [f"# Calibrated intervals: fitted on {', '.join(fitted)}, checked on {', '.join(checked_on)}", "",
             f"Made by `python experiments/interval_calibration.py {' '.join(sys.argv[1:])}` ({args.draws} random parts "
             f"per N, 200 replicates, seed 0; {seconds / 60:.0f} min). The factor is the 95th percentile of "
             "|value - truth| / half-width over the rows the `thin` rule trusts (parts drawn without replacement: "
             "divided by the finite-population correction), at least 1, the larger of the models'. `default`: the share "
             "of trusted rows the default 95% interval holds; `calibrated`: with the factor, and a zero-width interval (every "
             "unit of the part agrees) with the rule of three over its units instead, which no factor can widen "
             "(`headscan.intervals.calibration.zero_width_floor`; those rows are left out of the fit). An exact method covers "
             "about 0.952, 0.955 and 0.981 of parts of 10, 30 and 100 of 318 documents.", "",
             "## Factors (fit split)", "", "| family | " + " | ".join(f"N={n}" for n in args.sizes) + " |",
             "|---|" + "---|" * len(args.sizes)]
    for family, rows in table.groupby("family"):
        cells = [rows[rows["N"] == n] for n in args.sizes]
        lines.append(f"| {family} | " + " | ".join(
            f"{c['factor'].iloc[0]:.2f} (default {c['coverage'].iloc[0]:.2f})" if len(c) else "–" for c in cells) + " |")
    for corpus, part in checked.groupby("corpus", sort=False):
        lines += ["", f"## Coverage on {corpus}" + (" (held out)" if corpus in checked_on else " (fit split)"), "",
                  "| model | family | " + " | ".join(f"N={n}: default → calibrated" for n in args.sizes) + " |",
                  "|---|---|" + "---|" * len(args.sizes)]
        for (model, family), rows in part.groupby(["model", "family"]):
            cells = [rows[rows["N"] == n] for n in args.sizes]
            lines.append(f"| {model} | {family} | " + " | ".join(_coverage_cell(c) for c in cells) + " |")
        measured = part[part["trusted"] >= MIN_TRUSTED]  # a few trusted rows are no measurement (sparse metrics)
        held = measured.groupby("N").apply(lambda g: (g["calibrated"].min(), g.loc[g["calibrated"].idxmin(), "family"]
                                                     + " " + g.loc[g["calibrated"].idxmin(), "model"]))
        sparse = part[part["trusted"] < MIN_TRUSTED]
        if len(sparse):
            lines += ["", f"Fewer than {MIN_TRUSTED} trusted rows (no measurement): " + ", ".join(
                f"{r.family} {r.model} N={r.N} ({r.trusted})" for r in sparse.itertuples()) + "."]
        lines += ["", f"Lowest calibrated coverage per N, over cells of at least {MIN_TRUSTED} trusted rows: " + "; ".join(
            f"N={n}: {low:.3f} ({where})" for n, (low, where) in held.items()) + "."]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "out" / "unit_sums",
                        help="folder of MODEL-CORPUS.npz from unit_sums.py")
    parser.add_argument("--models", nargs="+", default=["minilm", "smollm2"])
    parser.add_argument("--fit", nargs="*", default=["test"], help="corpora the factors are fitted on")
    parser.add_argument("--check", nargs="*", default=["dev"], help="corpora they are checked on")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--draws", type=int, default=100, help="random parts per N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tables", nargs="+", default=["heads", "value", "syntax"])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--package", action="store_true", help=f"also write the factors to {PACKAGED}")
    parser.add_argument("--from-coverage", nargs="+", default=[], metavar="CSV:MODEL[,MODEL]",
                        help="interval_coverage.py's coverage.csv and the models to take from it, for models whose "
                             "unit sums are not at hand")
    parser.add_argument("--documents", type=int, default=316, help="documents of the split --from-coverage used")
    parser.add_argument("--sparse-fit", nargs="*", default=[], metavar="CORPUS",
                        help="corpora fitted for the sparse families only (induction, duplicate_token and their value "
                             "rows): repeated random tokens, where every second-half query has them")
    parser.add_argument("--sparse-check", nargs="*", default=[], metavar="CORPUS",
                        help="corpora the sparse families' factors are checked on")
    parser.add_argument("--merge-into", type=Path, metavar="CSV",
                        help="a factor table (the packaged one) to keep but for the families fitted here")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    started = time.perf_counter()
    per_row = []
    for model in args.models:
        for corpus in [*args.fit, *args.check, *args.sparse_fit, *args.sparse_check]:
            path = args.data / f"{model}-{corpus}.npz"
            if not path.is_file():
                print(f"skipped {model} {corpus}: no {path} (experiments/unit_sums.py makes it)", file=sys.stderr)
                continue
            sums, counts, metric = None, None, None
            for size in args.sizes:
                sparse_only = corpus in [*args.sparse_fit, *args.sparse_check]
                # v2: zero-width rows kept apart (zero_width_floor); "sparse": the sparse families' columns only
                cached = args.data / (f"ratios2-{model}-{corpus}-{size}-{args.draws}-{args.seed}"
                                      f"{'-sparse' if sparse_only else ''}.parquet")
                if cached.is_file():  # the ratios of these parts, from an earlier run on the same unit sums
                    per_row.append(pd.read_parquet(cached))
                    continue
                if sums is None:
                    sums, counts, metric = load(path, tuple(args.tables))
                    if sparse_only:  # random tokens measure the sparse families only (only_sparse_from)
                        mine = np.isin([name.removeprefix("value:") for name in metric], SPARSE)
                        sums, counts, metric = sums[:, mine], counts[:, mine], metric[mine]
                parts = parts_of(len(sums), size, "random", args.draws, args.seed)
                frame = ratios(sums, counts, metric, parts).assign(model=model, corpus=corpus, N=size)
                frame.to_parquet(cached)
                per_row.append(frame)
                print(f"{model} {corpus}: {len(parts)} parts of {size} ({time.perf_counter() - started:.0f} s)",
                      file=sys.stderr)
    per_row = only_sparse_from(pd.concat(per_row, ignore_index=True), [*args.sparse_fit, *args.sparse_check])
    table = fit(per_row[per_row["corpus"].isin([*args.fit, *args.sparse_fit])])
    for given in args.from_coverage:
        path, models = given.rsplit(":", 1)
        table = with_coverage(table, pd.read_csv(path), models.split(","), args.documents)
    # the factors fitted here, and the whole table a sweep reads (with --merge-into, the others kept beside them)
    whole = merged(pd.read_csv(args.merge_into), table) if args.merge_into else table
    checked = check(per_row, whole)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "calibration.csv", index=False)
    checked.to_csv(args.out / "check.csv", index=False)
    markdown = report(table, checked, args, time.perf_counter() - started)
    (args.out / "calibration.md").write_text(markdown + "\n")
    if args.package:
        whole.to_csv(PACKAGED, index=False)
    print(markdown)


if __name__ == "__main__":
    main()
