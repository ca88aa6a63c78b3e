"""Numbers as a report writes them: shares as percentages, position buckets as the positions they cover.

Torch-free, like `headscan.analysis.syntax`, which writes its sentences with them.
"""

from __future__ import annotations

__all__ = ["pct", "fmt_bucket"]


def fmt_bucket(bucket) -> str:
    """A positions-table bucket as the query positions it covers: bucket b is [b, 2b), bucket 0 position 0 alone.

    >>> [fmt_bucket(b) for b in (0, 1, 2, 64)]
    ['0', '1', '2\u20133', '64\u2013127']
    """
    bucket = int(bucket)
    return str(bucket) if bucket < 2 else f"{bucket}\u2013{2 * bucket - 1}"


def pct(value: float) -> str:
    """A share as a percentage with one decimal, two where one would round a share short of all to 100.0%.

    >>> pct(0.6123), pct(0.99981), pct(1.0)
    ('61.2%', '99.98%', '100.0%')
    """
    text = f"{100 * value:.1f}%"
    # 0.9998 is not all of the attention: keep the digit that says so.
    return f"{100 * value:.2f}%" if text == "100.0%" and value < 1 else text
