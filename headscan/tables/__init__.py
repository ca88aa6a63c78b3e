"""The tables a sweep writes: their registry and columns, reading and writing them, and their typed provenance.

Torch-free: ``import headscan`` and ``headscan.load`` need nothing heavier than pandas and pyarrow.
"""

from .io import (HEAD_COLUMNS, TABLES, VALUE_COLUMNS, SweepTables, Table, check_out, combine, concat, head_label, load,
                 register_table, thin_support, top_heads, write)
from .provenance import CorpusProvenance, ModelProvenance, RunProvenance

__all__ = ["HEAD_COLUMNS", "VALUE_COLUMNS", "Table", "TABLES", "register_table", "SweepTables", "load", "write",
           "check_out", "head_label", "combine", "concat", "top_heads", "thin_support", "RunProvenance", "ModelProvenance",
           "CorpusProvenance"]
