"""Moved to `headscan.tables.provenance`; kept so that ``from headscan.provenance import RunProvenance`` works."""

from .tables.provenance import SCHEMA_VERSION, CorpusProvenance, ModelProvenance, RunProvenance  # noqa: F401
