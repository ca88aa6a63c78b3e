#!/usr/bin/env python
"""What a control model costs: one sweep with ``--control``, each control's sweep time against its model's.

For each model (default: minilm and smollm2), one sweep of the first `--limit` sentences of the UD-EWT dev
treebank (``../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu``, or the folder or file in ``HEADSCAN_EWT``)
on the CPU with the controls asked for (default: random-init), in one process. The sweep times come from each
model's provenance (``seconds``: the window loop, without loading), so the ratio compares a control with its
own model in the same run; the wall time includes loading every model. Then it prints

    model | seconds | control | seconds | ratio | wall seconds of the whole sweep

and checks that the random-init control's tables differ from the trained model's.

    python benchmarks/controls.py
    python benchmarks/controls.py --model minilm --limit 100 --control random-init --control shuffled-words
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", help="model spec (repeatable; default minilm and smollm2)")
    parser.add_argument("--control", action="append", help="random-init and/or shuffled-words (default random-init)")
    parser.add_argument("--limit", type=int, default=100, help="EWT dev sentences (default 100)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    folder = Path(os.environ.get("HEADSCAN_EWT", EWT.parent))
    corpus = folder if folder.is_file() else folder / "en_ewt-ud-dev.conllu"

    import headscan

    controls = tuple(args.control or ["random-init"])
    print("| model | seconds | control | seconds | ratio | wall seconds, loading included |")
    print("|---|---:|---|---:|---:|---:|")
    for spec in args.model or ["minilm", "smollm2"]:
        started = time.perf_counter()
        tables = headscan.sweep(spec, str(corpus), limit=args.limit, device=args.device, control=controls)
        wall = time.perf_counter() - started
        trained = tables.provenance.model(spec)
        heads = tables.heads.set_index(["model", "layer", "head", "metric"])["value"]
        for model in tables.provenance.models:
            if model.control is None:
                continue
            differs = not heads.loc[model.name].equals(heads.loc[spec])
            print(f"| {spec} | {trained.seconds:.1f} | {model.control}{'' if differs else ' (EQUAL TABLES)'} | "
                  f"{model.seconds:.1f} | {model.seconds / trained.seconds:.2f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
