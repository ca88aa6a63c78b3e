"""Regenerate the README's metric definitions from the registry: ``python -m headscan.docs``."""

import re
import sys
from pathlib import Path

from .metrics import definitions_markdown

BLOCK = re.compile(r"(<!-- metrics:start -->\n).*?(<!-- metrics:end -->)", re.S)


def update_readme(path: Path) -> bool:
    """Rewrite the metrics block of `path`; True when it changed."""
    text = path.read_text()
    updated = BLOCK.sub(lambda m: m.group(1) + definitions_markdown() + m.group(2), text)
    if updated != text:
        path.write_text(updated)
    return updated != text


if __name__ == "__main__":
    readme = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("README.md")
    print(f"{readme}: {'updated' if update_readme(readme) else 'already up to date'}")
