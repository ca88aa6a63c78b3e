"""How long the docs' sweeps take, measured, with the machine and its load: the times README.md and docs/ quote.

Each sweep is the docs' own command (README's EWT dev sweep of minilm and smollm2; docs/custom-metrics.md's sweep
with its metric module and 3 random-init controls), run as a user runs it (a fresh ``headscan sweep`` process,
loading included) on a sample of EWT dev: every k-th sentence, ``--sample`` of them, so that their lengths are the
file's; its time is scaled to the 2,001 sentences of the whole file, beside the time of the same command on the
whole file where one is measured (``--whole``). Printed with what the time depends on: the CPU, its cores, torch's threads and the load average
before and after (other jobs share the machine).

Also printed: the seconds each committed run records for its models (``reports/runs/*/run.json``, the sweep
itself, loading excluded), which say how fast the machine that made them was.

    HF_HUB_OFFLINE=1 python benchmarks/doc_times.py [--sample 64] [--only readme|custom-metrics] [--whole]

The sweeping itself (the seconds the run records per model) is close to linear in the sentences; loading and
writing are not, and are counted once: the estimate for the whole file is the sample's wall time less its
sweeping, plus its sweeping scaled by 2,001 / --sample. It holds for the same machine at the same load (the
sample's and the file's mean sentence lengths are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EWT = ROOT.parent / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"
SWEEPS = {
    "readme": ["sweep", "--corpus", str(EWT)],
    "custom-metrics": ["sweep", "--metric-module", str(ROOT / "examples" / "patterns.py"), "--corpus", str(EWT),
                       "--control", "random-init", "--control-seeds", "3"],
}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = re.findall(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
        cpu = names[0] if names else cpu
    except OSError:
        pass
    threads = os.environ.get("OMP_NUM_THREADS", "torch's default")
    return f"{cpu}, {os.cpu_count()} cores, OMP_NUM_THREADS={threads}"


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def sentences(path: Path) -> list[str]:
    """The sentence blocks of a CoNLL-U file, each with its comment lines and its blank line."""
    blocks, lines = [], []
    for line in path.open():
        lines.append(line)
        if not line.strip():
            if any(row[0].isdigit() for row in lines if row.strip()):
                blocks.append("".join(lines))
            lines = []
    return blocks + (["".join(lines)] if lines else [])


def words(block: str) -> int:
    return sum(1 for row in block.splitlines() if row[:1].isdigit() and "-" not in row.split("\t", 1)[0]
               and "." not in row.split("\t", 1)[0])


def timed(arguments: list[str], corpus: Path) -> tuple[float, float]:
    """The wall time of the sweep over `corpus`, and the seconds of sweeping its run.json records (all models)."""
    arguments = [str(corpus) if a == str(EWT) else a for a in arguments]
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "headscan", *arguments, "--out", f"{folder}/out", "-q"]
        start = time.perf_counter()
        subprocess.run(command, check=True, env=os.environ | {"HF_HUB_OFFLINE": "1"}, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        run = json.loads(Path(folder, "out", "run.json").read_text())
        return wall, sum(model["seconds"] for model in run["models"])


def committed() -> None:
    for run in sorted(ROOT.glob("reports/runs/*/run.json")):
        data = json.loads(run.read_text())
        swept = [(m["name"], m.get("seconds")) for m in data.get("models", []) if m.get("seconds") is not None]
        if swept:
            print(f"  {run.parent.name}: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in swept))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=64, help="sentences of EWT dev swept, every k-th (default 64)")
    parser.add_argument("--only", choices=list(SWEEPS), default=None)
    parser.add_argument("--whole", action="store_true", help="also sweep the whole file (minutes to hours)")
    args = parser.parse_args()
    if not EWT.is_file():
        sys.exit(f"no EWT treebank at {EWT}")
    blocks = sentences(EWT)
    sample = blocks[:: max(1, len(blocks) // args.sample)][: args.sample]
    print(f"machine: {machine()}; load average (1/5/15 min) at the start {load()}")
    print(f"EWT dev: {len(blocks)} sentences of {sum(map(words, blocks)) / len(blocks):.1f} words on average; the "
          f"sample: {len(sample)} of {sum(map(words, sample)) / len(sample):.1f}")
    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / "sample.conllu"
        corpus.write_text("".join(sample))
        for name in [args.only] if args.only else SWEEPS:
            wall, swept = timed(SWEEPS[name], corpus)
            whole = wall - swept + swept * len(blocks) / len(sample)
            print(f"{name}: {wall:.0f} s for {len(sample)} sentences ({swept:.0f} s of it sweeping, the rest loading "
                  f"and writing): about {whole / 60:.0f} minutes for the {len(blocks)} (load average after: {load()})")
            if args.whole:
                wall, _ = timed(SWEEPS[name], EWT)
                print(f"{name}, whole file: {wall / 60:.1f} minutes (load average after: {load()})")
    print("seconds of sweeping each committed run records (loading excluded):")
    committed()


if __name__ == "__main__":
    main()
