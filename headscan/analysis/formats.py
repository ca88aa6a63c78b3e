"""Numbers and names as a report writes them: shares as percentages, position buckets as the positions they cover,
user-given names (paths, commands, relations) as code spans that hold them whole.

Torch-free, like `headscan.analysis.syntax`, which writes its sentences with them.
"""

from __future__ import annotations

import re

__all__ = ["pct", "fmt_bucket", "code"]


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


def code(text) -> str:
    """`text` as a Markdown code span that holds it whole: fenced by one more backtick than its longest run of
    them, padded with a space where it starts or ends with one (the report's Markdown and HTML read it back alike).

    >>> print(code("out/ewt"), code("a`b"), code("`x`"))
    `out/ewt` ``a`b`` `` `x` ``
    """
    text = str(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
