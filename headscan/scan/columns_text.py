"""How two fingerprints' score columns differ, said in one line for a refusal."""

from __future__ import annotations

__all__ = ["columns_text"]


def columns_text(a: list | None, b: list | None) -> str:
    """How two fingerprints' score columns differ, in short: their numbers, and one column of each that the other
    lacks (each column as the fingerprint holds it: metric, axis position and table where not the metric's own).

    >>> columns_text([["syntax", ["all", "dependent_to_head"]], ["syntax", ["all", "dependent_to_head_visible"]]],
    ...              [["syntax", ["all", "dependent_to_head"]]])
    '2 != 1 score columns (1 only on the left, such as syntax all dependent_to_head_visible; metrics or their axes differ)'
    """
    a, b = list(a or []), list(b or [])

    def name(column) -> str:
        if not (isinstance(column, list) and len(column) >= 2 and isinstance(column[1], list)):
            return str(column)
        return " ".join(str(part) for part in [column[0], *column[1], *column[2:]])

    left, right = [name(c) for c in a], [name(c) for c in b]
    said = []
    for own, other, side in ((left, set(right), "left"), (right, set(left), "right")):
        only = [n for n in own if n not in other]
        if only:
            said.append(f"{len(only)} only on the {side}, such as {only[0]}")
    return f"{len(a)} != {len(b)} score columns ({'; '.join([*said, 'metrics or their axes differ'])})"
