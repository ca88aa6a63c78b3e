"""Regenerate the README's generated blocks (metric definitions, table schema) from the registries:
``python -m headscan.docs``."""

import re
import sys
from pathlib import Path

from .metrics import syntax  # noqa: F401  (registers the syntax metric, so that its definition is listed)
from .metrics.attention import definitions_markdown
from .tables.io import tables_markdown


def blocks() -> dict[str, str]:
    """Each generated block of the README by name: ``<!-- NAME:start -->`` ... ``<!-- NAME:end -->``."""
    from .testing.architectures import support_matrix_markdown  # builds no checkpoint; imports transformers

    return {"metrics": definitions_markdown(), "tables": tables_markdown(), "architectures": support_matrix_markdown()}


def pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {name}:start -->\n)(.*?)(<!-- {name}:end -->)", re.S)


def update_readme(path: Path) -> bool:
    """Rewrite the generated blocks of `path`; True when one changed."""
    text = path.read_text()
    updated = text
    for name, body in blocks().items():
        updated = pattern(name).sub(lambda m, body=body: m.group(1) + body + m.group(3), updated)
    if updated != text:
        path.write_text(updated)
    return updated != text


if __name__ == "__main__":
    readme = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("README.md")
    print(f"{readme}: {'updated' if update_readme(readme) else 'already up to date'}")
