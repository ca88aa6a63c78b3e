"""Judge a committed sweep's rows again by today's rule, without sweeping again.

    python experiments/retest.py reports/runs/ewt-long

A sweep's verdicts (``null_kind`` ... ``verdict``, `headscan.metrics.nulls.add_findings`) are computed from its
own tables once every model is in: values, intervals, units, ``thin``, chance and the controls' rows. When the rule
changes (the calibrated intervals, one family per table, no finding without random-init controls), a run whose
sweep takes an hour can be judged again from those tables alone: this script runs `add_findings` on them with the
run's own ``--fdr``, writes the run back whole (`headscan.tables.write`, run.json last) and records in its
provenance, under ``extra["retested"]``, the revision and date of the new verdicts beside the sweep's own. The
scores, intervals and everything else in the tables are left as the sweep wrote them.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import headscan
from headscan.metrics.nulls import add_findings
from headscan.tables import write

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="sweep folders (run.json and heads.parquet)")
    args = parser.parse_args(argv)
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    for run in args.runs:
        tables = headscan.load(run)
        fdr = float(tables.provenance.config.get("fdr", 0.05))
        frames, summary = add_findings(tables.frames, q=fdr)
        tables.frames.update(frames)
        retested = {"revision": revision.strip() or None, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "by": "experiments/retest.py", "swept_at": tables.provenance.git_revision}
        tables.provenance = dataclasses.replace(tables.provenance, extra={
            **tables.provenance.extra, "findings": summary, "retested": retested})
        write(tables, run, overwrite=True)
        print(f"{run}: " + "; ".join(f"{model} {found} findings of {summary['family'][model]} tested"
                                     for model, found in summary["findings"].items()))


if __name__ == "__main__":
    main()
