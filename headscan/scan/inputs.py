"""A run's inputs checked without torch: what a user can get wrong, refused in about the time of ``--help``.

`check_sweep` checks a sweep's models (named once, each one findable, each model --importance-model names among
them), its output folder and partial-state folder, its shard, how often it saves and its corpus
(`headscan.corpus.check_source`: a missing or empty file, a bad spec); `check_retrieval` the same of a retrieval run, and its needles file (read whole: it is small). The
command line calls them before it imports the sweep, which imports torch; `headscan.sweep` calls `check_sweep`
too, so that both refuse alike. Settings themselves are checked by their config (`headscan.config`).

This module imports no torch, transformers or model code beyond `headscan.models.specs` (nor do
`headscan.scan.resume` and `headscan.scan.state`, whose checks it uses).
"""

from __future__ import annotations

from pathlib import Path

from ..config import SweepConfig
from ..corpus import Corpus, check_source
from ..corpus.needles import read_needles
from ..errors import ConfigError
from ..tables import check_out
from .resume import check_models, partial_folder
from .state import Shard

__all__ = ["check_sweep", "check_retrieval"]


def check_sweep(models, corpus, out, config: SweepConfig, *, overwrite: bool, save_every: float,
                shard: Shard | str | None = None) -> tuple[list[str], Shard | None]:
    """Refuse, before anything is loaded, a sweep that would fail on its inputs; return its models as a list and
    its shard parsed. `corpus` is what `headscan.sweep` takes (a file or spec is checked by a look, not read)."""
    shard = Shard.parse(shard) if isinstance(shard, str) else shard
    models = check_models(models)
    unknown = [name for name in config.importance_models if name not in models]
    if unknown:
        raise ConfigError(f"importance_models: {', '.join(map(repr, unknown))} is not a model of this sweep "
                          f"({', '.join(models)}); name a model as --model names it", setting="importance_models")
    if not save_every >= 0:  # NaN too: it would never save, silently
        raise ConfigError(f"save_every must be a number of seconds >= 0 (0 saves at every window's end, inf never), "
                          f"got {save_every}", setting="save_every")
    if out is not None:
        check_out(out, overwrite=overwrite)
        partial_folder(out)
    if isinstance(corpus, (Corpus, list, tuple)):
        if config.document_field is not None:
            raise ConfigError("document_field names a field of a .jsonl file's lines; leave it out for a list of "
                              "texts or a Corpus (give each Segment its document)", setting="document_field")
    else:
        check_source(corpus, document_field=config.document_field)
    return models, shard


def check_retrieval(models, haystack, out, *, needles: str | Path | None, overwrite: bool) -> list[str]:
    """Refuse, before anything is loaded, a retrieval run that would fail on its inputs; return its models."""
    models = check_models(models, example="--model smollm2")
    if out is not None:
        check_out(out, overwrite=overwrite)
        partial_folder(out)
    check_source(haystack)
    if needles is not None:
        read_needles(needles)  # a small file, read whole: every line checked
    return models
