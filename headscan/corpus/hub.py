"""Corpora from Hugging Face `datasets`: ``hf:NAME[:option=value,...]``, one segment per row.

NAME is a folder written by ``Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``), a folder of data files
that `datasets` reads (parquet, JSON lines, CSV, text), or a dataset on the Hugging Face Hub (``wikitext``,
``allenai/c4``): from the local cache under ``HF_HUB_OFFLINE=1``, downloaded otherwise. Options:
``config`` (the Hub dataset's configuration, e.g. ``wikitext-2-raw-v1``), ``split`` (default ``train``),
``revision`` (a Hub revision) and ``field`` (the column holding the text, default ``text``). A Hub dataset or
a data folder is read as a stream, so ``--limit 1000`` reads 1,000 rows of C4, not C4; the rows read are held
in memory.

The text is the row's ``text`` field (or ``field=...``); rows whose text is empty or blank are skipped, as blank
lines are. With `document_field` (``--document-field``), consecutive rows with the same value form one
document (as in JSONL); without it each row is its own document. The corpus's sha256 is of the texts and documents read, so two
sweeps of the same spec that read different rows (a dataset changed on the Hub) do not merge.

`datasets` comes with TransformerLens, so it is always installed; it is imported only for an ``hf:`` corpus.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..config import hf_offline
from ..errors import CorpusError
from .files import EACH_SEGMENT
from .segment import Segment

PREFIX = "hf:"
OPTIONS = ("config", "split", "revision", "field")


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """NAME and options of ``hf:NAME[:option=value,...]``.

    >>> parse_spec("hf:wikitext:config=wikitext-2-raw-v1,split=test")
    ('wikitext', {'config': 'wikitext-2-raw-v1', 'split': 'test'})
    >>> parse_spec("hf:/data/my corpus")
    ('/data/my corpus', {})
    """
    rest = spec.removeprefix(PREFIX)
    name, _, options_text = rest.partition(":")
    if options_text and "=" not in options_text:  # a ":" inside the name itself (a Windows path): no options
        name, options_text = rest, ""
    options = {}
    for item in filter(None, options_text.split(",")):
        key, _, value = item.partition("=")
        if key not in OPTIONS or not value:
            raise CorpusError(f"corpus {spec!r}: bad option {item!r}; use hf:NAME:config=...,split=...,field=... "
                              f"(options {', '.join(OPTIONS)})")
        options[key] = value
    if not name:
        raise CorpusError(f"corpus {spec!r}: no dataset named; use hf:NAME, a Hub id or a local folder")
    return name, options


def _rows(spec: str, name: str, options: dict[str, str]):
    """An iterable of the split's rows (dicts), streamed where `datasets` can stream."""
    import datasets

    split = options.get("split", "train")
    folder = Path(name).expanduser()
    offline = hf_offline()
    try:
        if (folder / "dataset_info.json").is_file() or (folder / "dataset_dict.json").is_file():
            loaded = datasets.load_from_disk(str(folder))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise CorpusError(f"corpus {spec!r}: no split {split!r} in {folder} (splits: "
                                      f"{', '.join(loaded)}); pass split=...")
                return loaded[split]
            if "split" in options and loaded.split is not None and str(loaded.split) != split:
                raise CorpusError(f"corpus {spec!r}: {folder} holds split {str(loaded.split)!r} only; leave split= "
                                  f"out")
            if "split" in options and loaded.split is None:
                raise CorpusError(f"corpus {spec!r}: {folder} holds one dataset without splits; leave split= out")
            return loaded
        local = folder.is_dir()
        # offline, a Hub dataset can only come from its prepared copy in the cache, which streaming does not read
        return datasets.load_dataset(str(folder) if local else name, options.get("config"), split=split,
                                     revision=options.get("revision"), streaming=local or not offline)
    except CorpusError:
        raise
    except (FileNotFoundError, ConnectionError, OSError) as error:
        where = (f"{folder} cannot be read" if folder.exists() else
                 "not in the local Hugging Face cache and HF_HUB_OFFLINE=1 (download it once with a network, or "
                 "pass a folder written by save_to_disk)" if offline else "not found on the Hugging Face Hub")
        raise CorpusError(f"corpus {spec!r}: {where}: {str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
    except ValueError as error:  # datasets' unknown split or config
        raise CorpusError(f"corpus {spec!r}: {str(error).splitlines()[0]}") from None


def read_hub_corpus(spec: str, *, limit: int | None, text_field: str, document_field: str | None):
    """The segments, sha256, options and documents rule of an ``hf:`` corpus (see the module docstring)."""
    name, options = parse_spec(spec)
    text_field = options.get("field", text_field)
    rows = _rows(spec, name, options)
    segments: list[Segment] = []
    digest = hashlib.sha256()
    document, last_key = -1, object()
    for number, row in enumerate(rows, start=1):
        if limit is not None and len(segments) >= limit:
            break
        if text_field not in row:
            raise CorpusError(f"corpus {spec!r}, row {number}: no field {text_field!r} (fields: "
                              f"{', '.join(map(str, row))}); name the text's column: hf:NAME:field=COLUMN")
        text = row[text_field]
        if not isinstance(text, str):
            raise CorpusError(f"corpus {spec!r}, row {number}: field {text_field!r} holds {type(text).__name__}, "
                              f"not text")
        if document_field is not None:
            if document_field not in row:
                raise CorpusError(f"corpus {spec!r}, row {number}: no field {document_field!r} for documents "
                                  f"(fields: {', '.join(map(str, row))})")
            key = row[document_field]
            if key != last_key:
                document, last_key = document + 1, key
        if not text.strip():
            continue
        if document_field is None:
            document += 1
        segments.append(Segment(text.strip(), number, document=document))
        digest.update(f"{document}\t{text.strip()}\n".encode())
    if not segments:
        raise CorpusError(f"corpus {spec!r}: no row with text in field {text_field!r}")
    documents = (EACH_SEGMENT if document_field is None else
                 f"consecutive rows with the same {document_field!r} value")
    if document_field is not None:  # renumbered from 0 over the rows kept (a document of blank rows is gone)
        renumber = {d: i for i, d in enumerate(dict.fromkeys(s.document for s in segments))}
        segments = [Segment(s.text, s.line, document=renumber[s.document]) for s in segments]
    return tuple(segments), digest.hexdigest(), {"dataset": name, **options}, documents
