#!/usr/bin/env python
"""Peak memory of a sweep over a corpus and over ten times that corpus: reading files as a stream keeps them equal.

Writes into a temporary folder the corpus (1x, by default the UD-EWT dev treebank) and a file holding its
sentences `--times` times over (10x: the .conllu repeated, its ``# newdoc id`` and ``# sent_id`` values made
unique per copy; a .txt or .jsonl is repeated as it is). Then runs each measurement in a fresh Python process
and takes that process's peak resident memory (max RSS, from ``os.wait4``):

  import   importing headscan.corpus and headscan.scan, nothing read: the floor under the rows below
  read     ``headscan.corpus.read_corpus`` on the file
  sweep    ``headscan.scan.sweep`` of one model (minilm) on the CPU, 20 bootstrap replicates, no output folder

and prints them side by side with the ratio 10x / 1x. The goal for the sweep: 1.10 or lower.

    python benchmarks/memory.py
    python benchmarks/memory.py --corpus path/to/en_ewt-ud-dev.conllu --times 10 --model minilm
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"
_ID = re.compile(r"^(#\s*newdoc\s+id\s*=|#\s*sent_id\s*=)(.*)$")


def repeat(source: Path, out: Path, times: int) -> None:
    """`source` written `times` times into `out`, one copy after another; CoNLL-U ids get a copy suffix."""
    with out.open("w", encoding="utf-8") as stream:
        for copy in range(times):
            with source.open(encoding="utf-8") as lines:
                for line in lines:
                    if source.suffix == ".conllu" and (match := _ID.match(line.rstrip("\n"))):
                        line = f"{match[1]}{match[2]}-copy{copy}\n"
                    stream.write(line)
            stream.write("\n")  # ends the last sentence (or paragraph) of each copy


def child(what: str, path: str, model: str) -> dict:
    """One measurement, in this (fresh) process."""
    import headscan.scan  # noqa: F401  (the import row's floor: torch, transformers' lazy modules, headscan)
    from headscan.corpus import read_corpus

    start = time.perf_counter()
    if what == "import":
        return {"seconds": 0.0}
    if what == "read":
        corpus = read_corpus(path)
        return {"seconds": time.perf_counter() - start, "segments": len(corpus.segments)}
    tables = headscan.scan.sweep(model, path, None, device="cpu", bootstrap=20)
    (described,) = tables.provenance.models
    return {"seconds": time.perf_counter() - start, "segments": described.n_segments, "tokens": described.n_tokens}


def measure(what: str, path: Path | None, model: str) -> tuple[float, dict]:
    """Peak RSS in MiB of a fresh process that runs `child(what, path, model)`, and what it reported."""
    command = [sys.executable, __file__, "--child", what, str(path or ""), "--model", model]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # already reaped: keep Popen from waiting again
    if process.returncode:
        raise SystemExit(f"{what} {path}: the measuring process failed with exit code {process.returncode}")
    kib = usage.ru_maxrss if sys.platform != "darwin" else usage.ru_maxrss / 1024  # macOS counts bytes
    return kib / 1024, json.loads(output.decode().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=EWT, help="the 1x corpus file (default: UD-EWT dev)")
    parser.add_argument("--times", type=int, default=10, help="copies of the corpus in the large file (default 10)")
    parser.add_argument("--model", default="minilm", help="the model to sweep (default minilm)")
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.model)), flush=True)
        return
    if not args.corpus.is_file():
        raise SystemExit(f"{args.corpus}: no such corpus file; pass --corpus path/to/en_ewt-ud-dev.conllu")
    with tempfile.TemporaryDirectory() as folder:
        small = Path(folder) / f"1x{args.corpus.suffix}"
        large = Path(folder) / f"{args.times}x{args.corpus.suffix}"
        repeat(args.corpus, small, 1)
        repeat(args.corpus, large, args.times)
        floor, _ = measure("import", None, args.model)
        print(f"{args.corpus.name}: 1x {small.stat().st_size / 2**20:.1f} MiB, {args.times}x "
              f"{large.stat().st_size / 2**20:.1f} MiB; model {args.model}; peak RSS of a fresh process that only "
              f"imports headscan: {floor:.0f} MiB\n")
        print(f"{'peak RSS (MiB)':<26}{'1x':>10}{f'{args.times}x':>10}{'ratio':>8}   segments         seconds")
        for what, label in (("read", "read_corpus"), ("sweep", f"sweep {args.model}, bootstrap 20")):
            (one, info_one), (many, info_many) = measure(what, small, args.model), measure(what, large, args.model)
            print(f"{label:<26}{one:>10.0f}{many:>10.0f}{many / one:>8.3f}   "
                  f"{info_one['segments']:>7,} {info_many['segments']:>8,}  {info_one['seconds']:>6.1f} "
                  f"{info_many['seconds']:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
