"""The tables a sweep writes: their registry and columns, reading and writing them, and their typed provenance.

Torch-free: ``import headscan`` and ``headscan.load`` need nothing heavier than pandas and pyarrow.
"""

from .export import export_dataset
from .io import RUN_TABLES, SweepTables, check_out, load, merge_tables, side_by_side, thin_rows, write
from .provenance import IMPORTED, CorpusProvenance, ModelProvenance, RunProvenance
from .schema import (
    FINDING_EXTRA,
    HEAD_COLUMNS,
    TABLES,
    VALUE_COLUMNS,
    Table,
    head_columns,
    head_label,
    register_table,
    tables_markdown,
)

__all__ = ["export_dataset", "IMPORTED", "HEAD_COLUMNS", "VALUE_COLUMNS", "FINDING_EXTRA", "Table", "TABLES", "register_table", "tables_markdown", "head_label",
           "head_columns", "RUN_TABLES", "SweepTables", "load", "write", "check_out", "merge_tables", "side_by_side", "thin_rows",
           "RunProvenance", "ModelProvenance", "CorpusProvenance"]
