"""What a report is given, checked before any slow work: the runs (none given twice), --top, and the folder it
goes to (by default beside the first run; an earlier report there replaced only with --overwrite, never a folder
that holds anything else).

`headscan.report.build.write_report` calls these; the command line calls them first too, before it loads the
models for the example attention.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..analysis.runs import run_names
from ..errors import ConfigError
from ..tables import SweepTables, folders
from .document import FOLDER_FILES
from .figures import name_part

__all__ = ["check_report_options", "check_runs", "report_folder"]


def check_report_options(*, top: int, out: str | os.PathLike | None = None, overwrite: bool = False) -> None:
    """Refuse a `top` below 1, and an `out` that is not a folder, holds anything but an earlier report, or holds
    one and `overwrite` is not set.

    `write_report` calls it; call it first to fail before slow work, such as loading models for the examples.
    An earlier report in `out` is replaced only with `overwrite`; refusing anything else means ``out="."`` never
    deletes a project.
    """
    if top < 1:
        raise ConfigError(f"top must be at least 1, not {top}; pass how many heads to list per metric, e.g. 10",
                          setting="top")
    if out is None:
        return
    target = folders.where(out)
    if target.exists() and not target.is_dir():
        raise ConfigError(f"out {out}: exists and is not a folder; choose another", setting="out")
    if target.is_dir() and any(target.iterdir()):
        folders.check_not_here(target, str(out))
        folders.check_only_ours(target, str(out), FOLDER_FILES, "a headscan report")
        if not overwrite:
            raise ConfigError(f"out {out}: already holds a report; pass --overwrite to replace it, or choose another "
                              f"--out", setting="out")
    folders.check_writable(target, str(out))


def check_runs(runs: Sequence[str | os.PathLike | SweepTables]) -> None:
    """Refuse a run given twice: the same folder, or tables of the same run (the same run id).

    A run compared with itself has nothing to show; two runs of one model are compared as ``run:model``.
    """
    seen: dict = {}
    for run in runs:
        path = run.path if isinstance(run, SweepTables) else Path(run)
        keys = [("path", Path(path).resolve())] if path is not None else []
        run_id = run.provenance.run_id if isinstance(run, SweepTables) else None
        keys += [("run", run_id)] if run_id else []
        for key in keys:
            if key in seen:
                raise ConfigError(f"run {path or 'given as tables'} is given twice (as {seen[key]}); a report compares "
                                  "different runs, so pass each once")
            seen[key] = path or "tables"


def report_folder(runs: Sequence[SweepTables], out: str | os.PathLike | None = None) -> Path:
    """Where the report of `runs` goes: `out`, or by default ``NAME-report`` beside the first run's folder, where
    a user looks for it (not inside whatever project the command runs in); in the current folder for tables that
    were never written.

    >>> runs = [SweepTables({}, path=Path("out/ewt"))]
    >>> report_folder(runs).as_posix(), report_folder([SweepTables({}), SweepTables({})]).as_posix()
    ('out/ewt-report', 'run1-run2-report')
    """
    if out is not None:
        return Path(out)
    names = run_names([run.path or f"run{i + 1}" for i, run in enumerate(runs)])
    name = folders.fitting(name_part("+".join(names)), 113) + "-report"  # many runs, or long names: one file name
    return Path(runs[0].path).parent / name if runs[0].path is not None else Path(name)
