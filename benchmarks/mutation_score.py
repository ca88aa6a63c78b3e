"""The mutation score of the modules `[tool.mutmut] only_mutate` names: the share of mutants the fast tests kill.

Reads what ``mutmut run`` left in ``mutants/`` (each mutated module's ``.meta`` file: an exit code per mutant)
and ``benchmarks/mutation_equivalent.txt`` (mutants that no test can kill because they compute the same thing,
one a line with its reason), and prints, per module and in all, the mutants killed over the mutants that are not
equivalent. `make mutation` runs both; ``--survivors`` lists what survived, for writing tests or the list.

Running every mutant takes many hours on 2 cores, so ``--pick N`` prints a seeded random sample of N mutant
names (generating the mutants first if ``mutants/`` has none), for ``mutmut run NAME ...``; the score is then
an estimate, printed with its 95% Wilson interval over the mutants that were run (`make mutation SAMPLE=N`).

    python benchmarks/mutation_score.py [--survivors] [--mutants mutants]
    python benchmarks/mutation_score.py --pick 300 [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = ROOT / "benchmarks" / "mutation_equivalent.txt"
# mutmut's exit codes (mutmut.stats.status_by_exit_code): 1 and 3 a test failed, 0 every test passed,
# 33 and 5 no selected test calls the function, 34 skipped, 36 and the SIGXCPU codes a timeout.
KILLED, SURVIVED, NO_TESTS = {1, 3}, {0}, {5, 33}
TIMEOUT = {36, 24, -24, 152, 255}


def equivalent_mutants(path: Path = EQUIVALENT) -> dict[str, str]:
    """{mutant name: reason} from the committed list; '#' starts a comment line, each entry is
    ``NAME  reason``."""
    found = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1) if path.is_file() else ():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            raise SystemExit(f"{path}:{number}: {name} has no reason; write why no test can kill it")
        found[name] = reason.strip()
    return found


def statuses(mutants: Path) -> dict[str, dict[str, int | None]]:
    """{module file: {mutant name: exit code}} from mutmut's .meta files."""
    found = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        module = str(meta.relative_to(mutants)).removesuffix(".meta")
        found[module] = json.loads(meta.read_text())["exit_code_by_key"]
    return found


def generate(mutants: Path) -> None:
    """Write the mutants as `mutmut run` would before running any (mutmut has no command for this alone)."""
    from mutmut.__main__ import copy_also_copy_files, copy_src_dir, create_mutants, set_mutant_under_test
    from mutmut.utils.file_utils import setup_source_paths

    set_mutant_under_test("mutant_generation")
    mutants.mkdir(exist_ok=True)
    # mutmut prints what it copies to stdout, where `--pick` writes the names that `mutmut run` is given
    with contextlib.redirect_stdout(sys.stderr):
        copy_src_dir()
        copy_also_copy_files()
        setup_source_paths()
        create_mutants(os.cpu_count() or 2)


def pick(mutants: Path, size: int, seed: int) -> list[str]:
    """A seeded sample of `size` mutant names, drawn from every mutated module alike."""
    by_module = statuses(mutants)
    if not by_module:
        generate(mutants)
        by_module = statuses(mutants)
    names = sorted(name for codes in by_module.values() for name in codes)
    return sorted(random.Random(seed).sample(names, min(size, len(names))))


def wilson(killed: int, scored: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a share killed/scored (a sample's estimate of the whole score)."""
    share, n = killed / scored, scored
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=ROOT / "mutants", help="mutmut's folder (default: mutants)")
    parser.add_argument("--survivors", action="store_true", help="list the mutants that survived")
    parser.add_argument("--pick", type=int, metavar="N", help="print a seeded sample of N mutant names and stop")
    parser.add_argument("--sample", type=int, metavar="N", help="score only the N mutants `--pick N` draws")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    args = parser.parse_args(argv)
    if args.pick:
        print(" ".join(pick(args.mutants, args.pick, args.seed)))
        return 0
    by_module = statuses(args.mutants)
    if not by_module:
        print(f"no mutmut results in {args.mutants}: run `make mutation` (or `mutmut run`) first", file=sys.stderr)
        return 2
    every_name = {name for codes in by_module.values() for name in codes}
    everything = len(every_name)
    if args.sample:  # score only the sample `--pick` drew: results of earlier runs would bias it
        sample = set(pick(args.mutants, args.sample, args.seed))
        by_module = {module: {name: code for name, code in codes.items() if name in sample}
                     for module, codes in by_module.items()}
    equivalent = equivalent_mutants()
    total = Counter()
    survivors = []
    print(f"{'module':42} {'mutants':>8} {'killed':>7} {'timeout':>8} {'survived':>9} {'equivalent':>11} {'untested':>9} "
          f"{'score':>7}")
    for module, codes in by_module.items():
        count = Counter()
        for name, code in codes.items():
            if name in equivalent:
                count["equivalent"] += 1
            elif code in KILLED:
                count["killed"] += 1
            elif code in TIMEOUT:
                # not scored: mutmut's limit is wall-clock time, so on a busy machine a slow worker times out
                # like a mutant that loops forever; rerun them (mutmut run NAME) where the machine is quiet
                count["timeout"] += 1
            elif code in SURVIVED:
                count["survived"] += 1
                survivors.append(name)
            elif code in NO_TESTS:
                count["untested"] += 1
                survivors.append(name)
            else:
                count["other"] += 1  # not checked yet, skipped, suspicious
        count["mutants"] = len(codes)
        total.update(count)
        print(f"{module:42} {count['mutants']:8} {count['killed']:7} {count['timeout']:8} {count['survived']:9} "
              f"{count['equivalent']:11} {count['untested']:9} {_score(count):>7}")
    print(f"{'all':42} {total['mutants']:8} {total['killed']:7} {total['timeout']:8} {total['survived']:9} "
          f"{total['equivalent']:11} {total['untested']:9} {_score(total):>7}")
    if total["timeout"]:
        print(f"{total['timeout']} mutants timed out: not in the score (rerun them on a quiet machine)")
    if total["other"]:
        print(f"{total['other']} mutants not checked (run interrupted, skipped or suspicious): not in the score")
    stale = sorted(set(equivalent) - every_name)
    if stale:
        print(f"{len(stale)} listed equivalent mutants no longer exist (the code moved): {', '.join(stale[:5])}")
    scored = total["killed"] + total["survived"] + total["untested"]
    print(f"mutation score: {_score(total)} of the non-equivalent mutants killed ({total['killed']} of {scored})")
    if scored and args.sample:
        low, high = wilson(total["killed"], scored)
        print(f"  an estimate of the score over all {everything} mutants, from a seeded sample of {total['mutants']} "
              f"({scored} scored): 95% interval {low:.1%} to {high:.1%}"
              + (f"; {total['other']} of the sample not run yet, and mutmut runs them module by module, so this is "
                 "not yet a fair estimate" if total["other"] else ""))
    if args.survivors:
        print("\n".join(survivors))
    return 0


def _score(count: Counter) -> str:
    scored = count["killed"] + count["survived"] + count["untested"]
    return f"{count['killed'] / scored:.1%}" if scored else "-"


if __name__ == "__main__":
    sys.exit(main())
