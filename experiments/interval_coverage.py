"""How often 95% intervals hold on parts of whole documents: per metric, interval method and support rule.

    python experiments/unit_sums.py minilm ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu out/unit_sums/minilm-dev.npz
    ...                                                    # once per (model, corpus): one sweep each, ~4-60 min on 2 cores
    python experiments/interval_coverage.py --data out/unit_sums      # the protocol: numpy only, ~15 min on 1 core

Protocol. A model is swept once over a whole treebank split with ``bootstrap_unit="document"``, keeping every
document's own sums and counts per (layer, head, column) (`experiments/unit_sums.py`). The truth is the whole
split's ratio, sum over documents of s_u over the sum of c_u. A *part* is N whole documents; it gets exactly the
state a sweep of those documents alone builds (`part_state`): its documents renumbered 0..N-1 in corpus order,
their Poisson weights (`headscan.intervals.bootstrap_weights`, 200 replicates, seed 0), replicate totals,
replicate power sums (`headscan.intervals.replicate_moments`) and power sums (`headscan.intervals.unit_moments`).
Each method's interval (`headscan.intervals.interval`) is checked against the truth, and each support rule says
which rows it trusts: ``thin`` (`headscan.intervals.thin`) and ``thin_support`` (a simpler
rule: fewer than 15 units or a largest share above 0.25).

- Parts: for N = 10, 30 and 100, ``disjoint``: the documents shuffled with seed 0 (``--seed``) and dealt into
  floor(documents / N) disjoint parts (EWT dev: ten parts of 30); ``random``: ``--draws`` independent draws of
  N documents (seeds 1000 + N, ...), so that a cell is not the noise of ten parts.
- Rows: every row of heads.parquet and offsets.parquet (``--tables``) whose count in the part is > 0, less those
  whose sum is 0 in every document of the split (a structural zero such as a causal model's next_token, which any
  interval [0, 0] would "cover").
- Repeat-random: parts of N of the 300 segments of ``repeat-random:count=300`` (each its own document), the
  contrast for the sparse metrics.

Monte Carlo error. The rows of one part are not independent (its heads miss together: a part short of long
documents moves every head's ``distance``), so the error of a coverage is that of a mean over parts: the standard
deviation of the parts' coverages over sqrt(parts). Random draws of N from about 300 documents overlap a little
(N^2 / 300 documents in common on average), which this ignores. Parts are samples *without* replacement from the
split whose ratio is the truth, so an exact interval for a sample from an infinite population covers more than
95%: about 0.952 for N = 10, 0.955 for 30 and 0.981 for 100 of 318 documents (z / sqrt(1 - N/318) for z = 1.96).

Writes ``coverage.csv`` (one row per model, corpus, N, design, metric, method: rows, coverage, coverage and share
of the rows each rule trusts, Monte Carlo error), ``parts.csv`` (the same per part, not committed) and
``coverage.md`` into ``--out`` (``reports/experiments/interval_coverage``), and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from headscan import intervals
from headscan.metrics import describe

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "experiments" / "interval_coverage"
DATA = ROOT / "out" / "unit_sums"
SIZES = (10, 30, 100)
REPLICATES = 200
METHODS = ("studentized", "studentized_symmetric", "bca", "percentile", "delta")
RULES = ("none", "thin", "thin_support")
# Metrics whose queries are picked by the text's content (a repeated token): `intervals.thin`'s `sparse`.
SPARSE = ("duplicate_token", "induction")
# The metrics reported first, in this order (heads.parquet's pattern metrics and the offset profile).
TARGETS = ("prev_token", "next_token", "self", "first_token", "sep", "entropy", "entropy_norm", "distance",
           "positional_prev", "positional_next", "duplicate_token", "induction", "offsets")
_S, _C = intervals.MOMENT_TERMS.index("s"), intervals.MOMENT_TERMS.index("c")


# --- data ----------------------------------------------------------------------------------------------------------


def load(path: Path, tables=("heads", "offsets")):
    """(sums, counts) as (unit, row) and the metric name of each row ("offsets" for the offset profile)."""
    with np.load(path, allow_pickle=False) as data:
        columns = json.loads(str(data["columns"]))
        keep = [i for i, (_, _, table) in enumerate(columns) if table in tables]
        sums, counts = data["sums"][..., keep], data["counts"][..., keep]
    n, layers, heads, k = sums.shape
    # a value.parquet row is named value:METRIC, apart from the heads.parquet row of the same metric
    # and an importance.parquet row importance:METHOD:TARGET (a file of unit_sums.py --importance)
    def name(metric, key, table):
        if table == "offsets":
            return "offsets"
        if table == "value":
            return f"value:{metric}"
        if table == "importance":
            return f"importance:{key[0]}:{key[1]}"
        return "syntax" if table == "syntax" else metric

    names = np.array([name(*columns[i]) for i in keep], dtype=object)
    metric = np.broadcast_to(names, (layers, heads, k)).reshape(-1)
    return sums.reshape(n, -1), counts.reshape(n, -1), metric


def parts_of(n_units: int, size: int, design: str, draws: int, seed: int) -> list[np.ndarray]:
    if design == "disjoint":
        order = np.random.default_rng(seed).permutation(n_units)
        return [np.sort(order[k * size:(k + 1) * size]) for k in range(n_units // size)]
    rng = np.random.default_rng(1000 + size + seed)
    return [np.sort(rng.choice(n_units, size, replace=False)) for _ in range(draws)]


# --- one part ------------------------------------------------------------------------------------------------------


_WEIGHTS: dict[int, np.ndarray] = {}


def part_state(sums: np.ndarray, counts: np.ndarray) -> dict:
    """What a sweep of these units alone accumulates (units renumbered 0..n-1, seed 0, 200 replicates)."""
    n = len(sums)
    if n not in _WEIGHTS:
        _WEIGHTS[n] = intervals.bootstrap_weights(range(n), REPLICATES, 0)
    weights = _WEIGHTS[n]
    return {"replicate_sums": weights @ sums, "replicate_counts": weights @ counts,
            "replicate_power": intervals.replicate_moments(weights, sums, counts),
            "moments": intervals.unit_moments(sums, counts)}


def part_rows(state: dict, sparse: np.ndarray, methods=METHODS, bounds=(0.0, np.inf)) -> dict:
    """Each method's interval and each rule's flag for one part's state, (row,) arrays."""
    moments = state["moments"]
    with np.errstate(invalid="ignore", divide="ignore"):
        value = moments[_S] / moments[_C]
    out = {"value": value, "defined": moments[_C] > 0}
    for method in methods:
        out[method] = intervals.interval(value, state["replicate_sums"], state["replicate_counts"], moments,
                                         method=method, replicate_power=state["replicate_power"], bounds=bounds)
    contributing, _ = intervals.support(moments)
    n_eff = intervals.effective_units(moments)
    df = intervals.variance_df(state["replicate_sums"], state["replicate_counts"], state["replicate_power"])
    # as the sweep flags rows: ceiling-aware, on the default method's interval, within each metric's own range
    low, high = intervals.interval(value, state["replicate_sums"], state["replicate_counts"], moments,
                                   method="studentized_symmetric", replicate_power=state["replicate_power"],
                                   bounds=bounds)
    out.update(n_eff=n_eff, df=df, contributing=contributing,
               thin=intervals.thin(n_eff, df, contributing, sparse=sparse, value=value, low=low, high=high,
                                   bounds=bounds),
               thin_support=intervals.thin_support(moments))
    return out


def coverage_of(sums, counts, metric, parts, *, methods=METHODS) -> pd.DataFrame:
    """Per part and metric: rows, and per method and rule the rows trusted and covered."""
    with np.errstate(invalid="ignore", divide="ignore"):
        truth = sums.sum(0) / counts.sum(0)
    structural = ~(np.abs(sums).sum(0) > 0)
    names, code = np.unique(metric, return_inverse=True)
    sparse = np.isin([name.split(":", 1)[-1] for name in metric], SPARSE)  # value:induction too, as the sweep does
    ranges = {name: describe("importance" if name.startswith("importance:") else name.split(":", 1)[-1]
                             if name != "offsets" else "offsets").bounds() for name in names}
    bounds = tuple(np.array([ranges[name][end] for name in metric]) for end in (0, 1))  # each row's metric's range
    frames = []
    for index, part in enumerate(parts):
        rows = part_rows(part_state(sums[part], counts[part]), sparse, methods, bounds)
        keep = rows["defined"] & ~structural & np.isfinite(truth)
        count = lambda mask: np.bincount(code[keep & mask], minlength=len(names))  # noqa: E731
        frame = {"part": index, "metric": names, "rows": count(keep)}
        for rule in RULES:
            trusted = keep if rule == "none" else keep & ~rows[rule]
            frame[f"trusted_{rule}"] = count(trusted)
            for method in methods:
                low, high = rows[method]
                frame[f"{method}_{rule}"] = count(trusted & (low <= truth) & (truth <= high))
        frames.append(pd.DataFrame(frame))
    return pd.concat(frames, ignore_index=True)


# --- summaries -----------------------------------------------------------------------------------------------------


def summarise(per_part: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Coverage per `keys` (+ method, rule) with the part-clustered Monte Carlo error; 'all' pools the metrics."""
    pooled = per_part.groupby([*keys, "part"], sort=False).sum(numeric_only=True).reset_index().assign(metric="all")
    frame = pd.concat([per_part, pooled], ignore_index=True)
    out = []
    for (group, g) in frame.groupby([*keys, "metric"], sort=False):
        base = dict(zip([*keys, "metric"], group))
        rows = g["rows"].sum()
        if rows == 0:  # a metric this model does not have (a bidirectional model's dla)
            continue
        for rule in RULES:
            trusted = g[f"trusted_{rule}"]
            for method in METHODS:
                if f"{method}_{rule}" not in g:
                    continue
                covered = g[f"{method}_{rule}"]
                with np.errstate(invalid="ignore", divide="ignore"):
                    per = (covered / trusted).where(trusted > 0)
                n_parts = int(per.notna().sum())
                out.append(base | {
                    "method": method, "rule": rule, "rows": int(rows), "trusted": int(trusted.sum()),
                    "flagged_share": 1 - trusted.sum() / rows if rows else np.nan,
                    "coverage": covered.sum() / trusted.sum() if trusted.sum() else np.nan,
                    "mc_error": per.std() / np.sqrt(n_parts) if n_parts > 1 else np.nan, "parts": n_parts,
                })
    return pd.DataFrame(out)


def cell(table: pd.DataFrame, **where) -> pd.Series | None:
    mask = np.ones(len(table), bool)
    for key, value in where.items():
        mask &= (table[key] == value).to_numpy()
    rows = table[mask]
    return rows.iloc[0] if len(rows) else None


def metric_table(table: pd.DataFrame, columns: list[tuple[str, dict]], metrics: list[str], fmt) -> list[str]:
    lines = ["| metric | " + " | ".join(name for name, _ in columns) + " |", "|---|" + "---|" * len(columns)]
    for metric in metrics:
        cells = []
        for _, where in columns:
            row = cell(table, metric=metric, **where)
            cells.append("–" if row is None else fmt(row))
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    return lines


def covered_cell(row) -> str:
    if row["trusted"] == 0:
        return "all flagged"
    flagged = f", {row['flagged_share']:.0%} flagged" if row["rule"] != "none" else ""
    return f"{row['coverage']:.2f}{flagged}"


def report(table: pd.DataFrame, datasets: list[str], args, seconds: float) -> str:
    present = set(table["metric"])
    metrics = [m for m in TARGETS if m in present] + sorted(present - set(TARGETS) - {"all"}) + ["all"]
    lines = [
        "# Interval coverage on parts of whole documents",
        "",
        f"Made by `python experiments/interval_coverage.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}` "
        f"from the unit sums in `{args.data}` ({REPLICATES} replicates, seed 0; {args.draws} random draws per N; "
        f"{seconds / 60:.0f} min).",
        "",
        "Each cell: the share of 95% intervals that hold the whole split's value, among the rows the rule trusts, "
        "and the share of rows it flags. `default`: `studentized_symmetric` + `thin`, headscan's default; `bca`: `bca` + "
        "`thin_support`. Rows: heads.parquet, offsets.parquet, value.parquet (`value:METRIC`) and syntax.parquet "
        f"(`syntax`; `--tables {' '.join(args.tables)}`), count > 0, structural zeros left out; `all` pools "
        "them. Parts of N documents are drawn without replacement from about 318, so an exact method covers "
        "about 0.952 (N = 10), 0.955 (30) and 0.981 (100) of the time. Monte Carlo error of a pooled cell "
        "(parts as clusters) in the CSV: about 0.01 for 200 random parts of 30, 0.03-0.04 for the ten disjoint "
        "ones.",
        "",
    ]
    for dataset in datasets:
        sub = table[table["dataset"] == dataset]
        if sub.empty:
            continue
        sizes = sorted(set(sub["N"]))
        lines += [f"## {dataset}", ""]
        columns = [(f"N={n} {design}: {label}", dict(N=n, design=design, method=method, rule=rule))
                   for n in sizes for design in ("random", "disjoint") if n == 30 or design == "random"
                   for label, method, rule in (("default", "studentized_symmetric", "thin"), ("bca", "bca", "thin_support"))]
        lines += metric_table(sub, columns, metrics, covered_cell) + [""]
        for n in sizes:
            lines += [f"### {dataset}, random parts of {n}: every method, every rule", ""]
            columns = [(f"{method}, {rule}", dict(N=n, design="random", method=method, rule=rule))
                       for rule in RULES for method in ("studentized", "studentized_symmetric", "bca", "delta")]
            lines += metric_table(sub, columns, metrics, covered_cell) + [""]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder of MODEL-CORPUS.npz from unit_sums.py")
    parser.add_argument("--models", nargs="+", default=["minilm", "smollm2"])
    parser.add_argument("--corpora", nargs="+", default=["dev", "test", "repeat-random"])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--draws", type=int, default=200, help="random parts per N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tables", nargs="+", default=["heads", "offsets", "value", "syntax"],
                        help="tables whose rows are checked; importance for the files of unit_sums.py --importance")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=RuntimeWarning)

    started = time.perf_counter()
    per_part, datasets = [], []
    for model in args.models:
        for corpus in args.corpora:
            path = args.data / f"{model}-{corpus}.npz"
            if not path.is_file():
                print(f"skipped {model} {corpus}: no {path} (experiments/unit_sums.py makes it)", file=sys.stderr)
                continue
            sums, counts, metric = load(path, tuple(args.tables))
            dataset = f"{model}, {corpus}"
            datasets.append(dataset)
            for size in args.sizes:
                for design in ("disjoint", "random"):
                    parts = parts_of(len(sums), size, design, args.draws, args.seed)
                    if not parts:
                        continue
                    part = coverage_of(sums, counts, metric, parts)
                    per_part.append(part.assign(dataset=dataset, model=model, corpus=corpus, N=size, design=design))
                    print(f"{dataset}: {len(parts)} {design} parts of {size} ({time.perf_counter() - started:.0f} s)",
                          file=sys.stderr)
    per_part = pd.concat(per_part, ignore_index=True)
    table = summarise(per_part, ["dataset", "model", "corpus", "N", "design"])
    markdown = report(table, datasets, args, time.perf_counter() - started)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "coverage.csv", index=False, float_format="%.4f")
    per_part.to_csv(args.out / "parts.csv", index=False)
    (args.out / "coverage.md").write_text(markdown + "\n")
    print(markdown)


if __name__ == "__main__":
    main()
