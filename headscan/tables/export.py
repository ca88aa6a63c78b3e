"""A run as a Hugging Face dataset: its tables and provenance in a folder that ``datasets.load_dataset`` reads, one
config per table, with a dataset card, ready for ``huggingface-cli upload`` (or ``HfApi.upload_folder``).

    headscan export out/ewt --out out/ewt-dataset
    datasets.load_dataset("out/ewt-dataset", "heads", split="train")   # or "USER/NAME" once uploaded

The folder holds ``data/TABLE.parquet`` for every table of the run, exactly as headscan wrote it (its provenance
stamp included, so `headscan.load` still checks a file against run.json), ``run.json``, and ``README.md``: YAML
front matter that declares each table as a config (``data_files: data/TABLE.parquet``), the ``headscan``
library tag and the corpus licence where the corpus is the EWT treebank, then a card saying what was swept, with
which settings and findings rule, and how to read each table. Nothing is uploaded from here: machines that sweep
often reach no hub.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import TablesError
from . import folders
from .io import SweepTables, load
from .schema import TABLES

__all__ = ["export_dataset", "DATASET_FILES"]

DATASET_FILES = {"README.md", "run.json", "data"}  # all that export_dataset puts in a folder


def export_dataset(run: str | os.PathLike | SweepTables, out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write the run (a sweep or retrieval output folder, or its tables as loaded) into `out` as a dataset folder;
    replaces an earlier export there only with `overwrite`, and never a folder holding anything else.

    Returns the folder's absolute path. This is ``headscan.export`` (the ``headscan export`` command).

    Example: ``headscan.export("out/ewt", "out/ewt-dataset")``, then ``datasets.load_dataset("out/ewt-dataset",
    "heads")``
    """
    tables = run if isinstance(run, SweepTables) else load(run)
    if tables.path is None:
        raise TablesError("export a run that was written to a folder (headscan sweep --out), so its files are exported "
                          "as they are")
    source = Path(tables.path)
    target = folders.where(out)
    if target.resolve() == source.resolve():
        raise TablesError(f"--out {out}: is the run itself; choose another folder")
    with folders.lock(target, str(out)):
        if target.is_dir() and any(target.iterdir()):
            folders.check_not_here(target, str(out))
            folders.check_only_ours(target, str(out), DATASET_FILES, "a headscan dataset export")
            if not overwrite:
                raise TablesError(f"--out {out}: already holds a dataset export; pass --overwrite to replace it")
        folders.check_writable(target, str(out))
        names = [name for name in TABLES if name in tables.frames]

        def fill(folder: Path) -> None:
            (folder / "data").mkdir()
            for name in names:
                shutil.copyfile(source / TABLES[name].file, folder / "data" / TABLES[name].file)
            shutil.copyfile(source / "run.json", folder / "run.json")
            (folder / "README.md").write_text(dataset_card(tables, names))

        return folders.publish(target, fill, last="README.md")


def dataset_card(tables: SweepTables, names: list[str]) -> str:
    """The README.md of an export: YAML front matter (configs, tags) and what the run holds."""
    provenance = tables.provenance
    corpus = provenance.corpus
    models = [m.name for m in provenance.models]
    ewt = "ewt" in str(corpus.source or "").lower()
    front = ["---", "library_name: headscan", "tags:", "- interpretability", "- attention-heads", "- headscan"]
    if ewt:
        front += ["license: cc-by-sa-4.0"]  # the EWT treebank's: its text is in examples.parquet and the trials
    front += ["configs:"]
    for index, name in enumerate(names):
        front += [f"- config_name: {name}", *(["  default: true"] if index == 0 else []),
                  f"  data_files: data/{TABLES[name].file}"]
    front += ["---", ""]
    findings = provenance.extra.get("findings") or {}
    rule = (f"Rows with `finding` true passed {findings['rule']} at q = {findings['q']:g} over one family per "
            "model (heads, value and syntax tables), each tested against its null (`null_kind`, `null_low`, "
            "`null_high`)." if findings.get("rule") else "This run records no findings rule.")
    body = [
        f"# headscan run: {', '.join(models)}", "",
        f"Attention-head scores from headscan {provenance.headscan_version or ''}"
        f" (git {str(provenance.git_revision)[:12]}): every head of every layer of {', '.join(f'`{m}`' for m in models)}"
        f" over `{corpus.source}` ({corpus.kind}). Heads are labelled `L{{layer}}H{{head}}`, 0-indexed.", "",
        f"Made by `{provenance.command}`.", "",
        rule, "",
        "```python",
        "import datasets",
        f'heads = datasets.load_dataset("PATH_OR_REPO", "{names[0]}", split="train").to_pandas()',
        "```", "",
        "| config | one row per |", "|---|---|",
        *[f"| `{name}` | {TABLES[name].description.removeprefix('one row per ').split(':')[0]} |" for name in names],
        "",
        "`run.json` holds the provenance: settings, library versions, each model's source and what the sweep fed it.",
    ]
    if ewt:
        body += ["", "The corpus is the Universal Dependencies English EWT treebank (CC BY-SA 4.0); text from it "
                     "appears in the tables that quote units or trials."]
    return "\n".join(front + body) + "\n"
