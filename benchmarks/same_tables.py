"""Every number equal through a refactor: a fixed set of sweeps, written before and after, compared to the bit.

    python benchmarks/same_tables.py write /tmp/before          # on the code before a change
    python benchmarks/same_tables.py write /tmp/after           # on the code after it
    python benchmarks/same_tables.py compare /tmp/before /tmp/after

The sweeps cover each pass a sweep can run (values and dla, syntax, weights, importance, similarity, controls,
chunked attention, shards and merge, retrieval) on the embedded models over a few EWT dev sentences, so that the
set takes a few minutes on 2 cores. `compare` checks every table cell for cell (NaN equal to NaN, float bits
equal) and each run.json but for what differs between two runs of the same code (times, versions, paths).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"
COMMON = ["--corpus", str(EWT), "--limit", "24", "--bootstrap", "20", "--device", "cpu", "-q", "--overwrite"]
SWEEPS = {
    "plain": ["-m", "minilm", "-m", "smollm2", "--similarity-sample", "8"],
    "chunked": ["-m", "smollm2", "--attention", "chunked", "--query-chunk", "7", "--no-values"],
    "importance": ["-m", "smollm2", "--importance", "ablate", "--ablate-top", "3", "--importance-sample", "8",
                   "--control", "random-init"],
    "shard0": ["-m", "minilm", "--shard", "0/2"],
    "shard1": ["-m", "minilm", "--shard", "1/2"],
}
# what differs between two runs of the same code, and is not a number the sweep computed
UNSTABLE = {"created", "started", "finished", "seconds", "elapsed", "versions", "host", "path", "out", "command",
            "argv", "python", "platform", "headscan_version", "git", "time", "duration", "hostname", "cwd",
            "run_id", "git_revision", "merged_from", "source"}  # source: the corpus path as this checkout spells it


def write(folder: Path) -> None:
    from click.testing import CliRunner

    from headscan.cli import cli

    folder.mkdir(parents=True, exist_ok=True)
    runner = CliRunner()
    for name, options in SWEEPS.items():
        result = runner.invoke(cli, ["sweep", *options, *COMMON, "--out", str(folder / name)], catch_exceptions=False)
        if result.exit_code != 0:
            sys.exit(f"sweep {name} failed: {result.output}")
        print(f"{name}: {sorted(p.name for p in (folder / name).iterdir())}")
    merged = runner.invoke(cli, ["merge", str(folder / "shard0"), str(folder / "shard1"), "--out",
                                 str(folder / "merged"), "--overwrite"], catch_exceptions=False)
    if merged.exit_code != 0:
        sys.exit(f"merge failed: {merged.output}")


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in UNSTABLE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _same_frame(a: pd.DataFrame, b: pd.DataFrame) -> str | None:
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return f"columns or rows differ: {list(a.columns)} x {len(a)} against {list(b.columns)} x {len(b)}"
    for column in a.columns:
        x, y = a[column].to_numpy(), b[column].to_numpy()
        if x.dtype.kind == "f" and y.dtype.kind == "f":
            if x.dtype != y.dtype or not np.array_equal(x.view(np.uint8), y.view(np.uint8)):
                bad = ~((x == y) | (np.isnan(x) & np.isnan(y)))
                return f"{column}: {int(bad.sum())} cells differ (largest {np.nanmax(np.abs(x - y)):.3g})"
        elif not a[column].equals(b[column]):
            return f"{column}: differs"
    return None


def compare(before: Path, after: Path) -> int:
    failures = 0
    runs = sorted(p.name for p in before.iterdir() if p.is_dir())
    for run in runs:
        tables = sorted(p.name for p in (before / run).glob("*.parquet"))
        other = sorted(p.name for p in (after / run).glob("*.parquet"))
        if tables != other:
            print(f"{run}: tables {tables} against {other}")
            failures += 1
        for table in set(tables) & set(other):
            problem = _same_frame(pd.read_parquet(before / run / table), pd.read_parquet(after / run / table))
            print(f"{run}/{table}: {problem or 'equal to the bit'}")
            failures += problem is not None
        a, b = (_stable(json.loads((side / run / "run.json").read_text())) for side in (before, after))
        if a != b:
            print(f"{run}/run.json differs beyond times and versions")
            failures += 1
    print("all equal" if not failures else f"{failures} differences")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
