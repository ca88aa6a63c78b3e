"""Output folders published whole: where an ``--out`` really is, whether it can be written, and the swap.

A sweep's tables (`headscan.tables.io.write`) and a report (`headscan.report.document.write_folder`) are both
published here. `where` reads an ``--out`` the way the system will (symlinks and ``..`` resolved, so ``link/..``
is the folder the link's target lies in, not the one the link lies in); `check_writable` tries a real write,
since root passes ``os.access`` on a read-only mount; `check_not_here` refuses to replace the folder the user
works in; `publish` builds the folder with a function and puts it at ``out`` in one step.

This module knows nothing of tables or reports, and imports no torch.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..errors import TablesError

__all__ = ["where", "check_writable", "check_not_here", "publish"]


def where(out: str | os.PathLike) -> Path:
    """The absolute folder `out` names, as the system resolves it (the part that exists), for every check and
    write to use alike.

    >>> where(".") == Path.cwd().resolve()
    True
    """
    return Path(os.path.realpath(out))


def _existing_parent(target: Path) -> Path:
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    return parent


def check_writable(out: str | os.PathLike, shown: str) -> None:
    """Refuse `out` (spelt `shown` by the user) unless a folder can be made where it will be written: beside it,
    and inside it when it is an empty folder already (which may be another file system, a mount point)."""
    target = where(out)
    parent = _existing_parent(target)
    if not parent.is_dir():
        raise TablesError(f"{shown}: {parent} is a file, not a folder; choose another --out")
    places = [parent] + ([target] if target.is_dir() else [])
    for place in places:
        try:
            tempfile.TemporaryDirectory(prefix=".headscan-probe-", dir=place).cleanup()
        except OSError as error:
            raise TablesError(f"{shown}: cannot write in {place} ({error.strerror or error}); choose another "
                              f"--out") from None


def check_not_here(out: str | os.PathLike, shown: str) -> None:
    """Refuse to replace the folder the user works in, or one holding it: the replacement would leave their shell
    in a deleted folder."""
    target, here = where(out), Path.cwd().resolve()
    if here == target or target in here.parents:
        raise TablesError(f"{shown}: is the folder you are in, and replacing it would leave your shell in a deleted "
                          f"folder; cd to {target.parent} and pass --out {target.name}")


def publish(out: str | os.PathLike, fill: Callable[[Path], None], *, last: str | None = None) -> Path:
    """Build a folder with `fill(folder)` and put it at `out` whole; returns where it now is (`where`).

    The folder is built in a new hidden folder and swapped in, replacing whatever `out` held: a failure leaves
    `out` as it was, never half of one. An empty folder already at `out` (made for the run, or the folder one
    works in) is kept and filled: the files are built inside it and moved up, `last` last, and moved back out
    should that fail. Files get the usual permissions (the umask).
    """
    target = where(out)
    if target.is_dir() and not any(target.iterdir()):
        return _fill_in_place(target, fill, last)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".new", dir=target.parent))
    old = None
    try:
        fill(staging)
        staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; what is published is meant to be read
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
            os.replace(target, old / target.name)
        os.replace(staging, target)
    except BaseException:
        if old is not None and not target.exists():
            os.replace(old / target.name, target)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def _fill_in_place(target: Path, fill: Callable[[Path], None], last: str | None) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=".headscan-", suffix=".new", dir=target))  # same file system as target
    moved: list[str] = []
    try:
        fill(staging)
        for path in sorted(staging.iterdir(), key=lambda path: path.name == last):
            os.replace(path, target / path.name)
            moved.append(path.name)
    except BaseException:
        for name in moved:  # back out: the folder is empty again, as it was
            os.replace(target / name, staging / name)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
