#!/usr/bin/env python
"""This checkout's sweep against a previous revision's, side by side: `sweep_vs_hf.py` of each, one machine, one run.

Each revision given with ``--rev`` is exported (``git archive``) into a temporary folder and imported from there
(its own ``PYTHONPATH``; the same Python and packages as this checkout); then, for each round, this checkout's
``benchmarks/sweep_vs_hf.py`` and each revision's own copy of it run one after another, in a fresh process each,
the order reversed every other round, with the same options. Both ratios (sweep / Hugging Face's headless
forward, unscored / the same) are read from each run's output and printed side by side with their quotients:
a slow spell of the machine slows both revisions of a round alike, and each ratio is already over a forward
timed in the same process, so the quotient is what to compare across machines and days, not the seconds.

An option that a revision's script does not know (``--composition`` before composition existed) is left out of
that revision's runs, and said so. Everything after ``--`` goes to `sweep_vs_hf.py`; a ``--corpus`` path is
made absolute first.

    python benchmarks/previous.py --rev 7719a4e -- --corpus ../shared/data/ud-english-ewt/en_ewt-ud-test.conllu
    python benchmarks/previous.py --rev 7719a4e --rev e6dbf21 --rounds 2 -- --corpus FILE --plain --cpu-time
    make benchmark-previous REV=7719a4e ARGS="--plain"
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path("benchmarks") / "sweep_vs_hf.py"
RATIOS = {"sweep": r"ratio sweep / hf_attn = ([0-9.]+)", "unscored": r"ratio unscored / hf_attn = ([0-9.]+)",
          "sweep_s": r"^\s+sweep\s+median\s+([0-9.]+) s", "hf_s": r"^\s+hf_attn\s+median\s+([0-9.]+) s"}


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def export(rev: str, into: Path) -> Path:
    """The tree of `rev` written into `into`/<short hash> (no git metadata: nothing is left in the repository)."""
    try:
        commit = _git("rev-parse", "--verify", "--short", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"benchmark-previous: {rev!r} is not a revision of {ROOT}; give a commit, tag or branch (REV=7719a4e)")
    folder = into / commit
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def known_options(root: Path, env: dict) -> str:
    """The --help text of `root`'s sweep_vs_hf.py: which options that revision's script takes."""
    done = subprocess.run([sys.executable, str(root / SCRIPT), "--help"], cwd=root, env=env, capture_output=True,
                          text=True)
    if done.returncode:
        sys.exit(f"benchmark-previous: {root / SCRIPT} does not start with this Python:\n{done.stderr[-2000:]}")
    return done.stdout


def supported(args: list[str], help_text: str) -> tuple[list[str], list[str]]:
    """`args` less the options `help_text` does not list (each with its value): (kept, left out)."""
    kept, dropped, i = [], [], 0
    while i < len(args):
        takes_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        item = args[i:i + 2] if args[i].startswith("--") and takes_value else args[i:i + 1]
        flag = item[0].split("=")[0]
        (kept if not flag.startswith("--") or re.search(rf"{re.escape(flag)}\b", help_text) else dropped).extend(item)
        i += len(item)
    return kept, dropped


def absolute_corpus(args: list[str]) -> list[str]:
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg == "--corpus" and Path(out[i + 1]).exists():
            out[i + 1] = str(Path(out[i + 1]).resolve())
    return out


def run_once(root: Path, args: list[str], env: dict) -> dict[str, float]:
    done = subprocess.run([sys.executable, str(root / SCRIPT), *args], cwd=root, env=env, capture_output=True,
                          text=True)
    if done.returncode:
        sys.exit(f"benchmark-previous: {root / SCRIPT} failed:\n{done.stderr[-3000:]}")
    print(done.stdout.rstrip(), flush=True)
    found = {name: re.search(pattern, done.stdout, re.MULTILINE) for name, pattern in RATIOS.items()}
    return {name: float(match.group(1)) for name, match in found.items() if match}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", action="append", required=True, help="a previous revision (repeatable)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every revision, order reversed each round")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then sweep_vs_hf.py's options")
    options = parser.parse_args()
    passed = absolute_corpus(options.args[1:] if options.args[:1] == ["--"] else options.args)
    here = _git("describe", "--always", "--dirty")
    base_env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="headscan-previous-") as tmp:
        checkouts = {f"{here} (this checkout)": ROOT} | {rev: export(rev, Path(tmp)) for rev in options.rev}
        plans = {}
        for name, root in checkouts.items():
            env = base_env | {"PYTHONPATH": str(root)}
            kept, dropped = supported(passed, known_options(root, env))
            if dropped:
                print(f"# {name}: its sweep_vs_hf.py has no {' '.join(dropped)}: run without it")
            plans[name] = (root, kept, env)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in plans}
        for round_ in range(options.rounds):
            order = list(plans) if round_ % 2 == 0 else list(reversed(plans))
            for name in order:
                root, kept, env = plans[name]
                print(f"\n## round {round_ + 1}: {name}: sweep_vs_hf.py {' '.join(kept)}", flush=True)
                results[name].append(run_once(root, kept, env))
    median = {name: {key: statistics.median(r[key] for r in runs) for key in RATIOS if all(key in r for r in runs)}
              for name, runs in results.items()}
    first = next(iter(median))
    print(f"\nside by side ({options.rounds} round(s), medians over rounds; the quotient is this checkout's over each "
          f"revision's):")
    print(f"  {'revision':32} {'sweep/HF':>9} {'unscored/HF':>12} {'sweep s':>8} {'HF s':>7}")
    for name, values in median.items():
        print(f"  {name:32} {values.get('sweep', float('nan')):9.2f} {values.get('unscored', float('nan')):12.2f} "
              f"{values.get('sweep_s', float('nan')):8.3f} {values.get('hf_s', float('nan')):7.3f}")
    for name in list(median)[1:]:
        print(f"  quotient {first} / {name}: sweep {median[first]['sweep'] / median[name]['sweep']:.2f}, "
              f"unscored {median[first]['unscored'] / median[name]['unscored']:.2f}")


if __name__ == "__main__":
    main()
