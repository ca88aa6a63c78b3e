"""Every number equal through a refactor: a fixed set of runs, written before and after, compared to the bit.

    python benchmarks/same_tables.py write /tmp/before          # on the code before a change
    python benchmarks/same_tables.py write /tmp/after           # on the code after it
    python benchmarks/same_tables.py compare /tmp/before /tmp/after

or, in one go, an earlier revision's code against this checkout's (`make same-tables REV=d7af62a`):

    python benchmarks/same_tables.py against d7af62a --out /tmp/same-tables

`write` imports whichever headscan Python finds first: put the tree to measure first on PYTHONPATH
(`git archive REV | tar -x -C /tmp/old` and `PYTHONPATH=/tmp/old`; `against` does that for you). The runs,
each through the `headscan` command line of that tree (click's runner, in this process):

- sweeps over a few EWT dev sentences covering each pass a sweep can run: `plain` (minilm and smollm2: values
  and dla, syntax, weights, similarity, minilm's composition), `chunked` (smollm2, chunked attention),
  `importance` (minilm and smollm2: exact ablation of the top 3 heads by AtP, composition, random-init
  controls), `shard0` and `shard1` (minilm) and `merged`, their `headscan merge`;
- `retrieval`: smollm2's needle-in-a-haystack trials at 256 tokens and two depths, with the masking test
  (`--mask-top 2 --mask-random 2`, 3 draws);
- `patch`: smollm2 over 12 IOI pairs (`pairs.jsonl`, written by `headscan pairs`), every head patched and
  path patching between the top 2 (`--path-top 2`).

The set is not yet a few minutes on 2 cores: through `retrieval` it took 21 CPU minutes (at a load of 8 to 17
on 2 shared cores: over an hour), most of it `importance`, where smollm2's composition null alone (65,536
Haar-random draws, about 13 CPU seconds per 2,048) is about 7; `plain` is about 80 CPU seconds. A run whose command or option the
imported headscan lacks is not written: `write` says which option, leaves `NAME.skipped` with the reason and
exits 1 at the end, and `compare` reports that run as missing on that side.

`compare` checks every parquet table of every run cell for cell (float bits equal, NaN equal to NaN; each
differing column with its number of cells and largest difference), each run.json but for what differs between
two runs of the same code (times, versions, paths), and the files beside the runs (pairs.jsonl) byte for byte;
it exits 1 on any difference. With `--common` it compares only what both sides have: rows matched by their
table's key (`headscan.TABLES[name].row_key`), the columns and run.json entries both hold; the rows, columns and
entries only one side has are listed, not counted (for a deliberate change that adds or removes rows, such as
a bidirectional model's syntax table without `_visible` rows).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
# the EWT dev file in HEADSCAN_EWT (a folder, or a file in it: as the tests read it), else beside the checkout
EWT = Path(os.environ.get("HEADSCAN_EWT", ROOT.parent / "shared/data/ud-english-ewt")).expanduser().resolve()
EWT = (EWT if EWT.is_dir() else EWT.parent) / "en_ewt-ud-dev.conllu"
COMMON = ["--corpus", str(EWT), "--limit", "24", "--bootstrap", "20", "--device", "cpu", "-q", "--overwrite"]
SMALL = ["--bootstrap", "20", "--device", "cpu", "-q", "--overwrite"]
# name -> (command, its arguments); "{folder}" is the folder being written. In order: a run may read an earlier one.
RUNS = {
    "plain": ("sweep", ["-m", "minilm", "-m", "smollm2", "--similarity-sample", "8", *COMMON]),
    "chunked": ("sweep", ["-m", "smollm2", "--attention", "chunked", "--query-chunk", "7", "--no-values", *COMMON]),
    "importance": ("sweep", ["-m", "minilm", "-m", "smollm2", "--importance", "ablate", "--ablate-top", "3",
                             "--importance-sample", "8", "--control", "random-init", "--composition", "on", *COMMON]),
    "shard0": ("sweep", ["-m", "minilm", "--shard", "0/2", *COMMON]),
    "shard1": ("sweep", ["-m", "minilm", "--shard", "1/2", *COMMON]),
    "merged": ("merge", ["{folder}/shard0", "{folder}/shard1", "--overwrite"]),
    "retrieval": ("retrieval", ["-m", "smollm2", "--corpus", str(EWT), "--lengths", "256", "--depths", "0,1",
                                "--max-new-tokens", "8", "--mask-top", "2", "--mask-random", "2", "--mask-draws", "3",
                                *SMALL]),
    "pairs.jsonl": ("pairs", ["ioi", "--n", "12", "-m", "smollm2", "--overwrite"]),
    "patch": ("patch", ["-m", "smollm2", "--pairs", "{folder}/pairs.jsonl", "--path-top", "2", *SMALL]),
}
# what differs between two runs of the same code, and is not a number the run computed
UNSTABLE = {"created", "started", "finished", "seconds", "elapsed", "versions", "host", "path", "out", "command",
            "argv", "python", "platform", "headscan_version", "git", "time", "duration", "hostname", "cwd",
            "run_id", "git_revision", "merged_from", "source"}  # source: the corpus path as this checkout spells it
SHOWN = 12  # differing run.json entries printed per run


def missing_options(command, words: list[str]) -> list[str]:
    """The options among `words` that the click `command` does not take."""
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    return [word.split("=")[0] for word in words if word.startswith("-") and word.split("=")[0] not in known]


def write(folder: Path, only: list[str] | None = None) -> int:
    """Write the runs of `RUNS` (or those named in `only`) into `folder` with the headscan Python imports."""
    from click.testing import CliRunner

    import headscan
    from headscan.cli import cli

    print(f"headscan from {Path(headscan.__file__).parent}")
    folder.mkdir(parents=True, exist_ok=True)
    runner, failures, started = CliRunner(), 0, time.perf_counter()
    for name, (command, words) in RUNS.items():
        if only and name not in only:
            continue
        marker = folder / f"{name}.skipped"
        marker.unlink(missing_ok=True)
        words = [word.format(folder=folder) for word in words] + ["--out", str(folder / name)]
        needed = [w for w in words if w.startswith(str(folder)) and w != str(folder / name) and not Path(w).exists()]
        lacks = missing_options(cli.commands[command], words) if command in cli.commands else None
        if lacks is None or lacks or needed:
            reason = (f"this headscan has no `{command}` command" if lacks is None else
                      f"this headscan's `headscan {command}` has no {', '.join(lacks)}" if lacks else
                      f"it needs {', '.join(needed)}, which was not written")
            marker.write_text(reason + "\n")
            print(f"{name}: NOT WRITTEN: {reason}")
            failures += 1
            continue
        start = time.perf_counter()
        result = runner.invoke(cli, [command, *words], catch_exceptions=False)
        if result.exit_code != 0:
            marker.write_text(f"`headscan {command}` failed: {result.output.strip()}\n")
            print(f"{name}: FAILED: {result.output.strip()}")
            failures += 1
            continue
        written = sorted(p.name for p in (folder / name).iterdir()) if (folder / name).is_dir() else [name]
        print(f"{name}: {time.perf_counter() - start:.0f} s, {written}")
    print(f"{time.perf_counter() - started:.0f} s in all" + (f"; {failures} runs not written" if failures else ""))
    return 1 if failures else 0


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in UNSTABLE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def json_differences(a, b, where: str = "") -> tuple[list[str], list[str]]:
    """(entries both hold that differ, entries only one side holds) between two parsed JSON values; NaN equals NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        differ, only = [], [f"{where}.{k}: only in {'before' if k in a else 'after'}" for k in sorted(set(a) ^ set(b))]
        for key in sorted(set(a) & set(b)):
            d, o = json_differences(a[key], b[key], f"{where}.{key}")
            differ, only = differ + d, only + o
        return differ, only
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        differ, only = [], []
        for i, (x, y) in enumerate(zip(a, b)):
            d, o = json_differences(x, y, f"{where}[{i}]")
            differ, only = differ + d, only + o
        return differ, only
    same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return ([] if same and type(a) is type(b) else [f"{where or '.'}: {a!r:.80} against {b!r:.80}"]), []


def column_difference(x: pd.Series, y: pd.Series, by: pd.Series | None = None) -> str | None:
    """None if the two columns are equal to the bit (NaN equal to NaN), else how they differ; `by` (a key column,
    such as the metric) counts the differing cells by its values."""
    note = f"dtype {x.dtype} against {y.dtype}" if x.dtype != y.dtype else ""
    if note and not (x.dtype.kind in "fiu" and y.dtype.kind in "fiu"):
        return note
    a, b = x.to_numpy(), y.to_numpy()
    parts = [note]
    if a.dtype.kind == "f" and b.dtype.kind == "f":
        same_bits = a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}") if a.dtype == b.dtype else a == b
        bad = ~(same_bits | (np.isnan(a) & np.isnan(b)))
        both, nan = bad & np.isfinite(a) & np.isfinite(b), int((bad & (np.isnan(a) ^ np.isnan(b))).sum())
        parts += [f"largest difference {np.max(np.abs(a[both] - b[both].astype(a.dtype))):.3g}" if both.any()
                  else "", f"{nan} NaN on one side only" if nan else ""]
    else:
        xs, ys = x.astype(object).reset_index(drop=True), y.astype(object).reset_index(drop=True)
        bad = ~((xs.isna() & ys.isna()) | (xs == ys).fillna(False).astype(bool)).to_numpy()
    if not bad.any():
        return note or None
    parts.insert(1, f"{int(bad.sum())} of {len(a)} cells differ")
    if by is not None:
        counts = pd.Series(by.to_numpy()[bad]).value_counts().sort_index()
        parts.append(f"in {by.name} " + ", ".join(f"{value} {n}" for value, n in counts.items()))
    return ", ".join(filter(None, parts))


def _key(table: str) -> list[str] | None:
    try:
        from headscan import TABLES
    except ImportError:
        return None
    return TABLES[table].row_key if table in TABLES else None


def _keyed(frame: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """`frame` with its key columns as plain objects, a missing key ("not by position") spelled out, so that
    merge matches it."""
    return frame.assign(**{k: frame[k].astype(object).where(frame[k].notna(), "<NA>") for k in key})


def frame_differences(a: pd.DataFrame, b: pd.DataFrame, table: str, common: bool) -> tuple[list[str], list[str]]:
    """(differences, what only one side has) between two tables; `common`: rows matched by key, shared columns."""
    only = [f"column {c} only in {side}" for side, x, y in (("before", a, b), ("after", b, a))
            for c in x.columns if c not in y.columns]
    key = _key(table)
    if not common:
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            return [f"columns or rows differ: {list(a.columns)} x {len(a)} against {list(b.columns)} x {len(b)}"], []
    elif key and set(key) <= set(a.columns) & set(b.columns) and not a.duplicated(key).any() \
            and not b.duplicated(key).any():
        a, b = _keyed(a, key), _keyed(b, key)
        both = a[key].merge(b[key], how="outer", indicator=True)
        for side, mark in (("before", "left_only"), ("after", "right_only")):
            rows = both[both["_merge"] == mark]
            if len(rows):
                by = (", by metric: " + ", ".join(f"{m} {n}" for m, n in rows["metric"].value_counts().sort_index()
                                                   .items())) if "metric" in rows else ""
                only.append(f"{len(rows)} rows only in {side}{by}")
        shared = both[both["_merge"] == "both"][key]
        a, b = shared.merge(a, on=key, how="left"), shared.merge(b, on=key, how="left")
    elif len(a) != len(b):
        return [f"{len(a)} rows against {len(b)}, and no unique row key to match them by"], only
    differences = []
    named = [c for c in ("model", "metric", "relation", "mode", "method", "condition") if c in a.columns and c in b.columns]
    by = a[named].astype(str).agg(" ".join, axis=1).rename("/".join(named)) if named else None
    for column in (c for c in a.columns if c in b.columns):
        problem = column_difference(a[column], b[column], by)
        if problem:
            differences.append(f"{column}: {problem}")
    return differences, only


def _absent(path: Path) -> str:
    """Why `path`, a run or file of a written set, is not there."""
    marker = path.parent / f"{path.name}.skipped"
    return marker.read_text().strip() if marker.is_file() else "no such run"


def compare_run(run: str, sides: dict[str, Path], common: bool) -> int:
    """Print how one run's tables and run.json compare; the number of differences."""
    failures = 0
    tables = [sorted(p.name for p in path.glob("*.parquet")) for path in sides.values()]
    for table in sorted(set(tables[0]) ^ set(tables[1])):
        print(f"{run}/{table}: only in {'before' if table in tables[0] else 'after'}")
        failures += not common
    for table in sorted(set(tables[0]) & set(tables[1])):
        differences, only = frame_differences(*(pd.read_parquet(path / table) for path in sides.values()),
                                              table.removesuffix(".parquet"), common)
        print(f"{run}/{table}: {'DIFFERS' if differences else 'equal to the bit'}"
              + (" in what both have" if only and not differences else ""))
        for line in [*differences, *only]:
            print(f"    {line}")
        failures += bool(differences)
    differ, only = json_differences(*(_stable(json.loads((path / "run.json").read_text()))
                                      for path in sides.values()))
    differ, only = (differ + only, []) if not common else (differ, only)
    print(f"{run}/run.json: {'DIFFERS' if differ else 'equal'} but for times, versions and paths"
          + (f" ({len(only)} entries only on one side)" if only else ""))
    for line in [*differ[:SHOWN], *only[:SHOWN]]:
        print(f"    {line}")
    if len(differ) > SHOWN or len(only) > SHOWN:
        print(f"    ... ({len(differ)} differing, {len(only)} on one side in all)")
    return failures + bool(differ)


def compare(before: Path, after: Path, common: bool = False) -> int:
    """Print how each run of `before` and `after` compares; 1 if anything differs (`common`: in what both hold)."""
    failures = 0
    for name in sorted({p.name.removesuffix(".skipped") for side in (before, after) for p in side.iterdir()}):
        sides = {"before": before / name, "after": after / name}
        if not all(path.exists() for path in sides.values()):
            print(f"{name}: NOT COMPARED, not written by " + "; ".join(
                f"{side}: {_absent(path)}" for side, path in sides.items() if not path.exists()))
            failures += 1
        elif all(path.is_dir() for path in sides.values()):
            failures += compare_run(name, sides, common)
        else:  # a file beside the runs (pairs.jsonl)
            same = len({path.read_bytes() if path.is_file() else None for path in sides.values()}) == 1
            print(f"{name}: {'equal to the bit' if same else 'DIFFERS'}")
            failures += not same
    print("all equal" + (" in what both have" if common else "") if not failures else f"{failures} differences")
    return 1 if failures else 0


def against(rev: str, out: Path, common: bool) -> int:
    """Write the set with `rev`'s code (exported with git archive) and with this checkout's, and compare them."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--short", f"{rev}^{{commit}}"],
                            capture_output=True, text=True)
    if commit.returncode:
        sys.exit(f"same_tables: {rev!r} is not a revision of {ROOT}; give a commit, tag or branch")
    tree = out / f"tree-{commit.stdout.strip()}"
    if not tree.is_dir():
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit.stdout.strip()],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for code, folder in ((tree, out / commit.stdout.strip()), (ROOT, out / "this")):
        print(f"== writing {folder} with the code of {code}", flush=True)
        # the script from this checkout (the revision's may lack runs), the package from `code`
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "write", str(folder)], cwd=out,
                       env=os.environ | {"PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1"})
    return compare(out / commit.stdout.strip(), out / "this", common)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="action", required=True)
    writes = commands.add_parser("write", help="write the set of runs into FOLDER")
    writes.add_argument("folder", type=Path)
    writes.add_argument("--only", nargs="+", choices=list(RUNS), help="only these runs")
    compares = commands.add_parser("compare", help="compare two folders that write made")
    compares.add_argument("before", type=Path)
    compares.add_argument("after", type=Path)
    compares.add_argument("--common", action="store_true", help="compare only what both sides have")
    againsts = commands.add_parser("against", help="write with REV's code and with this checkout's, and compare")
    againsts.add_argument("rev")
    againsts.add_argument("--out", type=Path, default=None, help="where both sets go (default: a temporary folder)")
    againsts.add_argument("--common", action="store_true", help="compare only what both sides have")
    args = parser.parse_args()
    if args.action == "write":
        sys.exit(write(args.folder, args.only))
    if args.action == "compare":
        sys.exit(compare(args.before, args.after, args.common))
    sys.exit(against(args.rev, (args.out or Path(tempfile.mkdtemp(prefix="same-tables-"))).resolve(), args.common))


if __name__ == "__main__":
    main()
