"""Output folders published whole: where an ``--out`` really is, whether it can be written, and the swap.

A sweep's tables (`headscan.tables.io.write`) and a report (`headscan.report.document.write_folder`) are both
published here. `where` reads an ``--out`` the way the system will (symlinks and ``..`` resolved, so ``link/..``
is the folder the link's target lies in, not the one the link lies in); `check_writable` tries a real write,
since root passes ``os.access`` on a read-only mount; `check_not_here` refuses to replace the folder the user
works in; `check_only_ours` refuses to replace a folder that holds anything headscan did not write; `publish`
builds the folder with a function and puts it at ``out`` in one step, keeping the old folder's mode; `lock` keeps
two processes from writing one folder at once.

This module knows nothing of tables or reports, and imports no torch.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import inspect
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from ..errors import TablesError

__all__ = ["where", "fitting", "check_writable", "check_not_here", "check_only_ours", "publish", "lock", "holding_out"]

# The longest addition publish and the sweep make to a folder's name: ".NAME.XXXXXXXX.new" beside it
NAME_OVERHEAD = len("..xxxxxxxx.new")


def where(out: str | os.PathLike) -> Path:
    """The absolute folder `out` names, as the system resolves it (the part that exists), for every check and
    write to use alike.

    >>> where(".") == Path.cwd().resolve()
    True
    """
    return Path(os.path.realpath(out))


def fitting(name: str, limit: int = 120) -> str:
    """`name` as a file name of at most `limit` bytes, well within any file system's 255 with room for the staging
    names beside it: a longer one keeps its start and its suffix and gains a digest of the whole, so that two
    names that differ only past the cut stay apart (names built from run and model names can be any length).

    >>> fitting("figure.png"), fitting("d" * 300 + ".png", 40)
    ('figure.png', 'ddddddddddddddddddddddddd-fc9b8209ba.png')
    """
    encoded = os.fsencode(name)
    if len(encoded) <= limit:
        return name
    suffix = os.path.splitext(name)[1] if len(os.path.splitext(name)[1]) <= 8 else ""
    digest = hashlib.sha256(encoded).hexdigest()[:10]
    stem = os.fsencode(name[:len(name) - len(suffix)])[:limit - len(suffix) - len(digest) - 1]
    return f"{stem.decode('utf-8', errors='ignore')}-{digest}{suffix}"


def _existing_parent(target: Path) -> Path:
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    return parent


def check_writable(out: str | os.PathLike, shown: str) -> None:
    """Refuse `out` (spelt `shown` by the user) unless a folder can be made where it will be written: beside it,
    and inside it when it is an empty folder already (which may be another file system, a mount point)."""
    target = where(out)
    try:  # parquet files are written through pyarrow, which takes only paths that are valid UTF-8
        str(target).encode("utf-8")
    except UnicodeEncodeError:
        raise TablesError(f"{ascii(shown)[1:-1]}: is not valid UTF-8 (a byte of another encoding in the name), and "
                          f"the parquet writer takes only UTF-8 paths; choose another --out") from None
    if os.path.lexists(target) and not os.path.exists(target):
        raise TablesError(f"{shown}: is a symbolic link that leads nowhere (a loop, or a target that is gone); "
                          f"remove it or choose another --out")
    try:
        parent = _existing_parent(target)
    except OSError as error:  # a loop among the links above it
        raise TablesError(f"{shown}: cannot be reached ({error.strerror or error}); choose another --out") from None
    first = parent / target.relative_to(parent).parts[0]  # the first folder to make, below the last that exists
    if os.path.lexists(first) and not os.path.exists(first):  # `where` leaves a loop unresolved: mkdir would fail
        raise TablesError(f"{shown}: {first} is a symbolic link that leads nowhere (a loop, or a target that is "
                          f"gone); remove it or choose another --out")
    if not parent.is_dir():
        raise TablesError(f"{shown}: {parent} is a file, not a folder; choose another --out")
    longest = os.pathconf(parent, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
    for part in target.relative_to(parent).parts or (target.name,):
        if len(os.fsencode(part)) + NAME_OVERHEAD > longest:
            raise TablesError(f"{shown}: the name {part[:40]}... is too long for this file system (at most "
                              f"{longest - NAME_OVERHEAD} bytes, room left for the files headscan writes beside "
                              f"it); choose a shorter --out")
    if target.is_dir() and any(target.iterdir()) and os.path.ismount(target):
        raise TablesError(f"{shown}: is a mount point that holds files, and a mount point cannot be swapped for a "
                          f"new folder; pass a folder inside it, or empty it")
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


def check_only_ours(out: str | os.PathLike, shown: str, ours: Collection[str], what: str) -> None:
    """Refuse to replace `out` when it holds anything but the entries headscan writes there (`ours`), naming what
    else it holds: --overwrite replaces headscan's own output, never a user's notes kept beside it."""
    target = where(out)
    if not target.is_dir():
        return
    others = sorted(entry.name for entry in target.iterdir() if entry.name not in ours)
    if others:
        named = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise TablesError(f"{shown}: holds {named}, which {what} does not write, and replacing the folder would "
                          f"delete {'it' if len(others) == 1 else 'them'}; move {'it' if len(others) == 1 else 'them'}"
                          f" out, or choose another --out")


def publish(out: str | os.PathLike, fill: Callable[[Path], None], *, last: str | None = None) -> Path:
    """Build a folder with `fill(folder)` and put it at `out` whole; returns where it now is (`where`).

    The folder is built in a new hidden folder and swapped in, replacing whatever `out` held: a failure leaves
    `out` as it was, never half of one. An empty folder already at `out` (made for the run, or the folder one
    works in) is kept and filled: the files are built inside it and moved up, `last` last, and moved back out
    should that fail. A new folder gets the usual permissions (the umask); a replaced one keeps its mode.
    """
    target = where(out)
    if target.is_dir() and not any(target.iterdir()):
        return _fill_in_place(target, fill, last)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(target.stat().st_mode) if target.is_dir() else 0o777 & ~_umask()
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".new", dir=target.parent))
    old = None
    try:
        fill(staging)
        staging.chmod(mode)  # mkdtemp makes it private; what is published is meant to be read
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


# --- one writer at a time ----------------------------------------------------------------------------------


_HELD: dict[tuple[int, Path], int] = {}  # the folders each thread of this process holds, and how many blocks hold each


def _lock_file(target: Path) -> Path:
    """Where the lock of `target` lives: this machine's temporary folder, by the folder's resolved path, so that it
    is the same file however `target` was spelt and whether or not its parent exists yet."""
    folder = Path(tempfile.gettempdir()) / f"headscan-locks-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / (hashlib.sha256(os.fsencode(target)).hexdigest()[:32] + ".lock")


@contextlib.contextmanager
def lock(out: str | os.PathLike, shown: str | None = None, *, wait: bool = False,
         waiting: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold `out` for this process while the block runs: another process asking for it is refused in one line
    naming this one (or, with `wait`, waits and is told so through `waiting`). The system releases the lock when
    a process ends, however it ends, so a killed sweep leaves no stale lock behind.

    One machine only: processes on two machines that share a disk do not see each other's locks. The lock file
    holds nothing to clear by hand (the refusal names the pid, not the file: deleting the file while its holder
    runs would let a second writer in). The thread that holds `out` may ask for it again (the command line holds
    a report's folder while the models load, then writes); another thread waits or is refused as another process
    would be.
    """
    target, shown = where(out), shown or str(out)
    mine = (threading.get_ident(), target)
    if mine in _HELD:
        _HELD[mine] += 1
        try:
            yield target
        finally:
            _HELD[mine] -= 1
        return
    path = _lock_file(target)
    while True:
        handle = open(path, "a+")  # noqa: SIM115  (held open, and so locked, until the caller's block ends)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                handle.close()
                raise
            holder = _holder(handle)
            if not wait:
                handle.close()
                raise TablesError(f"{shown}: another headscan process (pid {holder}) is writing there; wait for it "
                                  f"to finish, or choose another --out") from None
            if waiting is not None:
                waiting(f"{shown}: waiting for headscan process {holder}, which is writing there")
            fcntl.flock(handle, fcntl.LOCK_EX)
        if os.path.exists(path) and os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
            break  # still the lock file: the holder before us did not remove it while we waited
        handle.close()
    _HELD[mine] = 1
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield target
    finally:
        del _HELD[mine]
        with contextlib.suppress(OSError):
            os.unlink(path)
        handle.close()


def _holder(handle) -> str:
    """The pid the holder of `handle`'s lock wrote in it, waiting a moment for one that has just taken it."""
    for _ in range(20):
        handle.seek(0)
        holder = handle.read().strip()
        if holder:
            return holder
        time.sleep(0.01)  # between its flock and its write of the pid
    return "unknown"


def holding_out(function):
    """Run `function` holding the `lock` of its ``out`` argument (when one is given)."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        out = signature.bind(*args, **kwargs).arguments.get("out")
        with lock(out) if out is not None else contextlib.nullcontext():
            return function(*args, **kwargs)

    return wrapper
