"""What the experiment scripts share: where EWT is, which models are on this machine, where outputs go.

Each experiment is one script that imports headscan's public API; this module holds only the few lines every
one of them would otherwise repeat. It scores nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ("minilm", "smollm2")


def ewt_dev() -> str:
    """The UD English EWT dev file: ``HEADSCAN_EWT`` (the folder or a file in it), else ../shared beside the repo;
    "builtin" when neither is there (then a note says so)."""
    folder = Path(os.environ.get("HEADSCAN_EWT", ROOT.parent / "shared" / "data" / "ud-english-ewt")).expanduser()
    path = (folder.parent if folder.is_file() else folder) / "en_ewt-ud-dev.conllu"
    if path.is_file():
        return str(path)
    print(f"note: no EWT treebank at {path} (set HEADSCAN_EWT); using the builtin sentences instead")
    return "builtin"


def weights_present(spec: str) -> bool:
    """Whether `spec` loads without a network: an embedded alias that is installed, a local folder, or a
    Hugging Face id already in the local cache."""
    from huggingface_hub import try_to_load_from_cache

    from headscan.models import alias_status

    if spec in EMBEDDED:
        return alias_status()[spec] is not None
    if Path(spec).expanduser().exists():
        return True
    names = {spec, {"gpt2": "openai-community/gpt2", "bert-base-uncased": "google-bert/bert-base-uncased"}.get(spec, spec)}
    return any(isinstance(try_to_load_from_cache(name, "config.json"), str) for name in names)


def corpus_name(corpus) -> str:
    """The corpus as written into committed outputs: a file's name, not this machine's path to it."""
    return Path(str(corpus)).name if Path(str(corpus)).is_file() else str(corpus)


def out_folder(name: str, out: str | None) -> Path:
    """``reports/experiments/<name>`` (or `out`), created."""
    folder = Path(out) if out else ROOT / "reports" / "experiments" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def markdown_table(frame, floats: str = "{:.3f}") -> str:
    """A DataFrame as a Markdown table (no tabulate dependency)."""
    def cell(value):
        if value is None or (isinstance(value, float) and value != value):
            return ""
        return floats.format(value) if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"
